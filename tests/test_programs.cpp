// SPDX-License-Identifier: MIT
// Random differential testing: random programs of 1-4 collectives with random parameters run
// on a random 2-D mesh in every placement (device x device, device x vectorized, ...) and in
// pure vectorized mode must agree bit for bit, each device passing every operand evaluated or
// lazy as it draws. CI runs a fixed seed; to run more by hand:
//   NAMEDAX_PROGRAM_SEED=123 NAMEDAX_PROGRAMS=2000 ./namedax_tests -ts=programs
#include "test_support.hpp"

#include <cstdlib>
#include <functional>
#include <numeric>
#include <thread>

using namespace namedax::literals;

namespace {

enum class op { psum, pmean, pmax, pmin, all_gather, psum_scatter, all_to_all, pswapaxes, ppermute, pshuffle, pargmax,
                pargmin, axis_index, scale };
constexpr const char* op_names[] = {"psum",     "pmean",    "pmax",    "pmin",    "all_gather", "psum_scatter", "all_to_all",
                                    "pswapaxes", "ppermute", "pshuffle", "pargmax", "pargmin",    "axis_index",   "scale"};
constexpr const char* axes_names[] = {"i", "j", "(i, j)", "(j, i)"};

/// One collective call of a program with every parameter drawn.
struct step {
  op kind = op::psum;
  int axes = 0;  // index into axes_names
  std::optional<std::vector<std::vector<int>>> groups;
  int a = 0, b = 0;  // axis / scatter_dimension / split_axis; concat_axis
  bool tiled = false;
  std::vector<std::pair<int, int>> pairs;
  std::vector<int> perm;
};

/// Whether `tiled` makes the step's value go as a pytree: the value and twice the value, as
/// one pair. Twice a float's sum, mean, maximum, minimum or move is exactly twice the
/// result, so the pair gives the single value's bits; among device threads the two leaves go
/// through one exchange.
constexpr bool as_pair(op kind) { return kind <= op::pmin || kind == op::ppermute || kind == op::pshuffle; }

std::string describe(const std::vector<step>& program) {
  std::string text;
  for (const step& s : program) {
    text += namedax::detail::message(op_names[static_cast<int>(s.kind)], " over ", axes_names[s.axes], " a=", s.a, " b=", s.b,
                                     s.tiled ? (as_pair(s.kind) ? " as a pair" : " tiled") : "");
    if (s.groups) text += namedax::detail::message(" groups=", *s.groups);
    if (!s.pairs.empty()) text += namedax::detail::message(" pairs=", s.pairs);
    if (!s.perm.empty()) text += namedax::detail::message(" perm=", s.perm);
    text += "; ";
  }
  return text;
}

/// Draws a program for a mesh of sizes (ni, nj) and a per-member input `shape`, tracking the
/// shape so that every parameter is valid.
std::vector<step> draw_program(std::mt19937& rng, std::size_t ni, std::size_t nj, std::vector<std::size_t> shape) {
  auto uniform = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::vector<step> program(static_cast<std::size_t>(uniform(1, 4)));
  for (step& s : program) {
    for (;;) {
      s = step{};
      s.kind = static_cast<op>(uniform(0, 13));
      s.axes = uniform(0, 3);
      const std::size_t n = s.axes == 0 ? ni : s.axes == 1 ? nj : ni * nj;
      // Groups: a random partition of 0..n-1 into groups of one random size that divides n.
      std::size_t g = n;
      const bool groupable = s.kind <= op::pswapaxes || s.kind == op::pargmax || s.kind == op::pargmin;
      if (groupable && uniform(0, 2) == 0) {
        std::vector<std::size_t> divisors;
        for (std::size_t d = 1; d <= n; ++d)
          if (n % d == 0) divisors.push_back(d);
        g = divisors[static_cast<std::size_t>(uniform(0, static_cast<int>(divisors.size()) - 1))];
        std::vector<int> order(n);
        std::iota(order.begin(), order.end(), 0);
        std::shuffle(order.begin(), order.end(), rng);
        s.groups.emplace();
        for (std::size_t k = 0; k < n; k += g) s.groups->emplace_back(order.begin() + static_cast<std::ptrdiff_t>(k),
                                                                     order.begin() + static_cast<std::ptrdiff_t>(k + g));
      }
      const int rank = static_cast<int>(shape.size());
      std::size_t elements = std::accumulate(shape.begin(), shape.end(), std::size_t{1}, std::multiplies<>{});
      s.tiled = uniform(0, 1) == 1;
      auto dims_of_size = [&](auto pred) {
        std::vector<int> dims;
        for (int d = 0; d < rank; ++d)
          if (pred(shape[static_cast<std::size_t>(d)])) dims.push_back(d);
        return dims;
      };
      auto pick = [&](const std::vector<int>& dims) { return dims[static_cast<std::size_t>(uniform(0, static_cast<int>(dims.size()) - 1))]; };
      switch (s.kind) {
        case op::all_gather:
          if (elements * g > 4096 || (!s.tiled && rank == 3)) continue;
          s.a = uniform(0, s.tiled ? rank - 1 : rank);
          if (s.tiled) shape[static_cast<std::size_t>(s.a)] *= g;
          else shape.insert(shape.begin() + s.a, g);
          break;
        case op::psum_scatter: {
          auto dims = dims_of_size([&](std::size_t e) { return s.tiled ? e % g == 0 : e == g; });
          if (dims.empty() || (!s.tiled && rank == 1)) continue;
          s.a = pick(dims);
          if (s.tiled) shape[static_cast<std::size_t>(s.a)] /= g;
          else shape.erase(shape.begin() + s.a);
          break;
        }
        case op::all_to_all: {
          auto dims = dims_of_size([&](std::size_t e) { return s.tiled ? e % g == 0 : e == g; });
          if (dims.empty()) continue;
          s.a = pick(dims);
          s.b = uniform(0, rank - 1);
          if (s.tiled) {
            shape[static_cast<std::size_t>(s.a)] /= g, shape[static_cast<std::size_t>(s.b)] *= g;
          } else {
            shape.erase(shape.begin() + s.a);
            shape.insert(shape.begin() + s.b, g);
          }
          break;
        }
        case op::pswapaxes: {
          auto dims = dims_of_size([&](std::size_t e) { return e == g; });
          if (dims.empty()) continue;
          s.a = pick(dims);
          break;
        }
        case op::ppermute: {  // a random partial permutation
          std::vector<int> to(n);
          std::iota(to.begin(), to.end(), 0);
          std::shuffle(to.begin(), to.end(), rng);
          for (std::size_t from = 0; from < n; ++from)
            if (uniform(0, 3) > 0) s.pairs.emplace_back(static_cast<int>(from), to[from]);
          break;
        }
        case op::pshuffle:
          s.perm.resize(n);
          std::iota(s.perm.begin(), s.perm.end(), 0);
          std::shuffle(s.perm.begin(), s.perm.end(), rng);
          break;
        default:
          break;
      }
      break;
    }
  }
  return program;
}

/// Calls f with the axes of a step: one name, or both in either order.
template <class F>
auto with_axes(int which, F f) {
  switch (which) {
    case 0: return f(namedax::axes("i"_ax));
    case 1: return f(namedax::axes("j"_ax));
    case 2: return f(namedax::axes("i"_ax, "j"_ax));
    default: return f(namedax::axes("j"_ax, "i"_ax));
  }
}

/// Every step's result becomes float32 varying along both names, so that a program is a loop
/// over steps of one type (adding a zero that varies changes no bit).
template <class V>
auto normalize(const V& v) {
  auto zero = namedax::cast<float>(namedax::axis_index(namedax::axes("i"_ax, "j"_ax)) * 0);
  return namedax::eval(namedax::cast<float>(v) + zero);
}

/// One step on `v`, which is V or a lazy expression of the same values; the result is a V.
template <class V, class U>
V run_step(const step& s, const U& v) {
  return with_axes(s.axes, [&](auto ax) -> V {
    const auto groups = s.groups.value_or(std::vector<std::vector<int>>{});
    auto grouped = [&](auto options) {
      if (s.groups) options.axis_index_groups = *s.groups;
      return options;
    };
    if (s.tiled && as_pair(s.kind)) {
      const auto pair = std::pair{v, namedax::eval(v * 2.0f)};
      auto halved = [](const auto& result) { return normalize((result.first + result.second * 0.5f) * 0.5f); };
      switch (s.kind) {
        case op::psum: return halved(namedax::psum(pair, ax, grouped(namedax::reduce_options{})));
        case op::pmean: return halved(namedax::pmean(pair, ax, grouped(namedax::reduce_options{})));
        case op::pmax: return halved(namedax::pmax(pair, ax, grouped(namedax::reduce_options{})));
        case op::pmin: return halved(namedax::pmin(pair, ax, grouped(namedax::reduce_options{})));
        case op::ppermute: return halved(namedax::ppermute(pair, ax, s.pairs));
        default: return halved(namedax::pshuffle(pair, ax, s.perm));
      }
    }
    switch (s.kind) {
      case op::psum: return normalize(namedax::psum(v, ax, grouped(namedax::reduce_options{})));
      case op::pmean: return normalize(namedax::pmean(v, ax, grouped(namedax::reduce_options{})));
      case op::pmax: return normalize(namedax::pmax(v, ax, grouped(namedax::reduce_options{})));
      case op::pmin: return normalize(namedax::pmin(v, ax, grouped(namedax::reduce_options{})));
      case op::all_gather:
        return normalize(namedax::all_gather(v, ax, grouped(namedax::all_gather_options{.axis = s.a, .tiled = s.tiled})));
      case op::psum_scatter:
        return normalize(
            namedax::psum_scatter(v, ax, grouped(namedax::psum_scatter_options{.scatter_dimension = s.a, .tiled = s.tiled})));
      case op::all_to_all:
        return normalize(namedax::all_to_all(v, ax, s.a, s.b, grouped(namedax::all_to_all_options{.tiled = s.tiled})));
      case op::pswapaxes: return normalize(namedax::pswapaxes(v, ax, s.a, grouped(namedax::pswapaxes_options{})));
      case op::ppermute: return normalize(namedax::ppermute(v, ax, s.pairs));
      case op::pshuffle: return normalize(namedax::pshuffle(v, ax, s.perm));
      case op::pargmax: return normalize(namedax::pargmax(v, ax, grouped(namedax::reduce_options{})));
      case op::pargmin: return normalize(namedax::pargmin(v, ax, grouped(namedax::reduce_options{})));
      case op::axis_index: return normalize(v * 0.5f + namedax::cast<float>(namedax::axis_index(ax)));
      case op::scale: return normalize(v * 3.0f - 1.0f);
    }
    return normalize(v);
  });
}

/// Calls g with `v` as it is (evaluated) or as a lazy expression of the same values, drawn
/// anew on every call by each device thread: how a device holds its operand must never change
/// what the devices exchange, nor a single bit of the results.
template <class V, class G>
V with_random_form(const V& v, G g) {
  thread_local std::minstd_rand draws(static_cast<unsigned>(std::hash<std::thread::id>{}(std::this_thread::get_id())));
  if (draws() % 2 == 0) return g(v);
  return g(v * 1.0f);
}

unsigned env_or(const char* name, unsigned fallback) {
  const char* text = std::getenv(name);
  return text ? static_cast<unsigned>(std::strtoul(text, nullptr, 10)) : fallback;
}

}  // namespace

