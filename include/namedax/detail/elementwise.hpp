// SPDX-License-Identifier: MIT
// Helpers behind namedax/elementwise.hpp: the macros that lift xtensor's elementwise functions
// to named values, the scalar functors xtensor lacks, apply's xfunction, printing and local().
#pragma once
// IWYU pragma: private, include <namedax/elementwise.hpp>

#include <namedax/detail/collective_frame.hpp>
#include <namedax/detail/compilation.hpp>
#include <namedax/named_array.hpp>

#include <xtensor/xarray.hpp>
#include <xtensor/xfunction.hpp>
#include <xtensor/xio.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xoperation.hpp>

#include <cmath>
#include <ostream>
#include <string>
#include <type_traits>
#include <utility>

namespace namedax {

/// Operands of an elementwise operation: each mixes into named arithmetic, and one at least is
/// namedax's (named, or waiting for its environment), so that calls on plain xtensor arrays and
/// scalars keep meaning what they mean in xtensor.
template <class... Xs>
concept ElementwiseOperands = (Operand<Xs> && ...) && (NamedOperand<Xs> || ...);

}  // namespace namedax

#define NAMEDAX_FWD(x) std::forward<decltype(x)>(x)

// One public verb per use, in namedax/elementwise.hpp (which undefines these). Forwarding
// parameters, like xtensor's own functions: for (xtensor array, named value) found by ADL, both
// are equally good matches, and these, being constrained, are chosen. `expression` is written in
// terms of the payloads `a`, `b`, `c`.
#define NAMEDAX_ELEMENTWISE_UNARY(name, expression)                                              \
  template <class X>                                                                             \
    requires ElementwiseOperands<X>                                                              \
  auto name(X&& x) {                                                                             \
    return ::namedax::detail::elementwise([](auto&& a) { return expression; }, x);               \
  }
#define NAMEDAX_ELEMENTWISE_BINARY(name, expression)                                             \
  template <class L, class R>                                                                    \
    requires ElementwiseOperands<L, R>                                                           \
  auto name(L&& l, R&& r) {                                                                      \
    return ::namedax::detail::elementwise([](auto&& a, auto&& b) { return expression; }, l, r);  \
  }
#define NAMEDAX_ELEMENTWISE_TERNARY(name, expression)                                                      \
  template <class X, class Y, class Z>                                                                     \
    requires ElementwiseOperands<X, Y, Z>                                                                  \
  auto name(X&& x, Y&& y, Z&& z) {                                                                         \
    return ::namedax::detail::elementwise([](auto&& a, auto&& b, auto&& c) { return expression; }, x, y, z); \
  }
// The common case: xtensor's function of the same arity applied to the payloads.
#define NAMEDAX_XT_UNARY(name) NAMEDAX_ELEMENTWISE_UNARY(name, xt::name(NAMEDAX_FWD(a)))
#define NAMEDAX_XT_BINARY(name) NAMEDAX_ELEMENTWISE_BINARY(name, xt::name(NAMEDAX_FWD(a), NAMEDAX_FWD(b)))
#define NAMEDAX_XT_TERNARY(name) \
  NAMEDAX_ELEMENTWISE_TERNARY(name, xt::name(NAMEDAX_FWD(a), NAMEDAX_FWD(b), NAMEDAX_FWD(c)))

