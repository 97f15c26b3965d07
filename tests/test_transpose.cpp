// SPDX-License-Identifier: MIT
// Transposes of the linear collectives, pvary, and composites: the dot-product test
// <A x, y> == <x, A^T y> on random integer-valued data (exact in double), in both modes and
// with every option; the path all_gather's transpose takes, read from the types; vjp.
#include "test_support.hpp"

#include <xtensor/xadapt.hpp>

using namespace namedax::literals;
using namedax_test::error_of;
namespace linear = namedax::linear;

namespace {

/// Random integers in [-9, 9], as double: every sum below is exact.
xt::xarray<double> random_integers(std::mt19937& rng, const std::vector<std::size_t>& shape) {
  xt::xarray<double> a = xt::xarray<double>::from_shape(shape);
  std::uniform_int_distribution<int> d(-9, 9);
  for (auto& v : a) v = d(rng);
  return a;
}

/// The pairing of named values: the sum of every element, over every index of the names the
/// value varies along; a value that does not vary along a name counts once.
template <class W>
auto total(const W& w) {
  auto d = namedax::eval(namedax::cast<double>(w));
  std::size_t n = 1;
  for (auto s : d.shape()) n *= s;
  auto s = namedax::psum(linear::reshape({n})(d), namedax::axes(0));
  using S = decltype(s);
  if constexpr (S::varying != 0) return namedax::psum(s, namedax::detail::axes_of_mask<typename S::env_type, S::varying>());
  else return s;
}

/// <A x, ct> and <x, A^T ct> inside the map, with A^T ct itself.
template <class Op>
auto pairing(const Op& op) {
  return [op](auto x, auto ct) {
    auto ax = op(x);
    auto aty = namedax::transpose(op, ct);
    return std::tuple{total(ax * ct), total(x * aty), namedax::eval(aty)};
  };
}

/// The dot-product test for `op` on x of shape `x_shape` (axis "i" first), with a cotangent
/// that varies along "i" or does not; both modes, which must also agree bit for bit.
template <bool CotangentVaries, class Op>
void check_adjoint(const Op& op, std::mt19937& rng, const std::vector<std::size_t>& x_shape) {
  const xt::xarray<double> x = random_integers(rng, x_shape);
  const xt::xarray<double> y = namedax::vmap<"i">(op)(x);
  std::vector<std::size_t> ct_shape(y.shape().begin(), y.shape().end());
  if (!CotangentVaries) ct_shape.erase(ct_shape.begin());
  const xt::xarray<double> ct = random_integers(rng, ct_shape);
  auto in_axes = [] {
    if constexpr (CotangentVaries) return std::tuple{0, 0};
    else return std::tuple{0, namedax::none};
  }();
  auto [lv, rv, tv] = namedax::vmap<"i">(pairing(op), in_axes)(x, ct);
  auto [lp, rp, tp] = namedax::pmap<"i">(pairing(op), in_axes)(x, ct);
  CHECK(lv(0) == rv(0));
  CHECK(lv(0) != 0.0);  // the test would pass vacuously on zeros
  CHECK_BITWISE(lv, lp);
  CHECK_BITWISE(rv, rp);
  CHECK_BITWISE(tv, tp);
}

template <class Op>
void check_adjoint_both(const Op& op, std::mt19937& rng, const std::vector<std::size_t>& x_shape) {
  check_adjoint<true>(op, rng, x_shape);
  check_adjoint<false>(op, rng, x_shape);
}

/// The same test through vjp, with a primal that varies along "i" or not.
template <bool PrimalVaries, bool CotangentVaries, class Op>
void check_vjp(const Op& op, std::mt19937& rng, std::vector<std::size_t> x_shape) {
  const std::size_t n = x_shape.front();
  if (!PrimalVaries) x_shape.erase(x_shape.begin());
  const xt::xarray<double> x = random_integers(rng, x_shape);
  xt::xarray<double> dummy = xt::zeros<double>({n});
  auto forward = [op](auto x, auto) { return op(x); };
  auto x_axis = [] {
    if constexpr (PrimalVaries) return 0;
    else return namedax::none;
  }();
  const xt::xarray<double> y = namedax::vmap<"i">(forward, std::tuple{x_axis, 0})(x, dummy);
  std::vector<std::size_t> ct_shape(y.shape().begin(), y.shape().end());
  if (!CotangentVaries) ct_shape.erase(ct_shape.begin());
  const xt::xarray<double> ct = random_integers(rng, ct_shape);
  auto ct_axis = [] {
    if constexpr (CotangentVaries) return 0;
    else return namedax::none;
  }();
  auto body = [op](auto x, auto ct, auto) {
    auto [ax, pullback] = namedax::vjp(op, x);
    auto xbar = pullback(ct);
    static_assert(decltype(xbar)::varying == decltype(x)::varying, "the pullback gives the primal's type");
    return std::tuple{total(ax * ct), total(x * xbar), namedax::eval(xbar)};
  };
  auto [lv, rv, tv] = namedax::vmap<"i">(body, std::tuple{x_axis, ct_axis, 0})(x, ct, dummy);
  auto [lp, rp, tp] = namedax::pmap<"i">(body, std::tuple{x_axis, ct_axis, 0})(x, ct, dummy);
  CHECK(lv(0) == rv(0));
  CHECK(lv(0) != 0.0);
  CHECK_BITWISE(lv, lp);
  CHECK_BITWISE(rv, rp);
  CHECK_BITWISE(tv, tp);
}

template <class Op>
void check_vjp_all(const Op& op, std::mt19937& rng, const std::vector<std::size_t>& x_shape) {
  check_vjp<true, true>(op, rng, x_shape);
  check_vjp<true, false>(op, rng, x_shape);
  check_vjp<false, true>(op, rng, x_shape);
  check_vjp<false, false>(op, rng, x_shape);
}

/// A column (n, 1): xtensor finds nested one-element lists ambiguous.
xt::xarray<double> column(std::vector<double> v) {
  xt::xarray<double> a = xt::adapt(v, {v.size(), std::size_t{1}});
  return a;
}

const std::vector<std::vector<int>> pairs_groups{{0, 1}, {2, 3}};
const std::vector<std::vector<int>> crossed_groups{{0, 2}, {3, 1}};
const std::vector<std::vector<int>> uneven_groups{{0}, {3, 1, 2}};

}  // namespace