TEST_SUITE("programs") {
  TEST_CASE("random programs of collectives agree in every placement of a 2-D mesh") {
    const unsigned seed = env_or("NAMEDAX_PROGRAM_SEED", 2026), count = env_or("NAMEDAX_PROGRAMS", 60);
    std::mt19937 rng(seed);
    std::size_t ran = 0;
    for (unsigned k = 0; k < count; ++k) {
      auto uniform = [&](int lo, int hi) { return static_cast<std::size_t>(std::uniform_int_distribution<int>(lo, hi)(rng)); };
      const std::size_t ni = uniform(1, 4), nj = uniform(1, 3);
      std::vector<std::size_t> member_shape(uniform(1, 2));
      for (auto& e : member_shape) e = uniform(1, 3) * (uniform(0, 1) ? ni : nj);
      const auto program = draw_program(rng, ni, nj, member_shape);
      std::vector<std::size_t> shape{ni, nj};
      shape.insert(shape.end(), member_shape.begin(), member_shape.end());
      const xt::xarray<float> x = namedax_test::random_array<float>(rng, shape);
      const std::string context = namedax::detail::message("seed ", seed, ", program ", k, ": mesh ", ni, "x", nj, ", input ",
                                                           shape, ": ", describe(program));
      INFO(context);

      auto f = [&program](auto x) {
        auto v = normalize(x);
        for (const step& s : program)
          v = with_random_form(v, [&](const auto& operand) { return run_step<decltype(v)>(s, operand); });
        return v;
      };
      const xt::xarray<float> reference = namedax::vmap<"i">(namedax::vmap<"j">(f))(x);
      CHECK_BITWISE(namedax::pmap<"i">(namedax::pmap<"j">(f))(x), reference);
      CHECK_BITWISE(namedax::pmap<"i">(namedax::vmap<"j">(f))(x), reference);
      CHECK_BITWISE(namedax::vmap<"i">(namedax::pmap<"j">(f))(x), reference);
      ++ran;
    }
    CHECK(ran == count);
  }

  TEST_CASE("three levels of nesting: pmap of vmap of pmap") {
    std::mt19937 rng(11);
    const xt::xarray<double> x = namedax_test::random_array<double>(rng, {2, 3, 2, 6});
    auto f = [](auto x) {
      auto all = namedax::axes("i"_ax, "j"_ax, "k"_ax);
      auto s = namedax::psum(x, namedax::axes("i"_ax, "k"_ax));
      auto g = namedax::all_gather(x, all, {.tiled = true});
      auto t = namedax::all_to_all(x, namedax::axes("k"_ax, "j"_ax), 0, 0, {.tiled = true});
      return std::tuple{namedax::eval(s + namedax::axis_index(all)), namedax::eval(g), namedax::eval(t)};
    };
    auto reference = namedax::vmap<"i">(namedax::vmap<"j">(namedax::vmap<"k">(f)))(x);
    auto check = [&](auto result) {
      CHECK_BITWISE(std::get<0>(result), std::get<0>(reference));
      CHECK_BITWISE(std::get<1>(result), std::get<1>(reference));
      CHECK_BITWISE(std::get<2>(result), std::get<2>(reference));
    };
    check(namedax::pmap<"i">(namedax::vmap<"j">(namedax::pmap<"k">(f)))(x));
    check(namedax::pmap<"i">(namedax::pmap<"j">(namedax::pmap<"k">(f)))(x));
    check(namedax::vmap<"i">(namedax::pmap<"j">(namedax::vmap<"k">(f)))(x));
  }
}
