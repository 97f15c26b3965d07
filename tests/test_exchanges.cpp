// SPDX-License-Identifier: MIT
// all_gather, psum_scatter, all_to_all, pswapaxes, ppermute, pshuffle, pargmax and pargmin:
// JAX's docstring examples in both modes, semantics against naive loops, vmap against pmap
// bit for bit on random inputs, and the errors bad input gets.
#include "test_support.hpp"

#include <atomic>

#include <xtensor/xview.hpp>

using namespace namedax::literals;
using namedax_test::both_modes;
using namedax_test::error_of;

namespace {


// x with each index's slice: x(i, ...) for the mapped leading axis.
template <class T>
xt::xarray<T> slice(const xt::xarray<T>& x, std::size_t i) {
  return xt::view(x, i);
}
// Stack slices along a new axis `axis` (a plain loop: the reference must not share code with namedax).
template <class T>
xt::xarray<T> stack_at(const std::vector<xt::xarray<T>>& parts, std::size_t axis) {
  std::vector<std::size_t> shape(parts[0].shape().begin(), parts[0].shape().end());
  shape.insert(shape.begin() + static_cast<std::ptrdiff_t>(axis), parts.size());
  xt::xarray<T> out = xt::xarray<T>::from_shape(shape);
  for (std::size_t flat = 0; flat < out.size(); ++flat) {
    auto index = xt::unravel_index(flat, out.shape());
    const auto k = index[axis];
    index.erase(index.begin() + static_cast<std::ptrdiff_t>(axis));
    out.flat(flat) = parts[k].element(index.begin(), index.end());
  }
  return out;
}
// Elements [begin, begin + length) of x along `dim`; with `squeeze`, element `begin` without the dim.
template <class T>
xt::xarray<T> pick(const xt::xarray<T>& x, std::size_t dim, std::size_t begin, std::size_t length, bool squeeze) {
  std::vector<std::size_t> shape(x.shape().begin(), x.shape().end());
  if (squeeze) shape.erase(shape.begin() + static_cast<std::ptrdiff_t>(dim));
  else shape[dim] = length;
  xt::xarray<T> out = xt::xarray<T>::from_shape(shape);
  for (std::size_t flat = 0; flat < out.size(); ++flat) {
    const auto unraveled = xt::unravel_index(flat, out.shape());
    std::vector<std::size_t> index(unraveled.begin(), unraveled.end());
    if (squeeze) index.insert(index.begin() + static_cast<std::ptrdiff_t>(dim), begin);
    else index[dim] += begin;
    out.flat(flat) = x.element(index.begin(), index.end());
  }
  return out;
}
}  // namespace

TEST_SUITE("docstring examples") {
  TEST_CASE("JAX docstring, all_gather: [0, 1, 2, 3] on every index") {
    xt::xarray<int> x = xt::arange<int>(4);
    auto [v, p] = both_modes([](auto x) { return namedax::all_gather(x, "i"_ax); }, x);
    xt::xarray<int> expected{{0, 1, 2, 3}, {0, 1, 2, 3}, {0, 1, 2, 3}, {0, 1, 2, 3}};
    CHECK_BITWISE(v, expected);
    CHECK_BITWISE(p, expected);
  }
  TEST_CASE("JAX docstring, all_gather with axis_index_groups [[0, 2], [3, 1]]") {
    xt::xarray<int> x = xt::arange<int>(16).reshape({4, 4});
    auto [v, p] = both_modes([](auto x) { return namedax::all_gather(x, "i"_ax, {.axis_index_groups = {{0, 2}, {3, 1}}}); }, x);
    xt::xarray<int> expected{{{0, 1, 2, 3}, {8, 9, 10, 11}},
                             {{12, 13, 14, 15}, {4, 5, 6, 7}},
                             {{0, 1, 2, 3}, {8, 9, 10, 11}},
                             {{12, 13, 14, 15}, {4, 5, 6, 7}}};
    CHECK_BITWISE(v, expected);
    CHECK_BITWISE(p, expected);
  }
  TEST_CASE("JAX docstring, psum_scatter: untiled, tiled, and tiled in groups [[0, 2], [3, 1]]") {
    xt::xarray<int> x = xt::arange<int>(16).reshape({4, 4});
    auto [v, p] = both_modes([](auto x) { return namedax::psum_scatter(x, "i"_ax); }, x);
    xt::xarray<int> untiled{24, 28, 32, 36};
    CHECK_BITWISE(v, untiled);
    CHECK_BITWISE(p, untiled);
    auto [vt, pt] = both_modes([](auto x) { return namedax::psum_scatter(x, "i"_ax, {.tiled = true}); }, x);
    xt::xarray<int> tiled{24, 28, 32, 36};
    tiled.reshape({4, 1});
    CHECK_BITWISE(vt, tiled);
    CHECK_BITWISE(pt, tiled);
    auto grouped = [](auto x) {
      return namedax::psum_scatter(x, "i"_ax, {.axis_index_groups = {{0, 2}, {3, 1}}, .tiled = true});
    };
    auto [vg, pg] = both_modes(grouped, x);
    xt::xarray<int> expected{{8, 10}, {20, 22}, {12, 14}, {16, 18}};
    CHECK_BITWISE(vg, expected);
    CHECK_BITWISE(pg, expected);
  }
}

