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
