// SPDX-License-Identifier: MIT
// Structural operations over positional dims, as jax.numpy and jax.lax define them: views,
// dynamic slices, concatenation, the reshape family and take. Each keeps the trailing
// vectorized dims of a payload in place, so it is batched over vmap axes as it stands; each
// accepts named values and values from axis_index.
#pragma once

#include <namedax/detail/structure.hpp>
#include <namedax/detail/traced.hpp>
#include <namedax/detail/unpack.hpp>

namespace namedax {

namespace detail {
/// A structural operation `op` (a function of one named value) on a traced value: each
/// element of the result is an element of x, so the pullback adds the cotangent back where
/// each came from (detail/autodiff.hpp). `Verb` makes the lookup wait for instantiation.
template <class Verb, class X, class Op>
auto traced_structural(const X& x, const Op& op) {
  return derivative<rule::structural, typename dependent<X, Verb>::type>::apply(op, x);
}

/// A std::tuple or std::array of values, one at least traced (namedax::grad).
template <class T>
inline constexpr bool holds_traced_value = false;
template <class... Xs>
inline constexpr bool holds_traced_value<std::tuple<Xs...>> = (Traced<Xs> || ...);
template <class X, std::size_t N>
inline constexpr bool holds_traced_value<std::array<X, N>> = N > 0 && Traced<X>;

/// concat and stack of values one at least traced: a structural op of all of them.
template <class Verb, class Values, class Join>
auto traced_join(const Values& values, const Join& join) {
  return detail::unpack(values, [&](const auto&... xs) {
    return derivative<rule::structural, typename dependent<Values, Verb>::type>::apply(
        [&](const auto&... ys) { return join(std::make_tuple(ys...)); }, xs...);
  });
}
}  // namespace detail

/// A std::tuple or std::array of values, at least one of them named (or from axis_index).
template <class T>
concept NamedValues = detail::holds_named_value<std::remove_cvref_t<T>>;

/// A view of positional dims through xtensor slices (`xt::range`, `xt::all()`, `xt::newaxis()`,
/// integers, `xt::keep`, `xt::drop`, `xt::ellipsis()`); no copy. The ellipsis covers positional
/// dims only. `namedax::view(x, xt::range(1, 3), 0)`: rows 1 and 2 of column 0, on every index.
struct view_fn {
  template <NamedOperand X, class... S>
  auto operator()(const X& x, const S&... slices) const {
    static_assert(detail::slices_are_positional<S...>,
                  "namedax::view: slices select positional dims; a named axis is not sliced, since each index of "
                  "its map holds its own value; use dynamic_slice with axis_index or pgather to pick across it");
    static_assert(detail::at_most_one_ellipsis<S...>, "namedax::view: give xt::ellipsis() at most once");
    static_assert(detail::ellipsis_without_keep_or_drop<S...>,
                  "namedax::view: xt::keep and xt::drop do not combine with xt::ellipsis(); spell the dims out with xt::all()");
    return detail::view(x, slices...);
  }
  template <Traced X, class... S>
  auto operator()(const X& x, const S&... slices) const {
    return detail::traced_structural<view_fn>(x, [slices...](const auto& v) { return view_fn{}(v, slices...); });
  }
};
inline constexpr view_fn view{};

/// lax.dynamic_slice: the block of extents `sizes` from `starts`, one start per positional dim,
/// each clamped so that the block fits. Starts are ints, values from axis_index, named integer
/// scalars, or a std::tuple mixing them; starts that differ along a vmap axis gather a block
/// per index. `dynamic_slice(x, std::array{axis_index("i"_ax) * b, 0 * axis_index("i"_ax)}, std::array<std::size_t, 2>{b, n})`.
struct dynamic_slice_fn {
  template <NamedOperand X, class Starts, std::size_t R>
    requires detail::is_tuple_like<Starts>
  auto operator()(const X& x, const Starts& starts, const std::array<std::size_t, R>& sizes) const {
    static_assert(std::tuple_size_v<Starts> == R, "namedax::dynamic_slice: give as many sizes as starts");
    return detail::dynamic_slice(x, starts, sizes);
  }
  template <Traced X, class Starts, std::size_t R>
    requires detail::is_tuple_like<Starts>
  auto operator()(const X& x, const Starts& starts, const std::array<std::size_t, R>& sizes) const {
    return detail::traced_structural<dynamic_slice_fn>(x, [starts, sizes](const auto& v) { return dynamic_slice_fn{}(v, starts, sizes); });
  }
};
inline constexpr dynamic_slice_fn dynamic_slice{};

/// lax.dynamic_update_slice: `x` with `update` written from `starts` (clamped so that it fits);
/// the result varies along every name of its operands.
/// `dynamic_update_slice(acc, block, std::array{axis_index("i"_ax) * b, 0})`.
struct dynamic_update_slice_fn {
  template <Operand X, Operand U, class Starts>
    requires(detail::is_tuple_like<Starts> && (NamedOperand<X> || NamedOperand<U>))
  auto operator()(const X& x, const U& update, const Starts& starts) const {
    return detail::dynamic_update_slice(x, update, starts);
  }
  /// Differentiated: each element of the result comes from x or from the update.
  template <class X, class U, class Starts>
    requires(detail::is_tuple_like<Starts> && (Traced<X> || Traced<U>) && (Traced<X> || Operand<X>) &&
             (Traced<U> || Operand<U>))
  auto operator()(const X& x, const U& update, const Starts& starts) const {
    return detail::derivative<detail::rule::structural, typename detail::dependent<X, dynamic_update_slice_fn>::type>::apply(
        [starts](const auto& a, const auto& b) { return detail::dynamic_update_slice(a, b, starts); }, x, update);
  }
};
inline constexpr dynamic_update_slice_fn dynamic_update_slice{};

/// jnp.concatenate along positional dim `dim` of a std::tuple or std::array of values; they
/// broadcast by name, and their positional shapes match except at `dim`.
/// `concat(std::tuple{a, b}, 0)`: a's rows, then b's.
struct concat_fn {
  template <NamedValues Values>
    requires(!detail::holds_traced_value<Values>)
  auto operator()(const Values& values, int dim) const {
    static_assert(detail::tuple_envs_share_one_map<Values>::value,
                  "namedax::concat: the values come from different maps that are not nested in one another; "
                  "pass an outer value to the inner map as an argument instead of capturing it");
    return detail::join<false>(values, dim);
  }
  template <class Values>
    requires detail::holds_traced_value<Values>
  auto operator()(const Values& values, int dim) const {
    return detail::traced_join<concat_fn>(values, [dim](const auto& ys) { return concat_fn{}(ys, dim); });
  }
};
inline constexpr concat_fn concat{};

/// jnp.stack: the values, of one positional shape, along a new positional dim `dim`.
/// `stack(std::tuple{a, b}, 0)`: shape (2, ...a's shape).
struct stack_fn {
  template <NamedValues Values>
    requires(!detail::holds_traced_value<Values>)
  auto operator()(const Values& values, int dim) const {
    static_assert(detail::tuple_envs_share_one_map<Values>::value,
                  "namedax::stack: the values come from different maps that are not nested in one another; "
                  "pass an outer value to the inner map as an argument instead of capturing it");
    return detail::join<true>(values, dim);
  }
  template <class Values>
    requires detail::holds_traced_value<Values>
  auto operator()(const Values& values, int dim) const {
    return detail::traced_join<stack_fn>(values, [dim](const auto& ys) { return stack_fn{}(ys, dim); });
  }
};
inline constexpr stack_fn stack{};

/// jnp.reshape (row-major) of the positional dims; one extent may be -1. A view of a value in
/// memory of its own, else one copy. `reshape(x, {2, -1})`.
struct reshape_fn {
  template <NamedOperand X>
  auto operator()(const X& x, const int_list& shape) const {
    return detail::when_resolved(detail::reshape_op{shape.values}, x);
  }
  template <Traced X>
  auto operator()(const X& x, const int_list& shape) const {
    return detail::traced_structural<reshape_fn>(x, detail::reshape_op{shape.values});
  }
};
inline constexpr reshape_fn reshape{};

/// jnp.permute_dims (jnp.transpose) of the positional dims; a view. `permute_dims(x, {1, 0})`.
struct permute_dims_fn {
  template <NamedOperand X>
  auto operator()(const X& x, const int_list& axes) const {
    return detail::when_resolved(detail::permute_dims_op{axes.values}, x);
  }
  template <Traced X>
  auto operator()(const X& x, const int_list& axes) const {
    return detail::traced_structural<permute_dims_fn>(x, detail::permute_dims_op{axes.values});
  }
};
inline constexpr permute_dims_fn permute_dims{};

/// jnp.moveaxis of one positional dim; a view. `moveaxis(x, 0, -1)`.
struct moveaxis_fn {
  template <NamedOperand X>
  auto operator()(const X& x, int source, int destination) const {
    return detail::when_resolved(detail::moveaxis_op{source, destination}, x);
  }
  template <Traced X>
  auto operator()(const X& x, int source, int destination) const {
    return detail::traced_structural<moveaxis_fn>(x, detail::moveaxis_op{source, destination});
  }
};
inline constexpr moveaxis_fn moveaxis{};

/// jnp.swapaxes of two positional dims; a view. `swapaxes(x, 0, 1)`.
struct swapaxes_fn {
  template <NamedOperand X>
  auto operator()(const X& x, int a, int b) const {
    return detail::when_resolved(detail::swapaxes_op{a, b}, x);
  }
  template <Traced X>
  auto operator()(const X& x, int a, int b) const {
    return detail::traced_structural<swapaxes_fn>(x, detail::swapaxes_op{a, b});
  }
};
inline constexpr swapaxes_fn swapaxes{};

/// jnp.squeeze: removes the given positional dims, each of extent 1 (without dims: every dim
/// of extent 1); a view. `squeeze(x, {0})`.
struct squeeze_fn {
  template <NamedOperand X>
  auto operator()(const X& x) const {
    return detail::when_resolved(detail::squeeze_op{std::nullopt}, x);
  }
  template <NamedOperand X>
  auto operator()(const X& x, const int_list& dims) const {
    return detail::when_resolved(detail::squeeze_op{dims.values}, x);
  }
  template <Traced X>
  auto operator()(const X& x) const {
    return detail::traced_structural<squeeze_fn>(x, detail::squeeze_op{std::nullopt});
  }
  template <Traced X>
  auto operator()(const X& x, const int_list& dims) const {
    return detail::traced_structural<squeeze_fn>(x, detail::squeeze_op{dims.values});
  }
};
inline constexpr squeeze_fn squeeze{};

/// jnp.broadcast_to of the positional dims (NumPy's rules, aligned on the right); lazy.
/// `broadcast_to(row, {4, 3})`.
struct broadcast_to_fn {
  template <NamedOperand X>
  auto operator()(const X& x, const int_list& shape) const {
    return detail::when_resolved(detail::broadcast_to_op{shape.values}, x);
  }
  template <Traced X>
  auto operator()(const X& x, const int_list& shape) const {
    return detail::traced_structural<broadcast_to_fn>(x, detail::broadcast_to_op{shape.values});
  }
};
inline constexpr broadcast_to_fn broadcast_to{};

/// jnp.flip along a positional dim (without one: along every positional dim); a view.
/// `flip(x, 0)`.
struct flip_fn {
  template <NamedOperand X>
  auto operator()(const X& x) const {
    return detail::when_resolved(detail::flip_op{std::nullopt}, x);
  }
  template <NamedOperand X, Dim D>
  auto operator()(const X& x, D dim) const {
    detail::check_static_dim<X>(dim);
    return detail::when_resolved(detail::flip_op{static_cast<int>(dim)}, x);
  }
  template <Traced X>
  auto operator()(const X& x) const {
    return detail::traced_structural<flip_fn>(x, detail::flip_op{std::nullopt});
  }
  template <Traced X, Dim D>
  auto operator()(const X& x, D dim) const {
    return detail::traced_structural<flip_fn>(x, detail::flip_op{static_cast<int>(dim)});
  }
};
inline constexpr flip_fn flip{};

/// jnp.roll along a positional dim: element k moves to (k + shift) mod n. `roll(x, 1, 0)`.
struct roll_fn {
  template <NamedOperand X, Dim D>
  auto operator()(const X& x, std::ptrdiff_t shift, D dim) const {
    detail::check_static_dim<X>(dim);
    return detail::when_resolved(detail::roll_op{shift, static_cast<int>(dim)}, x);
  }
  template <Traced X, Dim D>
  auto operator()(const X& x, std::ptrdiff_t shift, D dim) const {
    return detail::traced_structural<roll_fn>(x, detail::roll_op{shift, static_cast<int>(dim)});
  }
};
inline constexpr roll_fn roll{};

/// jnp.pad in constant mode: `(before, after)` elements of `value` around each positional dim
/// (one pair for every dim alike). `pad(x, {{1, 2}, {0, 0}}, 0.f)`.
struct pad_fn {
  template <NamedOperand X, class V = int>
    requires std::is_arithmetic_v<V>
  auto operator()(const X& x, const pad_widths& widths, V value = 0) const {
    return detail::when_resolved(detail::pad_op<V>{widths, value}, x);
  }
  /// Differentiated: the pad's elements come from no operand (their positions are -1).
  template <Traced X, class V = int>
    requires std::is_arithmetic_v<V>
  auto operator()(const X& x, const pad_widths& widths, V value = 0) const {
    return detail::traced_structural<pad_fn>(x, [widths, value]<class Y>(const Y& y) {
      if constexpr (std::is_same_v<typename Y::value_type, std::int64_t>) return detail::pad_op<std::int64_t>{widths, -1}(y);
      else return detail::pad_op<V>{widths, value}(y);
    });
  }
};
inline constexpr pad_fn pad{};

/// jnp.take along positional dim `dim`: the indices' dims replace it. Indices may be named or
/// from axis_index (each index of a map takes its own); negative ones count from the end, and
/// ones out of [-n, n) read the fill value (mode "fill": NaN, the lowest signed or the largest
/// unsigned integer, true). `take(table, ids, 0)`.
struct take_fn {
  template <Operand X, Operand I, Dim D>
    requires(NamedOperand<X> || NamedOperand<I>)
  auto operator()(const X& x, const I& indices, D dim) const {
    detail::check_static_dim<X>(dim);
    return detail::when_resolved(detail::take_op<false>{static_cast<int>(dim)}, x, indices);
  }
  template <Traced X, Operand I, Dim D>
  auto operator()(const X& x, const I& indices, D dim) const {
    return detail::traced_structural<take_fn>(
        x, [indices, dim](const auto& v) { return detail::when_resolved(detail::take_op<false>{static_cast<int>(dim)}, v, indices); });
  }
};
inline constexpr take_fn take{};

/// jnp.take_along_axis: indices of the value's positional rank pick along `dim` (default the
/// last); the other dims broadcast. Same index rules as take. `take_along_axis(x, order, -1)`.
struct take_along_axis_fn {
  template <Operand X, Operand I, Dim D = int>
    requires(NamedOperand<X> || NamedOperand<I>)
  auto operator()(const X& x, const I& indices, D dim = -1) const {
    detail::check_static_dim<X>(dim);
    return detail::when_resolved(detail::take_op<true>{static_cast<int>(dim)}, x, indices);
  }
  template <Traced X, Operand I, Dim D = int>
  auto operator()(const X& x, const I& indices, D dim = -1) const {
    return detail::traced_structural<take_along_axis_fn>(
        x, [indices, dim](const auto& v) { return detail::when_resolved(detail::take_op<true>{static_cast<int>(dim)}, v, indices); });
  }
};
inline constexpr take_along_axis_fn take_along_axis{};

}  // namespace namedax