TEST_SUITE("transpose") {
  TEST_CASE("transpose of psum and pmean: without groups, with groups, uneven groups") {
    std::mt19937 rng(1);
    for (int round = 0; round < 3; ++round) {
      check_adjoint_both(linear::psum("i"_ax), rng, {4, 3});
      check_adjoint_both(linear::psum("i"_ax, {}), rng, {4, 2, 3});
      check_adjoint_both(linear::psum("i"_ax, {.axis_index_groups = pairs_groups}), rng, {4, 3});
      check_adjoint_both(linear::psum("i"_ax, {.axis_index_groups = uneven_groups}), rng, {4, 3});
      check_adjoint_both(linear::pmean("i"_ax), rng, {4, 5});
      check_adjoint_both(linear::pmean("i"_ax, {.axis_index_groups = crossed_groups}), rng, {4, 5});
      check_vjp_all(linear::psum("i"_ax), rng, {4, 3});
      check_vjp_all(linear::psum("i"_ax, {.axis_index_groups = crossed_groups}), rng, {4, 3});
      check_vjp_all(linear::pmean("i"_ax), rng, {4, 3});
    }
  }

  TEST_CASE("psum of a varying value transposes to pvary, of an invariant one to psum") {
    xt::xarray<double> x{1, 2, 3, 4};
    xt::xarray<double> c{10};
    auto varying = [](auto x, auto c) {
      auto [y, pullback] = namedax::vjp(linear::psum("i"_ax), namedax::expand_dims(x, 0));  // y of shape (1,), as c
      auto xbar = pullback(c);
      static_assert(decltype(xbar)::varying == 1 && decltype(y)::varying == 0);
      return xbar;
    };
    auto in_axes = std::tuple{0, namedax::none};
    CHECK_BITWISE(namedax::vmap<"i">(varying, in_axes)(x, c), column({10, 10, 10, 10}));
    CHECK_BITWISE(namedax::pmap<"i">(varying, in_axes)(x, c), column({10, 10, 10, 10}));
    // A cotangent of another shape than y is an error naming both, as for any vjp.
    auto scalar_y = [](auto x, auto c) { return namedax::vjp(linear::psum("i"_ax), x).second(c); };
    const std::string wrong = "namedax::vjp: the cotangent has positional shape (1,) but the output it stands for has "
                              "positional shape () (rank 1, not 0); give the pullback a cotangent of the output's "
                              "shape, as jax.vjp";
    CHECK(namedax_test::error_of([&] { (void)namedax::vmap<"i">(scalar_y, in_axes)(x, c); }) == wrong);
    CHECK(namedax_test::error_of([&] { (void)namedax::pmap<"i">(scalar_y, in_axes)(x, c); }) == wrong);
    auto invariant = [](auto, auto c) {
      auto [y, pullback] = namedax::vjp(linear::psum("i"_ax), c);  // y = 4 c
      auto cbar = pullback(c);
      static_assert(decltype(cbar)::varying == 0);
      return cbar;
    };
    CHECK_BITWISE(namedax::vmap<"i">(invariant, in_axes)(x, c), column({40, 40, 40, 40}));
    CHECK_BITWISE(namedax::pmap<"i">(invariant, in_axes)(x, c), column({40, 40, 40, 40}));
  }

  TEST_CASE("transpose of pvary is a psum where the cotangent varies") {
    std::mt19937 rng(2);
    auto body = [](auto x, auto ct) {
      auto invariant = namedax::psum(x, "i"_ax);
      auto op = linear::pvary("i"_ax);
      auto y = op(invariant);
      static_assert(decltype(y)::varying == 1 && decltype(invariant)::varying == 0);
      auto back = namedax::transpose(op, ct);
      static_assert(decltype(back)::varying == 0);
      return std::tuple{total(y * ct), total(invariant * back)};
    };
    xt::xarray<double> x = random_integers(rng, {4, 3}), ct = random_integers(rng, {4, 3});
    auto [lv, rv] = namedax::vmap<"i">(body)(x, ct);
    auto [lp, rp] = namedax::pmap<"i">(body)(x, ct);
    CHECK(lv(0) == rv(0));
    CHECK_BITWISE(lv, lp);
    CHECK_BITWISE(rv, rp);
    CHECK(namedax::pmap<"i">([](auto x) { return namedax::psum(namedax::pvary(namedax::psum(x, "i"_ax), "i"_ax), "i"_ax); })(
              xt::xarray<int>{1, 2, 3, 4}) == xt::xarray<int>{40, 40, 40, 40});
    // pcast to varying is the same map.
    auto cast = [](auto x, auto ct) {
      auto invariant = namedax::psum(x, "i"_ax);
      auto op = linear::pcast("i"_ax, namedax::pcast_to::varying);
      auto y = op(invariant);
      static_assert(decltype(y)::varying == 1);
      return std::tuple{total(y * ct), total(invariant * namedax::transpose(op, ct))};
    };
    auto [lc, rc] = namedax::pmap<"i">(cast)(x, ct);
    CHECK(lc(0) == rc(0));
    CHECK(lc(0) != 0.0);
  }

  TEST_CASE("vjp of pvary of a value that already varies is the identity") {
    // pvary of a varying value changes nothing, so its pullback must not sum the cotangent.
    std::mt19937 rng(3);
    auto body = [](auto x, auto ct) {
      static_assert(decltype(x)::varying == 1);
      auto [y, pullback] = namedax::vjp(linear::pvary("i"_ax), x);
      auto back = pullback(ct);
      static_assert(decltype(back)::varying == 1);
      return back;
    };
    xt::xarray<double> x = random_integers(rng, {4, 3}), ct = random_integers(rng, {4, 3});
    CHECK_BITWISE(namedax::vmap<"i">(body)(x, ct), ct);
    CHECK_BITWISE(namedax::pmap<"i">(body)(x, ct), ct);
  }

  TEST_CASE("transpose of pbroadcast: the cotangent at index source, zeros elsewhere, with no exchange") {
    std::mt19937 rng(11);
    for (int source : {0, 2, 3}) {
      CAPTURE(source);
      check_adjoint_both(linear::pbroadcast("i"_ax, source), rng, {4, 3});
      check_adjoint_both(linear::pbroadcast("i"_ax, source), rng, {4, 2, 3});
      check_vjp_all(linear::pbroadcast("i"_ax, source), rng, {4, 3});
    }
    // By hand: ct = 10 (invariant) goes to index 2 only, typed as varying.
    auto f = [](auto x, auto c) {
      auto op = linear::pbroadcast("i"_ax, 2);
      static_assert(decltype(op(x))::varying == 0);
      auto back = namedax::transpose(op, c);
      static_assert(decltype(back)::varying == 1);
      return back;
    };
    xt::xarray<double> x{1, 2, 3, 4}, c{10};
    auto in_axes = std::tuple{0, namedax::none};
    CHECK_BITWISE(namedax::vmap<"i">(f, in_axes)(x, c), column({0, 0, 10, 0}));
    CHECK_BITWISE(namedax::pmap<"i">(f, in_axes)(x, c), column({0, 0, 10, 0}));
    // A varying cotangent stands for its sum over "i" (the pairing with an invariant result).
    xt::xarray<double> cv = column({1, 2, 3, 4});
    CHECK_BITWISE(namedax::vmap<"i">(f)(x, cv), column({0, 0, 10, 0}));
    CHECK_BITWISE(namedax::pmap<"i">(f)(x, cv), column({0, 0, 10, 0}));
    // A source out of range.
    auto bad = [](auto x) { return namedax::transpose(linear::pbroadcast("i"_ax, 4), namedax::psum(x, "i"_ax)); };
    CHECK(error_of([&] { namedax::vmap<"i">(bad)(x); }) ==
          "namedax::transpose of pbroadcast: source 4 is out of range for axis ('i',) of size 4; use indices 0..3");
  }

  TEST_CASE("transpose of pbroadcast over two names: the source is row-major, in vmap of vmap and pmap of vmap") {
    xt::xarray<double> x = xt::arange<double>(8).reshape({4, 2});
    xt::xarray<double> c{5};
    auto f = [](auto x, auto c) {
      auto op = linear::pbroadcast(namedax::axes("i"_ax, "j"_ax), 5);  // i = 2, j = 1
      auto y = op(x);
      auto back = namedax::transpose(op, c);
      return std::tuple{namedax::eval(y + x * 0.), back};
    };
    auto in_axes = std::tuple{0, namedax::none};
    xt::xarray<double> ey = xt::ones<double>({4, 2}) * 5.;
    xt::xarray<double> eb{{0, 0}, {0, 0}, {0, 5}, {0, 0}};
    eb.reshape({4, 2, 1});
    for (const auto& [y, b] : {namedax::vmap<"i">(namedax::vmap<"j">(f, in_axes), in_axes)(x, c),
                               namedax::pmap<"i">(namedax::vmap<"j">(f, in_axes), in_axes)(x, c)}) {
      CHECK_BITWISE(y, ey);
      CHECK_BITWISE(b, eb);
    }
  }

  TEST_CASE("linear::all_gather_invariant transposes as all_gather without groups") {
    std::mt19937 rng(12);
    check_adjoint_both(linear::all_gather_invariant("i"_ax), rng, {4, 3});
    check_adjoint_both(linear::all_gather_invariant("i"_ax, {.axis = 1, .tiled = true}), rng, {4, 2, 3});
  }

  TEST_CASE("transpose of all_gather: axis, tiled, groups, with either cotangent") {
    std::mt19937 rng(3);
    check_adjoint_both(linear::all_gather("i"_ax), rng, {4, 3});
    check_adjoint_both(linear::all_gather("i"_ax, {.axis = 1}), rng, {4, 2, 3});
    check_adjoint_both(linear::all_gather("i"_ax, {.axis = -1}), rng, {4, 2, 3});
    check_adjoint_both(linear::all_gather("i"_ax, {.axis = 0, .tiled = true}), rng, {4, 2, 3});
    check_adjoint_both(linear::all_gather("i"_ax, {.axis = 1, .tiled = true}), rng, {4, 2, 3});
    check_adjoint_both(linear::all_gather("i"_ax, {.axis_index_groups = crossed_groups}), rng, {4, 3});
    check_adjoint_both(linear::all_gather("i"_ax, {.axis_index_groups = pairs_groups, .axis = 1}), rng, {4, 3, 2});
    check_adjoint_both(linear::all_gather("i"_ax, {.axis_index_groups = crossed_groups, .axis = 1, .tiled = true}), rng,
                       {4, 3, 2});
    check_adjoint_both(linear::all_gather("i"_ax, namedax::all_gather_options{}), rng, {4, 3});
    check_vjp_all(linear::all_gather("i"_ax, {.axis = 1, .tiled = true}), rng, {4, 2, 3});
    check_vjp_all(linear::all_gather("i"_ax, {.axis_index_groups = crossed_groups}), rng, {4, 3});
  }

  TEST_CASE("all_gather's transpose: the own chunk for an invariant cotangent, psum_scatter otherwise") {
    auto body = [](auto x, auto c, auto c2) {
      auto op = linear::all_gather("i"_ax);
      auto grouped = linear::all_gather("i"_ax, {.axis_index_groups = crossed_groups});
      using invariant = decltype(c);
      using varying = decltype(x);
      static_assert(decltype(op)::path<invariant>() == linear::all_gather_transpose::own_chunk);
      static_assert(decltype(op)::path<varying>() == linear::all_gather_transpose::psum_scatter);
      static_assert(decltype(grouped)::path<invariant>() == linear::all_gather_transpose::own_chunk);
      static_assert(decltype(grouped)::path<varying>() == linear::all_gather_transpose::psum_scatter);
      static_assert(decltype(op(x))::varying == 0 && decltype(grouped(x))::varying == 1);
      return std::tuple{namedax::transpose(op, c), namedax::transpose(grouped, c2)};
    };
    xt::xarray<double> x = xt::zeros<double>({4, 1});
    xt::xarray<double> c = column({1, 2, 3, 4}), c2 = column({1, 2});
    auto in_axes = std::tuple{0, namedax::none, namedax::none};
    for (auto [own, scaled] : {namedax::vmap<"i">(body, in_axes)(x, c, c2), namedax::pmap<"i">(body, in_axes)(x, c, c2)}) {
      CHECK_BITWISE(own, column({1, 2, 3, 4}));
      // Groups {0, 2}, {3, 1}: positions 0, 1, 1, 0, times the group size.
      CHECK_BITWISE(scaled, column({2, 4, 4, 2}));
    }
  }

  TEST_CASE("all_gather over two names: a cotangent varying along one of them sums, then slices") {
    std::mt19937 rng(4);
    xt::xarray<double> x = random_integers(rng, {2, 3, 5});
    xt::xarray<double> ct_i = random_integers(rng, {2, 6, 5});  // varies along i only
    auto body = [](auto x, auto ct) {
      auto op = linear::all_gather(namedax::axes("i"_ax, "j"_ax));
      static_assert(decltype(op)::path<decltype(ct)>() == linear::all_gather_transpose::sum_then_chunk);
      auto back = namedax::transpose(op, ct);
      return std::tuple{total(op(x) * ct), total(x * back)};
    };
    auto inner_v = [&](auto x, auto ct) { return namedax::vmap<"j">(body, std::tuple{0, namedax::none})(x, ct); };
    auto inner_p = [&](auto x, auto ct) { return namedax::pmap<"j">(body, std::tuple{0, namedax::none})(x, ct); };
    auto [lv, rv] = namedax::vmap<"i">(inner_v)(x, ct_i);
    auto [lp, rp] = namedax::pmap<"i">(inner_p)(x, ct_i);
    auto [lm, rm] = namedax::vmap<"i">(inner_p)(x, ct_i);
    CHECK(lv(0, 0) == rv(0, 0));
    CHECK_BITWISE(lv, lp);
    CHECK_BITWISE(rv, rp);
    CHECK_BITWISE(rv, rm);
  }

  TEST_CASE("transpose of psum_scatter: scatter_dimension, tiled, groups") {
    std::mt19937 rng(5);
    check_adjoint_both(linear::psum_scatter("i"_ax), rng, {4, 4, 3});
    check_adjoint_both(linear::psum_scatter("i"_ax, {.scatter_dimension = 1}), rng, {4, 3, 4});
    check_adjoint_both(linear::psum_scatter("i"_ax, {.scatter_dimension = 1, .tiled = true}), rng, {4, 3, 8});
    check_adjoint_both(linear::psum_scatter("i"_ax, {.axis_index_groups = crossed_groups}), rng, {4, 2, 3});
    check_adjoint_both(
        linear::psum_scatter("i"_ax, {.scatter_dimension = 0, .axis_index_groups = pairs_groups, .tiled = true}), rng,
        {4, 6});
    check_vjp_all(linear::psum_scatter("i"_ax, {.tiled = true}), rng, {4, 8});
  }

  TEST_CASE("transpose of all_to_all and pswapaxes: split and concat swapped, tiled, groups") {
    std::mt19937 rng(6);
    check_adjoint_both(linear::all_to_all("i"_ax, 0, 0), rng, {4, 4, 3});
    check_adjoint_both(linear::all_to_all("i"_ax, 0, 1), rng, {4, 4, 3});
    check_adjoint_both(linear::all_to_all("i"_ax, 1, 0), rng, {4, 3, 4});
    check_adjoint_both(linear::all_to_all("i"_ax, 1, 0, {.tiled = true}), rng, {4, 3, 8});
    check_adjoint_both(linear::all_to_all("i"_ax, 0, 1, {.axis_index_groups = crossed_groups}), rng, {4, 2, 3});
    check_adjoint_both(linear::all_to_all("i"_ax, 1, 1, {.axis_index_groups = pairs_groups, .tiled = true}), rng,
                       {4, 3, 4});
    check_adjoint_both(linear::pswapaxes("i"_ax, 1), rng, {4, 3, 4});
    check_adjoint_both(linear::pswapaxes("i"_ax, 0, {.axis_index_groups = crossed_groups}), rng, {4, 2, 3});
    check_vjp_all(linear::all_to_all("i"_ax, 1, 0), rng, {4, 3, 4});
  }

  TEST_CASE("transpose of ppermute and pshuffle: the inverse permutation") {
    std::mt19937 rng(7);
    check_adjoint_both(linear::ppermute("i"_ax, {{0, 1}, {1, 2}, {2, 3}, {3, 0}}), rng, {4, 3});
    check_adjoint_both(linear::ppermute("i"_ax, {{0, 2}, {3, 1}}), rng, {4, 3});  // partial: zeros elsewhere
    check_adjoint_both(linear::pshuffle("i"_ax, {2, 0, 3, 1}), rng, {4, 3});
    check_vjp_all(linear::ppermute("i"_ax, {{1, 0}, {2, 3}}), rng, {4, 2});
  }

  TEST_CASE("transpose of all_gather_matmul and matmul_reduce_scatter: each other, by w transposed") {
    std::mt19937 rng(21);
    const xt::xarray<double> w = random_integers(rng, {3, 2});  // plain, the same on every index
    check_adjoint_both(linear::all_gather_matmul(w, "i"_ax), rng, {4, 2, 3});
    check_adjoint_both(linear::matmul_reduce_scatter(w, "i"_ax), rng, {4, 8, 3});
    check_adjoint_both(linear::all_gather_matmul(w, "i"_ax), rng, {1, 5, 3});  // one index: a plain product
    check_adjoint_both(linear::all_gather_matmul(w, "i"_ax, {.bidirectional = true}), rng, {5, 2, 3});
    check_adjoint_both(linear::matmul_reduce_scatter(w, "i"_ax, {.bidirectional = true}), rng, {4, 8, 3});
  }

  TEST_CASE("transpose of pdot, in either operand, with contractions and batch dims") {
    std::mt19937 rng(8);
    const xt::xarray<double> w = random_integers(rng, {3, 5});  // plain, the same on every index
    check_adjoint_both(linear::pdot_lhs(w, "i"_ax, {{1}, {0}}), rng, {4, 2, 3});
    check_adjoint_both(linear::pdot_rhs(w, "i"_ax, {{1}, {0}}), rng, {4, 5, 2});
    const xt::xarray<double> b = random_integers(rng, {2, 3, 4});  // (batch, contracted, free)
    check_adjoint_both(linear::pdot_lhs(b, "i"_ax, {{2}, {1}}, {{0}, {0}}), rng, {4, 2, 5, 3});
    check_adjoint_both(linear::pdot_rhs(b, "i"_ax, {{1}, {2}}, {{0}, {0}}), rng, {4, 2, 5, 3});
    check_adjoint_both(linear::pdot_lhs(b, "i"_ax, {{0, 2}, {2, 1}}), rng, {4, 4, 6, 3});
    check_vjp_all(linear::pdot_lhs(w, "i"_ax, {{0}, {0}}), rng, {4, 3, 2});

    // A named other operand that varies along "i": the sharded weight of a tensor-parallel layer.
    const xt::xarray<double> x = random_integers(rng, {4, 2, 3}), ws = random_integers(rng, {4, 3, 5});
    const xt::xarray<double> ct = random_integers(rng, {2, 5});
    auto body = [](auto x, auto w, auto ct) {
      auto dx = namedax::transpose(linear::pdot_lhs(w, "i"_ax, {{1}, {0}}), ct);
      auto dw = namedax::transpose(linear::pdot_rhs(x, "i"_ax, {{1}, {0}}), ct);
      auto y = namedax::pdot(x, w, "i"_ax, {{1}, {0}});
      return std::tuple{total(y * ct), total(x * dx), total(w * dw)};
    };
    auto in_axes = std::tuple{0, 0, namedax::none};
    auto [yv, xv, wv] = namedax::vmap<"i">(body, in_axes)(x, ws, ct);
    auto [yp, xp, wp] = namedax::pmap<"i">(body, in_axes)(x, ws, ct);
    CHECK(yv(0) == xv(0));  // bilinear: both pairings give <x w, ct>
    CHECK(yv(0) == wv(0));
    CHECK_BITWISE(xv, xp);
    CHECK_BITWISE(wv, wp);
  }

  TEST_CASE("positional linear maps: scale, permute_dims, reshape, reduce_sum") {
    std::mt19937 rng(9);
    check_adjoint_both(linear::scale(3.0), rng, {4, 2, 3});
    check_adjoint_both(linear::permute_dims({2, 0, 1}), rng, {4, 2, 3, 5});
    check_vjp_all(linear::reshape({6}), rng, {4, 2, 3});
    check_vjp_all(linear::reduce_sum(0, 2), rng, {4, 2, 3, 5});
    check_vjp_all(linear::reduce_sum(-1), rng, {4, 2, 3});
  }

  TEST_CASE("composites: the adjoint of a composite is the composite of adjoints, reversed") {
    std::mt19937 rng(10);
    // psum_scatter then all_gather is psum, in two steps.
    auto reduce_scatter_gather = linear::compose(linear::all_gather("i"_ax, {.tiled = true}),
                                                 linear::psum_scatter("i"_ax, {.tiled = true}));
    check_adjoint_both(reduce_scatter_gather, rng, {4, 8});
    check_vjp_all(reduce_scatter_gather, rng, {4, 8});
    auto mixed = linear::compose(linear::scale(2.0), linear::permute_dims({1, 0}), linear::pswapaxes("i"_ax, 0),
                                 linear::ppermute("i"_ax, {{0, 3}, {3, 0}, {1, 2}, {2, 1}}), linear::psum("i"_ax));
    check_adjoint_both(mixed, rng, {4, 4, 3});
    check_vjp_all(mixed, rng, {4, 4, 3});
    auto with_shapes = linear::compose(linear::reduce_sum(1), linear::reshape({2, 6}), linear::all_gather("i"_ax));
    check_vjp_all(with_shapes, rng, {4, 3});
    auto sum_of_maps = linear::add(linear::psum("i"_ax), linear::scale(-2.0),
                                   linear::compose(linear::ppermute("i"_ax, {{0, 1}, {1, 2}, {2, 3}, {3, 0}}),
                                                   linear::pshuffle("i"_ax, {3, 2, 1, 0})));
    check_vjp_all(sum_of_maps, rng, {4, 3});
    // add is transposed through vjp only: the transpose of each term depends on its type.

    // The composite's transpose, step by step, is the same computation.
    xt::xarray<double> x = random_integers(rng, {4, 8});
    auto by_hand = [](auto ct) {
      auto a = namedax::all_gather(ct, "i"_ax, namedax::all_gather_options{.tiled = true});
      return namedax::psum_scatter(a, "i"_ax, {.tiled = true});
    };
    auto whole = [&](auto ct) {
      return namedax::transpose(linear::compose(linear::psum_scatter("i"_ax, {.tiled = true}),
                                                linear::all_gather("i"_ax, {.tiled = true})),
                                ct);
    };
    CHECK_BITWISE(namedax::vmap<"i">(by_hand)(x), namedax::vmap<"i">(whole)(x));
    CHECK_BITWISE(namedax::pmap<"i">(by_hand)(x), namedax::pmap<"i">(whole)(x));
  }

  TEST_CASE("transpose reports bad input in the collective's words") {
    xt::xarray<double> x = xt::zeros<double>({4, 3});
    auto bad_perm = [](auto c) { return namedax::transpose(linear::pshuffle("i"_ax, {0, 0, 1, 2}), c); };
    CHECK(error_of([&] { namedax::vmap<"i">(bad_perm)(x); }).find("pshuffle") != std::string::npos);
    auto bad_split = [](auto, auto c) { return namedax::transpose(linear::all_gather("i"_ax), c); };
    xt::xarray<double> row = xt::zeros<double>({1, 3});  // gathered dim of size 1, not 4
    CHECK(error_of([&] { namedax::vmap<"i">(bad_split, std::tuple{0, namedax::none})(x, row); })
              .find("transpose of all_gather") != std::string::npos);
  }
}

