// SPDX-License-Identifier: MIT
// The concepts of namedax's values, in a header other headers can include alone: a named
// value, a value waiting for its environment (axis_index before it meets a mapped value), a
// plain xtensor expression or scalar, and positional dims known at compile time.
#pragma once

#include <namedax/named_shape.hpp>

#include <xtensor/xexpression.hpp>

#include <concepts>
#include <type_traits>

namespace namedax {

template <class E, class Env, axis_mask Varying>
class named;
template <class T, axis_mask Varying, class... Names>
class deferred;
struct axis_index_fn;

namespace detail {
template <class T>
inline constexpr bool is_named = false;
template <class E, class Env, axis_mask V>
inline constexpr bool is_named<named<E, Env, V>> = true;
template <class T>
inline constexpr bool is_deferred = false;
template <class T, axis_mask Varying, class... Names>
inline constexpr bool is_deferred<deferred<T, Varying, Names...>> = true;

// Named so that a failing static_assert prints the environment and the mask.
template <class Env, axis_mask Varying>
inline constexpr bool is_one_value_per_device = (Varying & Env::vectorized_mask) == 0;
}  // namespace detail

/// A value with named axes in its type (what a mapped function receives and returns).
template <class T>
concept NamedValue = detail::is_named<std::remove_cvref_t<T>>;
/// A value waiting for an environment: `axis_index("i"_ax)` before it meets a mapped value.
template <class T>
concept DeferredValue = detail::is_deferred<std::remove_cvref_t<T>>;
/// A positional value: an arithmetic scalar or an xtensor expression; it varies along no name.
template <class T>
concept PlainValue = std::is_arithmetic_v<std::remove_cvref_t<T>> || xt::is_xexpression<std::remove_cvref_t<T>>::value;
/// Anything that mixes into named arithmetic.
template <class T>
concept Operand = NamedValue<T> || DeferredValue<T> || PlainValue<T>;

/// A positional dim known at compile time, accepted wherever an operation takes a dim:
/// `namedax::sum(x, namedax::dim<1>)`. Against a value whose type fixes its rank (a mapped
/// `xt::xtensor<T, N>`, and lazy expressions of such), a dim out of range does not compile.
template <int K>
struct dim_t {
  static constexpr int value = K;
  constexpr operator int() const noexcept { return K; }
};
template <int K>
inline constexpr dim_t<K> dim{};

namespace detail {
template <class D>
inline constexpr bool is_dim_constant = false;
template <int K>
inline constexpr bool is_dim_constant<dim_t<K>> = true;
}  // namespace detail

/// A positional dim: an int, checked at run time, or `dim<K>`, checked at compile time too.
template <class D>
concept Dim = std::integral<D> || detail::is_dim_constant<D>;

/// A named value or one waiting for its environment: what makes an expression namedax's.
template <class T>
concept NamedOperand = NamedValue<T> || DeferredValue<T>;

}  // namespace namedax