TEST_SUITE("gathers and scatters") {
  TEST_CASE("all_gather at another axis, stacked and tiled") {
    xt::xarray<float> x = xt::arange<float>(24).reshape({4, 2, 3});
    std::vector<xt::xarray<float>> slices;
    for (std::size_t i = 0; i < 4; ++i) slices.push_back(slice(x, i));
    xt::xarray<float> at1 = stack_at(slices, 1);                        // (2, 4, 3) on each index
    xt::xarray<float> tiled0 = xt::concatenate(xt::xtuple(slices[0], slices[1], slices[2], slices[3]), 0);  // (8, 3)
    auto [v, p] = both_modes([](auto x) { return namedax::all_gather(x, "i"_ax, {.axis = 1}); }, x);
    auto [vt, pt] = both_modes([](auto x) { return namedax::all_gather(x, "i"_ax, {.axis = 0, .tiled = true}); }, x);
    for (std::size_t i = 0; i < 4; ++i) {
      CHECK_BITWISE(slice(v, i), at1);
      CHECK_BITWISE(slice(vt, i), tiled0);
    }
    CHECK_BITWISE(v, p);
    CHECK_BITWISE(vt, pt);
  }
  TEST_CASE("a value that does not vary is gathered as copies, and scattered as size * chunk") {
    xt::xarray<int> x = xt::arange<int>(3);
    xt::xarray<int> w{5, 6, 7};
    auto f = [](auto, auto w) { return std::tuple{namedax::all_gather(w, "i"_ax), namedax::psum_scatter(w, "i"_ax)}; };
    for (auto [gathered, scattered] : {namedax::vmap<"i">(f, std::tuple{0, namedax::none})(x, w),
                                       namedax::pmap<"i">(f, std::tuple{0, namedax::none})(x, w)}) {
      xt::xarray<int> copies{{5, 6, 7}, {5, 6, 7}, {5, 6, 7}};
      CHECK_BITWISE(slice(gathered, 1), copies);
      CHECK_BITWISE(scattered, (xt::xarray<int>{15, 18, 21}));
    }
  }
  TEST_CASE("psum_scatter sums in index order, bool as int32") {
    xt::xarray<bool> x{{true, false}, {true, true}};
    auto [v, p] = both_modes([](auto x) { return namedax::psum_scatter(x, "i"_ax); }, x);
    static_assert(std::is_same_v<decltype(v)::value_type, std::int32_t>);
    CHECK_BITWISE(v, (xt::xarray<std::int32_t>{2, 1}));
    CHECK_BITWISE(p, (xt::xarray<std::int32_t>{2, 1}));
  }
}

TEST_SUITE("all_to_all") {
  // Naive: index p gets chunk p (along split) of every index k, placed at k along concat.
  template <class T>
  xt::xarray<T> naive_all_to_all(const xt::xarray<T>& x, std::size_t p, std::size_t split, std::size_t concat, bool tiled) {
    const std::size_t n = x.shape()[0];
    std::vector<xt::xarray<T>> pieces;
    for (std::size_t k = 0; k < n; ++k) {
      xt::xarray<T> s = slice(x, k);
      const std::size_t chunk = s.shape()[split] / n;
      pieces.push_back(tiled ? pick(s, split, p * chunk, chunk, false) : pick(s, split, p, 1, true));
    }
    if (!tiled) return stack_at(pieces, concat);
    xt::xarray<T> out = pieces[0];
    for (std::size_t k = 1; k < n; ++k) out = xt::concatenate(xt::xtuple(out, pieces[k]), concat);
    return out;
  }

  TEST_CASE("untiled and tiled, for every split and concat axis") {
    xt::xarray<double> x = xt::arange<double>(3 * 3 * 6).reshape({3, 3, 6});
    for (int split : {0, 1})
      for (int concat : {0, 1})
        for (bool tiled : {false, true}) {
          CAPTURE(split);
          CAPTURE(concat);
          CAPTURE(tiled);
          if (!tiled && split == 1) continue;  // untiled needs split size == axis size (3)
          auto f = [=](auto x) { return namedax::all_to_all(x, "i"_ax, split, concat, {.tiled = tiled}); };
          auto [v, p] = both_modes(f, x);
          for (std::size_t i = 0; i < 3; ++i)
            CHECK_BITWISE(slice(v, i), naive_all_to_all(x, i, static_cast<std::size_t>(split), static_cast<std::size_t>(concat), tiled));
          CHECK_BITWISE(v, p);
        }
  }
  TEST_CASE("pswapaxes is all_to_all(x, name, axis, axis): a distributed transpose") {
    xt::xarray<int> x = xt::arange<int>(16).reshape({4, 4});
    auto [v, p] = both_modes([](auto x) { return namedax::pswapaxes(x, "i"_ax, 0); }, x);
    xt::xarray<int> transposed = xt::transpose(x);
    CHECK_BITWISE(v, transposed);
    CHECK_BITWISE(p, transposed);
  }
  TEST_CASE("all_to_all within groups") {
    xt::xarray<int> x = xt::arange<int>(8).reshape({4, 2});
    auto f = [](auto x) { return namedax::all_to_all(x, "i"_ax, 0, 0, {.axis_index_groups = {{0, 3}, {1, 2}}}); };
    auto [v, p] = both_modes(f, x);
    // Group {0, 3}: index 0 gets (x[0][0], x[3][0]), index 3 gets (x[0][1], x[3][1]).
    xt::xarray<int> expected{{0, 6}, {2, 4}, {3, 5}, {1, 7}};
    CHECK_BITWISE(v, expected);
    CHECK_BITWISE(p, expected);
  }
}

