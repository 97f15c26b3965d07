// SPDX-License-Identifier: MIT
// Gradient checks of namedax::grad, value_and_grad and vjp: every differentiated rule against
// central finite differences of the same function evaluated on plain named values (float64,
// step 1e-6), in vmap, pmap, nested maps and a mesh, vmap and pmap agreeing bit for bit; the
// variance semantics (replicated parameters, psum of a loss, varying results), ties of
// pmax/pmin and of the local extremes, prod and cumprod at zeros (exact, against naive loops),
// digamma at known values (lgamma's and tgamma's derivatives), nan_to_num at NaN and the
// infinities, constants (pargmax, integers, bools, stop_gradient),
// grad outside any map (of arrays, and outside a map of strided views, transposes, lazy
// expressions and of size 0), pytrees, value_and_grad, vjp, the options argnums and has_aux,
// checkpoint (the same gradient, the forward run again), jvp (the closed form and the
// dot-product identity with vjp), pgather (names and positional axes in either order, indices
// out of range), ragged_all_to_all (operand and output) and all_gather_v (padding under a
// vmap too) against closed forms, the asynchronous collectives (the blocking forms' rules),
// predicates and logical operators (constants), custom_vjp
// and custom_jvp (the user's rule is the one used, with collectives in it, in vmap and pmap
// and through a map; a fault in the backward map), the error of a non-scalar result and of a
// cotangent of another shape, and nested derivatives (an error until they are supported).
//
// One generic checker serves every rule: a family of rules is one function `f(x, c, op)` that
// picks the rule by the runtime number `op`, so each family is compiled once per placement.
#include "test_support.hpp"

#include <xtensor/xadapt.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xview.hpp>

#include <atomic>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

using namespace namedax::literals;
using namedax_test::error_of;

namespace {

constexpr double step = 1e-6;
constexpr double tolerance = 1e-6;

/// Random values uniform in [lo, hi].
xt::xarray<double> uniform(std::mt19937& rng, const std::vector<std::size_t>& shape, double lo, double hi) {
  xt::xarray<double> a = xt::xarray<double>::from_shape(shape);
  std::uniform_real_distribution<double> d(lo, hi);
  for (auto& v : a) v = d(rng);
  return a;
}

/// A loss value as one number: the sum over every index of the names it varies along (a
/// replicated value counts once), so that the map returns it unmapped.
template <class Y>
auto total(const Y& y) {
  if constexpr (Y::varying != 0) return namedax::psum(y, namedax::detail::axes_of_mask<typename Y::env_type, Y::varying>());
  else return y;
}

/// The loss every rule ends in: sum(s * sin(g)), s a positive per-index weight, so that the
/// cotangent reaching the rule differs from element to element and from index to index.
template <class S, class G>
auto finish(const S& s, const G& g) {
  return namedax::eval(namedax::sum(s * namedax::sin(namedax::eval(g))));
}

/// Central differences of `loss` (array -> double) at x.
template <class Loss>
xt::xarray<double> finite_difference(const Loss& loss, xt::xarray<double> x) {
  xt::xarray<double> g = xt::zeros<double>(x.shape());
  for (std::size_t k = 0; k < x.size(); ++k) {
    const double v = x.flat(k);
    x.flat(k) = v + step;
    const double up = loss(x);
    x.flat(k) = v - step;
    const double down = loss(x);
    x.flat(k) = v;
    g.flat(k) = (up - down) / (2 * step);
  }
  return g;
}

/// max |got - expected| / max |expected|: the check fails where it is `tolerance` or more.
double relative_error(const xt::xarray<double>& got, const xt::xarray<double>& expected) {
  if (got.shape() != expected.shape()) return INFINITY;
  const double scale = xt::amax(xt::abs(expected))();
  return xt::amax(xt::abs(got - expected))() / scale;
}

void check_close(const std::string& what, const xt::xarray<double>& got, const xt::xarray<double>& fd) {
  INFO(what, "\n  grad: ", namedax_test::show(got), "\n  finite differences: ", namedax_test::show(fd));
  CHECK(xt::amax(xt::abs(fd))() > 1e-3);  // not vacuous
  CHECK(relative_error(got, fd) < tolerance);
}

/// The loss of a family at rule `op`, summed over the names, and its gradient in x.
template <class F>
auto loss_body(const F& f, int op) {
  return [f, op](const auto& x, const auto& c) { return total(f(x, c, op)); };
}
template <class F>
auto grad_body(const F& f, int op) {
  return [f, op](const auto& x, const auto& c) {
    return namedax::grad([&](const auto& t, const auto& cc) { return f(t, cc, op); })(x, c);
  };
}

double first(const xt::xarray<double>& a) { return a.flat(0); }

/// Checks rule `op` of family `f` on x of positional shape (4, 3), c the same, under "i" of
/// size 4: x mapped (varying) or unmapped (replicated, its gradient the sum over the indices),
/// in vmap and pmap (bit for bit equal) against finite differences of the summed loss.
template <bool Replicated, class F>
void check_single(const F& f, int op, std::mt19937& rng) {
  using namedax::none;
  const xt::xarray<double> x = Replicated ? uniform(rng, {4, 3}, 0.2, 0.8) : uniform(rng, {4, 4, 3}, 0.2, 0.8);
  const xt::xarray<double> c = uniform(rng, {4, 4, 3}, 0.5, 1.5);
  auto in_axes = [] {
    if constexpr (Replicated) return std::tuple{none, 0};
    else return std::tuple{0, 0};
  }();
  auto out_axes = [] {
    if constexpr (Replicated) return none;
    else return 0;
  }();
  const xt::xarray<double> gv = namedax::vmap<"i">(grad_body(f, op), in_axes, out_axes)(x, c);
  const xt::xarray<double> gp = namedax::pmap<"i">(grad_body(f, op), in_axes, out_axes)(x, c);
  auto loss = [&, l = namedax::vmap<"i">(loss_body(f, op), in_axes, none)](const xt::xarray<double>& at) {
    return first(l(at, c));
  };
  INFO("rule ", op, Replicated ? ", replicated parameter" : ", mapped parameter");
  CHECK_BITWISE(gv, gp);
  check_close("vmap<i>", gv, finite_difference(loss, x));
}

/// The same, nested: pmap<"j"> (2 devices) of vmap<"i"> (4), x mapped along "i" and replicated
/// along "j" (its gradient summed over "j"), c mapped along both.
template <class F>
void check_nested(const F& f, int op, std::mt19937& rng) {
  using namedax::none;
  const xt::xarray<double> x = uniform(rng, {4, 4, 3}, 0.2, 0.8);
  const xt::xarray<double> c = uniform(rng, {2, 4, 4, 3}, 0.5, 1.5);
  const xt::xarray<double> g = namedax::pmap<"j">(namedax::vmap<"i">(grad_body(f, op), std::tuple{0, 0}, 0),
                                                  std::tuple{none, 0}, none)(x, c);
  auto l = namedax::vmap<"j">(namedax::vmap<"i">(loss_body(f, op), std::tuple{0, 0}, none), std::tuple{none, 0}, none);
  auto loss = [&](const xt::xarray<double>& at) { return first(l(at, c)); };
  INFO("rule ", op, ", nested pmap<j>(vmap<i>)");
  check_close("pmap<j>(vmap<i>)", g, finite_difference(loss, x));
}

// -------------------------------------------------------------------------------------------
// The families. Inputs: x in [0.2, 0.8] (inside every domain, away from the kinks used),
// c in [0.5, 1.5].

constexpr int local_rules = 78;

/// Elementwise functions, arithmetic, where, cast and the local reductions.
const auto local_family = [](const auto& x, const auto& c, int op) {
  const auto s = namedax::eval(namedax::sum(c));
  const auto b = namedax::eval(1.0 - x * x);  // a second traced operand, in [0.36, 0.96]
  switch (op) {
    case 0: return finish(s, namedax::exp(x));
    case 1: return finish(s, namedax::exp2(x));
    case 2: return finish(s, namedax::expm1(x));
    case 3: return finish(s, namedax::log(x));
    case 4: return finish(s, namedax::log2(x));
    case 5: return finish(s, namedax::log10(x));
    case 6: return finish(s, namedax::log1p(x));
    case 7: return finish(s, namedax::sigmoid(x));
    case 8: return finish(s, namedax::sqrt(x));
    case 9: return finish(s, namedax::cbrt(x));
    case 10: return finish(s, namedax::square(x));
    case 11: return finish(s, namedax::cube(x));
    case 12: return finish(s, namedax::sin(x));
    case 13: return finish(s, namedax::cos(x));
    case 14: return finish(s, namedax::tan(x));
    case 15: return finish(s, namedax::asin(x));
    case 16: return finish(s, namedax::acos(x));
    case 17: return finish(s, namedax::atan(x));
    case 18: return finish(s, namedax::sinh(x));
    case 19: return finish(s, namedax::cosh(x));
    case 20: return finish(s, namedax::tanh(x));
    case 21: return finish(s, namedax::asinh(x));
    case 22: return finish(s, namedax::acosh(namedax::eval(x + 1.5)));
    case 23: return finish(s, namedax::atanh(x));
    case 24: return finish(s, namedax::erf(x));
    case 25: return finish(s, namedax::erfc(x));
    case 26: return finish(s, namedax::deg2rad(x));
    case 27: return finish(s, namedax::radians(x));
    case 28: return finish(s, namedax::rad2deg(x));
    case 29: return finish(s, namedax::degrees(x));
    case 30: return finish(s, namedax::abs(namedax::eval(x - 1.0)));
    case 31: return finish(s, namedax::fabs(namedax::eval(x - 1.0)));
    case 32: return finish(s, namedax::sign(namedax::eval(x - 1.0)) * x);
    case 33: return finish(s, -x);
    case 34: return finish(s, +x * c);
    case 35: return finish(s, x + b);
    case 36: return finish(s, x - b);
    case 37: return finish(s, x * b);
    case 38: return finish(s, x / b);
    case 39: return finish(s, namedax::pow(x, b));
    case 40: return finish(s, namedax::maximum(x, b));  // crosses at x = 0.618
    case 41: return finish(s, namedax::minimum(x, b));
    case 42: return finish(s, namedax::fmax(x, b));
    case 43: return finish(s, namedax::fmin(x, b));
    case 44: return finish(s, namedax::atan2(x, b));
    case 45: return finish(s, namedax::hypot(x, b));
    case 46: return finish(s, c / x);
    case 47: return finish(s, x / c);
    case 48: return finish(s, namedax::pow(c, x));
    case 49: return finish(s, namedax::pow(x, 2.5));
    case 50: return finish(s, namedax::maximum(c - 0.5, x));
    case 51: return finish(s, 2.0 - x);
    case 52: return finish(s, x * 3.0 + c);
    case 53: return finish(s, namedax::where(x > 0.5, namedax::eval(x * x), namedax::eval(namedax::sin(x))));
    case 54: return finish(s, namedax::where(c > 1.0, x, 0.3));
    case 55: return finish(s, namedax::cast<double>(x) * x);
    case 56: return finish(s, namedax::sum(x, 0));
    case 57: return finish(s, namedax::sum(x, 1, {.keepdims = true}) * x);
    case 58: return finish(s, namedax::mean(x));
    case 59: return finish(s, namedax::mean(x, 1));
    case 60: return finish(s, namedax::max(x, 1));
    case 61: return finish(s, namedax::min(x, 0));
    case 62: return finish(s, namedax::max(x));
    case 63: return finish(s, namedax::logsumexp(x, 1));
    case 64: return finish(s, namedax::logsumexp(x));
    case 65: return finish(s, namedax::softmax(x, 1));
    case 66: return finish(s, namedax::softmax(x, 0) * c);
    case 67: return finish(s, namedax::log_softmax(x, 1));
    case 68: return finish(s, namedax::log_softmax(x, 0) * c);
    case 69: return finish(s, namedax::sum(x, {0, 1}));
    case 70: return finish(s, x * namedax::sum(x, 0));
    case 71: return finish(s, namedax::min(x, 1, {.keepdims = true}) * x);
    case 72: return finish(s, namedax::prod(x, 1));
    case 73: return finish(s, namedax::prod(namedax::eval(x + 0.5)));
    case 74: return finish(s, namedax::prod(x, 0, {.keepdims = true}) * c);
    case 75: return finish(s, namedax::lgamma(x));
    case 76: return finish(s, namedax::tgamma(x));
    case 77: return finish(s, namedax::nan_to_num(x) * c);
    default: throw std::logic_error("no such rule");
  }
};

constexpr int collective_rules = 38;

/// The collectives over "i" (4 indices), x of positional shape (4, 3).
const auto collective_family = [](const auto& x, const auto& c, int op) {
  const auto s = namedax::eval(namedax::sum(c));
  const auto i = "i"_ax;
  switch (op) {
    case 0: return finish(s, namedax::psum(x, i));
    case 1: return finish(s, namedax::pmean(x, i));
    case 2: return finish(s, namedax::psum(x, i, {}));
    case 3: return finish(s, namedax::pmean(x, i, {.axis_index_groups = {{0, 2}, {3, 1}}}));
    case 4: return finish(s, namedax::psum(x, namedax::axes(i, 0)));
    case 5: return finish(s, namedax::psum(x, i, {.axis_index_groups = {{0, 1}, {2, 3}}}));
    case 6: return finish(s, namedax::psum(x, i, {.axis_index_groups = {{0}, {3, 1, 2}}}));
    case 7: return finish(s, namedax::pmean(x, namedax::axes(i, 1)));
    case 8: return finish(s, namedax::all_gather(x, i));
    case 9: return finish(s, namedax::all_gather(x, i, {.axis = 1, .tiled = true}));
    case 10: return finish(s, namedax::all_gather_invariant(x, i, {.tiled = true}));
    case 11: return finish(s, namedax::all_gather(x, i, {.axis_index_groups = {{0, 1}, {2, 3}}}));
    case 12: return finish(s, namedax::psum_scatter(x, i));
    case 13: return finish(s, namedax::psum_scatter(x, i, {.scatter_dimension = 0, .tiled = true}));
    case 14: return finish(s, namedax::all_to_all(x, i, 0, 1, {.tiled = true}));
    case 15: return finish(s, namedax::all_to_all(x, i, 0, 0));
    case 16: return finish(s, namedax::pswapaxes(x, i, 0));
    case 17: return finish(s, namedax::ppermute(x, i, std::vector<std::pair<int, int>>{{0, 1}, {1, 2}, {2, 3}, {3, 0}}));
    case 18: return finish(s, namedax::ppermute(x, i, std::vector<std::pair<int, int>>{{0, 2}, {1, 0}}) + x);
    case 19: return finish(s, namedax::pshuffle(x, i, std::vector<int>{2, 0, 3, 1}));
    case 20: return finish(s, namedax::pvary(namedax::psum(x, i), i));
    case 21: return finish(s, namedax::pbroadcast(x, i, 2));
    case 22: return finish(s, namedax::pdot(x, c, i, {{0}, {0}}));
    case 23: return finish(s, namedax::pdot(x, namedax::eval(namedax::sin(x)), i, {{1}, {1}}));
    case 24: return finish(s, namedax::pdot(c, x, namedax::axes(), {{1}, {1}}));
    case 25: return finish(s, namedax::psum(x * x, i) * x);  // an invariant and a varying use
    case 26: return finish(s, namedax::pmean(namedax::eval(x * c), i) + namedax::psum(x, i));
    case 27: return finish(s, namedax::pmax(x, i));
    case 28: return finish(s, namedax::pmin(x, i));
    case 29: return finish(s, namedax::pmin(namedax::eval(x * c), i) + namedax::pmax(x, i));
    // The asynchronous forms: under grad the blocking form at start, its rule; on plain values
    // (the finite differences) the exchange itself.
    case 30: return finish(s, namedax::async::psum(x, i).wait());
    case 31: return finish(s, namedax::async::pmean(x * c, i).wait() + namedax::async::pmax(x, i).wait());
    case 32: return finish(s, namedax::async::all_gather(x, i, {.axis = 1, .tiled = true}).wait());
    case 33: return finish(s, namedax::async::psum_scatter(x, i, {.scatter_dimension = 0, .tiled = true}).wait());
    case 34: return finish(s, namedax::async::all_to_all(x, i, 0, 1, {.tiled = true}).wait());
    case 35: {
      auto h = namedax::async::ppermute(x, i, {{0, 1}, {1, 2}, {2, 3}, {3, 0}});
      auto g = namedax::async::pshuffle(x, i, std::vector<int>{2, 0, 3, 1});
      return finish(s, h.wait() * g.wait());
    }
    case 36: return finish(s, namedax::async::pdot(x, c, i, {{0}, {0}}).wait());
    case 37: return finish(s, namedax::async::pbroadcast(x, i, 2).wait() + namedax::async::pmin(x, i).wait());
    default: throw std::logic_error("no such rule");
  }
};

constexpr int structural_rules = 45;

/// Structural ops, xeinsum, scans and sorts, clip, fma, rounding, the collective matmuls and the
/// grouped extremes, x of positional shape (4, 3) under "i" of size 4.
const auto structural_family = [](const auto& x, const auto& c, int op) {
  const auto s = namedax::eval(namedax::sum(c));
  const auto i = "i"_ax;
  const xt::xarray<double> w{{0.5, -1.0}, {2.0, 0.25}, {-0.75, 1.5}};
  switch (op) {
    case 0: return finish(s, namedax::reshape(x, {3, 4}) * namedax::reshape(c, {3, 4}));
    case 1: return finish(s, namedax::permute_dims(x, {1, 0}));
    case 2: return finish(s, namedax::moveaxis(x, 0, 1) * namedax::moveaxis(c, 0, 1));
    case 3: return finish(s, namedax::swapaxes(x, 0, 1));
    case 4: return finish(s, namedax::squeeze(namedax::expand_dims(x, 0)) * c);
    case 5: return finish(s, namedax::expand_dims(x, 1) * c);
    case 6: return finish(s, namedax::broadcast_to(x, {2, 4, 3}) * c);
    case 7: return finish(s, namedax::flip(x, 0) * c);
    case 8: return finish(s, namedax::roll(x, 1, 1) * c);
    case 9: return finish(s, namedax::view(x, xt::range(1, 3), 0));
    case 10: return finish(s, namedax::dynamic_slice(x, std::array{1, 0}, std::array<std::size_t, 2>{2, 2}));
    case 11: return finish(s, namedax::take(x, xt::xarray<int>{2, 0, 2}, 0));
    case 12: return finish(s, namedax::take_along_axis(x, namedax::argsort(c, 1), 1));
    case 13: return finish(s, namedax::concat(std::tuple{x, c, namedax::eval(x * x)}, 0));
    case 14: return finish(s, namedax::stack(std::tuple{x, namedax::eval(x * c)}, 1));
    case 15: return finish(s, namedax::pad(x, {{1, 2}}, 0.5));
    case 16: return finish(s, namedax::dynamic_update_slice(x, namedax::view(namedax::eval(x * c), xt::range(0, 2)), std::array{1, 0}));
    case 17: return finish(s, namedax::xeinsum<"ab,ab->a">(x, c));
    case 18: return finish(s, namedax::xeinsum<"ab,cb->ac">(x, x));
    case 19: return finish(s, namedax::xeinsum<"ab->">(x) * x);
    case 20: return finish(s, namedax::xeinsum<"ab{i},ab->b">(x, c));
    case 21: return finish(s, namedax::cumsum(x, 1));
    case 22: return finish(s, namedax::cumsum(x) * namedax::reshape(c, {12}));
    case 23: return finish(s, namedax::sort(namedax::eval(x * c), 1));
    case 24: return finish(s, namedax::top_k(namedax::eval(x * c), 2).first);
    case 25: return finish(s, namedax::clip(x, 0.3, 0.7) * c);
    case 26: return finish(s, namedax::fma(x, c, namedax::eval(x * x)));
    case 27: return finish(s, namedax::floor(namedax::eval(x * 3.0)) * x);
    case 28: return finish(s, namedax::all_gather_matmul(x, w, i));
    case 29: return finish(s, namedax::matmul_reduce_scatter(x, w, i));
    case 30: return finish(s, namedax::all_gather_matmul(x, namedax::permute_dims(x, {1, 0}), i, {.bidirectional = true}));
    case 31: return finish(s, namedax::matmul_reduce_scatter(x, namedax::permute_dims(x, {1, 0}), i, {.bidirectional = true}));
    case 32: return finish(s, namedax::pmax(x, i, {.axis_index_groups = {{0, 2}, {3, 1}}}));
    case 33: return finish(s, namedax::pmin(namedax::eval(x * c), i, {.axis_index_groups = {{0, 1}, {2, 3}}}));
    case 34: return finish(s, namedax::cast<double>(namedax::pargmax(namedax::eval(x * c), i)) * x);
    case 35: return finish(s, namedax::pmax_with_index(x, i).first);
    case 36: return finish(s, namedax::fmod(namedax::eval(x * 5.0), c));
    case 37: return finish(s, namedax::remainder(c, x));
    case 38: return finish(s, namedax::fdim(x, namedax::eval(c - 0.75)));
    case 39: return finish(s, namedax::pow<3>(x) + namedax::pow<1>(x));
    case 40: return finish(s, namedax::pow<2>(namedax::eval(x * c)));
    // Bounds from x, lo > hi where x > 0: the value is hi there, and so is the cotangent.
    case 41: return finish(s, namedax::clip(c, x, namedax::eval(x * 0.5)));
    case 42: return finish(s, namedax::cumprod(namedax::eval(x + 0.5), 1));
    case 43: return finish(s, namedax::cumprod(namedax::eval(x + 0.5)) * namedax::reshape(c, {12}));
    case 44: return finish(s, namedax::cumprod(x, 0) * c);
    default: throw std::logic_error("no such rule");
  }
};

/// max |got - expected| / max |expected| below 1e-12: for gradients known in closed form.
void check_exact(const std::string& what, const xt::xarray<double>& got, const xt::xarray<double>& expected) {
  INFO(what, "\n  grad: ", namedax_test::show(got), "\n  expected: ", namedax_test::show(expected));
  CHECK(relative_error(got, expected) < 1e-12);
}

/// The per-index loss (w . x_i)^2, a varying scalar, and its psum over "i", invariant.
const auto squared_dot = [](const auto& w, const auto& x) { return namedax::square(namedax::sum(w * x)); };
const auto psum_of_squared_dot = [](const auto& w, const auto& x) { return namedax::psum(squared_dot(w, x), "i"_ax); };

/// Naive gradients of sum(w * prod(line)) and sum(w * cumprod(line)) for each row of a matrix,
/// w a weight per row (prod) or per element (cumprod): the products of the other elements,
/// by direct loops over them.
xt::xarray<double> naive_prod_gradient(const xt::xarray<double>& x, const xt::xarray<double>& w) {
  xt::xarray<double> g = xt::zeros<double>(x.shape());
  for (std::size_t r = 0; r < x.shape()[0]; ++r)
    for (std::size_t i = 0; i < x.shape()[1]; ++i) {
      double others = w(r);
      for (std::size_t k = 0; k < x.shape()[1]; ++k)
        if (k != i) others *= x(r, k);
      g(r, i) = others;
    }
  return g;
}
xt::xarray<double> naive_cumprod_gradient(const xt::xarray<double>& x, const xt::xarray<double>& w) {
  xt::xarray<double> g = xt::zeros<double>(x.shape());
  for (std::size_t r = 0; r < x.shape()[0]; ++r)
    for (std::size_t i = 0; i < x.shape()[1]; ++i)
      for (std::size_t j = i; j < x.shape()[1]; ++j) {
        double term = w(r, j);
        for (std::size_t k = 0; k <= j; ++k)
          if (k != i) term *= x(r, k);
        g(r, i) += term;
      }
  return g;
}

template <class F>
auto grad_of(const F& f) {
  return [f](const auto& w, const auto& x) { return namedax::grad(f)(w, x); };
}

}  // namespace

