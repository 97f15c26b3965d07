// SPDX-License-Identifier: MIT
// The axis environment of a value: which names enclosing maps bind, how each is placed, and
// compile-time sets of names as bit masks over that environment.
#pragma once

#include <namedax/axis.hpp>

#include <array>
#include <bit>
#include <cstdint>
#include <tuple>
#include <utility>
#include <span>
#include <string_view>
#include <type_traits>

namespace namedax {

/// Where the indices of a mapped axis live.
enum class placement {
  vectorized,  ///< a dimension of one tensor (vmap)
  devices,     ///< one simulated device per index (pmap)
};

inline constexpr std::size_t dynamic_extent = std::dynamic_extent;

/// What binds an axis: a map (vmap, pmap, mpi::pmap), or shard_map for an axis of its mesh.
/// Only the diagnostics read it: under shard_map, a name that is not bound is not an axis of
/// the mesh, and the fix is in the mesh, not in a map around the function.
enum class bound_by {
  map,
  mesh,
};

/// One axis bound by an enclosing map, with its placement and (optional) static size.
template <Axis A, placement P, std::size_t Extent = dynamic_extent>
struct binding {
  using axis_type = canonical_axis_t<A>;
  static constexpr placement place = P;
  static constexpr std::size_t extent = Extent;
  static constexpr bound_by by = bound_by::map;
};

/// An axis of the mesh of an enclosing shard_map. A type of its own rather than a parameter of
/// binding: the bindings of maps are spelled in nearly every type (and every debug name) of a
/// program, and then need not spell what bound them.
template <Axis A, placement P>
struct mesh_binding {
  using axis_type = canonical_axis_t<A>;
  static constexpr placement place = P;
  static constexpr std::size_t extent = dynamic_extent;
  static constexpr bound_by by = bound_by::mesh;
};

/// A set of names of an environment: bit k stands for the k-th binding.
using axis_mask = std::uint64_t;

/// The axes bound by the enclosing maps, outermost first. A value's payload ends with one
/// dimension per vectorized binding, in this order (size 1 where the value does not vary).
template <class... Bindings>
struct env {
  static constexpr std::size_t size = sizeof...(Bindings);
  static_assert(size <= 64, "namedax: at most 64 nested maps");
  static constexpr std::array<std::string_view, size> names{Bindings::axis_type::name...};
  static constexpr std::array<placement, size> places{Bindings::place...};
  static constexpr std::array<std::size_t, size> extents{Bindings::extent...};

  static constexpr axis_mask mask_where(placement p) {
    axis_mask m = 0;
    for (std::size_t k = 0; k < size; ++k)
      if (places[k] == p) m |= axis_mask{1} << k;
    return m;
  }
  static constexpr axis_mask vectorized_mask = mask_where(placement::vectorized);
  static constexpr axis_mask device_mask = mask_where(placement::devices);
  static constexpr std::size_t vectorized_count = std::popcount(vectorized_mask);
  /// Whether the axes are (or begin with) the mesh of an enclosing shard_map.
  static constexpr bool under_shard_map = ((Bindings::by == bound_by::mesh) || ... || false);