TEST_SUITE("permutations") {
  TEST_CASE("ppermute: a ring shift, and a partial permutation that zero-fills") {
    xt::xarray<float> x = xt::arange<float>(8).reshape({4, 2});
    auto ring = [](auto x) { return namedax::ppermute(x, "i"_ax, {{0, 1}, {1, 2}, {2, 3}, {3, 0}}); };
    auto [v, p] = both_modes(ring, x);
    xt::xarray<float> shifted{{6.f, 7.f}, {0.f, 1.f}, {2.f, 3.f}, {4.f, 5.f}};
    CHECK_BITWISE(v, shifted);
    CHECK_BITWISE(p, shifted);
    auto partial = [](auto x) { return namedax::ppermute(x, "i"_ax, {{0, 2}, {3, 1}}); };
    auto [vp, pp] = both_modes(partial, x);
    xt::xarray<float> expected{{0.f, 0.f}, {6.f, 7.f}, {0.f, 1.f}, {0.f, 0.f}};
    CHECK_BITWISE(vp, expected);
    CHECK_BITWISE(pp, expected);
  }
  TEST_CASE("an empty permutation written {} sends nothing: zeros, as JAX's perm=[]") {
    xt::xarray<float> x = xt::arange<float>(6).reshape({3, 2});
    auto [v, p] = both_modes([](auto x) { return namedax::ppermute(x, "i"_ax, {}); }, x);
    const xt::xarray<float> zeros = xt::zeros<float>({3, 2});
    CHECK_BITWISE(v, zeros);
    CHECK_BITWISE(p, zeros);
  }
  TEST_CASE("a ring all-reduce built from ppermute equals psum") {
    xt::xarray<int> x = xt::arange<int>(15).reshape({5, 3});
    auto ring_sum = [](auto x) {
      const int n = namedax::axis_size("i"_ax);
      std::vector<std::pair<int, int>> next;
      for (int k = 0; k < n; ++k) next.emplace_back(k, (k + 1) % n);
      auto total = namedax::eval(x);
      auto passing = namedax::eval(x);
      for (int step = 1; step < n; ++step) {
        passing = namedax::eval(namedax::ppermute(passing, "i"_ax, next));
        total = namedax::eval(total + passing);
      }
      return total;
    };
    auto psum = [](auto x) { return namedax::psum(x, "i"_ax); };
    CHECK_BITWISE(namedax::pmap<"i">(ring_sum)(x), namedax::vmap<"i">(psum)(x));
    CHECK_BITWISE(namedax::vmap<"i">(ring_sum)(x), namedax::vmap<"i">(psum)(x));
  }
  TEST_CASE("a permutation known at compile time, checked against a static axis size") {
    xt::xarray<int> x{10, 11, 12, 13};
    auto f = [](auto x) { return namedax::ppermute(x, "i"_ax, namedax::static_perm<0, 1, 1, 2, 2, 3, 3, 0>); };
    xt::xarray<int> expected{13, 10, 11, 12};
    auto static_size = namedax::vmap<"i", 4>(f);
    CHECK_BITWISE(static_size(x), expected);
    CHECK_BITWISE(namedax::pmap<"i">(f)(x), expected);
  }
  TEST_CASE("pshuffle: output i comes from input perm[i]") {
    xt::xarray<int> x{10, 11, 12, 13};
    auto [v, p] = both_modes([](auto x) { return namedax::pshuffle(x, "i"_ax, {2, 0, 3, 1}); }, x);
    xt::xarray<int> expected{12, 10, 13, 11};
    CHECK_BITWISE(v, expected);
    CHECK_BITWISE(p, expected);
  }
  TEST_CASE("ppermute over two names, row-major") {
    xt::xarray<int> x = xt::arange<int>(6).reshape({2, 3});  // rank = i * 3 + j
    auto f = [](auto x) { return namedax::ppermute(x, namedax::axes("i"_ax, "j"_ax), {{0, 5}, {5, 0}, {1, 3}}); };
    xt::xarray<int> expected{{5, 0, 0}, {1, 0, 0}};
    CHECK_BITWISE(namedax::vmap<"i">(namedax::vmap<"j">(f))(x), expected);
    CHECK_BITWISE(namedax::pmap<"i">(namedax::vmap<"j">(f))(x), expected);
    CHECK_BITWISE(namedax::pmap<"i">(namedax::pmap<"j">(f))(x), expected);
    CHECK_BITWISE(namedax::vmap<"i">(namedax::pmap<"j">(f))(x), expected);
  }
}

