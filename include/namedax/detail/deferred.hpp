// SPDX-License-Identifier: MIT
// The table behind a value that waits for its axis environment (axis_index and what is
// computed from it alone): how it is made, computed on, and resolved in an environment.
// IWYU pragma: private, include <namedax/namedax.hpp>
#pragma once

#include <namedax/concepts.hpp>
#include <namedax/detail/buffers.hpp>
#include <namedax/detail/evaluate.hpp>
#include <namedax/detail/pytree.hpp>
#include <namedax/detail/runtime.hpp>
#include <namedax/named_shape.hpp>

#include <xtensor/xarray.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <string_view>
#include <type_traits>
#include <vector>

// A value of axis_index is a function of the device coordinates only, so it is computed when
// it is made, for every index of the names it awaits, as if each were a vmap axis: a table.
// Its type then names the element type, the names and which of them it varies along, never
// the operations that made it (a chain of lambdas made its type grow geometrically with the
// program). A map resolves the table by moving its dims to the environment's vectorized
// slots and picking this device's index along device axes.

namespace namedax::detail {

template <class... Lists>
struct type_list_cat;
template <class... Ns>
struct type_list_cat<type_list<Ns...>> {
  using type = type_list<Ns...>;
};
template <class... A, class... B, class... Rest>
struct type_list_cat<type_list<A...>, type_list<B...>, Rest...> : type_list_cat<type_list<A..., B...>, Rest...> {};

/// The names of a list, each once, in the order of first appearance.
template <class Seen, class... Rest>
struct unique_names {
  using type = Seen;
};
template <class... Seen, class N, class... Rest>
struct unique_names<type_list<Seen...>, N, Rest...>
    : unique_names<std::conditional_t<(same_axis<N, Seen> || ...), type_list<Seen...>, type_list<Seen..., N>>,
                   Rest...> {};
template <class List>
struct unique_list;
template <class... Ns>
struct unique_list<type_list<Ns...>> : unique_names<type_list<>, Ns...> {};

/// The environment a table is expressed in: every awaited name as if vectorized.
template <class List>
struct table_env;
template <class... Names>
struct table_env<type_list<Names...>> {
  using type = env<binding<Names, placement::vectorized>...>;
};

/// The axis names a deferred operand waits for; none for other operands.
template <class X>
struct names_awaited {
  using type = type_list<>;
};
template <class T, axis_mask V, class... Names>
struct names_awaited<deferred<T, V, Names...>> {
  using type = type_list<Names...>;
};
/// The names that operands `Xs` wait for, each once.
template <class... Xs>
using names_awaited_t = typename unique_list<
    typename type_list_cat<type_list<>, typename names_awaited<std::remove_cvref_t<Xs>>::type...>::type>::type;

/// Bit k of `Varying` marks the k-th of `Names`; the same set as a mask over Env.
template <class Env, axis_mask Varying, class... Names>
constexpr axis_mask mask_in_env() {
  constexpr std::array<std::string_view, sizeof...(Names)> names{Names::name...};
  axis_mask mask = 0;
  for (std::size_t k = 0; k < names.size(); ++k)
    if (((Varying >> k) & 1) != 0 && Env::index_of(names[k]) >= 0) mask |= axis_mask{1} << Env::index_of(names[k]);
  return mask;
}

/// The table of `Names` as a named value of Env: its dims (after the positional ones) go to
/// Env's vectorized slots; along a device axis, this device's index is taken.
template <class Env, axis_mask Varying, class... Names, class T>
auto resolve_table(const shared_array<T>& from) {
  constexpr std::array<std::string_view, sizeof...(Names)> names{Names::name...};
  const std::size_t positional = from.dimension() - names.size();
  std::vector<std::size_t> shape(from.shape().begin(), from.shape().begin() + static_cast<std::ptrdiff_t>(positional));
  shape.resize(positional + Env::vectorized_count, 1);
  std::vector<std::size_t> strides(shape.size(), 0);  // into `from`, per dim of the result
  for (std::size_t d = 0; d < positional; ++d) strides[d] = static_cast<std::size_t>(from.strides()[d]);
  std::size_t offset = 0;
  for (std::size_t k = 0; k < names.size(); ++k) {
    const auto e = static_cast<std::size_t>(Env::index_of(names[k]));
    const std::size_t extent = from.shape()[positional + k];
    const auto stride = extent == 1 ? 0 : static_cast<std::size_t>(from.strides()[positional + k]);
    if (Env::places[e] == placement::vectorized) {
      shape[positional + Env::vectorized_slot(e)] = extent;
      strides[positional + Env::vectorized_slot(e)] = stride;
    } else {
      offset += bound_frame("axis_index", names[k]).index * stride;
    }
  }
  auto out = uninitialized_array<T>(shape);
  std::vector<std::size_t> at(shape.size(), 0);
  const T* source = from.data() + offset;
  for (std::size_t flat = 0; flat < out.size(); ++flat) {
    std::size_t element = 0;
    for (std::size_t d = 0; d < at.size(); ++d) element += at[d] * strides[d];
    out.data()[flat] = source[element];
    for (std::size_t d = at.size(); d-- > 0 && ++at[d] == shape[d];) at[d] = 0;  // the next index, row-major
  }
  return named<shared_array<T>, Env, mask_in_env<Env, Varying, Names...>()>(share_array(std::move(out)));
}

/// What an operation computed in the table environment of `Names` gave, kept as a value that
/// waits: named values become tables, pytrees keep their structure, anything else stays.
template <class... Names, class R>
auto to_deferred(type_list<Names...> names, const R& r) {
  if constexpr (NamedValue<R>) {
    using T = typename R::value_type;
    static_assert(std::is_same_v<typename R::env_type, typename table_env<type_list<Names...>>::type>);
    if constexpr (std::is_same_v<typename R::payload_type, shared_array<T>>)
      return deferred<T, R::varying, Names...>(r.payload());  // owned, row-major, never written: share it
    else
      return deferred<T, R::varying, Names...>(share_array(evaluate<T>(r.payload())));
  } else if constexpr (is_node<R>) {
    return detail::tree_map(r, [names](const auto& leaf) { return to_deferred(names, leaf); });
  } else {
    return r;
  }
}

/// Resolves a deferred operand in `Env`; other operands pass through.
template <class Env, class X>
decltype(auto) resolve_in(const X& x) {
  if constexpr (DeferredValue<X>) return x.template resolve<Env>();
  else return (x);
}

/// An operation on operands of which some wait and none is named, which also needs the names
/// `Extra` bound (a collective's axes): computed now, in the table environment of every name
/// awaited or needed.
template <class... Extra, class Op, class... Xs>
auto compute_deferred(type_list<Extra...>, Op op, const Xs&... xs) {
  using names =
      typename unique_list<typename type_list_cat<names_awaited_t<Xs...>, type_list<Extra...>>::type>::type;
  return to_deferred(names{}, op(resolve_in<typename table_env<names>::type>(xs)...));
}

/// The row-major index over `Names` of every position: axis_index's table.
template <class... Names>
auto index_table() {
  constexpr std::string_view verb = "axis_index";
  xt::xarray<std::int32_t> table = uninitialized_array<std::int32_t>(
      std::vector<std::size_t>{bound_frame(verb, Names::name).size...});
  std::iota(table.data(), table.data() + table.size(), std::int32_t{0});
  constexpr axis_mask every_name = (axis_mask{1} << sizeof...(Names)) - 1;
  return deferred<std::int32_t, every_name, Names...>(share_array(std::move(table)));
}

}  // namespace namedax::detail
