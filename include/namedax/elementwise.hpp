// SPDX-License-Identifier: MIT
// Elementwise operations on named values: operators, every elementwise function of xtensor's
// xmath.hpp, where, cast, apply for any scalar function, printing and local().
//
// Each broadcasts by name: the result varies along every name its operands vary along. An
// operand is a named value, an `axis_index` value, an xtensor expression or a scalar, and one at
// least must be namedax's. Results are lazy xtensor expressions (namedax::eval evaluates them).
// Element types follow xtensor, that is C++'s arithmetic conversions: int8, int16 and bool
// promote to int32 in `+`, `*`, `abs`, `square`, ...; math functions of integers give float64
// (JAX: float32); a float32 value with a double scalar gives float64 (JAX keeps float32).
#pragma once

#include <namedax/detail/elementwise.hpp>
#include <namedax/named_array.hpp>

#include <ostream>

namespace namedax {

// Arithmetic and comparison operators: `x * 2.f + y`, `x < 0`, `x == axis_index("i"_ax)`.
NAMEDAX_ELEMENTWISE_BINARY(operator+, NAMEDAX_FWD(a) + NAMEDAX_FWD(b))
NAMEDAX_ELEMENTWISE_BINARY(operator-, NAMEDAX_FWD(a) - NAMEDAX_FWD(b))
NAMEDAX_ELEMENTWISE_BINARY(operator*, NAMEDAX_FWD(a) * NAMEDAX_FWD(b))
NAMEDAX_ELEMENTWISE_BINARY(operator/, NAMEDAX_FWD(a) / NAMEDAX_FWD(b))
NAMEDAX_ELEMENTWISE_BINARY(operator%, NAMEDAX_FWD(a) % NAMEDAX_FWD(b))
NAMEDAX_ELEMENTWISE_BINARY(operator<, NAMEDAX_FWD(a) < NAMEDAX_FWD(b))
NAMEDAX_ELEMENTWISE_BINARY(operator<=, NAMEDAX_FWD(a) <= NAMEDAX_FWD(b))
NAMEDAX_ELEMENTWISE_BINARY(operator>, NAMEDAX_FWD(a) > NAMEDAX_FWD(b))
NAMEDAX_ELEMENTWISE_BINARY(operator>=, NAMEDAX_FWD(a) >= NAMEDAX_FWD(b))
NAMEDAX_ELEMENTWISE_BINARY(operator==, xt::equal(NAMEDAX_FWD(a), NAMEDAX_FWD(b)))
NAMEDAX_ELEMENTWISE_BINARY(operator!=, xt::not_equal(NAMEDAX_FWD(a), NAMEDAX_FWD(b)))
NAMEDAX_ELEMENTWISE_BINARY(operator&&, NAMEDAX_FWD(a) && NAMEDAX_FWD(b))
NAMEDAX_ELEMENTWISE_BINARY(operator||, NAMEDAX_FWD(a) || NAMEDAX_FWD(b))
NAMEDAX_ELEMENTWISE_UNARY(operator-, -NAMEDAX_FWD(a))
NAMEDAX_ELEMENTWISE_UNARY(operator+, +NAMEDAX_FWD(a))
NAMEDAX_ELEMENTWISE_UNARY(operator!, !NAMEDAX_FWD(a))

// Bitwise operators on integers and bool: `x & 0xff`, `x << 2`, `~mask`. bool operands promote
// to int32 (JAX keeps bool for &, |, ^ and ~ is logical not there); a shift by a negative count
// or by the bit width or more is undefined, as in C++ (JAX gives 0 or the sign).
NAMEDAX_ELEMENTWISE_BINARY(operator&, NAMEDAX_FWD(a) & NAMEDAX_FWD(b))
NAMEDAX_ELEMENTWISE_BINARY(operator|, NAMEDAX_FWD(a) | NAMEDAX_FWD(b))
NAMEDAX_ELEMENTWISE_BINARY(operator^, NAMEDAX_FWD(a) ^ NAMEDAX_FWD(b))
NAMEDAX_ELEMENTWISE_BINARY(operator<<, xt::left_shift(NAMEDAX_FWD(a), NAMEDAX_FWD(b)))
NAMEDAX_ELEMENTWISE_BINARY(operator>>, xt::right_shift(NAMEDAX_FWD(a), NAMEDAX_FWD(b)))
NAMEDAX_ELEMENTWISE_UNARY(operator~, ~NAMEDAX_FWD(a))
/// `left_shift(x, 2)` is `x << 2`; `right_shift(x, 1)` is `x >> 1`.
NAMEDAX_XT_BINARY(left_shift)
NAMEDAX_XT_BINARY(right_shift)

// Comparisons as functions (jnp.equal, ...), bool results: `namedax::less(x, 0.f)`.
NAMEDAX_XT_BINARY(equal)
NAMEDAX_XT_BINARY(not_equal)
NAMEDAX_XT_BINARY(less)
NAMEDAX_XT_BINARY(less_equal)
NAMEDAX_XT_BINARY(greater)
NAMEDAX_XT_BINARY(greater_equal)

// Basic functions.
/// `abs(x)`: |x|; {-2, 3} -> {2, 3}. int8 and int16 give int32 (JAX keeps the type).
NAMEDAX_XT_UNARY(abs)
/// `fabs(x)`: |x| as floating point; integers give float64.
NAMEDAX_XT_UNARY(fabs)
/// `sign(x)`: -1, 0 or 1 (NaN for NaN, -0 for -0); {-2.f, 0.f, 5.f} -> {-1.f, 0.f, 1.f}.
NAMEDAX_XT_UNARY(sign)
/// `maximum(x, 0.f)`: the larger; a NaN in `x` gives the other operand (JAX: NaN); see fmax.
NAMEDAX_XT_BINARY(maximum)
/// `minimum(x, y)`: the smaller; NaN as for maximum.
NAMEDAX_XT_BINARY(minimum)
/// `fmax(x, y)`: the larger, ignoring a NaN operand (jnp.fmax).
NAMEDAX_XT_BINARY(fmax)
/// `fmin(x, y)`: the smaller, ignoring a NaN operand (jnp.fmin).
NAMEDAX_XT_BINARY(fmin)
/// `fmod(x, 3.f)`: remainder with the sign of `x` (C's fmod, jnp.fmod); {-5.f, 5.f} -> {-2.f, 2.f}.
NAMEDAX_XT_BINARY(fmod)
/// `remainder(x, y)`: IEEE remainder, x - n y with n the nearest integer (not jnp.remainder,
/// which has the sign of `y`: that is namedax::mod).
NAMEDAX_XT_BINARY(remainder)
/// `mod(x, y)`: Python's and JAX's `x % y` (jnp.mod, jnp.remainder), the remainder with the sign
/// of `y`, for integers and floats; C++'s `%` truncates instead. (-1, 4) -> 3, (5, -3) -> -1,
/// (-5.5, 2.) -> 0.5. The index before this one, cyclically, JAX's `(axis_index("i") - 1) % n`:
/// `mod(axis_index("i"_ax) - 1, n)`. An integer divisor of zero is a namedax::error when the
/// value is evaluated (JAX gives unspecified values); a float one gives NaN.
NAMEDAX_ELEMENTWISE_BINARY(mod, ::namedax::detail::apply_xfunction(::namedax::detail::mod_fun{}, NAMEDAX_FWD(a),
                                                                   NAMEDAX_FWD(b)))
/// `floor_divide(x, y)`: Python's and JAX's `x // y` (jnp.floor_divide), the quotient rounded
/// toward -inf, for integers and floats, so that x == floor_divide(x, y) * y + mod(x, y); C++'s
/// `/` on integers truncates instead. (-7, 2) -> -4, (7, -2) -> -4, (-7.5, 2.) -> -4.
/// The minimum integer divided by -1 wraps to itself (as JAX). An integer divisor of zero is a
/// namedax::error when the value is evaluated; a float one gives x / 0 (+-inf, NaN for 0 / 0).
NAMEDAX_ELEMENTWISE_BINARY(floor_divide, ::namedax::detail::apply_xfunction(::namedax::detail::floor_divide_fun{},
                                                                            NAMEDAX_FWD(a), NAMEDAX_FWD(b)))
/// `fdim(x, y)`: max(x - y, 0).
NAMEDAX_XT_BINARY(fdim)
/// `clip(x, lo, hi)`: x limited to [lo, hi], as jnp.clip (hi where lo > hi); `lo` and `hi`
/// may be named values too.
NAMEDAX_ELEMENTWISE_TERNARY(clip, ::namedax::detail::apply_xfunction(::namedax::detail::clip_fun{}, NAMEDAX_FWD(a),
                                                                     NAMEDAX_FWD(b), NAMEDAX_FWD(c)))
/// `fma(a, b, c)`: a * b + c rounded once.
NAMEDAX_XT_TERNARY(fma)

// Exponential and logarithmic functions; integers and bool give float64 (JAX: float32).
/// `exp(x)`: e^x; {0.f, 1.f} -> {1.f, 2.7182817f}.
NAMEDAX_XT_UNARY(exp)
/// `exp2(x)`: 2^x.
NAMEDAX_XT_UNARY(exp2)
/// `expm1(x)`: e^x - 1, accurate near 0.
NAMEDAX_XT_UNARY(expm1)
/// `log(x)`: natural logarithm; NaN below 0, -inf at 0.
NAMEDAX_XT_UNARY(log)
/// `log2(x)`: base-2 logarithm.
NAMEDAX_XT_UNARY(log2)
/// `log10(x)`: base-10 logarithm.
NAMEDAX_XT_UNARY(log10)
/// `log1p(x)`: log(1 + x), accurate near 0.
NAMEDAX_XT_UNARY(log1p)
/// `sigmoid(x)`: 1 / (1 + exp(-x)), jax.nn.sigmoid, without overflow for large |x|;
/// {0.f} -> {0.5f}.
NAMEDAX_ELEMENTWISE_UNARY(sigmoid, ::namedax::detail::apply_xfunction(::namedax::detail::sigmoid_fun{}, NAMEDAX_FWD(a)))

// Power functions.
/// `pow(x, 2.f)`: x^y; {2.f, 3.f} -> {4.f, 9.f}. Integers give float64 (std::pow).
NAMEDAX_XT_BINARY(pow)
/// `pow<3>(x)`: x^N by N - 1 multiplications at most, keeping the element type.
template <std::size_t N, class X>
  requires ElementwiseOperands<X>
auto pow(X&& x) {
  return detail::elementwise([](auto&& a) { return xt::pow<N>(NAMEDAX_FWD(a)); }, x);
}
/// `sqrt(x)`: square root; {4.f, 9.f} -> {2.f, 3.f}.
NAMEDAX_XT_UNARY(sqrt)
/// `cbrt(x)`: cube root; {-8.} -> {-2.}.
NAMEDAX_XT_UNARY(cbrt)
/// `square(x)`: x * x; int8 and int16 give int32 (JAX keeps the type).
NAMEDAX_XT_UNARY(square)
/// `cube(x)`: x * x * x; types as square.
NAMEDAX_XT_UNARY(cube)
/// `hypot(x, y)`: sqrt(x^2 + y^2) without overflow; (3, 4) -> 5.
NAMEDAX_XT_BINARY(hypot)

// Trigonometric and hyperbolic functions (radians); integers and bool give float64.
/// `sin(x)`: {0., pi / 2} -> {0., 1.}.
NAMEDAX_XT_UNARY(sin)
/// `cos(x)`: {0.} -> {1.}.
NAMEDAX_XT_UNARY(cos)
/// `tan(x)`.
NAMEDAX_XT_UNARY(tan)
/// `asin(x)`: NaN outside [-1, 1].
NAMEDAX_XT_UNARY(asin)
/// `acos(x)`: NaN outside [-1, 1].
NAMEDAX_XT_UNARY(acos)
/// `atan(x)`.
NAMEDAX_XT_UNARY(atan)
/// `atan2(y, x)`: the angle of (x, y), in [-pi, pi]; (1, -1) -> 3 pi / 4.
NAMEDAX_XT_BINARY(atan2)
/// `sinh(x)`.
NAMEDAX_XT_UNARY(sinh)
/// `cosh(x)`.
NAMEDAX_XT_UNARY(cosh)
/// `tanh(x)`: {0.f} -> {0.f}.
NAMEDAX_XT_UNARY(tanh)
/// `asinh(x)`.
NAMEDAX_XT_UNARY(asinh)
/// `acosh(x)`: NaN below 1.
NAMEDAX_XT_UNARY(acosh)
/// `atanh(x)`: NaN outside [-1, 1], +-inf at +-1.
NAMEDAX_XT_UNARY(atanh)
/// `deg2rad(x)`, also spelled `radians(x)`: {180.} -> {pi}.
NAMEDAX_XT_UNARY(deg2rad)
NAMEDAX_XT_UNARY(radians)
/// `rad2deg(x)`, also spelled `degrees(x)`: {pi} -> {180.}.
NAMEDAX_XT_UNARY(rad2deg)
NAMEDAX_XT_UNARY(degrees)

// Error and gamma functions; integers and bool give float64.
/// `erf(x)`: {0.f} -> {0.f}.
NAMEDAX_XT_UNARY(erf)
/// `erfc(x)`: 1 - erf(x), accurate for large x.
NAMEDAX_XT_UNARY(erfc)
/// `tgamma(x)`: Gamma(x); {5.} -> {24.}.
NAMEDAX_XT_UNARY(tgamma)
/// `lgamma(x)`: log |Gamma(x)| (jax.scipy.special.gammaln).
NAMEDAX_ELEMENTWISE_UNARY(lgamma, ::namedax::detail::apply_xfunction(::namedax::detail::lgamma_fun{}, NAMEDAX_FWD(a)))

// Rounding; integers and bool give float64 (JAX keeps integers as they are).
/// `ceil(x)`: {1.2f, -1.2f} -> {2.f, -1.f}.
NAMEDAX_XT_UNARY(ceil)
/// `floor(x)`: {1.2f, -1.2f} -> {1.f, -2.f}.
NAMEDAX_XT_UNARY(floor)
/// `trunc(x)`: toward zero; {1.7f, -1.7f} -> {1.f, -1.f}.
NAMEDAX_XT_UNARY(trunc)
/// `round(x)`: halves away from zero, as C's round; {0.5f, 2.5f} -> {1.f, 3.f} (jnp.round
/// rounds halves to even: use rint).
NAMEDAX_XT_UNARY(round)
/// `nearbyint(x)`: the current rounding mode, halves to even by default; {0.5f, 2.5f} -> {0.f, 2.f}.
NAMEDAX_XT_UNARY(nearbyint)
/// `rint(x)`: as nearbyint (jnp.rint, jnp.round).
NAMEDAX_XT_UNARY(rint)

// Classification, bool results.
/// `isnan(x)`: {NaN, 1.f} -> {true, false}.
NAMEDAX_XT_UNARY(isnan)
/// `isinf(x)`: true for +-inf.
NAMEDAX_XT_UNARY(isinf)
/// `isfinite(x)`: false for NaN and +-inf.
NAMEDAX_XT_UNARY(isfinite)
/// `signbit(x)`: the sign bit; {-0.f, 0.f, -1.f} -> {true, false, true}.
NAMEDAX_ELEMENTWISE_UNARY(signbit, ::namedax::detail::apply_xfunction(::namedax::detail::signbit_fun{}, NAMEDAX_FWD(a)))
/// `nan_to_num(x)`: NaN -> 0, +-inf -> the largest finite values of the type.
NAMEDAX_XT_UNARY(nan_to_num)

/// `isclose(a, b, rtol, atol, equal_nan)`: |a - b| <= atol or |a - b| <= rtol * max(|a|, |b|),
/// xtensor's symmetric test (jnp.isclose: |a - b| <= atol + rtol * |b|); defaults as both.
template <class L, class R>
  requires ElementwiseOperands<L, R>
auto isclose(L&& l, R&& r, double rtol = 1e-05, double atol = 1e-08, bool equal_nan = false) {
  return detail::elementwise(
      [=](auto&& a, auto&& b) { return xt::isclose(NAMEDAX_FWD(a), NAMEDAX_FWD(b), rtol, atol, equal_nan); }, l, r);
}

/// `where(condition, a, b)`: elementwise choice, broadcasting by name;
/// `where(x > 0.f, x, 0.f)` is a ReLU.
NAMEDAX_XT_TERNARY(where)

/// `zeros_like(x)`: zeros of x's shape and element type (jnp.zeros_like). A named value keeps
/// x's names and the names it varies along, and owns its data, so it starts a loop carry:
/// `auto acc = namedax::zeros_like(x); for (...) acc += x;`. A plain xtensor value gives an
/// xt::xarray, a scalar a scalar, an axis_index value one waiting for its environment.
template <class X>
  requires Operand<X>
auto zeros_like(const X& x) {
  return detail::filled_like(x, 0);
}
/// `full_like(x, value)`: `value`, converted to x's element type (as static_cast does), in the
/// shape of x, keeping its names as zeros_like does (jnp.full_like without a dtype):
/// `full_like(x, 2.5)` of an int32 value holds 2.
template <class X, class V>
  requires(Operand<X> && std::is_arithmetic_v<V>)
auto full_like(const X& x, V value) {
  return detail::filled_like(x, value);
}

/// `cast<float>(x)`: converts the element type, as static_cast does.
template <class T, class X>
  requires ElementwiseOperands<X>
auto cast(X&& x) {
  return detail::elementwise([](auto&& a) { return xt::cast<T>(NAMEDAX_FWD(a)); }, x);
}

/// `apply(f, xs...)`: lifts `f`, any callable on scalars (a lambda, a function object, a
/// xtensor functor such as `xt::math::sin_fun{}`), to a lazy elementwise operation broadcasting
/// by name; its element type is `f`'s result on one element of each operand:
/// `namedax::apply([](float v, float w) { return v > w ? v - w : 0.f; }, x, y)`.
/// Nothing runs until the value is evaluated; the evaluator calls `f` over buffers of a few
/// hundred elements in a loop the compiler can vectorize when `f` is inlined.
template <class F, class... Xs>
  requires(sizeof...(Xs) > 0 && ElementwiseOperands<Xs...>)
auto apply(F f, Xs&&... xs) {
  return detail::apply_elementwise(std::move(f), xs...);
}

/// `local(x)`: this device's value as an `xt::xarray` of `x.shape()` (the positional shape), the
/// same in both modes: `namedax::local(namedax::psum(x, "i"_ax))`. Does not compile for a value
/// that varies along a vmap axis, which has one value per index: return it from the map, or
/// reduce over the axis first. (`x.payload()` is the internal layout: the positional dims, then
/// one per vmap axis of the environment, size 1 where the value does not vary.)
template <NamedValue X>
auto local(const X& x) {
  using Y = std::remove_cvref_t<X>;
  static_assert(detail::is_one_value_per_device<typename Y::env_type, Y::varying>,
                "namedax::local: this value varies along a vmap axis, so it has one value per index, not one local "
                "value; return it from the map, reduce over the axis (psum, ...), or map the axis with pmap");
  return detail::local_value(x);
}

/// Prints a named value: its element type (JAX's name), positional shape, the axes of its
/// environment with their placement (vmap size, or this device's index under pmap), the axes it
/// varies along, and its local value; under vmap that value is shown as held, with one dim per
/// vmap axis labelled "name=size" after the positional dims:
///
///     named float32 (2,)
///       axes: i (vmap, size 3)
///       varies along: i
///       value (2, i=3):
///     {{ 0.,  2.,  4.},
///      { 1.,  3.,  5.}}
template <class E, class Env, axis_mask V>
std::ostream& operator<<(std::ostream& out, const named<E, Env, V>& x) {
  detail::print_named(out, x);
  return out;
}

}  // namespace namedax

#undef NAMEDAX_XT_UNARY
#undef NAMEDAX_XT_BINARY
#undef NAMEDAX_XT_TERNARY
#undef NAMEDAX_ELEMENTWISE_UNARY
#undef NAMEDAX_ELEMENTWISE_BINARY
#undef NAMEDAX_ELEMENTWISE_TERNARY
#undef NAMEDAX_FWD