TEST_SUITE("results shared among device threads") {
  TEST_CASE("psum and all_gather build one output that every device returns; ppermute hands the array over") {
    // 4 devices x 128 Ki floats (512 KiB): the shared paths of psum (>= 256 KiB) and all_gather.
    constexpr std::size_t n = 4, e = std::size_t{128} << 10;
    xt::xarray<float> x = xt::xarray<float>::from_shape({n, e});
    for (std::size_t k = 0; k < x.size(); ++k) x.data()[k] = static_cast<float>(k % 1000) * 0.5f;
    std::vector<const float*> sums(n), gathers(n), received(n), inputs(n);
    auto collectives = [](const auto& mine) {
      return std::tuple{namedax::eval(namedax::psum(mine, "i"_ax)),
                        namedax::eval(namedax::all_gather(mine, "i"_ax, {.tiled = true})),
                        namedax::eval(namedax::ppermute(mine, "i"_ax, {{0, 1}, {1, 2}, {2, 3}, {3, 0}}))};
    };
    auto devices = namedax::pmap<"i">([&](auto slice) {
      const auto mine = namedax::eval(slice);
      auto results = collectives(mine);
      std::size_t d = 0;
      for (std::size_t k = 1; k < n; ++k)
        if (namedax::axis_index("i"_ax) == static_cast<int>(k)) d = k;
      sums[d] = std::get<0>(results).payload().data(), gathers[d] = std::get<1>(results).payload().data();
      inputs[d] = mine.payload().data(), received[d] = std::get<2>(results).payload().data();
      (void)namedax::psum(namedax::axis_index("i"_ax), "i"_ax);  // every device has recorded its pointers
      return results;
    })(x);
    auto vectorized = namedax::vmap<"i">([&](auto slice) { return collectives(namedax::eval(slice)); })(x);
    CHECK_BITWISE(std::get<0>(devices), std::get<0>(vectorized));
    CHECK_BITWISE(std::get<1>(devices), std::get<1>(vectorized));
    CHECK_BITWISE(std::get<2>(devices), std::get<2>(vectorized));
    CHECK(std::get<2>(devices)(1, 7) == x(0, 7));
    for (std::size_t d = 0; d < n; ++d) {
      CHECK(sums[d] == sums[0]);
      CHECK(gathers[d] == gathers[0]);
      CHECK(received[(d + 1) % n] == inputs[d]);  // the sender's array itself
    }
  }
  TEST_CASE("the shared paths with vectorized dims, two device axes and partial permutations") {
    constexpr std::size_t a = 2, b = 3, e = std::size_t{24} << 10;  // 96 KiB per (i, j); 288 KiB per i
    xt::xarray<double> x = xt::xarray<double>::from_shape({a, b, e});
    for (std::size_t k = 0; k < x.size(); ++k) x.data()[k] = static_cast<double>((k * 7919) % 4093) - 2000.0;
    auto f = [](auto slice) {
      const auto mine = namedax::eval(slice);
      return std::tuple{namedax::psum(mine, "i"_ax), namedax::pmax(mine, namedax::axes("i"_ax, "j"_ax)),
                        namedax::all_gather(mine, "i"_ax, {.axis = 0}),
                        namedax::all_gather(mine, namedax::axes("j"_ax, "i"_ax), {.axis = 0, .tiled = true}),
                        namedax::ppermute(mine, namedax::axes("i"_ax, "j"_ax), {{0, 5}, {5, 0}, {1, 3}}),
                        namedax::pshuffle(mine, "i"_ax, {1, 0})};
    };
    auto expected = namedax::vmap<"i">(namedax::vmap<"j">(f))(x);
    auto threads = namedax::pmap<"i">(namedax::pmap<"j">(f))(x);
    auto mixed = namedax::pmap<"i">(namedax::vmap<"j">(f))(x);
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      auto check = [&](const auto& got, const auto& want) { CHECK_BITWISE(got, want); };
      (check(std::get<I>(threads), std::get<I>(expected)), ...);
      (check(std::get<I>(mixed), std::get<I>(expected)), ...);
    }(std::make_index_sequence<6>{});
  }
}

TEST_SUITE("pytrees among device threads") {
  TEST_CASE("ppermute and pshuffle of a pytree hand every leaf over in one exchange") {
    xt::xarray<float> x = xt::arange<float>(8).reshape({4, 2});
    xt::xarray<std::int32_t> y = xt::arange<std::int32_t>(12).reshape({4, 3});
    static const std::vector<std::pair<int, int>> partial{{0, 1}, {1, 2}, {2, 3}};
    auto f = [](auto a, auto b) {
      const auto ea = namedax::eval(a);
      const auto eb = namedax::eval(b);
      return std::tuple{namedax::ppermute(std::pair{ea, eb}, "i"_ax, partial),
                        namedax::pshuffle(std::tuple{eb, ea, ea}, "i"_ax, {3, 2, 1, 0})};
    };
    auto leaf_by_leaf = [](auto a, auto b) {
      const auto ea = namedax::eval(a);
      const auto eb = namedax::eval(b);
      return std::tuple{std::pair{namedax::ppermute(ea, "i"_ax, partial), namedax::ppermute(eb, "i"_ax, partial)},
                        std::tuple{namedax::pshuffle(eb, "i"_ax, {3, 2, 1, 0}), namedax::pshuffle(ea, "i"_ax, {3, 2, 1, 0}),
                                   namedax::pshuffle(ea, "i"_ax, {3, 2, 1, 0})}};
    };
    namedax::start_tracing();
    const auto devices = namedax::pmap<"i">(f)(x, y);
    const auto events = namedax::stop_tracing();
    REQUIRE(events.size() == 4 * 2);  // one exchange per call and device, not one per leaf
    CHECK(events.front().parameters == " with pairs ((0, 1), (1, 2), (2, 3)) of 2 leaves: (2,) float32, (3,) int32");
    CHECK(namedax_test::tree_bitwise_equal(devices, namedax::pmap<"i">(leaf_by_leaf)(x, y)));
    CHECK(namedax_test::tree_bitwise_equal(devices, namedax::vmap<"i">(f)(x, y)));
    CHECK_BITWISE(std::get<1>(std::get<0>(devices)), (xt::xarray<std::int32_t>{{0, 0, 0}, {0, 1, 2}, {3, 4, 5}, {6, 7, 8}}));
  }
}