namespace namedax::detail {

/// std::signbit, which xtensor's xmath.hpp lacks: true for negative numbers, -0 and NaNs with
/// the sign bit set.
struct signbit_fun {
  template <class T>
  bool operator()(T x) const {
    return std::signbit(x);
  }
};

/// log |Gamma(x)| through the reentrant lgamma_r: std::lgamma writes the global `signgam`, a data
/// race when the devices of a pmap call it at once. Integers and bool give double, as std::lgamma.
struct lgamma_fun {
  template <class T>
  auto operator()(T x) const {
    int sign = 0;
    if constexpr (std::is_same_v<T, float>) {
      return ::lgammaf_r(x, &sign);
    } else if constexpr (std::is_same_v<T, long double>) {
      return ::lgammal_r(x, &sign);
    } else {
      return ::lgamma_r(static_cast<double>(x), &sign);
    }
  }
};

/// jnp.clip: minimum(maximum(v, lo), hi), so that hi wins when lo > hi (xtensor's clip tests
/// lo first and gives lo there); a NaN in v stays NaN.
struct clip_fun {
  template <class V, class L, class H>
  constexpr auto operator()(const V& v, const L& lo, const H& hi) const {
    const auto at_least_lo = xtl::select(v < lo, lo, v);
    return xtl::select(hi < at_least_lo, hi, at_least_lo);
  }
  template <class V, class L, class H>
  constexpr auto simd_apply(const V& v, const L& lo, const H& hi) const {
    const auto at_least_lo = xt_simd::select(v < lo, lo, v);
    return xt_simd::select(hi < at_least_lo, hi, at_least_lo);
  }
};

/// The logistic function 1 / (1 + exp(-x)), jax.nn.sigmoid, computed from exp(-|x|) so that no
/// intermediate overflows: 1 / (1 + e) for x >= 0 and e / (1 + e) below. Floating-point inputs
/// keep their type; integers and bool give double, as std::exp does.
struct sigmoid_fun {
  template <class T>
  auto operator()(T x) const {
    using R = decltype(std::exp(x));
    const R v = static_cast<R>(x);
    const R e = std::exp(v < R(0) ? v : -v);
    return v < R(0) ? e / (R(1) + e) : R(1) / (R(1) + e);
  }
};

/// Python's floor division and modulo (jnp.floor_divide, jnp.mod), in the type C++'s arithmetic
/// conversions give the operands (as xtensor's `/` and `%`). C++'s `/` and `%` truncate toward
/// zero: a nonzero remainder whose sign differs from the divisor's moves by one divisor, and
/// the quotient by one. Integers: a zero divisor throws (C++ leaves it undefined); the minimum
/// divided by -1 wraps to the minimum, as in JAX and NumPy, with remainder 0. Floats follow
/// NumPy's divmod, the quotient computed from the remainder so that a == q * b + r as nearly as
/// rounding allows (1. // 0.1 is 9, as in Python); a zero divisor gives a / b (+-inf, NaN for
/// 0 / 0) and remainder NaN, as IEEE division.
template <class R>
[[noreturn]] void integer_division_by_zero(std::string_view verb) {
  fail("namedax::", verb, ": integer division by zero (", dtype_name<R>(),
       "); make the divisor nonzero first, e.g. namedax::where(b == 0, 1, b)");
}

template <class R>
R float_mod(R a, R b) {
  R m = std::fmod(a, b);
  if (m != R(0)) {
    if ((b < R(0)) != (m < R(0))) m += b;
  } else {
    m = std::copysign(R(0), b);
  }
  return m;
}

template <class R>
R float_floor_divide(R a, R b) {
  if (b == R(0)) return a / b;
  const R m = std::fmod(a, b);
  R q = (a - m) / b;
  if (m != R(0) && (b < R(0)) != (m < R(0))) q -= R(1);
  if (q == R(0)) return std::copysign(R(0), a / b);
  R floored = std::floor(q);
  if (q - floored > R(0.5)) floored += R(1);  // q is an integer up to rounding: the nearest one
  return floored;
}

struct floor_divide_fun {
  template <class T, class U>
  auto operator()(T x, U y) const {
    using R = decltype(x + y);
    const R a = static_cast<R>(x), b = static_cast<R>(y);
    if constexpr (std::is_floating_point_v<R>) {
      return float_floor_divide(a, b);
    } else {
      if (b == R(0)) integer_division_by_zero<R>("floor_divide");
      if constexpr (std::is_signed_v<R>) {
        using W = std::make_unsigned_t<R>;
        if (b == R(-1)) return static_cast<R>(W(0) - static_cast<W>(a));  // wraps for the minimum
        const R q = a / b;
        return (a % b != R(0) && (a < R(0)) != (b < R(0))) ? static_cast<R>(q - R(1)) : q;
      } else {
        return static_cast<R>(a / b);
      }
    }
  }
};

struct mod_fun {
  template <class T, class U>
  auto operator()(T x, U y) const {
    using R = decltype(x + y);
    const R a = static_cast<R>(x), b = static_cast<R>(y);
    if constexpr (std::is_floating_point_v<R>) {
      return float_mod(a, b);
    } else {
      if (b == R(0)) integer_division_by_zero<R>("mod");
      if constexpr (std::is_signed_v<R>) {
        if (b == R(-1)) return R(0);  // the minimum % -1 would overflow
        const R r = a % b;
        return (r != R(0) && (r < R(0)) != (b < R(0))) ? static_cast<R>(r + b) : r;
      } else {
        return static_cast<R>(a % b);
      }
    }
  }
};

// Named so that a failing static_assert prints the callable and the element types.
template <class F, class... T>
inline constexpr bool callable_on_elements = std::is_invocable_v<const F&, const T&...>;

/// An xtensor function node with `f` as its functor: the tile evaluator calls it over whole
/// buffers, in a loop the compiler can vectorize. xtensor's own SIMD path (simd_apply) is left to
/// functors that define it, such as xt::math::sin_fun.
template <class F, class... E>
auto apply_xfunction(F f, E&&... e) {
  using type = typename xt::detail::xfunction_type<F, E...>::type;
  return type(std::move(f), std::forward<E>(e)...);
}

template <class F, class... Xs>
auto apply_elementwise(F f, const Xs&... xs) {
  return elementwise(
      [f](auto&&... p) {
        static_assert(callable_on_elements<F, value_type_of_t<decltype(p)>...>,
                      "namedax::apply: the function cannot be called with one element of each operand; give it a "
                      "callable that takes scalars of the operands' element types");
        return apply_xfunction(f, NAMEDAX_FWD(p)...);
      },
      xs...);
}

/// zeros_like and full_like: `value`, converted to x's element type, everywhere x has an
/// element. A named value's array has the payload's shape, so the result varies along the names
/// x varies along and owns its data (it can be rebound); a value waiting for its environment
/// gives one that waits too.
template <class X, class V>
auto filled_like(const X& x, V value) {
  if constexpr (DeferredValue<X>) {
    return when_resolved([value](const auto& y) { return filled_like(y, value); }, x);
  } else if constexpr (NamedValue<X>) {
    using T = typename X::value_type;
    auto a = uninitialized_array<T>(x.payload().shape());
    a.fill(static_cast<T>(value));
    return make_named<shared_array<T>, typename X::env_type, X::varying>(share_array(std::move(a)));
  } else if constexpr (std::is_arithmetic_v<X>) {
    return static_cast<X>(value);
  } else {
    using T = typename X::value_type;
    auto a = uninitialized_array<T>(x.shape());
    a.fill(static_cast<T>(value));
    return a;
  }
}

/// The value of `x` on this device (or, under vmap, the one value it has at every index), with
/// its positional shape.
template <class E, class Env, axis_mask V>
auto local_value(const named<E, Env, V>& x) {
  xt::xarray<typename named<E, Env, V>::value_type> a = evaluate(x.payload());
  a.reshape(x.shape());
  return a;
}

/// How a vectorized dim of the payload is printed: "i=4".
template <class Env>
std::string payload_dims(const std::vector<std::size_t>& shape, std::size_t positional) {
  std::string text = "(";
  std::size_t vectorized = 0;
  for (std::size_t k = 0; k < shape.size(); ++k) {
    if (k) text += ", ";
    if (k >= positional) {
      while (Env::places[vectorized] != placement::vectorized) ++vectorized;
      text += Env::names[vectorized++];
      text += '=';
    }
    text += std::to_string(shape[k]);
  }
  return text + (shape.size() == 1 ? ",)" : ")");
}

/// One axis of the environment as the printout shows it: "i (vmap, size 4)", "j (pmap, device 1
/// of 2)", or, printed outside the map that binds it, "i (vmap)".
NAMEDAX_DECL std::string describe_binding(std::string_view name, placement place);

template <class E, class Env, axis_mask V>
void print_named(std::ostream& out, const named<E, Env, V>& x) {
  using T = typename named<E, Env, V>::value_type;
  const auto shape = x.shape();
  out << "named " << dtype_name<T>() << ' ' << message(shape) << "\n  axes: ";
  if (Env::size == 0) out << "none";
  for (std::size_t k = 0; k < Env::size; ++k) out << (k ? ", " : "") << describe_binding(Env::names[k], Env::places[k]);
  out << "\n  varies along: ";
  if (V == 0) out << "none";
  for (std::size_t k = 0, shown = 0; k < Env::size; ++k)
    if (V & (axis_mask{1} << k)) out << (shown++ ? ", " : "") << Env::names[k];
  // The payload as it is held: positional dims, then one per vmap axis (1 where it does not vary).
  const auto a = evaluate(x.payload());
  const std::vector<std::size_t> held(a.shape().begin(), a.shape().end());
  out << "\n  value " << payload_dims<Env>(held, shape.size()) << ":\n";
  // int8 and uint8 elements print as numbers, not characters.
  if constexpr (std::is_integral_v<T> && sizeof(T) == 1 && !std::is_same_v<T, bool>) out << xt::xarray<int>(xt::cast<int>(a));
  else out << a;
}

#if NAMEDAX_DEFINITIONS  // the bodies of the functions declared above (see detail/compilation.hpp)
NAMEDAX_DECL std::string describe_binding(std::string_view name, placement place) {
  std::string text{name};
  const frame* f = find_frame(name);
  if (!f || f->place != place) return text + (place == placement::vectorized ? " (vmap)" : " (devices)");
  if (place == placement::vectorized) return text + message(" (vmap, size ", f->size, ")");
  return text + message(" (", map_verb(*f), ", device ", f->index, " of ", f->size, ")");
}
#endif  // NAMEDAX_DEFINITIONS

}  // namespace namedax::detail
