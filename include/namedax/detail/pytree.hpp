// SPDX-License-Identifier: MIT
// Pytrees: std::tuple, std::pair, std::array and Boost.Hana structs of values, nested. The
// collectives map over their leaves; the maps flatten them to leaves and build them again.
// IWYU pragma: private, include <namedax/namedax.hpp>
#pragma once

#include <namedax/detail/unpack.hpp>
#include <namedax/named_shape.hpp>

#include <boost/hana/accessors.hpp>
#include <boost/hana/concept/struct.hpp>
#include <boost/hana/second.hpp>
#include <boost/hana/unpack.hpp>

#include <array>
#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>

namespace namedax::detail {

template <class T>
inline constexpr bool is_tuple_like = false;
template <class... T>
inline constexpr bool is_tuple_like<std::tuple<T...>> = true;
template <class T, std::size_t N>
inline constexpr bool is_tuple_like<std::array<T, N>> = true;
template <class A, class B>
inline constexpr bool is_tuple_like<std::pair<A, B>> = true;

template <class T>
inline constexpr bool is_std_array = false;
template <class T, std::size_t N>
inline constexpr bool is_std_array<std::array<T, N>> = true;
template <class T>
inline constexpr bool is_std_pair = false;
template <class A, class B>
inline constexpr bool is_std_pair<std::pair<A, B>> = true;

/// A Boost.Hana struct (BOOST_HANA_DEFINE_STRUCT) is a pytree node too.
template <class X>
concept HanaStruct = boost::hana::Struct<X>::value;

/// A pytree node: its children are leaves or nodes.
template <class X>
inline constexpr bool is_node = is_tuple_like<X> || HanaStruct<X>;

/// The children of a pytree node, as a std::tuple of references (const for a const node).
template <class X>
auto children(X& x) {
  using node = std::remove_const_t<X>;
  if constexpr (HanaStruct<node>)
    return boost::hana::unpack(boost::hana::accessors<node>(),
                               [&](auto... member) { return std::tie(boost::hana::second(member)(x)...); });
  else
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::tuple<decltype(std::get<I>(x))...>(std::get<I>(x)...);
    }(std::make_index_sequence<std::tuple_size_v<node>>{});
}

/// The children's types of a node of type X, as a tuple-like type: the node's own type for a
/// std::tuple, std::pair or std::array. The type computations below then need no call of
/// children(), which would instantiate it.
template <class X>
struct child_types {
  using type = decltype(children(std::declval<const X&>()));
};
template <class... T>
struct child_types<std::tuple<T...>> {
  using type = std::tuple<T...>;
};
template <class A, class B>
struct child_types<std::pair<A, B>> {
  using type = std::pair<A, B>;
};
template <class T, std::size_t N>
struct child_types<std::array<T, N>> {
  using type = std::array<T, N>;
};
/// The type of child I of a node of type X, and the number of its children.
template <class X, std::size_t I>
using child_t = std::remove_cvref_t<std::tuple_element_t<I, typename child_types<X>::type>>;
template <class X>
inline constexpr std::size_t child_count = std::tuple_size_v<typename child_types<X>::type>;

/// The struct template `X` is made of, with the types of `Parts` as its arguments: one per
/// member, or one for all when the template has one parameter.
template <class X, class... Parts>
struct rebind_struct {
  static_assert(always_false<X>,
                "namedax: a Boost.Hana struct whose members change type must be a template of one type for all "
                "members, such as template <class T> struct params { BOOST_HANA_DEFINE_STRUCT(params, (T, w), (T, b)); }, "
                "or of one type per member, in the members' order");
};
template <template <class...> class S, class... T, class... Parts>
  requires(sizeof...(T) == sizeof...(Parts) && sizeof...(T) > 1)
struct rebind_struct<S<T...>, Parts...> {
  using type = S<Parts...>;
};
template <template <class> class S, class T, class... Parts>
  requires requires { typename std::common_type<Parts...>::type; }
struct rebind_struct<S<T>, Parts...> {
  using type = S<std::common_type_t<Parts...>>;
};

/// A node shaped as `X` (std::array, std::pair, std::tuple or Hana struct) of `parts`.
template <class X, class... Parts>
auto make_like(Parts&&... parts) {
  // The types spelled, not deduced: std::tuple{t} of one tuple t (or std::array{a}) would be
  // a copy of t, not a node holding it.
  if constexpr (is_std_array<X>) {
    using T = std::common_type_t<std::remove_cvref_t<Parts>...>;
    return std::array<T, sizeof...(Parts)>{std::forward<Parts>(parts)...};
  } else if constexpr (is_std_pair<X>) {
    return std::pair{std::forward<Parts>(parts)...};
  } else if constexpr (HanaStruct<X>) {
    if constexpr (requires { X{std::forward<Parts>(parts)...}; }) return X{std::forward<Parts>(parts)...};
    else return typename rebind_struct<X, std::remove_cvref_t<Parts>...>::type{std::forward<Parts>(parts)...};
  } else {
    return std::tuple<std::remove_cvref_t<Parts>...>{std::forward<Parts>(parts)...};
  }
}