TEST_SUITE("argmax") {
  TEST_CASE("pargmax and pargmin: ties go to the lowest index") {
    xt::xarray<float> x{{1.f, 9.f}, {7.f, 2.f}, {7.f, 9.f}, {0.f, 2.f}};
    auto f = [](auto x) { return std::tuple{namedax::pargmax(x, "i"_ax), namedax::pargmin(x, "i"_ax)}; };
    for (auto [amax, amin] : {namedax::vmap<"i">(f)(x), namedax::pmap<"i">(f)(x)}) {
      static_assert(std::is_same_v<typename decltype(amax)::value_type, std::int32_t>);
      for (std::size_t i = 0; i < 4; ++i) {
        CHECK_BITWISE(slice(amax, i), (xt::xarray<std::int32_t>{1, 0}));
        CHECK_BITWISE(slice(amin, i), (xt::xarray<std::int32_t>{3, 1}));
      }
    }
  }
  TEST_CASE("a NaN anywhere gives the largest int32") {
    xt::xarray<float> x{1.f, std::nanf(""), 3.f};
    auto [v, p] = both_modes([](auto x) { return namedax::pargmax(x, "i"_ax); }, x);
    CHECK(xt::all(xt::equal(v, std::numeric_limits<std::int32_t>::max())));
    CHECK(xt::all(xt::equal(p, std::numeric_limits<std::int32_t>::max())));
  }
  TEST_CASE("over two names (linear index), in groups, and with the value") {
    xt::xarray<int> x{{3, 8, 1}, {8, 0, 5}};  // rank = i * 3 + j; 8 at ranks 1 and 3
    auto both = [](auto x) { return namedax::pargmax(x, namedax::axes("i"_ax, "j"_ax)); };
    CHECK(xt::all(xt::equal(namedax::pmap<"i">(namedax::vmap<"j">(both))(x), 1)));
    CHECK(xt::all(xt::equal(namedax::vmap<"i">(namedax::vmap<"j">(both))(x), 1)));
    xt::xarray<int> y{4, 9, 9, 2, 7};
    auto grouped = [](auto y) { return namedax::pargmin(y, "i"_ax, {.axis_index_groups = {{0, 2}, {1, 3, 4}}}); };
    auto [gv, gp] = both_modes(grouped, y);
    xt::xarray<std::int32_t> expected{0, 3, 0, 3, 3};
    CHECK_BITWISE(gv, expected);
    CHECK_BITWISE(gp, expected);
    auto pair = [](auto y) { return namedax::pmax_with_index(y, "i"_ax); };
    for (auto [value, index] : {namedax::vmap<"i">(pair)(y), namedax::pmap<"i">(pair)(y)}) {
      CHECK(xt::all(xt::equal(value, 9)));
      CHECK(xt::all(xt::equal(index, 1)));
    }
  }
}

TEST_SUITE("bad input") {
  TEST_CASE("permutations with repeated or out-of-range indices") {
    xt::xarray<int> x = xt::arange<int>(4);
    auto with = [&](std::vector<std::pair<int, int>> perm) {
      auto f = [perm](auto x) { return namedax::ppermute(x, "i"_ax, perm); };
      return std::pair{error_of([&] { namedax::vmap<"i">(f)(x); }), error_of([&] { namedax::pmap<"i">(f)(x); })};
    };
    for (auto [v, p] : {with({{0, 1}, {0, 2}}), with({{0, 1}, {2, 1}}), with({{0, 4}})}) {
      CHECK(v.find("namedax::ppermute") != std::string::npos);
      CHECK(v.find("'i'") != std::string::npos);
      CHECK(v.find("size 4") != std::string::npos);
      CHECK(p == v);
    }
    CHECK(with({{0, 1}, {0, 2}}).first.find("source 0 appears twice") != std::string::npos);
    CHECK(with({{0, 1}, {2, 1}}).first.find("destination 1 appears twice") != std::string::npos);
    CHECK(with({{0, 4}}).first.find("(0, 4) is out of range") != std::string::npos);
    auto shuffle = [](auto x) { return namedax::pshuffle(x, "i"_ax, {0, 1, 1, 2}); };
    CHECK(error_of([&] { namedax::pmap<"i">(shuffle)(x); }).find("namedax::pshuffle: (0, 1, 1, 2) is not a permutation of 0..3") !=
          std::string::npos);
  }
  TEST_CASE("sizes that do not match or divide the axis size") {
    xt::xarray<int> x = xt::arange<int>(12).reshape({4, 3});
    auto scatter = [](auto x) { return namedax::psum_scatter(x, "i"_ax); };
    CHECK(error_of([&] { namedax::vmap<"i">(scatter)(x); })
              .find("namedax::psum_scatter: the size of scatter_dimension 0 (3) must equal the size of axis ('i',) (4)") !=
          std::string::npos);
    auto tiled = [](auto x) { return namedax::psum_scatter(x, "i"_ax, {.tiled = true}); };
    CHECK(error_of([&] { namedax::pmap<"i">(tiled)(x); }).find("must be divisible by the size of axis ('i',) (4)") !=
          std::string::npos);
    auto a2a = [](auto x) { return namedax::all_to_all(x, "i"_ax, 0, 0); };
    CHECK(error_of([&] { namedax::pmap<"i">(a2a)(x); }).find("namedax::all_to_all: the size of split_axis 0 (3) must equal") !=
          std::string::npos);
    auto axis = [](auto x) { return namedax::all_gather(x, "i"_ax, {.axis = 5}); };
    CHECK(error_of([&] { namedax::vmap<"i">(axis)(x); }).find("namedax::all_gather: axis 5 is out of range") != std::string::npos);
    auto bad_groups = [](auto x) { return namedax::pargmax(x, "i"_ax, {.axis_index_groups = {{0, 1}, {1, 2, 3}}}); };
    CHECK(error_of([&] { namedax::vmap<"i">(bad_groups)(x); }).find("namedax::pargmax: axis_index_groups over axis ('i',)") !=
          std::string::npos);
    auto unequal = [](auto x) { return namedax::all_gather(x, "i"_ax, {.axis_index_groups = {{0}, {1, 2, 3}}}); };
    CHECK(error_of([&] { namedax::pmap<"i">(unequal)(x); }).find("have unequal sizes 1 and 3") != std::string::npos);
  }
}