TEST_SUITE("grad") {
  TEST_CASE("grad of every elementwise and local reduction rule against finite differences, every placement") {
    std::mt19937 rng(21);
    for (int op = 0; op < local_rules; ++op) {
      check_single<false>(local_family, op, rng);
      check_nested(local_family, op, rng);
    }
  }

  TEST_CASE("grad of every collective against finite differences: mapped, replicated, nested") {
    std::mt19937 rng(22);
    for (int op = 0; op < collective_rules; ++op) {
      check_single<false>(collective_family, op, rng);
      check_single<true>(collective_family, op, rng);
      check_nested(collective_family, op, rng);
    }
  }

  TEST_CASE("grad of structural ops, xeinsum, scans, sorts, collective matmuls and grouped extremes against finite differences") {
    std::mt19937 rng(23);
    for (int op = 0; op < structural_rules; ++op) {
      check_single<false>(structural_family, op, rng);
      check_single<true>(structural_family, op, rng);
      check_nested(structural_family, op, rng);
    }
  }

  TEST_CASE("grad of a replicated parameter is summed over the indices; grad of psum(loss) is that of the total (jax#3970)") {
    using namedax::none;
    std::mt19937 rng(23);
    const xt::xarray<double> x = uniform(rng, {4, 3}, -1, 1);
    const xt::xarray<double> w = uniform(rng, {3}, -1, 1);
    const xt::xarray<double> ws = uniform(rng, {4, 3}, -1, 1);
    // By hand: d/dw sum_i (w . x_i)^2 = sum_i 2 (w . x_i) x_i; per index, 2 (w_i . x_i) x_i.
    xt::xarray<double> summed = xt::zeros<double>({3});
    xt::xarray<double> per_index = xt::zeros<double>({4, 3});
    for (std::size_t i = 0; i < 4; ++i) {
      double d = 0, di = 0;
      for (std::size_t k = 0; k < 3; ++k) d += w(k) * x(i, k), di += ws(i, k) * x(i, k);
      for (std::size_t k = 0; k < 3; ++k) summed(k) += 2 * d * x(i, k), per_index(i, k) = 2 * di * x(i, k);
    }
    const auto replicated = std::tuple{none, 0};
    // A varying scalar result: differentiated as the sum of its values.
    const xt::xarray<double> v1 = namedax::vmap<"i">(grad_of(squared_dot), replicated, none)(w, x);
    const xt::xarray<double> p1 = namedax::pmap<"i">(grad_of(squared_dot), replicated, none)(w, x);
    check_exact("replicated w, varying loss", v1, summed);
    CHECK_BITWISE(v1, p1);
    // The psum of the losses, invariant: the same gradient, not 4 times it.
    const xt::xarray<double> v2 = namedax::vmap<"i">(grad_of(psum_of_squared_dot), replicated, none)(w, x);
    const xt::xarray<double> p2 = namedax::pmap<"i">(grad_of(psum_of_squared_dot), replicated, none)(w, x);
    check_exact("replicated w, psum of the losses", v2, summed);
    CHECK_BITWISE(v2, p2);
    // A mapped parameter: each index's own gradient, with and without the psum.
    const xt::xarray<double> v3 = namedax::vmap<"i">(grad_of(squared_dot))(ws, x);
    const xt::xarray<double> p3 = namedax::pmap<"i">(grad_of(squared_dot))(ws, x);
    check_exact("mapped w, varying loss", v3, per_index);
    CHECK_BITWISE(v3, p3);
    const xt::xarray<double> v4 = namedax::vmap<"i">(grad_of(psum_of_squared_dot))(ws, x);
    const xt::xarray<double> p4 = namedax::pmap<"i">(grad_of(psum_of_squared_dot))(ws, x);
    check_exact("mapped w, psum of the losses", v4, per_index);
    CHECK_BITWISE(v4, p4);
  }

  TEST_CASE("grad of pmax and pmin at ties: shared equally, with groups too; a pargmax index is a constant") {
    const xt::xarray<double> x{1.0, 3.0, 3.0, 2.0};
    const xt::xarray<double> y{2.0, 1.0, 3.0, 1.0};
    auto extremes = [](const auto& u, const auto& v) {
      auto gu = namedax::grad([](const auto& t) { return namedax::pmax(t, "i"_ax); })(u);
      auto gv = namedax::grad([](const auto& t) { return namedax::pmin(t, "i"_ax); })(v);
      // x * pargmax(x): the index is a constant, 2 here, the gradient 2 on every index.
      auto ga = namedax::grad([](const auto& t) { return t * namedax::cast<double>(namedax::pargmax(t, "i"_ax)); })(v);
      // The sum over "i" of a grouped pmax: each group's maximum is held by both members, so
      // the one chosen gets 2 (ties in the group {3, 1}: 1 each).
      auto gg = namedax::grad([](const auto& t) {
        return namedax::psum(namedax::pmax(t, "i"_ax, {.axis_index_groups = {{0, 2}, {3, 1}}}), "i"_ax);
      })(v);
      return std::tuple{gu, gv, ga, gg};
    };
    const auto [mv, nv, av, gv] = namedax::vmap<"i">(extremes)(x, y);
    const auto [mp, np, ap, gp] = namedax::pmap<"i">(extremes)(x, y);
    CHECK_BITWISE(mv, (xt::xarray<double>{0.0, 0.5, 0.5, 0.0}));
    CHECK_BITWISE(nv, (xt::xarray<double>{0.0, 0.5, 0.0, 0.5}));
    CHECK_BITWISE(av, (xt::xarray<double>{2.0, 2.0, 2.0, 2.0}));
    CHECK_BITWISE(gv, (xt::xarray<double>{0.0, 1.0, 2.0, 1.0}));
    CHECK_BITWISE(mv, mp);
    CHECK_BITWISE(nv, np);
    CHECK_BITWISE(av, ap);
    CHECK_BITWISE(gv, gp);
  }

  TEST_CASE("grad at ties of the local extremes: shared equally") {
    const xt::xarray<double> x{{1.0, 3.0, 3.0}, {2.0, 2.0, 0.0}};
    const xt::xarray<double> row_max = namedax::grad([](const auto& v) { return namedax::sum(namedax::max(v, 1)); })(x);
    CHECK(row_max == xt::xarray<double>{{0.0, 0.5, 0.5}, {0.5, 0.5, 0.0}});
    const xt::xarray<double> three{2.0, 2.0, 2.0, 5.0};
    const xt::xarray<double> all_min = namedax::grad([](const auto& v) { return namedax::min(v); })(three);
    CHECK(relative_error(all_min, xt::xarray<double>{1.0 / 3, 1.0 / 3, 1.0 / 3, 0.0}) < 1e-15);
    const xt::xarray<double> other{1.0, 0.0, 5.0};
    const xt::xarray<double> a{1.0, 2.0, 3.0};
    const xt::xarray<double> maximum =
        namedax::grad([](const auto& v, const auto& o) { return namedax::sum(namedax::maximum(v, o)); })(a, other);
    CHECK(maximum == xt::xarray<double>{0.5, 1.0, 0.0});
    const xt::xarray<double> minimum =
        namedax::grad([](const auto& v, const auto& o) { return namedax::sum(namedax::minimum(o, v)); })(a, other);
    CHECK(minimum == xt::xarray<double>{0.5, 0.0, 1.0});
  }

  TEST_CASE("grad of prod and cumprod with zeros: exact, outside any map, in vmap and pmap, double and float") {
    // prod of {2, 0, 3}: {0, 6, 0}; two zeros: all zeros (no division by x).
    auto whole = [](const auto& v) { return namedax::prod(v); };
    const xt::xarray<double> one_zero{2.0, 0.0, 3.0}, one_zero_grad{0.0, 6.0, 0.0};
    const xt::xarray<double> two_zeros{2.0, 0.0, 0.0, 3.0}, two_zeros_grad{0.0, 0.0, 0.0, 0.0};
    const xt::xarray<float> one_zero_f{2.f, 0.f, 3.f}, one_zero_grad_f{0.f, 6.f, 0.f};
    CHECK_BITWISE(namedax::grad(whole)(one_zero), one_zero_grad);
    CHECK_BITWISE(namedax::grad(whole)(two_zeros), two_zeros_grad);
    CHECK_BITWISE(namedax::grad(whole)(one_zero_f), one_zero_grad_f);
    // Over two dims (every dim, and the list {0, 1}): one zero gets the product of the others.
    const xt::xarray<double> m{{1.0, 2.0, 3.0}, {4.0, 0.0, 6.0}};
    const xt::xarray<double> m_expected{{0.0, 0.0, 0.0}, {0.0, 144.0, 0.0}};
    CHECK_BITWISE(namedax::grad(whole)(m), m_expected);
    CHECK_BITWISE(namedax::grad([](const auto& v) { return namedax::prod(v, {1, 0}); })(m), m_expected);
    // Rows with no zero, one and two, weighted per row (prod) or per element (cumprod), each
    // against a naive loop over the other elements; the same in vmap and pmap, bit for bit.
    const xt::xarray<double> x{{2.0, 0.5, 3.0, 1.5}, {2.0, 0.0, 3.0, 5.0}, {0.0, 1.5, 0.0, 2.0}};
    const xt::xarray<double> w{{0.5, 1.5, -1.0, 2.0}, {1.0, 0.25, 2.0, -0.5}, {1.5, -2.0, 0.75, 1.0}};
    const xt::xarray<double> row_weight = xt::view(w, xt::all(), 0);
    const xt::xarray<double> expected = naive_prod_gradient(x, row_weight) + naive_cumprod_gradient(x, w);
    auto loss = [](const auto& v, const auto& u, const auto& r) {
      return namedax::sum(namedax::prod(v, 1) * r) + namedax::sum(namedax::cumprod(v, -1) * u);
    };
    check_exact("outside any map", namedax::grad(loss)(x, w, row_weight), expected);
    // A zero row first: cumprod {2, 0, 3, 5} weighted by ones has gradient {1, 38, 0, 0}.
    const xt::xarray<double> line_of_four{2.0, 0.0, 3.0, 5.0}, line_of_four_grad{1.0, 38.0, 0.0, 0.0};
    CHECK_BITWISE(namedax::grad([](const auto& v) { return namedax::sum(namedax::cumprod(v, 0)); })(line_of_four),
                  line_of_four_grad);
    auto per_row = [](const auto& v, const auto& u, const auto& r) {
      return namedax::grad([](const auto& t, const auto& k, const auto& q) {
        return namedax::prod(t) * q + namedax::sum(namedax::cumprod(t, 0) * k);
      })(v, u, r);
    };
    const xt::xarray<double> gv = namedax::vmap<"i">(per_row)(x, w, row_weight);
    const xt::xarray<double> gp = namedax::pmap<"i">(per_row)(x, w, row_weight);
    check_exact("vmap<i>", gv, expected);
    CHECK_BITWISE(gv, gp);
    const xt::xarray<float> xf = xt::cast<float>(x);
    const xt::xarray<float> wf = xt::cast<float>(w);
    const xt::xarray<float> rf = xt::cast<float>(row_weight);
    const xt::xarray<float> gf = namedax::pmap<"i">(per_row)(xf, wf, rf);
    CHECK_BITWISE(namedax::vmap<"i">(per_row)(xf, wf, rf), gf);
    CHECK(relative_error(xt::cast<double>(gf), expected) < 1e-6);
    // A replicated operand inside vmap: the gradient summed over the three indices.
    auto replicated = [](const auto& v, const auto& u) {
      return namedax::grad([](const auto& t, const auto& k) { return namedax::sum(namedax::cumprod(t, 0) * k); })(v, u);
    };
    const xt::xarray<double> line = xt::view(x, 1);
    const xt::xarray<double> gr = namedax::vmap<"i">(replicated, std::tuple{namedax::none, 0}, namedax::none)(line, w);
    xt::xarray<double> summed = xt::zeros<double>({4});
    for (std::size_t r = 0; r < 3; ++r) {
      const xt::xarray<double> one_line = xt::view(x, xt::range(1, 2));
      const xt::xarray<double> one_weight = xt::view(w, xt::range(r, r + 1));
      summed += xt::view(naive_cumprod_gradient(one_line, one_weight), 0);
    }
    check_exact("replicated in vmap<i>", gr, summed);
    CHECK_BITWISE(namedax::pmap<"i">(replicated, std::tuple{namedax::none, 0}, namedax::none)(line, w), gr);
    // Central differences through a zero: the products are linear in each element.
    auto plain = [&](const xt::xarray<double>& at) {
      return xt::sum(xt::prod(at, {1}) * row_weight)() + xt::sum(xt::cumprod(at, 1) * w)();
    };
    check_close("finite differences at zeros", namedax::grad(loss)(x, w, row_weight), finite_difference(plain, x));
  }

  TEST_CASE("grad of lgamma and tgamma: digamma at known values, negative arguments, every placement") {
    // psi at known points (DLMF 5.4.12, 5.4.13 and tables), to 1e-14.
    const std::vector<std::pair<double, double>> known{{1.0, -0.5772156649015329},
                                                        {0.5, -1.9635100260214235},
                                                        {10.0, 2.251752589066721},
                                                        {-0.5, 0.03648997397857652},
                                                        {2.0, 0.42278433509846713},
                                                        {-2.5, 1.1031566406452432}};
    for (const auto& entry : known) {  // not a structured binding: INFO captures it (clang 14)
      const double at = entry.first, psi = entry.second;
      INFO("psi(", at, ")");
      CHECK(std::abs(namedax::detail::digamma(at) - psi) < 1e-14 * std::max(1.0, std::abs(psi)));
    }
    CHECK(std::isnan(namedax::detail::digamma(0.0)));
    CHECK(std::isnan(namedax::detail::digamma(-3.0)));
    // d lgamma / dx = psi(x); d tgamma / dx = tgamma(x) psi(x), at positive and negative x.
    const xt::xarray<double> x{1.0, 0.5, 10.0, -0.5, 2.0, -2.5};
    xt::xarray<double> psi = xt::zeros<double>({6});
    for (std::size_t k = 0; k < 6; ++k) psi(k) = known[k].second;
    auto gammas = [](const auto& v) { return namedax::sum(namedax::lgamma(v)) + namedax::sum(namedax::tgamma(v) * 0.5); };
    const xt::xarray<double> expected = psi + 0.5 * xt::tgamma(x) * psi;
    check_exact("outside any map", namedax::grad(gammas)(x), expected);
    auto plain = [&](const xt::xarray<double>& at) { return xt::sum(xt::lgamma(at) + 0.5 * xt::tgamma(at))(); };
    check_close("finite differences", namedax::grad(gammas)(x), finite_difference(plain, x));
    // In vmap and pmap (x as 2 x 3), bit for bit; float too.
    auto mapped = [&](const auto& v) { return namedax::grad(gammas)(v); };
    xt::xarray<double> x2 = x;
    x2.reshape({2, 3});
    const xt::xarray<double> gv = namedax::vmap<"i">(mapped)(x2);
    CHECK_BITWISE(gv, namedax::pmap<"i">(mapped)(x2));
    xt::xarray<double> flat = gv;
    flat.reshape({6});
    check_exact("vmap<i>", flat, expected);
    const xt::xarray<float> xf = xt::cast<float>(x2);
    const xt::xarray<float> gf = namedax::vmap<"i">(mapped)(xf);
    CHECK_BITWISE(gf, namedax::pmap<"i">(mapped)(xf));
    xt::xarray<double> flat_f = xt::cast<double>(gf);
    flat_f.reshape({6});
    CHECK(relative_error(flat_f, expected) < 1e-5);
  }

  TEST_CASE("grad of nan_to_num: the cotangent where x is finite, zero at NaN and the infinities, every placement") {
    const double inf = std::numeric_limits<double>::infinity();
    const xt::xarray<double> x{{1.5, std::nan(""), inf}, {-inf, -2.0, 0.0}};
    const xt::xarray<double> w{{0.5, 1.5, -1.0}, {2.0, 0.25, 3.0}};
    const xt::xarray<double> expected{{0.5, 0.0, 0.0}, {0.0, 0.25, 3.0}};
    auto loss = [](const auto& v, const auto& u) { return namedax::sum(namedax::nan_to_num(v) * u); };
    CHECK_BITWISE(namedax::grad(loss)(x, w), expected);
    auto mapped = [&](const auto& v, const auto& u) { return namedax::grad(loss)(v, u); };
    CHECK_BITWISE(namedax::vmap<"i">(mapped)(x, w), expected);
    CHECK_BITWISE(namedax::pmap<"i">(mapped)(x, w), expected);
    const xt::xarray<float> xf = xt::cast<float>(x);
    const xt::xarray<float> wf = xt::cast<float>(w);
    const xt::xarray<float> expected_f = xt::cast<float>(expected);
    CHECK_BITWISE(namedax::vmap<"i">(mapped)(xf, wf), expected_f);
    CHECK_BITWISE(namedax::pmap<"i">(mapped)(xf, wf), expected_f);
  }

  TEST_CASE("grad: stop_gradient, integer and bool arguments, a result that does not depend on x") {
    using namedax::none;
    std::mt19937 rng(24);
    const xt::xarray<double> x = uniform(rng, {4, 3}, -1, 1);
    const xt::xarray<int> n{{1, -2, 3}, {0, 4, 5}, {7, 1, 1}, {2, 2, -9}};
    const xt::xarray<bool> on{true, false, true, true};
    // sum(x * stop_gradient(x)): the gradient is x, not 2x.
    auto stopped = [](const auto& v, const auto&) {
      return namedax::grad([](const auto& t) { return namedax::sum(t * namedax::stop_gradient(t)); })(v);
    };
    CHECK_BITWISE(namedax::vmap<"i">(stopped)(x, x), x);
    CHECK_BITWISE(namedax::pmap<"i">(stopped)(x, x), x);
    // A pytree of a double, an int and a bool value: the last two get zeros.
    auto mixed = [](const auto& v, const auto& k, const auto& b) {
      auto g = namedax::grad([](const auto& p) {
        const auto& [t, i, on] = p;
        return namedax::sum(t * namedax::cast<double>(i) * namedax::cast<double>(on));
      })(std::tuple{v, k, b});
      return g;
    };
    auto [gx, gn, gb] = namedax::vmap<"i">(mixed)(x, n, on);
    auto [px, pn, pb] = namedax::pmap<"i">(mixed)(x, n, on);
    xt::xarray<double> expected = xt::cast<double>(n);
    for (std::size_t i = 0; i < 4; ++i)
      if (!on(i)) xt::view(expected, i) = 0.0;
    CHECK_BITWISE(gx, expected);
    CHECK_BITWISE(gx, px);
    CHECK_BITWISE(gn, xt::xarray<int>(xt::zeros<int>({4, 3})));
    CHECK_BITWISE(gb, xt::xarray<bool>(xt::zeros<bool>({4})));
    CHECK_BITWISE(pn, gn);
    CHECK_BITWISE(pb, gb);
    // An integer first argument, outside any map: zeros of its type.
    CHECK(namedax::grad([](const auto& k) { return static_cast<double>(xt::sum(k)()); })(n) == xt::zeros<int>({4, 3}));
    // cast to float and back: the cotangent is cast back (to float, then to double).
    const xt::xarray<double> c = uniform(rng, {3}, 0.5, 1.5);
    const xt::xarray<double> through_float = namedax::grad([](const auto& t, const auto& w) {
      return namedax::sum(namedax::cast<double>(namedax::cast<float>(t)) * w);
    })(xt::xarray<double>(xt::view(x, 0)), c);
    CHECK_BITWISE(through_float, xt::xarray<double>(xt::cast<double>(xt::cast<float>(c))));
  }

  TEST_CASE("grad outside any map: arrays, doubles, a tuple of parameters; value_and_grad; vjp; the error") {
    std::mt19937 rng(25);
    const xt::xarray<double> x = uniform(rng, {4, 3}, -1, 1);
    const double a = 0.75;
    // An array argument and a double held constant.
    const xt::xarray<double> gx =
        namedax::grad([](const auto& v, double s) { return namedax::sum(namedax::sin(v) * s); })(x, a);
    check_exact("array argument", gx, xt::cos(x) * a);
    // A double argument.
    const double ga = namedax::grad([](const auto& s, const auto& v) { return xt::sum(xt::sin(v))() * s * s; })(a, x);
    CHECK(std::abs(ga - 2 * a * xt::sum(xt::sin(x))()) < 1e-12);
    // A tuple (w, b): r_n = w . x_n + b, loss sum_n r_n^2.
    const xt::xarray<double> w = uniform(rng, {3}, -1, 1);
    const double b = 0.25;
    auto loss = [](const auto& p, const auto& data) {
      const auto& [pw, pb] = p;
      return namedax::sum(namedax::square(namedax::sum(pw * data, 1) + pb));
    };
    xt::xarray<double> gw_expected = xt::zeros<double>({3});
    double gb_expected = 0, value_expected = 0;
    for (std::size_t n = 0; n < 4; ++n) {
      double r = b;
      for (std::size_t k = 0; k < 3; ++k) r += w(k) * x(n, k);
      for (std::size_t k = 0; k < 3; ++k) gw_expected(k) += 2 * r * x(n, k);
      gb_expected += 2 * r;
      value_expected += r * r;
    }
    const auto [gw, gb] = namedax::grad(loss)(std::tuple{w, b}, x);
    check_exact("tuple: w", gw, gw_expected);
    CHECK(std::abs(gb - gb_expected) < 1e-12 * std::abs(gb_expected));
    // An SGD step over the pytree of parameters and its gradient, with tree_map.
    const auto params = std::tuple{w, b};
    const auto stepped = namedax::tree_map(
        [](const auto& p, const auto& g) { return std::remove_cvref_t<decltype(p)>(p - 0.5 * g); }, params,
        namedax::grad(loss)(params, x));
    check_exact("tree_map: w", std::get<0>(stepped), w - 0.5 * gw);
    CHECK(std::get<1>(stepped) == b - 0.5 * gb);
    const auto [value, grads] = namedax::value_and_grad(loss)(std::tuple{w, b}, x);
    CHECK(std::abs(value.value() - value_expected) < 1e-12 * value_expected);
    CHECK_BITWISE(std::get<0>(grads), gw);
    CHECK(std::get<1>(grads) == gb);
    // vjp of a non-scalar function of two arrays, with a given cotangent.
    const xt::xarray<double> y = uniform(rng, {4, 3}, -1, 1);
    const xt::xarray<double> ct = uniform(rng, {4, 3}, -1, 1);
    auto [out, pullback] = namedax::vjp([](const auto& u, const auto& v) { return namedax::sin(u) * v; }, x, y);
    const xt::xarray<double> out_array = out.payload();
    check_exact("vjp: value", out_array, xt::sin(x) * y);
    // The cotangent as a plain array (outside any map), or as a named value of the result's type.
    const auto [dx, dy] = pullback(ct);
    check_exact("vjp: first cotangent", dx, ct * xt::cos(x) * y);
    check_exact("vjp: second cotangent", dy, ct * xt::sin(x));
    const auto [nx, ny] = pullback(decltype(out)(namedax::detail::share_array(xt::xarray<double>(ct))));
    CHECK_BITWISE(nx, dx);
    CHECK_BITWISE(ny, dy);
    // The same inside vmap and pmap, the cotangent mapped.
    auto mapped = [](const auto& u, const auto& v, const auto& c) {
      auto [o, pb] = namedax::vjp([](const auto& p, const auto& q) { return namedax::sin(p) * q; }, u, v);
      return pb(c);
    };
    const auto [mx, my] = namedax::vmap<"i">(mapped)(x, y, ct);
    const auto [qx, qy] = namedax::pmap<"i">(mapped)(x, y, ct);
    check_exact("vjp in vmap: first cotangent", mx, ct * xt::cos(x) * y);
    check_exact("vjp in vmap: second cotangent", my, ct * xt::sin(x));
    CHECK_BITWISE(mx, qx);
    CHECK_BITWISE(my, qy);
    // A result that is not a scalar.
    const std::string message = error_of([&] { (void)namedax::grad([](const auto& v) { return namedax::sin(v); })(x); });
    CHECK(message.find("namedax::grad") != std::string::npos);
    CHECK(message.find("scalar") != std::string::npos);
    CHECK(error_of([&] { (void)namedax::value_and_grad([](const auto& v) { return namedax::sum(v, 0); })(x); })
              .find("namedax::value_and_grad") != std::string::npos);
  }

  TEST_CASE("grad options argnums and has_aux, checkpoint, grad outside the map, jvp: closed forms, vjp, every placement") {
    std::mt19937 rng(38);
    const xt::xarray<double> x = uniform(rng, {4, 3}, -1, 1);
    const xt::xarray<double> w = uniform(rng, {4, 3}, -1, 1);
    const double s = 0.75;
    // argnums: f(a, b, s) = s * sum(a * a * b); d/da = 2 s a b, d/db = s a^2, d/ds = sum(a^2 b).
    auto f = [](const auto& a, const auto& b, const auto& c) { return namedax::sum(a * a * b) * c; };
    const auto [ga, gs] = namedax::grad(f, namedax::argnums<0, 2>)(x, w, s);
    check_exact("argnums<0, 2>: a", ga, 2 * s * x * w);
    CHECK(std::abs(gs - xt::sum(x * x * w)()) < 1e-12);
    const xt::xarray<double> gb = namedax::grad(f, namedax::argnums<1>)(x, w, s);
    check_exact("argnums<1>: b", gb, s * x * x);
    const auto [value, grads] = namedax::value_and_grad(f, namedax::argnums<2, 0>)(x, w, s);
    CHECK(std::abs(value.value() - s * xt::sum(x * x * w)()) < 1e-12);
    CHECK(std::get<0>(grads) == gs);
    CHECK_BITWISE(std::get<1>(grads), ga);
    // has_aux: the function returns (loss, aux); aux comes back as plain values, not traced.
    auto with_aux = [](const auto& a, const auto& b) {
      return std::pair{namedax::sum(namedax::sin(a) * b), std::tuple{namedax::cos(a), 7}};
    };
    const auto [g_aux, aux] = namedax::grad(with_aux, namedax::has_aux)(x, w);
    check_exact("has_aux: gradient", g_aux, xt::cos(x) * w);
    const xt::xarray<double> aux_cos = std::get<0>(aux).payload();
    check_exact("has_aux: aux", aux_cos, xt::cos(x));
    CHECK(std::get<1>(aux) == 7);
    // A constant argument is given as it is (here a plain array), as JAX gives it.
    auto product_with_aux = [](const auto& a, const auto& b) { return std::pair{namedax::sum(a * b * b), 7}; };
    const auto [value_aux, g_value_aux] =
        namedax::value_and_grad(product_with_aux, namedax::has_aux, namedax::argnums<1>)(x, w);
    CHECK(std::abs(value_aux.first.value() - xt::sum(x * w * w)()) < 1e-12);
    CHECK(value_aux.second == 7);
    check_exact("value_and_grad, has_aux, argnums<1>", g_value_aux, 2 * x * w);
    // In vmap and pmap, bit for bit: the gradient of a psum'd loss and a varying aux.
    auto mapped_aux = [&](const auto& a, const auto& b) {
      return namedax::grad(
          [](const auto& p, const auto& q) { return std::pair{namedax::psum(namedax::sum(p * q), "i"_ax), p * 2.0}; },
          namedax::has_aux)(a, b);
    };
    const auto [vg, va] = namedax::vmap<"i">(mapped_aux)(x, w);
    const auto [pg, pa] = namedax::pmap<"i">(mapped_aux)(x, w);
    check_exact("has_aux in vmap: gradient", vg, w);
    check_exact("has_aux in vmap: aux", va, 2.0 * x);
    CHECK_BITWISE(vg, pg);
    CHECK_BITWISE(va, pa);

    // checkpoint: the same gradient, the block's forward run once more in the backward pass.
    std::atomic<int> calls{0};
    auto layer = [&calls](const auto& a, const auto& b) {
      ++calls;
      return namedax::tanh(namedax::sin(a) * b);
    };
    auto remat = namedax::checkpoint(layer);
    const xt::xarray<double> plain = namedax::grad([&](const auto& a) { return namedax::sum(layer(layer(a, w), w)); })(x);
    calls = 0;
    const xt::xarray<double> rematerialized =
        namedax::grad([&](const auto& a) { return namedax::sum(remat(remat(a, w), w)); })(x);
    CHECK(calls == 4);  // two blocks, each forward and again backward
    check_exact("checkpoint", rematerialized, plain);
    // Outside any derivative it is the function itself.
    calls = 0;
    const xt::xarray<double> once = namedax::vmap<"i">(remat)(x, w);
    CHECK(calls == 1);
    check_exact("checkpoint without grad", once, xt::tanh(xt::sin(x) * w));
    // With a collective inside the block, and both operands traced, in vmap and pmap.
    auto mapped_remat = [](const auto& a, const auto& b) {
      auto block = namedax::checkpoint(
          [](const auto& p, const auto& q) { return namedax::tanh(p * namedax::psum(p * q, "i"_ax)); });
      return namedax::grad(
          [&](const auto& p, const auto& q) { return namedax::psum(namedax::sum(block(block(p, q), q)), "i"_ax); },
          namedax::argnums<0, 1>)(a, b);
    };
    auto mapped_plain = [](const auto& a, const auto& b) {
      auto block = [](const auto& p, const auto& q) { return namedax::tanh(p * namedax::psum(p * q, "i"_ax)); };
      return namedax::grad(
          [&](const auto& p, const auto& q) { return namedax::psum(namedax::sum(block(block(p, q), q)), "i"_ax); },
          namedax::argnums<0, 1>)(a, b);
    };
    const auto [rx, rw] = namedax::vmap<"i">(mapped_remat)(x, w);
    const auto [qx, qw] = namedax::pmap<"i">(mapped_remat)(x, w);
    const auto [px, pw] = namedax::vmap<"i">(mapped_plain)(x, w);
    CHECK_BITWISE(rx, qx);
    CHECK_BITWISE(rw, qw);
    check_exact("checkpoint in vmap: x", rx, px);
    check_exact("checkpoint in vmap: w", rw, pw);

    // grad outside the map (JAX's training step): the map's pullback is the map of the
    // function's pullback; a replicated argument's gradient summed over the axis.
    const xt::xarray<double> v = uniform(rng, {3}, -1, 1);
    auto per_example = [](const auto& p, const auto& row) { return namedax::square(namedax::sum(p * row)); };
    auto through_vmap = [&](const auto& p) {
      return namedax::sum(namedax::vmap<"i">(per_example, std::tuple{namedax::none, 0})(p, x));
    };
    auto through_pmap = [&](const auto& p) {
      return namedax::sum(namedax::pmap<"i">(per_example, std::tuple{namedax::none, 0})(p, x));
    };
    auto inside = [&](const auto& p, const auto& row) {
      return namedax::grad([&](const auto& q) { return namedax::psum(per_example(q, row), "i"_ax); })(p);
    };
    const xt::xarray<double> outside_v = namedax::grad(through_vmap)(v);
    const xt::xarray<double> outside_p = namedax::grad(through_pmap)(v);
    const xt::xarray<double> inside_v = namedax::vmap<"i">(inside, std::tuple{namedax::none, 0}, namedax::none)(v, x);
    xt::xarray<double> closed_form = xt::zeros<double>({3});
    for (std::size_t n = 0; n < 4; ++n) closed_form += 2 * xt::sum(v * xt::row(x, n))() * xt::row(x, n);
    check_exact("grad outside vmap", outside_v, closed_form);
    check_exact("grad outside vmap against inside", outside_v, inside_v);
    CHECK_BITWISE(outside_v, outside_p);
    // A mapped argument, a collective inside and an unstacked result (out_axes none).
    auto summed = [](const auto& p, const auto& row) { return namedax::psum(namedax::sum(namedax::sin(row) * p), "i"_ax); };
    auto over_rows = [&](const auto& rows) {
      return namedax::vmap<"i">(summed, std::tuple{namedax::none, 0}, namedax::none)(v, rows);
    };
    auto over_devices = [&](const auto& rows) {
      return namedax::pmap<"i">(summed, std::tuple{namedax::none, 0}, namedax::none)(v, rows);
    };
    const xt::xarray<double> rows_v = namedax::grad(over_rows)(x);
    const xt::xarray<double> rows_p = namedax::grad(over_devices)(x);
    check_exact("grad outside vmap: mapped argument", rows_v, xt::cos(x) * v);
    CHECK_BITWISE(rows_v, rows_p);

    // jvp: the closed form, and <jvp(t), c> == <t, vjp(c)>.
    const xt::xarray<double> t = uniform(rng, {4, 3}, -1, 1);
    const xt::xarray<double> c = uniform(rng, {4, 3}, -1, 1);
    auto g = [](const auto& a, const auto& b) { return namedax::sin(a) * b; };
    const auto [y, dy] = namedax::jvp(g, std::tuple{x, w}, std::tuple{t, c});
    const xt::xarray<double> y_array = y.payload(), dy_array = dy.payload();
    check_exact("jvp: value", y_array, xt::sin(x) * w);
    check_exact("jvp: tangent", dy_array, xt::cos(x) * w * t + xt::sin(x) * c);
    const xt::xarray<double> no_tangent = xt::zeros<double>({4, 3});
    const xt::xarray<double> along_x = namedax::jvp(g, std::tuple{x, w}, std::tuple{t, no_tangent}).second.payload();
    const auto [out, pullback] = namedax::vjp(g, x, w);
    const auto [cx, cw] = pullback(c);
    const double forward = xt::sum(along_x * c)();
    const double backward = xt::sum(t * cx)();
    CHECK(std::abs(forward - backward) < 1e-12 * (1 + std::abs(forward)));
    // A scalar result and a scalar primal.
    const auto [total, d_total] = namedax::jvp([](const auto& a, const auto& k) { return namedax::sum(a * k); },
                                               std::tuple{x, 2.0}, std::tuple{t, 1.0});
    CHECK(std::abs(d_total.value() - (2.0 * xt::sum(t)() + xt::sum(x)())) < 1e-12);
    (void)total;
    // A tangent of another shape than its primal.
    CHECK(error_of([&] { (void)namedax::jvp(g, std::tuple{x, w}, std::tuple{t, xt::xarray<double>({1.0, 2.0})}); })
              .find("namedax::jvp: the tangent of argument 1 has shape (2,) but its primal has shape (4, 3)") != std::string::npos);
  }

  TEST_CASE("grad of pgather: each cotangent added to the element it read, names and positional axes, vmap and pmap") {
    std::mt19937 rng(40);
    const xt::xarray<double> x = uniform(rng, {4, 3}, -1, 1);
    const xt::xarray<double> c = uniform(rng, {4, 2, 3}, -1, 1);
    const xt::xarray<double> c_flat = uniform(rng, {4, 2}, -1, 1);
    // Indices out of range (5, -1, 12, 13) read the fill value and send nothing back.
    const xt::xarray<int> ids = {{3, 0}, {1, 1}, {2, 5}, {-1, 3}};
    const xt::xarray<int> flat_ids = {{11, 0}, {4, 4}, {-1, 12}, {7, 13}};
    auto by_name = [](const auto& a, const auto& id, const auto& ct) {
      return namedax::grad([&](const auto& p) {
        return namedax::psum(namedax::sum(namedax::pgather(p, id, "i"_ax) * ct), "i"_ax);
      })(a);
    };
    auto name_then_dim = [](const auto& a, const auto& id, const auto& ct) {
      return namedax::grad([&](const auto& p) {
        return namedax::psum(namedax::sum(namedax::pgather(p, id, namedax::axes("i"_ax, 0)) * ct), "i"_ax);
      })(a);
    };
    auto dim_then_name = [](const auto& a, const auto& id, const auto& ct) {
      return namedax::grad([&](const auto& p) {
        return namedax::psum(namedax::sum(namedax::pgather(p, id, namedax::axes(0, "i"_ax)) * ct), "i"_ax);
      })(a);
    };
    xt::xarray<double> expected_rows = xt::zeros<double>({4, 3});
    xt::xarray<double> expected_name_dim = xt::zeros<double>({4, 3});
    xt::xarray<double> expected_dim_name = xt::zeros<double>({4, 3});
    for (std::size_t e = 0; e < 4; ++e)
      for (std::size_t k = 0; k < 2; ++k) {
        const int r = ids(e, k);
        if (r >= 0 && r < 4) xt::row(expected_rows, r) += xt::view(c, e, k, xt::all());
        const int f = flat_ids(e, k);
        if (f >= 0 && f < 12) {
          expected_name_dim(f / 3, f % 3) += c_flat(e, k);  // f = i * 3 + position
          expected_dim_name(f % 4, f / 4) += c_flat(e, k);  // f = position * 4 + i
        }
      }
    const xt::xarray<double> v1 = namedax::vmap<"i">(by_name)(x, ids, c);
    const xt::xarray<double> p1 = namedax::pmap<"i">(by_name)(x, ids, c);
    check_exact("pgather over a name", v1, expected_rows);
    CHECK_BITWISE(v1, p1);
    const xt::xarray<double> v2 = namedax::vmap<"i">(name_then_dim)(x, flat_ids, c_flat);
    const xt::xarray<double> p2 = namedax::pmap<"i">(name_then_dim)(x, flat_ids, c_flat);
    check_exact("pgather over axes(\"i\", 0)", v2, expected_name_dim);
    CHECK_BITWISE(v2, p2);
    const xt::xarray<double> v3 = namedax::vmap<"i">(dim_then_name)(x, flat_ids, c_flat);
    const xt::xarray<double> p3 = namedax::pmap<"i">(dim_then_name)(x, flat_ids, c_flat);
    check_exact("pgather over axes(0, \"i\")", v3, expected_dim_name);
    CHECK_BITWISE(v3, p3);
    // The forward value is pgather's own.
    auto gathered = [](const auto& a, const auto& id) {
      return namedax::vjp([&](const auto& p) { return namedax::pgather(p, id, "i"_ax); }, a).first;
    };
    auto plain = [](const auto& a, const auto& id) { return namedax::pgather(a, id, "i"_ax); };
    CHECK_BITWISE(namedax::vmap<"i">(gathered)(x, ids), namedax::vmap<"i">(plain)(x, ids));
    // Outside any map, over a positional dim: a lookup of rows.
    const xt::xarray<int> rows = {2, 0, 2};
    const xt::xarray<double> g_rows = namedax::grad([&](const auto& p) {
      return namedax::sum(namedax::pgather(p, rows, namedax::axes(0)));
    })(x);
    xt::xarray<double> expected_counts = xt::zeros<double>({4, 3});
    xt::row(expected_counts, 0) += 1.0;
    xt::row(expected_counts, 2) += 2.0;
    check_exact("pgather over a positional dim outside maps", g_rows, expected_counts);
  }

  TEST_CASE("grad of ragged_all_to_all: rows sent back in the operand, unwritten rows in the output, vmap and pmap") {
    // JAX's example (two indices along "i", each row a scalar): index 0 sends its row 0 to
    // row 0 of index 0 and its rows 1-2 to rows 0-1 of index 1; index 1 sends its row 0 to
    // row 1 of index 0 and its row 1 to row 2 of index 1.
    const xt::xarray<double> operand = {{1, 2, 2}, {3, 4, 0}};
    const xt::xarray<double> output = xt::zeros<double>({2, 4});
    const xt::xarray<int> input_offsets = {{0, 1}, {0, 1}}, send_sizes = {{1, 2}, {1, 1}};
    const xt::xarray<int> output_offsets = {{0, 0}, {1, 2}}, recv_sizes = {{1, 1}, {2, 1}};
    const xt::xarray<double> c = {{10, 11, 12, 13}, {20, 21, 22, 23}};
    auto grads = [](const auto& x, const auto& o, const auto& io, const auto& ss, const auto& oo, const auto& rs,
                    const auto& ct) {
      return namedax::grad(
          [&](const auto& p, const auto& q) {
            return namedax::psum(namedax::sum(namedax::ragged_all_to_all(p, q, io, ss, oo, rs, "i"_ax) * ct), "i"_ax);
          },
          namedax::argnums<0, 1>)(x, o);
    };
    const auto [v_operand, v_output] =
        namedax::vmap<"i">(grads)(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, c);
    // The asynchronous form under grad: the blocking form at start, the same gradients.
    auto started = [](const auto& x, const auto& o, const auto& io, const auto& ss, const auto& oo, const auto& rs,
                      const auto& ct) {
      return namedax::grad(
          [&](const auto& p, const auto& q) {
            auto h = namedax::async::ragged_all_to_all(p, q, io, ss, oo, rs, "i"_ax);
            return namedax::psum(namedax::sum(h.wait() * ct), "i"_ax);
          },
          namedax::argnums<0, 1>)(x, o);
    };
    const auto [a_operand, a_output] =
        namedax::pmap<"i">(started)(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, c);
    CHECK_BITWISE(a_operand, v_operand);
    CHECK_BITWISE(a_output, v_output);
    const auto [p_operand, p_output] =
        namedax::pmap<"i">(grads)(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, c);
    // Each operand row gets the cotangent of the row it landed in; a row not sent gets 0.
    const xt::xarray<double> expected_operand = {{10, 20, 21}, {11, 22, 0}};
    // Each output row a sender wrote gets 0, the others their cotangent.
    const xt::xarray<double> expected_output = {{0, 0, 12, 13}, {0, 0, 0, 23}};
    check_exact("ragged_all_to_all: operand", v_operand, expected_operand);
    check_exact("ragged_all_to_all: output", v_output, expected_output);
    CHECK_BITWISE(v_operand, p_operand);
    CHECK_BITWISE(v_output, p_output);
  }

  TEST_CASE("grad of all_gather_v: each row's cotangent back to its row, zero past the count, vmap, pmap and nested") {
    // Along "i" of size 3, index r contributes its first counts[r] of 3 rows; the gather holds
    // counts[0] + counts[1] + counts[2] rows. Row k < counts[r] of index r lands at row
    // offset_r + k, offset_r the counts before r.
    const xt::xarray<double> x = {{{0.1, 0.2}, {0.3, 0.4}, {0.5, 0.6}},
                                  {{0.7, 0.8}, {0.9, 1.0}, {1.1, 1.2}},
                                  {{1.3, 1.4}, {1.5, 1.6}, {1.7, 1.8}}};
    const xt::xarray<double> w = xt::arange<double>(1, 13).reshape({6, 2});
    // What grad must give: cos(x) w[offset_r + k] times `scale` for the rows that are sent.
    auto expected = [&](const xt::xarray<int>& counts, double scale) {
      xt::xarray<double> g = xt::zeros<double>(x.shape());
      for (std::size_t r = 0, offset = 0; r < 3; offset += static_cast<std::size_t>(counts(r)), ++r)
        for (std::size_t k = 0; k < static_cast<std::size_t>(counts(r)); ++k)
          for (std::size_t d = 0; d < 2; ++d) g(r, k, d) = std::cos(x(r, k, d)) * w(offset + k, d) * scale;
      return g;
    };
    // An invariant cotangent (each index takes its own rows) and one that varies along "i"
    // (weights 1, 2, 3: summed over the indices first, 6 times the rows' cotangent).
    auto grads = [&w](const auto& xs, const auto& count) {
      auto invariant = namedax::grad([&](const auto& u) {
        auto g = namedax::all_gather_v(u, count, "i"_ax);
        return namedax::sum(namedax::sin(g) * w);
      })(xs);
      auto varying = namedax::grad([&](const auto& u) {
        auto g = namedax::all_gather_v(u, count, "i"_ax);
        auto weight = namedax::cast<double>(namedax::axis_index("i"_ax) + 1);
        return namedax::psum(namedax::sum(namedax::sin(g) * w * weight), "i"_ax);
      })(xs);
      return std::tuple{invariant, varying};
    };
    const xt::xarray<int> counts = {2, 1, 3};
    const auto [v_invariant, v_varying] = namedax::vmap<"i">(grads)(x, counts);
    const auto [p_invariant, p_varying] = namedax::pmap<"i">(grads)(x, counts);
    check_exact("all_gather_v: invariant cotangent", v_invariant, expected(counts, 1));
    CHECK(relative_error(v_varying, expected(counts, 6)) < 1e-14);
    CHECK_BITWISE(v_invariant, p_invariant);
    CHECK_BITWISE(v_varying, p_varying);

    // Under a vmap over "b" whose two elements gather 6 and 4 rows: the second is padded with
    // zero rows to 6, which send nothing back.
    const xt::xarray<int> counts_b = {{2, 1, 3}, {0, 3, 1}};
    const xt::xarray<double> x_b = xt::stack(xt::xtuple(x, x));
    auto invariant_only = [&](const auto& xs, const auto& count) { return std::get<0>(grads(xs, count)); };
    const xt::xarray<double> vv = namedax::vmap<"b">(namedax::vmap<"i">(invariant_only))(x_b, counts_b);
    const xt::xarray<double> vp = namedax::vmap<"b">(namedax::pmap<"i">(invariant_only))(x_b, counts_b);
    check_exact("all_gather_v under vmap: element 0", xt::view(vv, 0), expected(xt::view(counts_b, 0), 1));
    check_exact("all_gather_v under vmap: element 1", xt::view(vv, 1), expected(xt::view(counts_b, 1), 1));
    CHECK_BITWISE(vv, vp);

    // A count computed from axis_index (3, 2, 1), which the pullback resolves as the gather did.
    auto from_index = [&](const auto& xs) { return std::get<0>(grads(xs, 3 - namedax::axis_index("i"_ax))); };
    const xt::xarray<double> vi = namedax::vmap<"i">(from_index)(x);
    check_exact("all_gather_v of an axis_index count", vi, expected(xt::xarray<int>{3, 2, 1}, 1));
    CHECK_BITWISE(vi, namedax::pmap<"i">(from_index)(x));
  }

  TEST_CASE("the asynchronous all_gather_v, pgather and pargmin under grad: the blocking forms' gradient, bit for bit") {
    const xt::xarray<double> x = {{1.0, 2.0, 3.0}, {4.0, 5.0, 6.0}};
    const xt::xarray<int> counts = {2, 1};
    auto started = [](const auto& xs, const auto& count) {
      return namedax::grad([&](const auto& u) {
        auto gathered = namedax::async::all_gather_v(u, count, "i"_ax);
        auto index = namedax::async::pargmin(u, "i"_ax);  // a constant: its wait only has to work
        auto looked_up = namedax::async::pgather(u, xt::xarray<int>{1, 0}, "i"_ax);
        return namedax::sum(namedax::sin(gathered.wait())) + namedax::sum(namedax::sin(looked_up.wait())) +
               namedax::sum(namedax::cast<double>(index.wait())) * 0.0;
      })(xs);
    };
    auto blocking = [](const auto& xs, const auto& count) {
      return namedax::grad([&](const auto& u) {
        return namedax::sum(namedax::sin(namedax::all_gather_v(u, count, "i"_ax))) +
               namedax::sum(namedax::sin(namedax::pgather(u, xt::xarray<int>{1, 0}, "i"_ax)));
      })(xs);
    };
    const xt::xarray<double> v = namedax::vmap<"i">(started)(x, counts);
    CHECK_BITWISE(v, namedax::vmap<"i">(blocking)(x, counts));
    CHECK_BITWISE(v, namedax::pmap<"i">(started)(x, counts));
    CHECK(xt::amax(xt::abs(v))() > 0.1);  // not vacuous
  }

  TEST_CASE("grad through isclose, the logical operators, any and all: constants on the primal, vmap and pmap") {
    // where(cond, u * u, 3 u): the condition is a constant, so the gradient is 2 u where it
    // holds and 3 elsewhere. Each predicate takes a traced operand (`u && ...`, `!(u * 0)`,
    // `all(u)`: every element nonzero).
    const xt::xarray<double> x = {{0.5, 1.0, 2.5}, {1.0, 3.0, 0.25}};
    auto f = [](const auto& xs) {
      return namedax::grad([](const auto& u) {
        const auto cond = (namedax::isclose(u, 1.0) || (u < 2.0 && u)) && !(u * 0.0) && namedax::all(u) &&
                          !namedax::any(u * 0.0, 0);
        return namedax::sum(namedax::where(cond, u * u, 3.0 * u));
      })(xs);
    };
    const xt::xarray<double> expected = {{1.0, 2.0, 3.0}, {2.0, 3.0, 0.5}};
    const xt::xarray<double> v = namedax::vmap<"i">(f)(x);
    const xt::xarray<double> p = namedax::pmap<"i">(f)(x);
    check_exact("constants", v, expected);
    CHECK_BITWISE(v, p);
  }

  TEST_CASE("custom_vjp and custom_jvp: the user's derivative is used, outside and inside maps, every placement") {
    std::mt19937 rng(39);
    const xt::xarray<double> x = uniform(rng, {4, 3}, -1, 1);
    const xt::xarray<double> w = uniform(rng, {4, 3}, 0.5, 2);
    // sin with its cosine kept by fwd: the gradient of the plain function, bit for bit.
    std::atomic<int> f_calls{0}, fwd_calls{0}, bwd_calls{0};
    auto sine = namedax::custom_vjp(
        [&](const auto& a) {
          ++f_calls;
          return namedax::sin(a);
        },
        [&](const auto& a) {
          ++fwd_calls;
          return std::pair{namedax::sin(a), namedax::cos(a)};
        },
        [&](const auto& cosine, const auto& ct) {
          ++bwd_calls;
          return std::tuple{ct * cosine};
        });
    const xt::xarray<double> g_sine = namedax::grad([&](const auto& a) { return namedax::sum(sine(a) * w); })(x);
    const xt::xarray<double> g_plain = namedax::grad([&](const auto& a) { return namedax::sum(namedax::sin(a) * w); })(x);
    CHECK_BITWISE(g_sine, g_plain);
    CHECK(f_calls == 0);  // under a derivative fwd computes the result
    CHECK(fwd_calls == 1);
    CHECK(bwd_calls == 1);
    // Outside any derivative, f alone runs.
    const xt::xarray<double> y_sine = namedax::vmap<"i">(sine)(x);
    CHECK_BITWISE(y_sine, xt::xarray<double>(xt::sin(x)));
    CHECK(f_calls == 1);
    CHECK(fwd_calls == 1);
    CHECK(bwd_calls == 1);

    // jax's clip_gradient: the identity forward, the cotangent clipped backward; the bounds are
    // constants (their cotangents ignored), the rule is the user's, not the identity's.
    auto clip_gradient = namedax::custom_vjp([](double, double, const auto& a) { return a * 1.0; },
                                             [](double lo, double hi, const auto& a) {
                                               return std::pair{a * 1.0, std::pair{lo, hi}};
                                             },
                                             [](const auto& bounds, const auto& ct) {
                                               return std::tuple{0.0, 0.0, namedax::clip(ct, bounds.first, bounds.second)};
                                             });
    const xt::xarray<double> g_clipped =
        namedax::grad([&](const auto& a) { return namedax::sum(clip_gradient(-1.0, 1.0, a) * w); })(x);
    check_exact("clip_gradient", g_clipped, xt::clip(w, -1.0, 1.0));
    // One argument's cotangent may be returned alone.
    auto doubled = namedax::custom_vjp([](const auto& a) { return a * 1.0; },
                                       [](const auto& a) { return std::pair{a * 1.0, 0}; },
                                       [](int, const auto& ct) { return ct * 2.0; });
    check_exact("a cotangent alone",
                namedax::grad([&](const auto& a) { return namedax::sum(doubled(a)); })(x), xt::full_like(x, 2.0));

    // A collective in f, fwd and bwd: y = x psum(x); dL/dx_j = c_j S + psum(c x) with S the
    // psum. In vmap and pmap bit for bit, and against the plain function's gradient.
    auto scaled = [](const auto& a) { return a * namedax::psum(a, "i"_ax); };
    auto custom_scaled = namedax::custom_vjp(
        scaled,
        [](const auto& a) {
          auto s = namedax::eval(namedax::psum(a, "i"_ax));
          return std::pair{a * s, std::pair{a, s}};
        },
        [](const auto& kept, const auto& ct) {
          const auto& [a, s] = kept;
          return std::tuple{ct * s + namedax::psum(ct * a, "i"_ax)};
        });
    auto grad_in_map = [](const auto& g) {
      return [g](const auto& a, const auto& c) {
        return namedax::grad([&](const auto& p) { return namedax::psum(namedax::sum(g(p) * c), "i"_ax); })(a);
      };
    };
    const xt::xarray<double> cv = namedax::vmap<"i">(grad_in_map(custom_scaled))(x, w);
    const xt::xarray<double> cp = namedax::pmap<"i">(grad_in_map(custom_scaled))(x, w);
    const xt::xarray<double> pv = namedax::vmap<"i">(grad_in_map(scaled))(x, w);
    CHECK_BITWISE(cv, cp);
    check_exact("custom_vjp with collectives", cv, pv);
    // grad outside the map: the map's pullback runs the user's bwd on every index.
    auto through_map = [&](const auto& g) {
      return [&, g](const auto& a) { return namedax::sum(namedax::vmap<"i">([&](const auto& p, const auto& c) {
                                      return namedax::psum(namedax::sum(g(p) * c), "i"_ax);
                                    }, std::tuple{0, 0}, namedax::none)(a, w)); };
    };
    check_exact("custom_vjp, grad outside vmap", namedax::grad(through_map(custom_scaled))(x), cv);

    // custom_jvp: the tangent map's transpose is the pullback. A rule that is not the true
    // derivative (2 t for the identity) shows it is the one used.
    auto twice = namedax::custom_jvp([](const auto& a) { return a * 1.0; },
                                     [](const auto& p, const auto& t) {
                                       return std::pair{std::get<0>(p) * 1.0, std::get<0>(t) * 2.0};
                                     });
    check_exact("custom_jvp's own rule", namedax::grad([&](const auto& a) { return namedax::sum(twice(a) * w); })(x),
                2.0 * w);
    auto cube = namedax::custom_jvp([](const auto& a) { return a * a * a; },
                                    [](const auto& p, const auto& t) {
                                      const auto& [a] = p;
                                      return std::pair{a * a * a, 3.0 * a * a * std::get<0>(t)};
                                    });
    check_exact("custom_jvp of x^3", namedax::grad([&](const auto& a) { return namedax::sum(cube(a) * w); })(x),
                3.0 * x * x * w);
    const xt::xarray<double> t = uniform(rng, {4, 3}, -1, 1);
    const auto [cube_value, cube_tangent] = namedax::jvp(cube, std::tuple{x}, std::tuple{t});
    const xt::xarray<double> cube_t = cube_tangent.payload(), cube_y = cube_value.payload();
    check_exact("jvp of a custom_jvp function", cube_t, 3.0 * x * x * t);
    check_exact("its value", cube_y, x * x * x);
    // A collective in the tangent map: psum's transpose found by reverse mode, in vmap and pmap.
    auto custom_psum = namedax::custom_jvp([](const auto& a) { return namedax::psum(a, "i"_ax); },
                                           [](const auto& p, const auto& t) {
                                             return std::pair{namedax::psum(std::get<0>(p), "i"_ax),
                                                              namedax::psum(std::get<0>(t), "i"_ax)};
                                           });
    auto plain_psum = [](const auto& a) { return namedax::psum(a, "i"_ax); };
    auto grad_of_psum = [](const auto& g) {
      return [g](const auto& a, const auto& c) {
        return namedax::grad([&](const auto& p) { return namedax::sum(namedax::sin(g(p * c))); })(a);
      };
    };
    const xt::xarray<double> jv = namedax::vmap<"i">(grad_of_psum(custom_psum))(x, w);
    const xt::xarray<double> jp = namedax::pmap<"i">(grad_of_psum(custom_psum))(x, w);
    const xt::xarray<double> jq = namedax::vmap<"i">(grad_of_psum(plain_psum))(x, w);
    CHECK_BITWISE(jv, jp);
    CHECK_BITWISE(jv, jq);

    // A fault in the backward pass: one device's bwd throws while the others wait in the psum
    // of theirs. Every device leaves, none hangs, and pmap rethrows the exception, with grad
    // inside the map and in the backward map of grad outside it.
    std::atomic<int> backward_calls{0};
    auto failing = namedax::custom_vjp([](const auto& a) { return a * 1.0; },
                                       [](const auto& a) { return std::pair{a * 1.0, 0}; },
                                       [&](int, const auto& ct) {
                                         if (backward_calls++ == 1) throw std::runtime_error("bwd failed");
                                         return namedax::psum(ct, "i"_ax) * 1.0;
                                       });
    auto thrown = [](const auto& run) -> std::string {
      try {
        run();
      } catch (const std::runtime_error& e) {
        return e.what();
      }
      return "no error";
    };
    auto inside_pmap = [&](const auto& a, const auto& c) {
      return namedax::grad([&](const auto& p) { return namedax::psum(namedax::sum(failing(p) * c), "i"_ax); })(a);
    };
    CHECK(thrown([&] { (void)namedax::pmap<"i">(inside_pmap)(x, w); }).find("bwd failed") != std::string::npos);
    backward_calls = 0;
    auto per_device = [&](const auto& p, const auto& c) { return namedax::sum(failing(p) * c); };
    auto outside_pmap = [&](const auto& a) { return namedax::sum(namedax::pmap<"i">(per_device)(a, w)); };
    CHECK(thrown([&] { (void)namedax::grad(outside_pmap)(x); }).find("bwd failed") != std::string::npos);
    // The runtime is usable afterwards: the gradient without the fault, each row the psum of
    // the cotangents (w's column sums).
    backward_calls = 2;
    const xt::xarray<double> recovered = namedax::grad(outside_pmap)(x);
    const xt::xarray<double> column_sums = xt::broadcast(xt::sum(w, {0}), x.shape());
    check_exact("after a fault in the backward map", recovered, column_sums);
  }

  TEST_CASE("checkpoint, custom_vjp and custom_jvp returning a pytree: vmap and pmap against the closed form") {
    const xt::xarray<double> x = {{0.1, 0.2, 0.3}, {0.4, 0.5, 0.6}};
    auto two = [](const auto& u) { return std::pair{namedax::sin(u), namedax::sum(u * u)}; };
    const auto remat = namedax::checkpoint(two);
    const auto own_vjp = namedax::custom_vjp(
        two, [&two](const auto& u) { return std::pair{two(u), u}; },
        [](const auto& u, const auto& ct) { return namedax::cos(u) * ct.first + 2.0 * u * ct.second; });
    const auto own_jvp = namedax::custom_jvp(
        [](const auto& u) { return std::tuple{namedax::exp(u), u * 2.0}; },
        [](const auto& p, const auto& t) {
          const auto& u = std::get<0>(p);
          const auto& du = std::get<0>(t);
          return std::pair{std::tuple{namedax::exp(u), u * 2.0}, std::tuple{namedax::exp(u) * du, du * 2.0}};
        });
    auto f = [&](const auto& row) {
      return namedax::grad([&](const auto& u) {
        const auto [a, b] = remat(u);
        const auto [c, d] = own_jvp(u);
        const auto [e, g] = own_vjp(u);
        return namedax::sum(a * a) + b * 3.0 + namedax::sum(c) + namedax::sum(d) + namedax::sum(e) + g;
      })(row);
    };
    const xt::xarray<double> expected = 2.0 * xt::sin(x) * xt::cos(x) + 6.0 * x + xt::exp(x) + 2.0 + xt::cos(x) + 2.0 * x;
    const xt::xarray<double> v = namedax::vmap<"i">(f)(x);
    CHECK(relative_error(v, expected) < 1e-14);
    CHECK_BITWISE(v, namedax::pmap<"i">(f)(x));
  }

  TEST_CASE("vjp: a cotangent of another shape than the output is a namedax::error naming both shapes") {
    std::mt19937 rng(27);
    const xt::xarray<double> x = uniform(rng, {2, 3}, -1, 1);
    const xt::xarray<double> ct = uniform(rng, {2, 3}, -1, 1);
    const xt::xarray<double> transposed_ct = xt::transpose(ct);
    const std::string fix = "; give the pullback a cotangent of the output's shape, as jax.vjp";
    const std::string transposed = "namedax::vjp: the cotangent has positional shape (3, 2) but the output it stands "
                                   "for has positional shape (2, 3) (dim 0 has size 3, not 2)" + fix;
    // Not structured bindings: the lambdas below capture them (clang 14).
    auto sin_vjp = namedax::vjp([](const auto& u) { return namedax::sin(u); }, x);
    using Y = decltype(sin_vjp.first);
    const auto& pullback = sin_vjp.second;
    // Fewer dims, which xtensor would broadcast silently; the same rank with other sizes, as a
    // plain array and as a named value of the output's type; a scalar.
    CHECK(error_of([&] { (void)pullback(xt::xarray<double>{1.0, 2.0, 3.0}); }) ==
          "namedax::vjp: the cotangent has positional shape (3,) but the output it stands for has positional shape "
          "(2, 3) (rank 1, not 2)" + fix);
    CHECK(error_of([&] { (void)pullback(transposed_ct); }) == transposed);
    CHECK(error_of([&] { (void)pullback(Y(namedax::detail::share_array(xt::xarray<double>(transposed_ct)))); }) == transposed);
    CHECK(error_of([&] { (void)pullback(2.0); }) ==
          "namedax::vjp: the cotangent has positional shape () but the output it stands for has positional shape "
          "(2, 3) (rank 0, not 2)" + fix);
    // The refused calls recorded nothing: the pullback still gives the right cotangent.
    check_exact("after the errors", std::get<0>(pullback(ct)), ct * xt::cos(x));
    // A scalar is the cotangent of a scalar result.
    auto [sum_of_sin, scalar_pullback] = namedax::vjp([](const auto& u) { return namedax::sum(namedax::sin(u)); }, x);
    check_exact("a scalar cotangent", std::get<0>(scalar_pullback(2.0)), 2.0 * xt::cos(x));
    // A pytree result: each leaf is checked, and named.
    auto pair_vjp = namedax::vjp([](const auto& u) { return std::tuple{namedax::sin(u), namedax::sum(u)}; }, x);
    const auto& pair_pullback = pair_vjp.second;
    CHECK(error_of([&] { (void)pair_pullback(std::tuple{ct, xt::xarray<double>{1.0, 2.0}}); }) ==
          "namedax::vjp: the cotangent of result 1 has positional shape (2,) but the output it stands for has "
          "positional shape () (rank 1, not 0)" + fix);
    CHECK(error_of([&] { (void)pair_pullback(std::tuple{transposed_ct, 1.0}); }) ==
          "namedax::vjp: the cotangent of result 0 has positional shape (3, 2) but the output it stands for has "
          "positional shape (2, 3) (dim 0 has size 3, not 2)" + fix);
    check_exact("a pytree cotangent", std::get<0>(pair_pullback(std::tuple{ct, 2.0})), ct * xt::cos(x) + 2.0);
    // Inside vmap and pmap: a mapped cotangent (the positional shapes compared, the mapped
    // axis apart), and a plain array, a constant for every index.
    const xt::xarray<double> xs = uniform(rng, {4, 2, 3}, -1, 1);
    const xt::xarray<double> cts = uniform(rng, {4, 3, 2}, -1, 1);
    auto mapped = [](const auto& u, const auto& c) {
      auto [o, pb] = namedax::vjp([](const auto& v) { return namedax::sin(v); }, u);
      return std::get<0>(pb(c));
    };
    CHECK(error_of([&] { (void)namedax::vmap<"i">(mapped)(xs, cts); }) == transposed);
    CHECK(error_of([&] { (void)namedax::pmap<"i">(mapped)(xs, cts); }) == transposed);
    auto constant = [ct = transposed_ct](const auto& u) {
      auto [o, pb] = namedax::vjp([](const auto& v) { return namedax::sin(v); }, u);
      return std::get<0>(pb(ct));
    };
    CHECK(error_of([&] { (void)namedax::vmap<"i">(constant)(xs); }) == transposed);
    CHECK(error_of([&] { (void)namedax::pmap<"i">(constant)(xs); }) == transposed);
  }

  TEST_CASE("custom_vjp's cotangent and custom_jvp's tangent of another shape: a namedax::error, one text in every placement") {
    const xt::xarray<double> x = xt::ones<double>({4, 3});
    auto wrong_bwd = namedax::custom_vjp([](const auto& a) { return a * 2.0; },
                                         [](const auto& a) { return std::pair{a * 2.0, 0}; },
                                         [](int, const auto&) { return std::tuple{xt::xarray<double>{1, 2, 3, 4, 5}}; });
    auto wrong_jvp = namedax::custom_jvp([](const auto& a) { return a * 2.0; }, [](const auto& primals, const auto& tangents) {
      return std::pair{std::get<0>(primals) * 2.0, namedax::sum(std::get<0>(tangents))};
    });
    auto loss_of = [](auto f) {
      return [f](const auto& row) { return namedax::grad([&](const auto& a) { return namedax::sum(f(a)); })(row); };
    };
    const std::string bwd_error = "namedax::custom_vjp: bwd's cotangent for argument 0 has positional shape (5,) but the "
                                  "argument has positional shape (3,) (dim 0 has size 5, not 3); return a cotangent of "
                                  "each argument's shape";
    const std::string jvp_error = "namedax::custom_jvp: jvp's tangent has positional shape () but the result it stands "
                                  "for has positional shape (3,) (rank 0, not 1); return a tangent of the result's shape";
    CHECK(error_of([&] { (void)namedax::vmap<"i">(loss_of(wrong_bwd))(x); }) == bwd_error);
    CHECK(error_of([&] { (void)namedax::pmap<"i">(loss_of(wrong_bwd))(x); }) == bwd_error);
    CHECK(error_of([&] { (void)namedax::vmap<"i">(loss_of(wrong_jvp))(x); }) == jvp_error);
    CHECK(error_of([&] { (void)namedax::pmap<"i">(loss_of(wrong_jvp))(x); }) == jvp_error);
  }

  TEST_CASE("grad of a function that closes over a traced value of an enclosing grad: an error, not a constant") {
    const xt::xarray<double> x{0.5, 1.0};
    // d/dx sum(x * g(x)), g(x) the gradient of sum(u * x) in u: x, so the result is 2 x, which
    // a nested derivative would give; without one, the inner gradient is not a constant.
    auto outer = [](const auto& t) {
      const xt::xarray<double> ones = xt::ones<double>({2});
      auto inner = namedax::grad([&t](const auto& u) { return namedax::sum(u * t); })(ones);
      return namedax::sum(t * inner);
    };
    CHECK(error_of([&] { (void)namedax::grad(outer)(x); }) ==
          "namedax::grad: higher-order derivatives are not supported yet: the function given to grad uses a traced "
          "value of an enclosing grad or vjp (captured, not passed as an argument); hold it constant with "
          "namedax::stop_gradient");
    // Held constant, as the message says: the gradient of sum(x * stop_gradient(x)).
    auto held = [](const auto& t) {
      const xt::xarray<double> ones = xt::ones<double>({2});
      auto inner = namedax::grad([&t](const auto& u) { return namedax::sum(u * namedax::stop_gradient(t)); })(ones);
      return namedax::sum(t * inner);
    };
    check_exact("held constant", namedax::grad(held)(x), x);
  }

  TEST_CASE("grad inside shard_map over a mesh of a device axis and a vectorized axis") {
    std::mt19937 rng(26);
    namedax::mesh m{namedax::devices<"i">(2), namedax::vectorized<"j">(2)};
    const xt::xarray<double> w = uniform(rng, {3}, 0.2, 0.8);
    const xt::xarray<double> x = uniform(rng, {8, 3}, 0.2, 0.8);
    // Each block of 2 rows: sum(sin(w x)), averaged over "j": the total is half the sum over rows.
    auto body = [](const auto& pw, const auto& block) {
      return namedax::grad([](const auto& t, const auto& data) {
        return namedax::pmean(namedax::sum(namedax::sin(t * data)), "j"_ax);
      })(pw, block);
    };
    const auto in_specs = std::tuple{namedax::P(), namedax::P(namedax::axes("i"_ax, "j"_ax))};
    const xt::xarray<double> g = namedax::shard_map(body, m, in_specs, namedax::P())(w, x);
    const xt::xarray<double> expected = 0.5 * xt::sum(xt::cos(w * x) * x, {0});
    check_exact("mesh", g, expected);
  }

  TEST_CASE("grad inside shard_map on a mixed mesh: all_gather_v, async, pgather and custom_jvp against finite differences") {
    std::mt19937 rng(41);
    namedax::mesh m{namedax::devices<"i">(2), namedax::vectorized<"j">(2)};
    const xt::xarray<double> x = uniform(rng, {6, 4}, 0.2, 0.8);  // a block of 3 x 2 per index
    const xt::xarray<double> c = uniform(rng, {6, 4}, 0.5, 1.5);
    // all_gather_v's counts per (i, j): along "i", j = 0 gathers 2 + 1 rows and j = 1 gathers 3 + 0.
    const xt::xarray<int> counts = {{2, 3}, {1, 0}};
    auto softplus = namedax::custom_jvp([](const auto& v) { return namedax::log1p(namedax::exp(v)); },
                                        [](const auto& p, const auto& t) {
                                          const auto& [v] = p;
                                          return std::pair{namedax::log1p(namedax::exp(v)), namedax::sigmoid(v) * std::get<0>(t)};
                                        });
    // The loss of one block, summed over the mesh.
    auto loss = [softplus](const auto& u, const auto& w, const auto& count) {
      const auto gathered = namedax::all_gather_v(u, namedax::sum(count), "i"_ax);
      auto summed = namedax::async::psum(u * w, "j"_ax);
      auto swapped = namedax::async::ppermute(u, "i"_ax, {{0, 1}, {1, 0}});
      const auto looked_up = namedax::pgather(u, xt::xarray<int>{1, 0}, "i"_ax);
      const auto l = namedax::sum(namedax::sin(gathered) * gathered) + namedax::sum(summed.wait() * w) +
                     namedax::sum(swapped.wait() * w * u) + namedax::sum(namedax::sin(looked_up)) +
                     namedax::sum(softplus(u) * w);
      return namedax::psum(l, namedax::axes("i"_ax, "j"_ax));
    };
    const auto block = namedax::P("i"_ax, "j"_ax);
    const auto in_specs = std::tuple{block, block, block};
    auto grad_body = [loss](const auto& u, const auto& w, const auto& count) {
      return namedax::grad([&](const auto& t) { return loss(t, w, count); })(u);
    };
    const xt::xarray<double> g = namedax::shard_map(grad_body, m, in_specs, block)(x, c, counts);
    auto at = [&](const xt::xarray<double>& point) {
      return first(namedax::shard_map(loss, m, in_specs, namedax::P())(point, c, counts));
    };
    check_close("shard_map on a mixed mesh", g, finite_difference(at, x));
  }

  TEST_CASE("grad of mod and floor_divide: 1 and -floor_divide(a, b) for mod, zero for floor_divide, vmap and pmap") {
    // Rows mapped along "i", mixed signs: floor_divide(a, b) is {{1, -2}, {-3, -1}}.
    const xt::xarray<double> a{{2.5, -2.5}, {7.0, -0.5}}, b{{2.0, 2.0}, {-3.0, 0.75}};
    auto f = [](const auto& a, const auto& b) {
      auto loss = [](const auto& p, const auto& q) {
        return namedax::sum(namedax::mod(p, q) * 2.0 + namedax::floor_divide(p, q) * 5.0);
      };
      return namedax::grad(loss, namedax::argnums<0, 1>)(a, b);
    };
    const xt::xarray<double> da{{2.0, 2.0}, {2.0, 2.0}}, db{{-2.0, 4.0}, {6.0, 2.0}};
    for (const auto& [ga, gb] : {namedax::vmap<"i">(f)(a, b), namedax::pmap<"i">(f)(a, b)}) {
      CHECK_BITWISE(ga, da);
      CHECK_BITWISE(gb, db);
    }
  }

  TEST_CASE("linearize, jacrev and jacfwd outside maps: closed forms, against jvp, a 2-D Jacobian") {
    std::mt19937 rng(43);
    const xt::xarray<double> x = uniform(rng, {3}, -1, 1), w = uniform(rng, {3}, -1, 1), t = uniform(rng, {3}, -1, 1);
    const xt::xarray<double> zero = xt::zeros<double>({3});
    auto g = [](const auto& a, const auto& b) { return namedax::sin(a) * b; };
    // linearize: f runs once; its linear map is jvp's tangent, bit for bit, for every tangent.
    const auto [y, f_jvp] = namedax::linearize(g, x, w);
    check_exact("linearize: value", xt::xarray<double>(y.payload()), xt::sin(x) * w);
    const xt::xarray<double> along_x = f_jvp(t, zero).payload();
    check_exact("linearize along x", along_x, xt::cos(x) * w * t);
    CHECK_BITWISE(along_x, xt::xarray<double>(namedax::jvp(g, std::tuple{x, w}, std::tuple{t, zero}).second.payload()));
    check_exact("linearize along w, called again", xt::xarray<double>(f_jvp(zero, t).payload()), xt::sin(x) * t);
    // jacrev: d(sin(x) w)_i / dx_j = cos(x_i) w_i on the diagonal; jacfwd the same bits.
    const xt::xarray<double> jacobian = namedax::jacrev(g)(x, w);
    xt::xarray<double> diagonal = xt::zeros<double>({3, 3});
    for (std::size_t i = 0; i < 3; ++i) diagonal(i, i) = std::cos(x(i)) * w(i);
    check_exact("jacrev", jacobian, diagonal);
    CHECK_BITWISE(jacobian, xt::xarray<double>(namedax::jacfwd(g)(x, w)));
    check_exact("J t against linearize", xt::xarray<double>(xt::sum(jacobian * t, {1})), along_x);
    CHECK_BITWISE(xt::xarray<double>(namedax::jacrev([](auto v) { return namedax::square(v); })(xt::xarray<double>{1., 2.})),
                  (xt::xarray<double>{{2., 0.}, {0., 4.}}));  // {{2., 0.}, {0., 4.}}
    // A 2-D argument and a 1-D result: d(sum_l a(k, l)^2)_i / da(k, l) = 2 a(k, l) where i = k.
    const xt::xarray<double> a = uniform(rng, {2, 3}, -1, 1);
    const xt::xarray<double> rows = namedax::jacrev([](const auto& v) { return namedax::sum(v * v, 1); })(a);
    REQUIRE(std::vector<std::size_t>(rows.shape().begin(), rows.shape().end()) == std::vector<std::size_t>{2, 2, 3});
    xt::xarray<double> expected = xt::zeros<double>({2, 2, 3});
    for (std::size_t k = 0; k < 2; ++k)
      for (std::size_t l = 0; l < 3; ++l) expected(k, k, l) = 2 * a(k, l);
    check_exact("jacrev, 2-D", rows, expected);
    // A scalar result: the Jacobian is the gradient.
    auto total = [](const auto& v) { return namedax::sum(namedax::square(v)); };
    CHECK_BITWISE(xt::xarray<double>(namedax::jacrev(total)(x)), xt::xarray<double>(namedax::grad(total)(x)));
  }

  TEST_CASE("jacrev inside maps: per-row Jacobians in vmap and pmap, nested maps, a collective inside, bit for bit") {
    const xt::xarray<double> x = {{0.1, 0.2, 0.3}, {0.4, 0.5, 0.6}};
    const xt::xarray<double> w = {1.0, -2.0, 0.5};
    // jax.vmap(jax.jacrev(f)): each row's Jacobian of sin(row) w, diag(cos(row) w).
    auto per_row = [&](const auto& row) { return namedax::jacrev([&](const auto& v) { return namedax::sin(v) * w; })(row); };
    const xt::xarray<double> jv = namedax::vmap<"i">(per_row)(x);
    xt::xarray<double> expected = xt::zeros<double>({2, 3, 3});
    for (std::size_t r = 0; r < 2; ++r)
      for (std::size_t k = 0; k < 3; ++k) expected(r, k, k) = std::cos(x(r, k)) * w(k);
    check_exact("vmap of jacrev", jv, expected);
    CHECK_BITWISE(jv, namedax::pmap<"i">(per_row)(x));
    // Nested maps: the rows of a 3-D array, two map axes; each index's Jacobian is the same.
    const xt::xarray<double> x3 = xt::stack(xt::xtuple(x, 2.0 * x));
    const xt::xarray<double> nested = namedax::vmap<"b">(namedax::pmap<"i">(per_row))(x3);
    CHECK_BITWISE(xt::xarray<double>(xt::view(nested, 0)), jv);
    CHECK_BITWISE(nested, namedax::pmap<"b">(namedax::vmap<"i">(per_row))(x3));
    // A linear map of another shape: the Jacobian is the matrix itself, (2, 3) on every row.
    const xt::xarray<double> a = {{1.0, 2.0, 3.0}, {4.0, 5.0, 6.0}};
    auto linear_rows = [&](const auto& row) {
      return namedax::jacrev([&](const auto& v) { return namedax::pdot(a, v, namedax::axes(), {{1}, {0}}); })(row);
    };
    check_exact("the Jacobian of a matrix product", namedax::vmap<"i">(linear_rows)(x), xt::stack(xt::xtuple(a, a)));
    // A collective inside: the Jacobian of a scalar is its gradient, the same bits as grad.
    auto coupled = [](const auto& row) {
      auto f = [](const auto& v) { return namedax::psum(namedax::sum(v * v), "i"_ax); };
      return std::pair{namedax::jacrev(f)(row), namedax::grad(f)(row)};
    };
    const auto [jacobian_v, gradient_v] = namedax::vmap<"i">(coupled)(x);
    const auto [jacobian_p, gradient_p] = namedax::pmap<"i">(coupled)(x);
    CHECK_BITWISE(jacobian_v, gradient_v);
    CHECK_BITWISE(jacobian_p, gradient_p);
    CHECK_BITWISE(jacobian_v, jacobian_p);
  }

  TEST_CASE("jvp, linearize and jacfwd inside maps: closed forms, collectives coupling the indices, <jvp(t), c> = <t, vjp(c)>") {
    const xt::xarray<double> x = {{0.1, 0.2, 0.3}, {0.4, 0.5, 0.6}};
    const xt::xarray<double> t = {{1.0, 0.5, -1.0}, {2.0, 0.0, 1.0}};
    const xt::xarray<double> c = {{0.3, -1.0, 2.0}, {1.5, 0.25, -0.5}};
    // y_d = x_d psum(x): dy_d = t_d psum(x) + x_d psum(t), each index's tangent reaching every other.
    auto coupled = [](const auto& v) { return v * namedax::psum(v, "i"_ax); };
    // y_d = (d + 1) x_{d-1}: dy_d = (d + 1) t_{d-1}.
    auto shifted = [](const auto& v) {
      return namedax::ppermute(v, "i"_ax, {{0, 1}, {1, 0}}) * (namedax::cast<double>(namedax::axis_index("i"_ax)) + 1.0);
    };
    auto tangent_of = [](auto f) {
      return [f](const auto& row, const auto& tan) { return namedax::jvp(f, std::tuple{row}, std::tuple{tan}).second; };
    };
    const xt::xarray<double> expected_coupled = t * xt::sum(x, {0}) + x * xt::sum(t, {0});
    const xt::xarray<double> expected_shifted = {{2.0, 0.0, 1.0}, {2.0, 1.0, -2.0}};
    const xt::xarray<double> coupled_v = namedax::vmap<"i">(tangent_of(coupled))(x, t);
    CHECK(relative_error(coupled_v, expected_coupled) < 1e-15);
    CHECK_BITWISE(coupled_v, namedax::pmap<"i">(tangent_of(coupled))(x, t));
    const xt::xarray<double> shifted_v = namedax::vmap<"i">(tangent_of(shifted))(x, t);
    check_exact("jvp of a ppermute times the index", shifted_v, expected_shifted);
    CHECK_BITWISE(shifted_v, namedax::pmap<"i">(tangent_of(shifted))(x, t));
    // The dot-product identity, summed over the indices: sum_d <(J t)_d, c_d> = sum_d <t_d, (J^T c)_d>.
    auto both_sides = [&](const auto& row, const auto& tan, const auto& ct) {
      auto f = [](const auto& v) { return namedax::sin(v) * namedax::pmean(v, "i"_ax); };
      auto [y, pullback] = namedax::vjp(f, row);
      const auto forward = namedax::psum(namedax::sum(namedax::jvp(f, std::tuple{row}, std::tuple{tan}).second * ct), "i"_ax);
      const auto backward = namedax::psum(namedax::sum(tan * std::get<0>(pullback(ct))), "i"_ax);
      return std::pair{forward, backward};
    };
    const auto [forward, backward] = namedax::vmap<"i">(both_sides, 0, namedax::none)(x, t, c);
    CHECK(std::abs(forward() - backward()) < 1e-14 * std::abs(backward()));
    const auto [forward_p, backward_p] = namedax::pmap<"i">(both_sides, 0, namedax::none)(x, t, c);
    CHECK_BITWISE(forward_p, forward);
    CHECK_BITWISE(backward_p, backward);
    // linearize: f runs once, its linear map called for two tangents; the same bits as jvp.
    auto twice = [&](const auto& row, const auto& tan) {
      auto [y, f_jvp] = namedax::linearize(coupled, row);
      return std::pair{f_jvp(tan), f_jvp(tan * 2.0)};
    };
    const auto [once, doubled] = namedax::vmap<"i">(twice)(x, t);
    CHECK_BITWISE(once, namedax::vmap<"i">(tangent_of(coupled))(x, t));
    CHECK(relative_error(doubled, 2.0 * expected_coupled) < 1e-15);
    // jacfwd inside a map: each index's basis tangent on every index at once (jax.vmap(jax.jacfwd)),
    // so for the shifted function the Jacobian on index d is (d + 1) I, where jacrev's is (d + 2 mod 2 + 1) I.
    auto jacobians = [&](const auto& row) { return std::pair{namedax::jacfwd(shifted)(row), namedax::jacrev(shifted)(row)}; };
    const auto [forward_jacobian, reverse_jacobian] = namedax::pmap<"i">(jacobians)(x);
    const xt::xarray<double> eye = xt::eye<double>(3);
    check_exact("jacfwd on index 0", xt::view(forward_jacobian, 0), eye);
    check_exact("jacfwd on index 1", xt::view(forward_jacobian, 1), 2.0 * eye);
    check_exact("jacrev on index 0", xt::view(reverse_jacobian, 0), 2.0 * eye);
    check_exact("jacrev on index 1", xt::view(reverse_jacobian, 1), eye);
    CHECK_BITWISE(forward_jacobian, std::get<0>(namedax::vmap<"i">(jacobians)(x)));
    // Rows of no element: Jacobians of shape (2, 0, 0) and a tangent of shape (2, 0), in both placements.
    const xt::xarray<double> empty = xt::zeros<double>({2, 0});
    auto sine = [](const auto& v) { return namedax::sin(v); };
    auto empty_jacobians = [&](const auto& row) { return std::pair{namedax::jacrev(sine)(row), namedax::jacfwd(sine)(row)}; };
    for (const auto& [rev, fwd] : {namedax::vmap<"i">(empty_jacobians)(empty), namedax::pmap<"i">(empty_jacobians)(empty)}) {
      CHECK(rev.shape() == std::vector<std::size_t>{2, 0, 0});
      CHECK(fwd.shape() == std::vector<std::size_t>{2, 0, 0});
    }
    CHECK(namedax::pmap<"i">(tangent_of(sine))(empty, empty).shape() == std::vector<std::size_t>{2, 0});
    // A tangent of another shape than its primal: one namedax::error, the same text in both placements.
    const xt::xarray<double> short_tangent = {{1.0, 2.0}, {3.0, 4.0}};
    const std::string mismatch =
        "namedax::jvp: the tangent of argument 0 has positional shape (2,) but its primal has positional shape (3,)";
    CHECK_THROWS_WITH_AS(namedax::vmap<"i">(tangent_of(sine))(x, short_tangent), mismatch.c_str(), namedax::error);
    CHECK_THROWS_WITH_AS(namedax::pmap<"i">(tangent_of(sine))(x, short_tangent), mismatch.c_str(), namedax::error);
    // Where nothing couples the indices, jacfwd and jacrev agree: diag(cos(x_i) w) for each row.
    const xt::xarray<double> w = {1.0, -2.0, 0.5};
    auto per_row = [&](const auto& row) { return namedax::jacfwd([&](const auto& v) { return namedax::sin(v) * w; })(row); };
    CHECK(relative_error(namedax::vmap<"i">(per_row)(x),
                         namedax::vmap<"i">([&](const auto& row) {
                           return namedax::jacrev([&](const auto& v) { return namedax::sin(v) * w; })(row);
                         })(x)) < 1e-15);
  }

  TEST_CASE("grad outside a map whose function returns a pytree: vmap, pmap and shard_map, against the closed form") {
    const xt::xarray<double> x = {{0.1, 0.2, 0.3}, {0.4, 0.5, 0.6}, {0.7, 0.8, 0.9}, {1.0, 1.1, 1.2}};
    const xt::xarray<double> w = {1.0, -2.0, 0.5};
    // Per row: (sin(row) w, sum(row^2)); the loss sum(a^2) + 3 sum(b) has the gradient
    // 2 sin(x) cos(x) w^2 + 6 x.
    auto body = [](const auto& row, const auto& weights) {
      return std::pair{namedax::sin(row) * weights, namedax::sum(row * row)};
    };
    auto finish_loss = [](const auto& ab) { return namedax::sum(ab.first * ab.first) + namedax::sum(ab.second * 3.0); };
    const auto in_axes = std::tuple{0, namedax::none};
    auto through_vmap = [&](const auto& p) { return finish_loss(namedax::vmap<"i">(body, in_axes, 0)(p, w)); };
    auto through_pmap = [&](const auto& p) { return finish_loss(namedax::pmap<"i">(body, in_axes, 0)(p, w)); };
    namedax::mesh m{namedax::devices<"i">(2)};
    // shard_map: blocks of two rows, each returning (sin(block) w, the sum of its rows' squares).
    auto block_body = [](const auto& block, const auto& weights) {
      return std::pair{namedax::sin(block) * weights, namedax::sum(block * block, {1})};
    };
    auto through_mesh = [&](const auto& p) {
      const auto specs = std::tuple{namedax::P("i"_ax), namedax::P()};
      return finish_loss(namedax::shard_map(block_body, m, specs, std::pair{namedax::P("i"_ax), namedax::P("i"_ax)})(p, w));
    };
    const xt::xarray<double> expected = 2.0 * xt::sin(x) * xt::cos(x) * w * w + 6.0 * x;
    const xt::xarray<double> gv = namedax::grad(through_vmap)(x);
    CHECK(relative_error(gv, expected) < 1e-14);
    CHECK_BITWISE(gv, namedax::grad(through_pmap)(x));
    CHECK_BITWISE(gv, namedax::grad(through_mesh)(x));
  }

  TEST_CASE("a pytree result whose leaves differ in element type and names: maps and checkpoint, one backward pass") {
    // Per row: (sin(row) w in double, varying; the mean over the rows of sum(row^2), as float
    // and the same on every index). The loss sum(a^2) + 3 b has the gradient
    // 2 sin(x) cos(x) w^2 + 6 x / 4 (4 rows), the float only on the way forward.
    const xt::xarray<double> x = {{0.1, 0.2, 0.3}, {0.4, 0.5, 0.6}, {0.7, 0.8, 0.9}, {1.0, 1.1, 1.2}};
    const xt::xarray<double> w = {1.0, -2.0, 0.5};
    std::atomic<int> calls{0};
    auto body = [&calls](const auto& row, const auto& weights) {
      ++calls;
      return std::pair{namedax::sin(row) * weights, namedax::cast<float>(namedax::pmean(namedax::sum(row * row), "i"_ax))};
    };
    auto finish_loss = [](const auto& ab) { return namedax::sum(ab.first * ab.first) + namedax::cast<double>(ab.second) * 3.0; };
    const auto in_axes = std::tuple{0, namedax::none};
    const auto out_axes = std::pair{0, namedax::none};
    auto through_vmap = [&](const auto& p) { return finish_loss(namedax::vmap<"i">(body, in_axes, out_axes)(p, w)); };
    auto through_pmap = [&](const auto& p) { return finish_loss(namedax::pmap<"i">(body, in_axes, out_axes)(p, w)); };
    const xt::xarray<double> expected = 2.0 * xt::sin(x) * xt::cos(x) * w * w + 1.5 * x;
    const xt::xarray<double> gv = namedax::grad(through_vmap)(x);
    CHECK(calls == 2);  // the forward, and one backward pass for both leaves
    CHECK(relative_error(gv, expected) < 1e-14);
    CHECK_BITWISE(gv, namedax::grad(through_pmap)(x));
    // A leaf that the loss does not use gets a zero cotangent.
    auto first_only = [&](const auto& p) { return namedax::sum(namedax::vmap<"i">(body, in_axes, out_axes)(p, w).first); };
    check_exact("the first leaf alone", namedax::grad(first_only)(x), xt::cos(x) * w);

    // checkpoint inside a map, returning (sin(row), row^2 as float): the gradient of
    // sum(a) + sum(b) is cos(row) + 2 row.
    auto block = namedax::checkpoint(
        [](const auto& r) { return std::pair{namedax::sin(r), namedax::cast<float>(r * r)}; });
    auto row_grad = [&](const auto& row) {
      return namedax::grad([&](const auto& r) {
        const auto [a, b] = block(r);
        return namedax::sum(a) + namedax::cast<double>(namedax::sum(b));
      })(row);
    };
    const xt::xarray<double> expected_rows = xt::cos(x) + 2.0 * x;
    for (const xt::xarray<double>& g : {namedax::vmap<"i">(row_grad)(x), namedax::pmap<"i">(row_grad)(x)})
      CHECK(relative_error(g, expected_rows) < 1e-14);  // r^2 is rounded to float on the way forward only
  }

  TEST_CASE("constants through a derivative that runs the call again: bool leaves, data through apply, pytrees") {
    const xt::xarray<double> x = {{0.1, 0.2, 0.3}, {0.4, 0.5, 0.6}};
    const xt::xarray<double> w = {1.0, 2.0, 3.0};
    // A map's result leaf of bools is a constant, as in JAX: usable as where's mask under grad.
    // The gradient of sum(where(x > 0.25, sin(x), 0)) is cos(x) where x > 0.25, else 0.
    auto masked = [](const auto& row) { return std::pair{namedax::sin(row), row > 0.25}; };
    auto mask_loss = [&](auto map) {
      return [map, masked](const auto& p) {
        auto [a, mask] = map(masked)(p);
        return namedax::sum(namedax::where(mask, a, 0.0));
      };
    };
    const xt::xarray<double> expected_masked = xt::where(x > 0.25, xt::cos(x), 0.0);
    const xt::xarray<double> gm = namedax::grad(mask_loss([](auto f) { return namedax::vmap<"i">(f); }))(x);
    check_exact("a bool leaf of a vmap's result", gm, expected_masked);
    CHECK_BITWISE(gm, namedax::grad(mask_loss([](auto f) { return namedax::pmap<"i">(f); }))(x));
    auto indexed = namedax::checkpoint([](const auto& r) { return std::pair{namedax::sin(r), namedax::argmax(r)}; });
    const xt::xarray<double> gi = namedax::grad([&](const auto& r) {
      auto [a, index] = indexed(r);
      return namedax::sum(a) + namedax::cast<double>(index).value();  // the index: an int64 constant
    })(w);
    check_exact("checkpoint returning (sin, argmax)", gi, xt::cos(w));

    // The backward map traces only what the forward was given traced: the data reach the
    // function as they were, here through apply (which has no derivative) and a double
    // constant. loss(v) = sum over rows of 2 sum(v row^2): dv = 2 (the column sums of x^2).
    auto body = [](const auto& weights, double scale, const auto& row) {
      return namedax::sum(weights * namedax::apply([](double e) { return e * e; }, row)) * scale;
    };
    const auto in_axes = std::tuple{namedax::none, namedax::none, 0};
    auto data_loss = [&](auto map) {
      return [map, body, in_axes, &x](const auto& v) { return namedax::sum(map(body, in_axes)(v, 2.0, x)); };
    };
    const xt::xarray<double> expected_data = 2.0 * xt::sum(x * x, {0});
    const xt::xarray<double> gd = namedax::grad(data_loss([](auto f, auto in) { return namedax::vmap<"i">(f, in); }))(w);
    CHECK(relative_error(gd, expected_data) < 1e-15);
    CHECK_BITWISE(gd, namedax::grad(data_loss([](auto f, auto in) { return namedax::pmap<"i">(f, in); }))(w));
    namedax::mesh m{namedax::devices<"i">(2)};
    auto mesh_loss = [&](const auto& v) {
      auto block = [body](const auto& weights, double scale, const auto& rows) {
        return namedax::psum(body(weights, scale, rows), "i"_ax);
      };
      const auto specs = std::tuple{namedax::P(), namedax::P(), namedax::P("i"_ax)};
      return namedax::shard_map(block, m, specs, namedax::P())(v, 2.0, x);
    };
    CHECK(relative_error(namedax::grad(mesh_loss)(w), expected_data) < 1e-15);
    // checkpoint with a double and a pytree of ints, which stay constants: 0.5 cos(0.5 w).
    auto scaled = namedax::checkpoint([](const auto& p, double scale, const std::tuple<int, int>& shape) {
      return namedax::sin(p * scale) * static_cast<double>(std::get<0>(shape));
    });
    const xt::xarray<double> gs = namedax::grad([&](const auto& p) {
      return namedax::sum(scaled(p, 0.5, std::tuple<int, int>{1, 2}));
    })(w);
    check_exact("checkpoint with constants", gs, 0.5 * xt::cos(0.5 * w));

    // custom_vjp with its bounds as one constant pair (jax's clip_gradient): {1, 0.5, -1}.
    auto clip_gradient = namedax::custom_vjp(
        [](const std::pair<double, double>&, const auto& a) { return a * 1.0; },
        [](const std::pair<double, double>& b, const auto& a) { return std::pair{a * 1.0, b}; },
        [](const auto& b, const auto& ct) {
          return std::tuple{std::pair{0.0, 0.0}, namedax::clip(ct, b.first, b.second)};
        });
    const xt::xarray<double> clip_weights = {5.0, 0.5, -3.0};
    const xt::xarray<double> gc = namedax::grad([&](const auto& a) {
      return namedax::sum(clip_gradient(std::pair{-1.0, 1.0}, a) * clip_weights);
    })(xt::xarray<double>{-2.0, 0.5, 3.0});
    check_exact("custom_vjp with a constant pair", gc, xt::xarray<double>{1.0, 0.5, -1.0});
  }

  TEST_CASE("grad inside an outer map of a function that calls an inner map: every mix of vmap and pmap") {
    // loss(p, w) = sum over the rows i of sum(sin(p_i) w): dp = cos(p) w; w is replicated, so
    // its gradient is summed over the rows and over the outer axis "b".
    const xt::xarray<double> x = xt::arange<double>(24).reshape({2, 4, 3}) * 0.05 + 0.1;
    const xt::xarray<double> w = {1.0, -2.0, 0.5};
    auto row_loss = [](const auto& row, const auto& weights) { return namedax::sum(namedax::sin(row) * weights); };
    auto through = [&]<class Inner>(Inner inner) {
      return [inner, row_loss, &w](const auto& block) {
        return namedax::grad(
            [&](const auto& p, const auto& v) { return namedax::sum(inner(row_loss, std::tuple{0, namedax::none})(p, v)); },
            namedax::argnums<0, 1>)(block, w);
      };
    };
    auto inner_vmap = through([](auto f, auto in_axes) { return namedax::vmap<"i">(f, in_axes); });
    auto inner_pmap = through([](auto f, auto in_axes) { return namedax::pmap<"i">(f, in_axes); });
    const auto [dp, dw] = namedax::vmap<"b">(inner_vmap)(x);
    const xt::xarray<double> expected_dp = xt::cos(x) * w;
    const xt::xarray<double> total = xt::sum(xt::sin(x), {0, 1});
    CHECK(relative_error(dp, expected_dp) < 1e-15);
    CHECK(relative_error(xt::view(dw, 0), total) < 1e-14);
    CHECK_BITWISE(xt::view(dw, 0), xt::view(dw, 1));
    for (const auto& [p, v] : {namedax::vmap<"b">(inner_pmap)(x), namedax::pmap<"b">(inner_vmap)(x), namedax::pmap<"b">(inner_pmap)(x)}) {
      CHECK_BITWISE(p, dp);
      CHECK_BITWISE(v, dw);
    }

    // An inner map that returns a pair (its leaves named in the outer map's environment, whose
    // pytree once met the public tree_map as well): loss sum(2 p) + sum(3 p), gradient 5.
    auto pair_through = [](auto inner) {
      return [inner](const auto& block) {
        return namedax::grad([&](const auto& p) {
          auto [a, b] = inner([](const auto& row) { return std::pair{row * 2.0, row * 3.0}; })(p);
          return namedax::sum(a) + namedax::sum(b);
        })(block);
      };
    };
    auto pair_vmap = pair_through([](auto f) { return namedax::vmap<"i">(f); });
    auto pair_pmap = pair_through([](auto f) { return namedax::pmap<"i">(f); });
    const xt::xarray<double> fives = xt::ones<double>(x.shape()) * 5.0;
    for (const xt::xarray<double>& g : {namedax::vmap<"b">(pair_vmap)(x), namedax::vmap<"b">(pair_pmap)(x),
                                        namedax::pmap<"b">(pair_vmap)(x), namedax::pmap<"b">(pair_pmap)(x)})
      check_exact("an inner map returning a pair", g, fives);
  }

  TEST_CASE("grad outside a map of strided views, a transpose and a lazy expression; a map of size 0") {
    // f(w) = sum over the map of sum(row^2): its gradient is 2 w whatever w's layout, and the
    // map takes a view of the caller's memory where the argument is one.
    auto summed_squares = [](auto map) {
      return [map](const auto& w) { return namedax::sum(map([](const auto& r) { return namedax::sum(r * r); })(w)); };
    };
    const auto by_vmap = summed_squares([](auto f) { return namedax::vmap<"i">(f); });
    const auto by_pmap = summed_squares([](auto f) { return namedax::pmap<"i">(f); });
    const xt::xarray<double> x = {{1., 2., 3.}, {4., 5., 6.}, {7., 8., 9.}, {10., 11., 12.}};
    const auto every_other_row = xt::view(x, xt::range(0, 4, 2), xt::all());
    const xt::xarray<double> rows_expected = {{2., 4., 6.}, {14., 16., 18.}};
    check_exact("strided rows, vmap", xt::xarray<double>(namedax::grad(by_vmap)(every_other_row)), rows_expected);
    CHECK_BITWISE(xt::xarray<double>(namedax::grad(by_pmap)(every_other_row)),
                  xt::xarray<double>(namedax::grad(by_vmap)(every_other_row)));
    const auto columns_first = xt::transpose(x);  // a column-major view
    check_exact("transposed, pmap", xt::xarray<double>(namedax::grad(by_pmap)(columns_first)),
                xt::xarray<double>(2.0 * xt::transpose(x)));
    const auto doubled = x * 2.0;  // an unevaluated expression
    check_exact("lazy, vmap", xt::xarray<double>(namedax::grad(by_vmap)(doubled)), xt::xarray<double>(4.0 * x));
    // A map of size 0: vmap gives the empty gradient; pmap has no device to run on, an error
    // naming it, as in the forward direction.
    const xt::xarray<double> none = xt::zeros<double>({0, 3});
    const xt::xarray<double> empty = namedax::grad(by_vmap)(none);
    CHECK(std::vector<std::size_t>(empty.shape().begin(), empty.shape().end()) == std::vector<std::size_t>{0, 3});
    CHECK_THROWS_WITH_AS(namedax::grad(by_pmap)(none), doctest::Contains("pmap<\"i\">: cannot map over zero devices"),
                         namedax::error);
  }
}