/// Maps a leaf function over a pytree: a single value, or a std::tuple, std::pair,
/// std::array or Boost.Hana struct of pytrees; the result has the same structure.
template <class X, class Leaf>
auto tree_map(const X& x, Leaf&& leaf) {
  if constexpr (is_node<X>) {
    return unpack(children(x), [&](const auto&... xs) { return make_like<X>(detail::tree_map(xs, leaf)...); });
  } else {
    return leaf(x);
  }
}

/// Calls `f` on every leaf of a pytree, in order.
template <class X, class F>
void tree_for_each(const X& x, F&& f) {
  if constexpr (is_node<X>) unpack(children(x), [&](const auto&... xs) { (tree_for_each(xs, f), ...); });
  else f(x);
}

/// A node whose children are leaves alone.
template <class X>
inline constexpr bool flat_node = false;
template <class... T>
inline constexpr bool flat_node<std::tuple<T...>> = (!is_node<std::remove_cvref_t<T>> && ...);

/// The number of leaves of a pytree of type X.
template <class X>
constexpr std::size_t leaf_count() {
  if constexpr (is_node<X>) {
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return (std::size_t{0} + ... + leaf_count<child_t<X, I>>());
    }(std::make_index_sequence<child_count<X>>{});
  } else {
    return 1;
  }
}

/// The leaves of a pytree, in order, as a std::tuple of references (const for a const tree).
/// A node whose children are all leaves (the usual arguments of a map) is its own children,
/// without std::tuple_cat, which costs every new type of a map's arguments a few instantiations.
template <class X>
auto tree_leaves(X& x) {
  if constexpr (!is_node<std::remove_const_t<X>>)
    return std::tuple<X&>(x);
  else if constexpr (flat_node<std::remove_const_t<X>>)
    return children(x);
  else
    return unpack(children(x), [](auto&... c) { return std::tuple_cat(tree_leaves(c)...); });
}

/// A pytree shaped as `X` whose leaves are `leaves` from position `Offset` on (a std::tuple, in
/// tree_leaves' order): the inverse of tree_leaves, with leaves of new types.
template <class X, std::size_t Offset = 0, class Leaves>
auto tree_unflatten(Leaves& leaves) {
  if constexpr (is_node<X>) {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      constexpr std::array<std::size_t, sizeof...(I)> sizes{leaf_count<child_t<X, I>>()...};
      [[maybe_unused]] constexpr auto before = [sizes](std::size_t i) {
        std::size_t n = 0;
        for (std::size_t k = 0; k < i; ++k) n += sizes[k];
        return n;
      };
      return make_like<X>(tree_unflatten<child_t<X, I>, Offset + before(I)>(leaves)...);
    }(std::make_index_sequence<child_count<X>>{});
  } else {
    return std::move(std::get<Offset>(leaves));
  }
}

/// Instantiated when a prefix (in_axes, out_axes, specs) has a node where its tree has a leaf,
/// or a node of another size; the compiler prints the two types.
template <class Tree, class Prefix>
struct prefix_does_not_match_tree {
  static_assert(always_false<Tree>,
                "namedax: in_axes, out_axes and specs are pytree prefixes: a single entry for a whole subtree, or "
                "a node (std::tuple, std::array, std::pair, Hana struct) with one entry per child of the node it "
                "stands for");
};

/// Whether `Tree` is a node with as many children as the node `Prefix`.
template <class Tree, class Prefix>
constexpr bool same_arity() {
  if constexpr (is_node<Tree>) return child_count<Tree> == child_count<Prefix>;
  else return false;
}

/// Whether `Prefix` is a prefix of a pytree of type `Tree` (as spread_prefix takes it): an
/// entry that is not a node, or a node with as many children as the tree's node there, each
/// a prefix of its child.
template <class Tree, class Prefix>
constexpr bool prefix_fits() {
  if constexpr (!is_node<Prefix>) {
    return true;
  } else if constexpr (!same_arity<Tree, Prefix>()) {
    return false;
  } else {
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return (prefix_fits<child_t<Tree, I>, child_t<Prefix, I>>() && ...);
    }(std::make_index_sequence<child_count<Tree>>{});
  }
}

/// The number of entries of a prefix at its top: its children's if it is a node, else
/// `Whole` (one entry stands for all of them).
template <class Prefix, std::size_t Whole>
constexpr std::size_t prefix_entries() {
  if constexpr (is_node<Prefix>) return child_count<Prefix>;
  else return Whole;
}

/// A prefix of a pytree of type `Tree` (JAX's in_axes and out_axes) spread to the leaves: a
/// std::tuple with the entry of each leaf, in tree_leaves' order. An entry that is not a node
/// holds for the whole subtree it stands for.
template <class Tree, class Prefix>
auto spread_prefix(const Prefix& prefix) {
  if constexpr (!is_node<Prefix>) {
    return [&]<std::size_t... L>(std::index_sequence<L...>) {
      return std::tuple{(static_cast<void>(L), prefix)...};
    }(std::make_index_sequence<leaf_count<Tree>()>{});
  } else if constexpr (!same_arity<Tree, Prefix>()) {
    (void)sizeof(prefix_does_not_match_tree<Tree, Prefix>);
    return std::tuple{};
  } else {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::tuple_cat(spread_prefix<child_t<Tree, I>>(std::get<I>(children(prefix)))...);
    }(std::make_index_sequence<child_count<Tree>>{});
  }
}

}  // namespace namedax::detail