TEST_SUITE("differential") {
  template <class T>
  void exchange_run(std::mt19937& rng) {
    std::uniform_int_distribution<std::size_t> size_of(1, 6), extent(1, 3);
    const std::size_t n = size_of(rng);
    // Positional shape (n * a, b): dimension 0 splits among the n indices.
    const std::size_t a = extent(rng), b = extent(rng);
    auto x = namedax_test::random_array<T>(rng, {n, n * a, b});
    std::vector<int> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    // Equal-sized groups: a divisor of n.
    std::size_t per = 1;
    for (std::size_t d = n; d >= 1; --d)
      if (n % d == 0 && std::uniform_int_distribution<int>(0, 1)(rng)) {
        per = d;
        break;
      }
    std::vector<std::vector<int>> groups(n / per);
    for (std::size_t k = 0; k < n; ++k) groups[k / per].push_back(order[k]);
    std::vector<std::pair<int, int>> perm;
    for (std::size_t k = 0; k + 1 < n; k += 2) perm.emplace_back(order[k], order[k + 1]);  // partial
    const int axis = std::uniform_int_distribution<int>(0, 2)(rng);
    CAPTURE(n);
    CAPTURE(a);
    CAPTURE(b);
    CAPTURE(per);
    auto f = [&](auto x) {
      return std::tuple{namedax::all_gather(x, "i"_ax, {.axis = axis}),
                        namedax::all_gather(x, "i"_ax, {.axis_index_groups = groups, .axis = axis % 2, .tiled = true}),
                        namedax::psum_scatter(x, "i"_ax, {.tiled = true}),
                        namedax::psum_scatter(x, "i"_ax, {.scatter_dimension = 0, .axis_index_groups = groups, .tiled = true}),
                        namedax::all_to_all(x, "i"_ax, 0, 1, {.tiled = true}),
                        namedax::all_to_all(x, "i"_ax, 0, 0, {.axis_index_groups = groups, .tiled = true}),
                        namedax::ppermute(x, "i"_ax, perm),
                        namedax::pargmax(x, "i"_ax),
                        namedax::pargmin(x, "i"_ax, {.axis_index_groups = groups})};
    };
    auto v = namedax::vmap<"i">(f)(x);
    auto p = namedax::pmap<"i">(f)(x);
    [&]<std::size_t... K>(std::index_sequence<K...>) {
      ([&] { CHECK_BITWISE(std::get<K>(v), std::get<K>(p)); }(), ...);
    }(std::make_index_sequence<std::tuple_size_v<decltype(v)>>{});
  }

  TEST_CASE_TEMPLATE("vmap and pmap agree bitwise on every exchange", T, float, double, std::int32_t, bool) {
    std::mt19937 rng(7);
    for (int run = 0; run < 10; ++run) exchange_run<T>(rng);
  }

  TEST_CASE("a 2-D mesh: collectives over one name and over both, in every placement") {
    xt::xarray<float> x = namedax_test::random_array<float>(*std::make_unique<std::mt19937>(3), {2, 3, 6, 2});
    auto f = [](auto x) {
      auto both = namedax::axes("i"_ax, "j"_ax);
      return std::tuple{namedax::all_gather(x, both), namedax::psum_scatter(x, both), namedax::all_to_all(x, "j"_ax, 0, 1, {.tiled = true}),
                        namedax::all_to_all(x, both, 0, 0), namedax::pargmax(x, both), namedax::psum_scatter(x, "i"_ax, {.tiled = true})};
    };
    auto reference = namedax::vmap<"i">(namedax::vmap<"j">(f))(x);
    auto check = [&](auto result) {
      [&]<std::size_t... K>(std::index_sequence<K...>) {
        ([&] { CHECK_BITWISE(std::get<K>(result), std::get<K>(reference)); }(), ...);
      }(std::make_index_sequence<6>{});
    };
    check(namedax::pmap<"i">(namedax::vmap<"j">(f))(x));
    check(namedax::vmap<"i">(namedax::pmap<"j">(f))(x));
    check(namedax::pmap<"i">(namedax::pmap<"j">(f))(x));
  }
}

