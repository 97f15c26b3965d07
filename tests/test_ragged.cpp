// SPDX-License-Identifier: MIT
// ragged_all_to_all: JAX's docstring example, random offsets and sizes against a plain-loop
// reference in vmap, pmap and pmap of vmap (bit for bit), groups, plain offsets, the errors of
// bad offsets and sizes in every mode, fault injection, and the transpose (a dot product).
// all_gather_v against a reference; the asynchronous forms of both against the blocking ones.
#include "test_support.hpp"

#include <namedax/ragged.hpp>

#include <xtensor/xview.hpp>

#include <atomic>
#include <limits>
#include <random>
#include <stdexcept>

using namespace namedax::literals;
using namedax_test::error_of;

namespace {

using ints = xt::xarray<std::int32_t>;

auto ragged_body() {
  return [](auto op, auto out, auto io, auto ss, auto oo, auto rs) {
    return namedax::eval(namedax::ragged_all_to_all(op, out, io, ss, oo, rs, "x"_ax));
  };
}

/// One exchange among n indices: operand [n, N, C], output [n, M, C], the four arrays [n, n].
struct ragged_case {
  xt::xarray<float> operand, output;
  ints input_offsets, send_sizes, output_offsets, recv_sizes;
};

/// Random chunks, `slices` per (sender, receiver) pair as JAX allows (entry r * slices + q of a
/// sender's arrays goes to receiver r): each sender lays its chunks in a random order with
/// random gaps (padding), sizes 0..2 (a quarter of the senders send nothing); each receiver
/// lays what it gets in sender order with random gaps. Nothing overlaps.
ragged_case random_case(std::mt19937& rng, std::size_t n, std::size_t row, std::size_t slices = 1) {
  const std::size_t K = n * slices, N = 3 * K + 1, M = 3 * K + 2;
  ragged_case c;
  c.operand = namedax_test::random_array<float>(rng, {n, N, row});
  c.output = namedax_test::random_array<float>(rng, {n, M, row});
  c.input_offsets = c.send_sizes = c.output_offsets = c.recv_sizes = xt::zeros<std::int32_t>({n, K});
  std::uniform_int_distribution<int> size(0, 2), gap(0, 1), quiet(0, 3);
  for (std::size_t s = 0; s < n; ++s) {
    const bool silent = quiet(rng) == 0;
    std::vector<std::size_t> order(K);
    for (std::size_t k = 0; k < K; ++k) order[k] = k;
    std::shuffle(order.begin(), order.end(), rng);
    int at = 0;
    for (std::size_t e : order) {
      at += gap(rng);
      const int sz = silent ? 0 : size(rng);
      c.send_sizes(s, e) = sz, c.input_offsets(s, e) = at;
      at += sz;
    }
  }
  for (std::size_t r = 0; r < n; ++r) {
    int at = 0;
    for (std::size_t s = 0; s < n; ++s)
      for (std::size_t q = 0; q < slices; ++q) {
        const std::size_t e = r * slices + q;
        at += gap(rng);
        c.output_offsets(s, e) = at, c.recv_sizes(r, s * slices + q) = c.send_sizes(s, e);
        at += c.send_sizes(s, e);
      }
  }
  return c;
}

/// The reference, with plain loops: receiver r's output with sender s's slices written in.
xt::xarray<float> reference(const ragged_case& c) {
  xt::xarray<float> out = c.output;
  const std::size_t n = c.operand.shape()[0], row = c.operand.shape()[2], slices = c.send_sizes.shape()[1] / n;
  for (std::size_t r = 0; r < n; ++r)
    for (std::size_t s = 0; s < n; ++s)
      for (std::size_t q = 0; q < slices; ++q) {
        const std::size_t e = r * slices + q;
        for (int t = 0; t < c.send_sizes(s, e); ++t)
          for (std::size_t k = 0; k < row; ++k)
            out(r, static_cast<std::size_t>(c.output_offsets(s, e) + t), k) =
                c.operand(s, static_cast<std::size_t>(c.input_offsets(s, e) + t), k);
      }
  return out;
}

template <class T>
xt::xarray<T> stack2(const std::vector<xt::xarray<T>>& parts, std::size_t inner) {
  // parts[a * inner + b] -> out[a, b, ...]
  std::vector<std::size_t> shape{parts.size() / inner, inner};
  shape.insert(shape.end(), parts[0].shape().begin(), parts[0].shape().end());
  xt::xarray<T> out = xt::xarray<T>::from_shape(shape);
  for (std::size_t k = 0; k < parts.size(); ++k)
    std::copy(parts[k].begin(), parts[k].end(), out.begin() + static_cast<std::ptrdiff_t>(k * parts[k].size()));
  return out;
}

/// A device that throws at one fault point, once.
std::atomic<int> fault_at{-1};
std::atomic<int> faults_fired{0};
thread_local bool fault_armed = false;
void inject(namedax::detail::fault_point point, std::string_view) {
  if (!fault_armed || static_cast<int>(point) != fault_at) return;
  fault_armed = false;
  ++faults_fired;
  if (point == namedax::detail::fault_point::allocation) throw std::bad_alloc();
  throw std::runtime_error("injected fault");
}

}  // namespace