TEST_SUITE("variance in the type") {
  TEST_CASE("options written without groups keep the result invariant; groups make it vary") {
    auto body = [](auto x) {
      static_assert(decltype(namedax::psum(x, "i"_ax, {}))::varying == 0);
      static_assert(decltype(namedax::pmax(x, "i"_ax, {.axis_index_groups = {{0, 1}, {2, 3}}}))::varying == 1);
      static_assert(decltype(namedax::all_gather(x, "i"_ax, {.axis = 1}))::varying == 0);
      static_assert(decltype(namedax::all_gather(x, "i"_ax, {.axis = 0, .tiled = true}))::varying == 0);
      static_assert(decltype(namedax::all_gather(x, "i"_ax, {.axis_index_groups = {{0, 1}, {2, 3}}}))::varying == 1);
      const namedax::all_gather_options runtime{};
      static_assert(decltype(namedax::all_gather(x, "i"_ax, runtime))::varying == 1);  // may carry groups
      static_assert(decltype(namedax::pvary(namedax::psum(x, "i"_ax), "i"_ax))::varying == 1);
      return namedax::psum(x, "i"_ax, {});
    };
    xt::xarray<int> x{1, 2, 3, 4};
    CHECK(namedax::vmap<"i">(body)(x) == xt::xarray<int>{10, 10, 10, 10});
    CHECK(namedax::pmap<"i">(body)(x) == xt::xarray<int>{10, 10, 10, 10});
  }
  TEST_CASE("pvary is the identity on data, and collectives read the value as replicated") {
    xt::xarray<float> x{1, 2, 3, 4};
    xt::xarray<float> w{5, 6};
    auto body = [](auto, auto w) {
      auto v = namedax::pvary(w, "i"_ax);
      return std::tuple{v, namedax::psum(v, "i"_ax), namedax::all_gather(v, "i"_ax)};
    };
    auto in_axes = std::tuple{0, namedax::none};
    auto [vv, sv, gv] = namedax::vmap<"i">(body, in_axes)(x, w);
    auto [vp, sp, gp] = namedax::pmap<"i">(body, in_axes)(x, w);
    CHECK_BITWISE(vv, (xt::xarray<float>{{5, 6}, {5, 6}, {5, 6}, {5, 6}}));
    CHECK_BITWISE(sv, (xt::xarray<float>{{20, 24}, {20, 24}, {20, 24}, {20, 24}}));
    CHECK_BITWISE(vv, vp);
    CHECK_BITWISE(sv, sp);
    CHECK_BITWISE(gv, gp);
  }
}
