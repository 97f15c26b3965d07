// SPDX-License-Identifier: MIT
// What every collective shares: the named axes a call reduces or exchanges, read from the
// environment; the rule run on one leaf (deferred values wait, names are checked at compile
// time); and the catch-all that reports options of the wrong collective.
// IWYU pragma: private, include <namedax/namedax.hpp>
#pragma once

#include <namedax/axis.hpp>
#include <namedax/detail/collective_frame.hpp>
#include <namedax/detail/pytree.hpp>
#include <namedax/detail/unpack.hpp>
#include <namedax/named_array.hpp>

#include <algorithm>
#include <concepts>
#include <array>
#include <optional>
#include <span>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace namedax::detail {

/// The positional axes of a collective (negative from the end) as dims of a value of
/// positional rank `rank`, checked for range and repetition.
NAMEDAX_DECL std::vector<std::size_t> canonical_positional(std::string_view verb, std::span<const int> positional,
                                                           std::size_t rank);

/// The named axes of a collective on x, in the order given, as the rules need them.
template <class X, class... Names>
std::array<named_axis, sizeof...(Names)> describe_named_axes([[maybe_unused]] std::string_view verb) {
  using Env = typename X::env_type;
  return {[&] {
    constexpr int k = Env::index_of(Names::name);
    const frame& f = bound_frame(verb, Names::name);
    return named_axis{Names::name, Env::places[k], f.size, ((X::varying >> k) & 1) != 0, Env::vectorized_slot(k), f.index};
  }()...};
}

/// Whether `holds(std::type_identity<L>{})` for every child type L of node X; false for a
/// leaf. The predicate is instantiated for every child, so it must accept any type.
template <class X, class Holds>
constexpr bool every_child(Holds holds) {
  if constexpr (!is_node<X>) {
    return false;
  } else {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return (holds(std::type_identity<child_t<X, I>>{}) && ...);
    }(std::make_index_sequence<child_count<X>>{});
  }
}

/// Whether leaf type L is a named value that varies along every one of `Names`.
template <class L, class... Names>
constexpr bool varies_along_all() {
  if constexpr (NamedValue<L>) {
    constexpr axis_mask names = L::env_type::template mask_of<Names...>();
    return (L::varying & names) == names;
  } else {
    return false;
  }
}

/// What a braced list naming fields of other collectives' options binds to
/// (`psum(x, "i"_ax, {.tiled = true})`): the overload that takes it fails a static_assert
/// naming the options the collective takes, instead of an error listing every candidate.
/// It lacks axis_index_groups, so lists naming only a collective's own fields go elsewhere.
struct foreign_option_fields {
  int axis = 0;
  int scatter_dimension = 0;
  bool tiled = false;
};

/// Options that none of `Accepted` can be made from: another collective's, or a wrong type.
/// The overload that takes them fails a static_assert saying which options the verb takes.
template <class Options, class... Accepted>
concept ForeignOptions = (!std::convertible_to<const Options&, Accepted> && ...);

/// Runs a collective's rule on one leaf: on a deferred value's table, at once; on a named
/// value, whose names are checked at compile time, where its payload lies. `Sums`
/// makes bool add up as int32; `Invariant` says the result is the same along the names.
template <class Verb, bool Invariant, bool Sums, class X, class... Names, class Rule>
auto collective_leaf(const X& x, type_list<Names...> names, Rule rule) {
  if constexpr (DeferredValue<X>) {
    return defer_with(x, names, [names, rule](const auto& resolved) {
      return collective_leaf<Verb, Invariant, Sums>(resolved, names, rule);
    });
  } else {
    static_assert(NamedValue<X>, "namedax: this collective takes a mapped value (an argument of the function given "
                                 "to vmap or pmap, or a value computed from one)");
    using Env = typename X::env_type;
    require_bound<Verb, Env, Names...>();
    using T = std::conditional_t<Sums && std::is_same_v<typename X::value_type, bool>, std::int32_t, typename X::value_type>;
    xt::xarray<T> storage = empty_array<T>();
    strided_block<T> in = block_in_memory<T>(x.payload(), storage);
    const std::size_t positional_rank = in.shape.size() - Env::vectorized_count;
    const auto axes = describe_named_axes<X, Names...>(Verb::name);
    auto out = rule(std::move(in), positional_rank, std::span<const named_axis>(axes));
    using R = typename decltype(out)::value_type;
    constexpr axis_mask names_mask = Env::template mask_of<Names...>();
    constexpr axis_mask varying = Invariant ? (X::varying & ~names_mask) : (X::varying | names_mask);
    using Out = decltype(out);
    if constexpr (std::is_same_v<Out, shared_array<R>> || std::is_same_v<Out, shared_window<R>>)
      return make_named<Out, Env, varying>(std::move(out));
    else return make_named<shared_array<R>, Env, varying>(share_array<R>(std::move(out)));
  }
}