TEST_SUITE("ragged_all_to_all") {
  TEST_CASE("JAX's docstring example, in vmap and pmap") {
    const xt::xarray<float> operand{{1, 2, 2}, {3, 4, 0}};
    const xt::xarray<float> output = xt::zeros<float>({2, 4});
    const ints input_offsets{{0, 1}, {0, 1}}, send_sizes{{1, 2}, {1, 1}}, output_offsets{{0, 0}, {1, 2}},
        recv_sizes{{1, 1}, {2, 1}};
    const xt::xarray<float> expected{{1, 3, 0, 0}, {2, 2, 4, 0}};
    const xt::xarray<float> v = namedax::vmap<"x">(ragged_body())(operand, output, input_offsets, send_sizes,
                                                                  output_offsets, recv_sizes);
    CHECK_BITWISE(v, expected);
    const xt::xarray<float> p = namedax::pmap<"x">(ragged_body())(operand, output, input_offsets, send_sizes,
                                                                  output_offsets, recv_sizes);
    CHECK_BITWISE(p, expected);
  }

  TEST_CASE("random offsets and sizes, zero sizes and silent senders: vmap and pmap give the loops' bits") {
    std::mt19937 rng(20);
    for (std::size_t n : {1u, 2u, 3u, 4u, 5u})
      for (int trial = 0; trial < 8; ++trial) {
        const std::size_t slices = trial < 6 ? 1 : 3;  // several slices per peer, as JAX allows
        const auto c = random_case(rng, n, 1 + static_cast<std::size_t>(trial % 3), slices);
        const auto expected = reference(c);
        INFO("n = ", n, ", trial ", trial, ", slices per peer ", slices);
        const xt::xarray<float> v = namedax::vmap<"x">(ragged_body())(c.operand, c.output, c.input_offsets,
                                                                      c.send_sizes, c.output_offsets, c.recv_sizes);
        CHECK_BITWISE(v, expected);
        const xt::xarray<float> p = namedax::pmap<"x">(ragged_body())(c.operand, c.output, c.input_offsets,
                                                                      c.send_sizes, c.output_offsets, c.recv_sizes);
        CHECK_BITWISE(p, expected);
      }
  }

  TEST_CASE("pmap of vmap and vmap of vmap: the exchange over either axis, the other one a batch") {
    std::mt19937 rng(21);
    const std::size_t A = 3, B = 2;
    std::vector<ragged_case> over_j, over_i;  // one exchange per outer (per inner) index
    for (std::size_t a = 0; a < A; ++a) over_j.push_back(random_case(rng, B, 2));
    for (std::size_t b = 0; b < B; ++b) over_i.push_back(random_case(rng, A, 2));
    auto grid = [&](auto field_of, bool exchange_over_j) {
      std::vector<std::remove_cvref_t<decltype(field_of(over_j[0]))>> parts;
      for (std::size_t a = 0; a < A; ++a)
        for (std::size_t b = 0; b < B; ++b) {
          const auto& whole = exchange_over_j ? field_of(over_j[a]) : field_of(over_i[b]);
          parts.push_back(xt::view(whole, exchange_over_j ? b : a));
        }
      return stack2(parts, B);
    };
    for (bool j : {true, false}) {
      INFO("exchange over ", j ? "j" : "i");
      std::vector<xt::xarray<float>> ref_parts;
      std::vector<xt::xarray<float>> refs;
      for (const auto& c : j ? over_j : over_i) refs.push_back(reference(c));
      for (std::size_t a = 0; a < A; ++a)
        for (std::size_t b = 0; b < B; ++b) ref_parts.push_back(xt::view(j ? refs[a] : refs[b], j ? b : a));
      const auto expected = stack2(ref_parts, B);
      const auto op = grid([](const ragged_case& c) -> const auto& { return c.operand; }, j);
      const auto out = grid([](const ragged_case& c) -> const auto& { return c.output; }, j);
      const auto io = grid([](const ragged_case& c) -> const auto& { return c.input_offsets; }, j);
      const auto ss = grid([](const ragged_case& c) -> const auto& { return c.send_sizes; }, j);
      const auto oo = grid([](const ragged_case& c) -> const auto& { return c.output_offsets; }, j);
      const auto rs = grid([](const ragged_case& c) -> const auto& { return c.recv_sizes; }, j);
      auto body = [j](auto... v) {
        if (j) return namedax::eval(namedax::ragged_all_to_all(v..., "j"_ax));
        return namedax::eval(namedax::ragged_all_to_all(v..., "i"_ax));
      };
      const xt::xarray<float> pv = namedax::pmap<"i">(namedax::vmap<"j">(body))(op, out, io, ss, oo, rs);
      CHECK_BITWISE(pv, expected);
      const xt::xarray<float> vv = namedax::vmap<"i">(namedax::vmap<"j">(body))(op, out, io, ss, oo, rs);
      CHECK_BITWISE(vv, expected);
      const xt::xarray<float> pp = namedax::pmap<"i">(namedax::pmap<"j">(body))(op, out, io, ss, oo, rs);
      CHECK_BITWISE(pp, expected);
    }
  }

  TEST_CASE("axis_index_groups: each group exchanges among itself, arrays of the group's size") {
    std::mt19937 rng(22);
    const auto even = random_case(rng, 2, 2), odd = random_case(rng, 2, 2);  // groups {0, 2} and {1, 3}
    auto interleave = [](const auto& e, const auto& o) {
      std::vector<std::remove_cvref_t<decltype(xt::eval(xt::view(e, 0)))>> parts;
      for (std::size_t k = 0; k < 4; ++k) parts.push_back(xt::view(k % 2 == 0 ? e : o, k / 2));
      return stack2(parts, 1);
    };
    auto flat = [](auto a) {
      auto s = a.shape();
      std::vector<std::size_t> shape{s[0] * s[1]};
      shape.insert(shape.end(), s.begin() + 2, s.end());
      a.reshape(shape);
      return a;
    };
    const auto expected = flat(interleave(reference(even), reference(odd)));
    auto body = [](auto... v) {
      return namedax::eval(namedax::ragged_all_to_all(v..., "x"_ax, {.axis_index_groups = {{0, 2}, {1, 3}}}));
    };
    const auto args = std::tuple{flat(interleave(even.operand, odd.operand)), flat(interleave(even.output, odd.output)),
                                 flat(interleave(even.input_offsets, odd.input_offsets)),
                                 flat(interleave(even.send_sizes, odd.send_sizes)),
                                 flat(interleave(even.output_offsets, odd.output_offsets)),
                                 flat(interleave(even.recv_sizes, odd.recv_sizes))};
    const xt::xarray<float> v = std::apply(namedax::vmap<"x">(body), args);
    CHECK_BITWISE(v, expected);
    const xt::xarray<float> p = std::apply(namedax::pmap<"x">(body), args);
    CHECK_BITWISE(p, expected);
  }

  TEST_CASE("a plain output and plain offsets are the same on every index") {
    // Every index sends row k of its operand to peer k, where sender s writes at row s; the
    // output (plain, -1s) keeps its last row.
    const xt::xarray<float> operand{{10, 11, 12}, {20, 21, 22}, {30, 31, 32}};
    const ints io{0, 1, 2}, ss{1, 1, 1}, rs{1, 1, 1};
    auto body = [&](auto op, auto oo) {
      const xt::xarray<float> out{-1, -1, -1, -1};
      return namedax::eval(namedax::ragged_all_to_all(op, out, io, ss, oo, rs, "x"_ax));
    };
    const ints oo{{0, 0, 0}, {1, 1, 1}, {2, 2, 2}};  // sender s writes at row s of every peer
    const xt::xarray<float> expected{{10, 20, 30, -1}, {11, 21, 31, -1}, {12, 22, 32, -1}};
    CHECK_BITWISE(xt::xarray<float>(namedax::vmap<"x">(body)(operand, oo)), expected);
    CHECK_BITWISE(xt::xarray<float>(namedax::pmap<"x">(body)(operand, oo)), expected);
  }

  TEST_CASE("bad offsets and sizes are an error naming the index, the peer and the numbers, in every mode") {
    const xt::xarray<float> operand{{1, 2, 2}, {3, 4, 0}};
    const xt::xarray<float> output = xt::zeros<float>({2, 4});
    const ints io{{0, 1}, {0, 1}}, ss{{1, 2}, {1, 1}}, oo{{0, 0}, {1, 2}}, rs{{1, 1}, {2, 1}};
    struct bad {
      const char* what;
      ints io, ss, oo, rs;
      const char* expect;
    };
    const bad cases[] = {
        {"negative size", io, ints{{1, -2}, {1, 1}}, oo, rs, "index 0 sending to peer 1 has input_offsets 1, send_sizes -2"},
        {"negative offset", ints{{0, 1}, {-1, 1}}, ss, oo, rs, "index 1 sending to peer 0 has input_offsets -1"},
        {"past the operand", ints{{0, 2}, {0, 1}}, ss, oo, rs,
         "index 0 sending to peer 1 sends rows 2..4 (input_offsets 2, send_sizes 2), past the operand's 3 rows"},
        {"past the output", io, ss, ints{{0, 3}, {1, 2}}, rs,
         "index 0 sending to peer 1 writes rows 3..5 (output_offsets 3, send_sizes 2), past the output's 4 rows"},
        {"recv_sizes disagree", io, ss, oo, ints{{1, 1}, {1, 1}},
         "index 0 sending to peer 1 sends 2 rows but the peer's recv_sizes[0] is 1"},
        {"wrong length", ints{{0, 1, 0}, {0, 1, 0}}, ints{{1, 2, 0}, {1, 1, 0}}, ints{{0, 0, 0}, {1, 2, 0}},
         ints{{1, 1, 0}, {2, 1, 0}}, "have 3 entries, which the 2 indices of a group do not divide"},
    };
    for (const auto& b : cases) {
      INFO(b.what);
      const auto v = error_of([&] { (void)namedax::vmap<"x">(ragged_body())(operand, output, b.io, b.ss, b.oo, b.rs); });
      const auto p = error_of([&] { (void)namedax::pmap<"x">(ragged_body())(operand, output, b.io, b.ss, b.oo, b.rs); });
      for (const auto& text : {v, p}) {
        INFO(text);
        CHECK(text.find("namedax::ragged_all_to_all over axis ('x',)") != std::string::npos);
        CHECK(text.find(b.expect) != std::string::npos);
      }
    }
  }

  TEST_CASE("int64 offsets and sizes near INT64_MAX are an error, not a bound that wraps") {
    // in + size and out + size overflow int64 here: the checks must not compute them.
    using longs = xt::xarray<std::int64_t>;
    constexpr std::int64_t top = std::numeric_limits<std::int64_t>::max();
    const xt::xarray<float> operand{{1, 2, 2}, {3, 4, 0}};
    const xt::xarray<float> output = xt::zeros<float>({2, 4});
    const longs io{{0, 1}, {0, 1}}, ss{{1, 2}, {1, 1}}, oo{{0, 0}, {1, 2}}, rs{{1, 1}, {2, 1}};
    struct bad {
      const char* what;
      longs io, ss, oo;
      const char* expect;
    };
    const bad cases[] = {
        {"an input offset near the top", longs{{0, top - 1}, {0, 1}}, ss, oo,
         "index 0 sending to peer 1 sends rows 9223372036854775806..9223372036854775808 (input_offsets "
         "9223372036854775806, send_sizes 2), past the operand's 3 rows"},
        {"an output offset at the top", io, ss, longs{{0, top}, {1, 2}},
         "index 0 sending to peer 1 writes rows 9223372036854775807..9223372036854775809 (output_offsets "
         "9223372036854775807, send_sizes 2), past the output's 4 rows"},
        {"a size at the top", longs{{0, 1}, {0, 1}}, longs{{1, top}, {1, 1}}, oo,
         "index 0 sending to peer 1 sends rows 1..9223372036854775808 (input_offsets 1, send_sizes 9223372036854775807)"},
    };
    for (const auto& b : cases) {
      INFO(b.what);
      const auto v = error_of([&] { (void)namedax::vmap<"x">(ragged_body())(operand, output, b.io, b.ss, b.oo, rs); });
      const auto p = error_of([&] { (void)namedax::pmap<"x">(ragged_body())(operand, output, b.io, b.ss, b.oo, rs); });
      for (const auto& text : {v, p}) {
        INFO(text);
        CHECK(text.find("namedax::ragged_all_to_all over axis ('x',)") != std::string::npos);
        CHECK(text.find(b.expect) != std::string::npos);
      }
    }
  }

  TEST_CASE("a device that fails at any point of the exchange fails the map cleanly, no hang") {
    namedax::detail::fault_injection() = &inject;
    std::mt19937 rng(23);
    const auto c = random_case(rng, 4, 2);
    const auto expected = reference(c);
    int runs = 0;
    for (int point = 0; point < 4; ++point)
      for (int device : {0, 3}) {
        INFO("fault point ", point, " on device ", device);
        fault_at = point, faults_fired = 0;
        auto body = [device](auto... v) {
          if (namedax::axis_index("x"_ax) == device) fault_armed = true;
          auto r = namedax::eval(namedax::ragged_all_to_all(v..., "x"_ax));
          fault_armed = false;
          return r;
        };
        std::string caught = "no error";
        try {
          const xt::xarray<float> out = namedax::pmap<"x">(body)(c.operand, c.output, c.input_offsets, c.send_sizes,
                                                                 c.output_offsets, c.recv_sizes);
          CHECK(faults_fired == 0);
          CHECK_BITWISE(out, expected);
        } catch (const std::bad_alloc&) {
          caught = "bad_alloc";
        } catch (const std::exception& e) {
          caught = e.what();
        }
        fault_armed = false;
        ++runs;
        if (faults_fired > 0) CHECK((caught == "bad_alloc" || caught.find("injected fault") != std::string::npos));
        if (point != 3) CHECK(faults_fired == 1);
      }
    namedax::detail::fault_injection() = nullptr;
    CHECK(runs == 8);
  }

  TEST_CASE("transpose: <ragged_all_to_all(x), y> == <x, transpose(y)>, under vmap and pmap") {
    std::mt19937 rng(24);
    for (std::size_t slices : {1u, 2u}) {
    INFO("slices per peer ", slices);
    const auto c = random_case(rng, 4, 3, slices);
    const std::size_t N = c.operand.shape()[1], M = c.output.shape()[1];
    const auto y = namedax_test::random_array<float>(rng, {4, M, 3});
    auto pair = [N, M](auto x, auto yy, auto io, auto ss, auto oo, auto rs) {
      auto map = namedax::linear::ragged_all_to_all("x"_ax, io, ss, oo, rs, N, M);
      auto forward = namedax::eval(map(x));
      auto back = namedax::eval(namedax::transpose(map, yy));
      return std::tuple{namedax::eval(namedax::psum(forward * yy, namedax::axes("x"_ax, 0, 1))),
                        namedax::eval(namedax::psum(x * back, namedax::axes("x"_ax, 0, 1)))};
    };
    auto check = [](const auto& got) {
      const xt::xarray<float> a = std::get<0>(got), b = std::get<1>(got);
      CHECK(a() == doctest::Approx(b()).epsilon(1e-5));
    };
    check(namedax::vmap<"x">(pair)(c.operand, y, c.input_offsets, c.send_sizes, c.output_offsets, c.recv_sizes));
    check(namedax::pmap<"x">(pair)(c.operand, y, c.input_offsets, c.send_sizes, c.output_offsets, c.recv_sizes));
    }
  }
}