  /// Position of the binding named `name`, or -1.
  static constexpr int index_of(std::string_view name) {
    for (std::size_t k = 0; k < size; ++k)
      if (names[k] == name) return static_cast<int>(k);
    return -1;
  }
  /// Which trailing payload dimension (0 = first vectorized binding) binding k occupies.
  static constexpr std::size_t vectorized_slot(std::size_t k) {
    return std::popcount(vectorized_mask & ((axis_mask{1} << k) - 1));
  }
  template <Axis... Names>
  static constexpr axis_mask mask_of() {
    return ((index_of(Names::name) >= 0 ? axis_mask{1} << index_of(Names::name) : axis_mask{0}) | ... | 0);
  }
};

namespace detail {
template <class T>
inline constexpr bool always_false = false;

template <class Env, class Binding>
struct env_push;
template <class... Bs, class Binding>
struct env_push<env<Bs...>, Binding> {
  using type = env<Bs..., Binding>;
};

/// Binding `K` of an environment.
template <class Env, std::size_t K>
struct binding_at;
template <class... Bs, std::size_t K>
struct binding_at<env<Bs...>, K> {
  using type = std::tuple_element_t<K, std::tuple<Bs...>>;
};

template <class Env, std::size_t N>
struct env_prefix;
template <class... Bs, std::size_t N>
struct env_prefix<env<Bs...>, N> {
  template <std::size_t... K>
  static auto pick(std::index_sequence<K...>) {
    using all = std::tuple<Bs...>;
    return env<std::tuple_element_t<K, all>...>{};
  }
  using type = decltype(pick(std::make_index_sequence<N>{}));
};

template <class Shorter, class Longer>
constexpr bool env_is_prefix() {
  if constexpr (Shorter::size > Longer::size) {
    return false;
  } else {
    for (std::size_t k = 0; k < Shorter::size; ++k)
      if (Shorter::names[k] != Longer::names[k] || Shorter::places[k] != Longer::places[k]) return false;
    return true;
  }
}

template <class E1, class E2>
constexpr bool static_extents_agree() {
  constexpr std::size_t n = E1::size < E2::size ? E1::size : E2::size;
  for (std::size_t k = 0; k < n; ++k)
    if (E1::extents[k] != dynamic_extent && E2::extents[k] != dynamic_extent && E1::extents[k] != E2::extents[k])
      return false;
  return true;
}

// Named predicates, so that a failing static_assert prints both environments.
template <class E1, class E2>
inline constexpr bool environments_are_nested = env_is_prefix<E1, E2>() || env_is_prefix<E2, E1>();
template <class E1, class E2>
inline constexpr bool sizes_agree_for_same_axis = static_extents_agree<E1, E2>();

/// The environment of a value combining values from `E1` and `E2`: the longer one, since
/// a value captured from an outer map lives in a prefix of the inner map's environment.
template <class E1, class E2>
struct env_merge {
  static_assert(environments_are_nested<E1, E2>,
                "namedax: values from unrelated maps are combined; pass an outer value to an inner map as an "
                "argument (in_axes namedax::none) instead of capturing it");
  static_assert(sizes_agree_for_same_axis<E1, E2>,
                "namedax: the same axis has two different static sizes; give the maps the same size");
  using type = std::conditional_t<(E1::size >= E2::size), E1, E2>;
};
template <class E1, class E2>
using env_merge_t = typename env_merge<E1, E2>::type;
}  // namespace detail

/// Instantiated when a collective names an axis that no enclosing map binds; the compiler
/// prints this type, with the axis, in the diagnostic.
template <class Verb, Axis A>
struct axis_not_bound {
  static_assert(detail::always_false<A>,
                "namedax: the axis named in this collective is not bound by an enclosing vmap or pmap; wrap the "
                "function in namedax::vmap<\"name\"> or namedax::pmap<\"name\">, or fix the axis name");
};

namespace detail {
// Named so that a failing static_assert prints the axis and the axes that are bound.
template <class A, class... Bound>
inline constexpr bool axis_is_bound = (same_axis<A, Bound> || ... || false);
}  // namespace detail

/// Instantiated when, inside the function given to shard_map, a collective names an axis that
/// is not an axis of the mesh (nor bound by a map inside the function); the compiler prints
/// this type: the collective, the axis, then the axes that are bound (the mesh's first).
template <class Verb, Axis A, Axis... Bound>
struct axis_not_in_mesh {
  static_assert(detail::axis_is_bound<A, Bound...>,
                "namedax::shard_map: the axis named in this collective is not an axis of the mesh of the enclosing "
                "shard_map (axis_is_bound<axis, the mesh's axes...>); add the axis to the mesh, or name one of the "
                "mesh's axes");
};

/// Instantiated when a map binds a name that an enclosing map already binds.
template <Axis A>
struct axis_bound_twice {
  static_assert(detail::always_false<A>,
                "namedax: a map binds an axis name that an enclosing map already binds; give the inner map "
                "another name");
};

template <class A, class Env>
concept BoundAxis = Axis<A> && (Env::index_of(std::remove_cvref_t<A>::name) >= 0);

namespace detail {
/// The type that reports axis `A` of collective `Verb` as not bound in `Env`: missing from the
/// mesh under shard_map, else missing an enclosing map. Naming it instantiates nothing.
template <class Verb, class Env, class A>
struct unbound_axis;
template <class Verb, class... Bindings, class A>
struct unbound_axis<Verb, env<Bindings...>, A> {
  using type = std::conditional_t<env<Bindings...>::under_shard_map,
                                  axis_not_in_mesh<Verb, A, typename Bindings::axis_type...>, axis_not_bound<Verb, A>>;
};

/// Compile-time check that every name is bound in `Env`, reported per axis.
template <class Verb, class Env, class... Names>
constexpr void require_bound() {
  (
      [] {
        if constexpr (!BoundAxis<Names, Env>) (void)sizeof(typename unbound_axis<Verb, Env, Names>::type);
      }(),
      ...);
}
}  // namespace detail

}  // namespace namedax