/// The names of a collective's axis argument: one name, or those of an axis list (a string
/// has none: it is reported on its own).
template <class A>
struct axis_argument_names {
  using type = type_list<>;
};
template <Axis A>
struct axis_argument_names<A> {
  using type = type_list<A>;
};
template <std::size_t P, class... Names>
struct axis_argument_names<axis_list<P, Names...>> {
  using type = type_list<Names...>;
};

/// Whether every one of `Names` is bound in the environment of leaf L; a leaf that is not a
/// named value is checked later (a deferred value when it is resolved, a plain one at run
/// time).
template <class L, class... Names>
constexpr bool leaf_binds(type_list<Names...>) {
  if constexpr (NamedValue<L>) return (BoundAxis<Names, typename L::env_type> && ...);
  else return true;
}

/// The leaf types of pytree X, as a type_list.
template <class X>
constexpr auto leaf_types() {
  using leaves = decltype(tree_leaves(std::declval<const X&>()));
  return [&]<std::size_t... I>(std::index_sequence<I...>) {
    return type_list<std::remove_cvref_t<std::tuple_element_t<I, leaves>>...>{};
  }(std::make_index_sequence<std::tuple_size_v<leaves>>{});
}

/// Whether a collective's axis argument (of type A) fits value X, as far as the types tell:
/// it is not a string, and every name is bound in the environment of each named leaf. The
/// verbs check it first, so that a mistake here is the only error reported.
template <class X, class A>
constexpr bool axis_argument_fits() {
  if constexpr (is_string_axis<A>) {
    return false;
  } else {
    return []<class... L>(type_list<L...>) {
      return (leaf_binds<L>(typename axis_argument_names<A>::type{}) && ...);
    }(leaf_types<X>());
  }
}

/// The type that reports the first name of `Names` not bound in the first leaf of `Leaves`
/// that misses one (unbound_axis), as a std::type_identity.
template <class Verb, class Env, class N, class... Rest>
constexpr auto first_unbound_name(type_list<N, Rest...>) {
  if constexpr (!BoundAxis<N, Env>) return std::type_identity<typename unbound_axis<Verb, Env, N>::type>{};
  else return first_unbound_name<Verb, Env>(type_list<Rest...>{});
}
template <class Verb, class Names, class L, class... Rest>
constexpr auto first_unbound_axis(Names names, type_list<L, Rest...>) {
  if constexpr (!leaf_binds<L>(names)) return first_unbound_name<Verb, typename L::env_type>(names);
  else return first_unbound_axis<Verb>(names, type_list<Rest...>{});
}

/// What a collective returns when its axis argument does not fit x (axis_argument_fits):
/// it reports the first mistake (a string for a name, or the first name that a leaf's
/// environment does not bind), then returns x typed as varying along no axis. The collective
/// would have made x the same along the axis the caller meant, whichever that is, so what
/// the function does next with the result (return it under an out spec or out_axes that
/// names no axis, ...) reports nothing more: the output is this one diagnostic.
template <class Verb, class X, class A>
auto misnamed_axis_result(const X& x, const A& axes) {
  if constexpr (is_string_axis<A>) {
    (void)to_axis_list(axes);  // its static_assert says how axis names are written
  } else {
    using names = typename axis_argument_names<A>::type;
    (void)sizeof(typename decltype(first_unbound_axis<Verb>(names{}, leaf_types<X>()))::type);
  }
  return detail::tree_map(x, [](const auto& leaf) {
    using L = std::remove_cvref_t<decltype(leaf)>;
    if constexpr (NamedValue<L>) return make_named<typename L::payload_type, typename L::env_type, 0>(leaf.payload());
    else return leaf;
  });
}

template <std::size_t P, class... Names>
constexpr auto names_only(const axis_list<P, Names...>&) {
  static_assert(P == 0, "namedax: this collective takes axis names only, no positional axes");
  return type_list<Names...>{};
}

inline std::optional<groups_t> groups_of(const std::vector<std::vector<int>>& groups) {
  if (groups.empty()) return std::nullopt;
  return groups;
}

/// A tuple of names as the axis list `axes(names...)`.
template <class... Names>
constexpr auto axis_list_of(const std::tuple<Names...>& names) {
  return unpack(names, [](const auto&... n) { return namedax::axes(n...); });
}

#if NAMEDAX_DEFINITIONS  // the bodies of the functions declared above (see detail/compilation.hpp)
NAMEDAX_DECL std::vector<std::size_t> canonical_positional(std::string_view verb, std::span<const int> positional,
                                                           std::size_t rank) {
  std::vector<std::size_t> dims;
  for (int p : positional) {
    int d = p < 0 ? p + static_cast<int>(rank) : p;
    if (d < 0 || d >= static_cast<int>(rank))
      fail("namedax::", verb, ": positional axis ", p, " is out of range for a value of positional rank ", rank);
    if (std::find(dims.begin(), dims.end(), static_cast<std::size_t>(d)) != dims.end())
      fail("namedax::", verb, ": positional axis ", p, " is given twice");
    dims.push_back(static_cast<std::size_t>(d));
  }
  return dims;
}
#endif  // NAMEDAX_DEFINITIONS

}  // namespace namedax::detail