TEST_SUITE("all_gather_v") {
  TEST_CASE("the valid rows of every index, concatenated in index order, in every placement") {
    std::mt19937 rng(30);
    for (std::size_t n : {1u, 3u, 4u}) {
      const std::size_t R = 3;
      const auto x = namedax_test::random_array<float>(rng, {n, R, 2});
      ints count = xt::zeros<std::int32_t>({n});
      std::uniform_int_distribution<int> pick(0, static_cast<int>(R));
      for (std::size_t k = 0; k < n; ++k) count(k) = pick(rng);
      // The reference: every index's rows in order, the same on every index.
      std::vector<float> rows;
      for (std::size_t k = 0; k < n; ++k)
        for (int t = 0; t < count(k); ++t)
          for (std::size_t e = 0; e < 2; ++e) rows.push_back(x(k, static_cast<std::size_t>(t), e));
      const std::size_t total = rows.size() / 2;
      xt::xarray<float> expected = xt::xarray<float>::from_shape({n, total, 2});
      for (std::size_t k = 0; k < n; ++k) std::copy(rows.begin(), rows.end(), expected.begin() + static_cast<std::ptrdiff_t>(k * rows.size()));
      auto body = [](auto v, auto c) { return namedax::eval(namedax::pvary(namedax::all_gather_v(v, c, "x"_ax), "x"_ax)); };
      INFO("n = ", n);
      CHECK_BITWISE(xt::xarray<float>(namedax::vmap<"x">(body)(x, count)), expected);
      CHECK_BITWISE(xt::xarray<float>(namedax::pmap<"x">(body)(x, count)), expected);
    }
  }
  TEST_CASE("a count outside 0..rows is an error naming the index and the count") {
    const xt::xarray<float> x = xt::zeros<float>({2, 3});
    const ints count{1, 4};
    auto body = [](auto v, auto c) { return namedax::eval(namedax::all_gather_v(v, c, "x"_ax)); };
    for (const auto& text : {error_of([&] { (void)namedax::vmap<"x">(body)(x, count); }),
                             error_of([&] { (void)namedax::pmap<"x">(body)(x, count); })}) {
      INFO(text);
      CHECK(text.find("namedax::all_gather_v over axis ('x',): index 1 gives count 4, outside 0..3") != std::string::npos);
    }
  }
}