TEST_SUITE("collective matmuls") {
  xt::xarray<double> uniform(std::mt19937& rng, const std::vector<std::size_t>& shape) {
    xt::xarray<double> a = xt::xarray<double>::from_shape(shape);
    std::uniform_real_distribution<double> u(-1, 1);
    for (auto& v : a) v = u(rng);
    return a;
  }

  // The largest difference between a and b, relative to the largest magnitude of b.
  double relative_error(const xt::xarray<double>& a, const xt::xarray<double>& b) {
    REQUIRE(a.shape() == b.shape());
    return xt::amax(xt::abs(a - b))() / std::max(1e-300, xt::amax(xt::abs(b))());
  }

  TEST_CASE("all_gather_matmul and matmul_reduce_scatter against gather-then-multiply and psum_scatter, random sizes") {
    std::mt19937 rng(29);
    for (int run = 0; run < 12; ++run) {
      const std::size_t n = 1 + rng() % 4, b = 1 + rng() % 4, k = 1 + rng() % 5, c = 1 + rng() % 4;
      const auto x = uniform(rng, {n, b, k});
      const auto w = uniform(rng, {k, c});                // the same on every index
      const auto w_parts = uniform(rng, {n, k, c});       // one per index
      const auto x_parts = uniform(rng, {n, n * b, k});  // a part of a sum on every index
      CAPTURE(n);
      CAPTURE(b);
      CAPTURE(k);
      CAPTURE(c);

      auto ring = [&w](auto x) { return namedax::all_gather_matmul(x, w, "i"_ax); };
      auto gathered = [&w](auto x) {
        return namedax::eval(namedax::xeinsum<"ij,jk->ik">(namedax::all_gather(x, "i"_ax, {.tiled = true}), w));
      };
      auto [v, p] = both_modes(ring, x);
      CHECK_BITWISE(v, p);
      CHECK(relative_error(v, namedax::vmap<"i">(gathered)(x)) < 1e-14);

      auto ring_varying = [](auto x, auto w) { return namedax::all_gather_matmul(x, w, "i"_ax); };
      auto [vv, pv] = both_modes(ring_varying, x, w_parts);
      CHECK_BITWISE(vv, pv);
      for (std::size_t i = 0; i < n; ++i) {  // index i multiplies the gathered rows by its own w
        xt::xarray<double> rows = xt::reshape_view(x, {n * b, k});
        xt::xarray<double> w_i = xt::view(w_parts, i);
        xt::xarray<double> expected = xt::zeros<double>({n * b, c});
        for (std::size_t r = 0; r < n * b; ++r)
          for (std::size_t col = 0; col < c; ++col)
            for (std::size_t j = 0; j < k; ++j) expected(r, col) += rows(r, j) * w_i(j, col);
        CHECK(relative_error(xt::xarray<double>(xt::view(vv, i)), expected) < 1e-14);
      }

      auto scatter_ring = [](auto x, auto w) { return namedax::matmul_reduce_scatter(x, w, "i"_ax); };
      auto scattered = [](auto x, auto w) {
        return namedax::psum_scatter(namedax::xeinsum<"ij,jk->ik">(x, w), "i"_ax, {.tiled = true});
      };
      auto [vs, ps] = both_modes(scatter_ring, x_parts, w_parts);
      CHECK_BITWISE(vs, ps);
      CHECK(relative_error(vs, namedax::vmap<"i">(scattered)(x_parts, w_parts)) < 1e-13);

      // Both ways round the ring: the gathering one gives the same bits (every block's product
      // is the same matmul); the scattering one the same sum in another order.
      auto both_ways = [](auto x, auto w) { return namedax::all_gather_matmul(x, w, "i"_ax, {.bidirectional = true}); };
      auto [vb, pb] = both_modes(both_ways, x, w_parts);
      CHECK_BITWISE(vb, pb);
      CHECK_BITWISE(vb, vv);
      auto scatter_both_ways = [](auto x, auto w) {
        return namedax::matmul_reduce_scatter(x, w, "i"_ax, {.bidirectional = true});
      };
      auto [vsb, psb] = both_modes(scatter_both_ways, x_parts, w_parts);
      CHECK_BITWISE(vsb, psb);
      CHECK(relative_error(vsb, vs) < 1e-13);
    }
  }

  TEST_CASE("bidirectional collective matmuls: exact on integers, every block counted once, for 1 to 7 indices") {
    // Integer products are exact, so a block added twice or left out shows in the result.
    for (std::size_t n = 1; n <= 7; ++n) {
      CAPTURE(n);
      const std::size_t b = 2, k = 3, c = 2;
      xt::xarray<std::int64_t> x = xt::arange<std::int64_t>(static_cast<std::int64_t>(n * b * k)).reshape({n, b, k});
      xt::xarray<std::int64_t> parts = xt::arange<std::int64_t>(static_cast<std::int64_t>(n * n * b * k)) % 17 - 8;
      parts.reshape({n, n * b, k});
      xt::xarray<std::int64_t> w = xt::arange<std::int64_t>(static_cast<std::int64_t>(n * k * c)) % 5 - 2;
      w.reshape({n, k, c});
      auto gather = [](auto x, auto w) {
        return namedax::eval(namedax::xeinsum<"ij,jk->ik">(namedax::all_gather(x, "i"_ax, {.tiled = true}), w));
      };
      auto scatter = [](auto x, auto w) {
        return namedax::psum_scatter(namedax::xeinsum<"ij,jk->ik">(x, w), "i"_ax, {.tiled = true});
      };
      auto gather_both = [](auto x, auto w) { return namedax::all_gather_matmul(x, w, "i"_ax, {.bidirectional = true}); };
      auto scatter_both = [](auto x, auto w) {
        return namedax::matmul_reduce_scatter(x, w, "i"_ax, {.bidirectional = true});
      };
      const xt::xarray<std::int64_t> gathered = namedax::vmap<"i">(gather)(x, w);
      const xt::xarray<std::int64_t> scattered = namedax::vmap<"i">(scatter)(parts, w);
      auto [vg, pg] = both_modes(gather_both, x, w);
      CHECK(vg == gathered);
      CHECK(pg == gathered);
      auto [vs, ps] = both_modes(scatter_both, parts, w);
      CHECK(vs == scattered);
      CHECK(ps == scattered);
    }
  }

  TEST_CASE("the rings' in-place update writes into an array held alone, and copies one that is shared") {
    const xt::xarray<double> x = xt::arange<double>(24).reshape({4, 3, 2});
    std::atomic<int> in_place{0}, copied{0};  // calls that wrote in place / copied a shared array
    auto fill = [&](auto v) {
      auto alone = namedax::eval(v * 1.0);
      const double* before = alone.payload().data();
      auto row = namedax::eval(namedax::view(v, xt::range(0, 1)) * 0.0 - 1.0);
      auto filled =
          namedax::detail::update_slice_in_place(std::move(alone), row, std::tuple{namedax::axis_index("i"_ax) % 2, 0});
      in_place += filled.payload().data() == before;
      auto kept = filled;  // shares filled's array: the next update must not change it
      auto again = namedax::detail::update_slice_in_place(std::move(filled), namedax::view(kept, xt::range(0, 1)) * 2.0,
                                                          std::tuple{2, 0});
      copied += again.payload().data() != kept.payload().data();
      return std::make_tuple(kept, again);
    };
    xt::xarray<double> kept = x, again;
    for (std::size_t i = 0; i < 4; ++i) xt::view(kept, i, i % 2) = -1.0;
    again = kept;
    xt::view(again, xt::all(), 2) = xt::view(kept, xt::all(), 0) * 2.0;
    auto [vk, va] = namedax::vmap<"i">(fill)(x);
    CHECK(in_place == 1);
    CHECK(copied == 1);
    CHECK_BITWISE(vk, kept);
    CHECK_BITWISE(va, again);
    auto [pk, pa] = namedax::pmap<"i">(fill)(x);
    CHECK(in_place == 5);  // and once on each of the 4 devices
    CHECK(copied == 5);
    CHECK_BITWISE(pk, kept);
    CHECK_BITWISE(pa, again);
  }

  TEST_CASE("collective matmuls: bad sizes are errors naming the verb, the axis and the sizes, alike in both modes") {
    std::mt19937 rng(5);
    const auto x = uniform(rng, {4, 6, 3});
    const auto w = uniform(rng, {4, 3, 2});
    auto scatter_ring = [](auto x, auto w) { return namedax::matmul_reduce_scatter(x, w, "i"_ax); };
    CHECK(error_of([&] { namedax::pmap<"i">(scatter_ring)(x, w); }) ==
          "namedax::matmul_reduce_scatter: the 6 rows of the left operand do not split into 4 equal blocks along "
          "axis 'i' of size 4");
    CHECK(error_of([&] { namedax::vmap<"i">(scatter_ring)(x, w); }) == error_of([&] { namedax::pmap<"i">(scatter_ring)(x, w); }));
    const auto vector = uniform(rng, {4, 3});
    auto gather_ring = [](auto x, auto w) { return namedax::all_gather_matmul(x, w, "i"_ax); };
    CHECK(error_of([&] { namedax::vmap<"i">(gather_ring)(vector, w); }) ==
          "namedax::all_gather_matmul: the left operand is a matrix; it has positional shape (3,)");
    // A right operand that does not fit the left one is named by the verb, not by the product inside it.
    const auto tall = uniform(rng, {4, 4, 2});
    const auto rows = uniform(rng, {4, 2, 3});
    for (const auto& text : {error_of([&] { namedax::vmap<"i">(gather_ring)(rows, tall); }),
                             error_of([&] { namedax::pmap<"i">(gather_ring)(rows, tall); })})
      CHECK(text == "namedax::all_gather_matmul: the left operand has positional shape (2, 3) and the right operand (4, 2); "
                    "give a right operand of 3 rows, a matrix");
    for (const auto& text : {error_of([&] { namedax::vmap<"i">(scatter_ring)(x, uniform(rng, {4, 3})); }),
                             error_of([&] { namedax::pmap<"i">(scatter_ring)(x, uniform(rng, {4, 3})); })})
      CHECK(text == "namedax::matmul_reduce_scatter: the left operand has positional shape (6, 3) and the right operand "
                    "(3,); give a right operand of 3 rows, a matrix");
  }

  TEST_CASE("collective matmuls called differently by the devices: the error names the function called, not only its step") {
    std::mt19937 rng(6);
    const auto x = uniform(rng, {4, 8, 3});
    const auto w = uniform(rng, {4, 3, 2});
    // Device 2 gathers twice the rows: the all_gather inside all_gather_matmul meets other shapes.
    auto gather_rows = [](auto x, auto w) {
      if (namedax::axis_index("i"_ax) == 2) return namedax::eval(namedax::all_gather_matmul(namedax::concat(std::tuple{x, x}, 0), w, "i"_ax));
      return namedax::eval(namedax::all_gather_matmul(x, w, "i"_ax));
    };
    const std::string gathered = error_of([&] { namedax::pmap<"i">(gather_rows)(x, w); });
    INFO(gathered);
    CHECK(gathered.find("different collective calls") != std::string::npos);
    CHECK(gathered.find("payload shape (16, 3)") != std::string::npos);
    CHECK(gathered.find("in namedax::all_gather_matmul") != std::string::npos);
    // Device 2 multiplies by a wider right operand: the ring's blocks meet other shapes.
    auto wider = [](auto x, auto w) {
      if (namedax::axis_index("i"_ax) == 2)
        return namedax::eval(namedax::matmul_reduce_scatter(x, namedax::concat(std::tuple{w, w}, 1), "i"_ax));
      return namedax::eval(namedax::matmul_reduce_scatter(x, w, "i"_ax));
    };
    const std::string scattered = error_of([&] { namedax::pmap<"i">(wider)(x, w); });
    INFO(scattered);
    CHECK(scattered.find("different asynchronous calls") != std::string::npos);
    CHECK(scattered.find("in namedax::matmul_reduce_scatter") != std::string::npos);
  }
}