TEST_SUITE("async ragged_all_to_all and all_gather_v") {
  /// The blocking call and the asynchronous one started, with a second one in flight and work
  /// done meanwhile: the same type and bits.
  auto started_and_blocking = [](auto blocking, auto start) {
    return std::pair{[blocking](auto... v) { return namedax::eval(blocking(v...)); },
                     [=](auto... v) {  // blocking only in decltype: not captured
                       auto h = start(v...);
                       static_assert(std::is_same_v<decltype(h.wait()), decltype(blocking(v...))>);
                       auto second = start(v...);
                       auto meanwhile = namedax::eval(std::get<0>(std::tuple{v...}) * 2.0f);
                       (void)meanwhile;
                       auto out = h.wait();
                       CHECK_BITWISE(second.wait().payload(), out.payload());
                       return namedax::eval(out);
                     }};
  };

  TEST_CASE("async::ragged_all_to_all gives the blocking bits in every placement, on random offsets and sizes") {
    std::mt19937 rng(40);
    const auto [blocking, started] = started_and_blocking(
        [](auto... v) { return namedax::ragged_all_to_all(v..., "x"_ax); },
        [](auto... v) { return namedax::async::ragged_all_to_all(v..., "x"_ax); });
    for (std::size_t n : {1u, 2u, 3u, 4u, 5u})
      for (int trial = 0; trial < 4; ++trial) {
        const std::size_t slices = trial < 3 ? 1 : 2;
        const auto c = random_case(rng, n, 1 + static_cast<std::size_t>(trial % 2), slices);
        const auto expected = reference(c);
        INFO("n = ", n, ", trial ", trial);
        const auto args = std::tuple{c.operand, c.output, c.input_offsets, c.send_sizes, c.output_offsets, c.recv_sizes};
        CHECK_BITWISE(xt::xarray<float>(std::apply(namedax::pmap<"x">(started), args)), expected);
        CHECK_BITWISE(xt::xarray<float>(std::apply(namedax::vmap<"x">(started), args)), expected);
        CHECK_BITWISE(xt::xarray<float>(std::apply(namedax::pmap<"x">(blocking), args)), expected);
      }
  }

  TEST_CASE("async::ragged_all_to_all over an inner axis of devices or vectors, and with groups") {
    std::mt19937 rng(41);
    // 2 x 3 indices; the exchange over "j" (3 indices) in each row "i".
    const auto c0 = random_case(rng, 3, 2), c1 = random_case(rng, 3, 2);
    auto rows = [](const auto& a, const auto& b) { return stack2(std::vector{xt::eval(a), xt::eval(b)}, 1); };
    auto flat2 = [](auto a) {  // [2, 1, 3, ...] -> [2, 3, ...]
      auto s = a.shape();
      std::vector<std::size_t> shape{s[0]};
      shape.insert(shape.end(), s.begin() + 2, s.end());
      a.reshape(shape);
      return a;
    };
    const auto args = std::tuple{flat2(rows(c0.operand, c1.operand)), flat2(rows(c0.output, c1.output)),
                                 flat2(rows(c0.input_offsets, c1.input_offsets)), flat2(rows(c0.send_sizes, c1.send_sizes)),
                                 flat2(rows(c0.output_offsets, c1.output_offsets)),
                                 flat2(rows(c0.recv_sizes, c1.recv_sizes))};
    const auto expected = flat2(rows(reference(c0), reference(c1)));
    const auto [blocking, started] = started_and_blocking(
        [](auto... v) { return namedax::ragged_all_to_all(v..., "j"_ax); },
        [](auto... v) { return namedax::async::ragged_all_to_all(v..., "j"_ax); });
    (void)blocking;
    CHECK_BITWISE(xt::xarray<float>(std::apply(namedax::pmap<"i">(namedax::pmap<"j">(started)), args)), expected);
    CHECK_BITWISE(xt::xarray<float>(std::apply(namedax::pmap<"i">(namedax::vmap<"j">(started)), args)), expected);
    CHECK_BITWISE(xt::xarray<float>(std::apply(namedax::vmap<"i">(namedax::pmap<"j">(started)), args)), expected);
    // Groups {0, 2} and {1, 3} of four devices.
    const auto g = random_case(rng, 4, 2, 1);
    auto grouped = [](auto... v) {
      return namedax::eval(namedax::ragged_all_to_all(v..., "x"_ax, {.axis_index_groups = {{0, 2}, {1, 3}}}));
    };
    auto grouped_async = [](auto... v) {
      return namedax::eval(
          namedax::async::ragged_all_to_all(v..., "x"_ax, {.axis_index_groups = {{0, 2}, {1, 3}}}).wait());
    };
    // Each group's arrays have its 2 entries: the first two of the random case's.
    auto firsts = [](const ints& a) { return ints(xt::view(a, xt::all(), xt::range(0, 2))); };
    const auto gargs = std::tuple{g.operand, g.output, firsts(g.input_offsets), xt::zeros_like(firsts(g.send_sizes)),
                                  firsts(g.output_offsets), xt::zeros_like(firsts(g.recv_sizes))};
    const xt::xarray<float> want = std::apply(namedax::pmap<"x">(grouped), gargs);
    CHECK_BITWISE(xt::xarray<float>(std::apply(namedax::pmap<"x">(grouped_async), gargs)), want);
    CHECK_BITWISE(xt::xarray<float>(std::apply(namedax::vmap<"x">(grouped_async), gargs)), want);
  }

  TEST_CASE("async::all_gather_v gives the blocking bits, batch elements with different totals included") {
    std::mt19937 rng(42);
    const auto [blocking, started] = started_and_blocking(
        [](auto v, auto c) { return namedax::all_gather_v(v, c, "x"_ax); },
        [](auto v, auto c) { return namedax::async::all_gather_v(v, c, "x"_ax); });
    for (std::size_t n : {1u, 3u, 4u}) {
      const auto x = namedax_test::random_array<float>(rng, {n, 2, 4, 3});  // along "x", then "b"
      ints count = xt::zeros<std::int32_t>({n, std::size_t{2}});
      std::uniform_int_distribution<int> pick(0, 4);
      for (auto& k : count) k = pick(rng);
      INFO("n = ", n);
      const xt::xarray<float> expected = namedax::pmap<"x">(namedax::vmap<"b">(blocking))(x, count);
      CHECK_BITWISE(xt::xarray<float>(namedax::pmap<"x">(namedax::vmap<"b">(started))(x, count)), expected);
      CHECK_BITWISE(xt::xarray<float>(namedax::vmap<"x">(namedax::vmap<"b">(started))(x, count)), expected);
      // Devices along "b" must return one shape: counts the same along "b".
      const ints same = xt::view(count, xt::all(), xt::keep(0, 0));
      CHECK_BITWISE(xt::xarray<float>(namedax::pmap<"x">(namedax::pmap<"b">(started))(x, same)),
                    xt::xarray<float>(namedax::pmap<"x">(namedax::vmap<"b">(blocking))(x, same)));
    }
  }

  TEST_CASE("the asynchronous forms take their operands at start and report bad input at wait, on every index") {
    const xt::xarray<float> operand{{1, 2, 2}, {3, 4, 0}};
    const xt::xarray<float> output = xt::zeros<float>({2, 4});
    const ints io{{0, 1}, {0, 1}}, ss{{1, 2}, {1, 1}}, oo{{0, 0}, {1, 2}}, rs{{1, 1}, {2, 1}};
    // Rebinding the operand after the start changes nothing: JAX's docstring example.
    auto rebound = [](auto op, auto out, auto i, auto s, auto o, auto r) {
      auto rows = namedax::eval(op);
      auto sizes = namedax::eval(s);
      auto h = namedax::async::ragged_all_to_all(rows, out, i, sizes, o, r, "x"_ax);
      rows = namedax::eval(rows * 0.0f);
      sizes = namedax::eval(sizes * 0);
      return namedax::eval(h.wait());
    };
    const xt::xarray<float> expected{{1, 3, 0, 0}, {2, 2, 4, 0}};
    CHECK_BITWISE(xt::xarray<float>(namedax::pmap<"x">(rebound)(operand, output, io, ss, oo, rs)), expected);
    CHECK_BITWISE(xt::xarray<float>(namedax::vmap<"x">(rebound)(operand, output, io, ss, oo, rs)), expected);
    auto bad = [](auto... v) { return namedax::eval(namedax::async::ragged_all_to_all(v..., "x"_ax).wait()); };
    const ints past{{0, 2}, {0, 1}};
    for (const auto& text : {error_of([&] { (void)namedax::pmap<"x">(bad)(operand, output, past, ss, oo, rs); }),
                             error_of([&] { (void)namedax::vmap<"x">(bad)(operand, output, past, ss, oo, rs); })}) {
      INFO(text);
      CHECK(text.find("namedax::async::ragged_all_to_all over axis ('x',): index 0 sending to peer 1 sends rows 2..4") !=
            std::string::npos);
    }
    auto bad_count = [](auto v, auto c) { return namedax::eval(namedax::async::all_gather_v(v, c, "x"_ax).wait()); };
    const xt::xarray<float> x = xt::zeros<float>({2, 3});
    for (const auto& text : {error_of([&] { (void)namedax::pmap<"x">(bad_count)(x, ints{1, 4}); }),
                             error_of([&] { (void)namedax::vmap<"x">(bad_count)(x, ints{1, 4}); })}) {
      INFO(text);
      CHECK(text.find("namedax::async::all_gather_v over axis ('x',): index 1 gives count 4, outside 0..3") !=
            std::string::npos);
    }
  }
}
