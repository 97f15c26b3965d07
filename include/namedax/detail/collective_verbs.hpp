// SPDX-License-Identifier: MIT
// The bodies of the collectives other than the all-reduces: each walks the pytree and runs its
// primitive's rule (detail/<primitive>.hpp) on every leaf, over processes first, then device
// threads, then in place for vectorized axes.
// IWYU pragma: private, include <namedax/namedax.hpp>
#pragma once

#include <namedax/collective_options.hpp>
#include <namedax/detail/all_gather.hpp>
#include <namedax/detail/all_reduce.hpp>
#include <namedax/detail/all_to_all.hpp>
#include <namedax/detail/pbroadcast.hpp>
#include <namedax/detail/pdot.hpp>
#include <namedax/detail/pgather.hpp>
#include <namedax/detail/ppermute.hpp>
#include <namedax/detail/psum_scatter.hpp>
#include <namedax/detail/traced.hpp>
#include <namedax/elementwise.hpp>

#include <limits>

namespace namedax::detail {
// The rules on one leaf's block, as collective_leaf runs them: over processes first, then
// among device threads, then in place for vectorized axes. Objects rather than lambdas of the
// verbs, so that each is compiled once per element type, not once per leaf type and placement.

/// all_gather's rule, reported in the name of `Verb`.
template <class Verb>
struct gather_rule {
  std::optional<groups_t> groups;
  int axis;
  bool tiled;

  template <class T>
  shared_array<T> operator()(strided_block<T> in, std::size_t rank, std::span<const named_axis> ax) const {
    constexpr std::string_view verb = Verb::name;
    if (auto out = all_gather_across_processes(verb, in, rank, ax, groups, axis, tiled))
      return share_array(std::move(*out));
    if (auto out = gather_among_threads(verb, in, rank, ax, groups, axis, tiled)) return std::move(*out);
    return share_array(all_gather_rule(verb, std::move(in), rank, ax, groups, axis, tiled, groups.has_value()));
  }
};

/// psum_scatter's rule.
template <class Verb>
struct scatter_rule {
  std::optional<groups_t> groups;
  int scatter_dimension;
  bool tiled;

  template <class T>
  xt::xarray<T> operator()(strided_block<T> in, std::size_t rank, std::span<const named_axis> ax) const {
    if (auto out = psum_scatter_across_processes(Verb::name, in, rank, ax, groups, scatter_dimension, tiled))
      return std::move(*out);
    return psum_scatter_rule(Verb::name, std::move(in), rank, ax, groups, scatter_dimension, tiled);
  }
};

/// all_to_all's rule; pswapaxes calls its split dimension `split_name` ("axis").
template <class Verb>
struct exchange_rule {
  std::optional<groups_t> groups;
  int split_axis, concat_axis;
  bool tiled;
  std::string_view split_name;

  template <class T>
  shared_window<T> operator()(strided_block<T> in, std::size_t rank, std::span<const named_axis> ax) const {
    if (auto out = all_to_all_across_processes(Verb::name, in, rank, ax, groups, split_axis, concat_axis, tiled))
      return share_window(std::move(*out));
    return share_window(
        all_to_all_rule(Verb::name, std::move(in), rank, ax, groups, split_axis, concat_axis, tiled, split_name));
  }
};

/// all_gather of every leaf, reported in the name of `Verb`; `Invariant` types the result as
/// the same along the axes.
template <class Verb, bool Invariant, class X, class A>
auto gather_tree(const X& x, const A& axes, const all_gather_options& options) {
  auto names = names_only(to_axis_list(axes));
  const gather_rule<Verb> block_rule{groups_of(options.axis_index_groups), options.axis, options.tiled};
  auto gather = [&](const auto& leaf) { return collective_leaf<Verb, Invariant, false>(leaf, names, block_rule); };
  return detail::tree_map(x, traced_to_rule<rule::all_gather<Invariant>, Verb>(gather, axes, options));
}

/// psum_scatter of every leaf.
template <class Verb, class X, class A>
auto psum_scatter_tree(const X& x, const A& axes, const psum_scatter_options& options) {
  auto names = names_only(to_axis_list(axes));
  const scatter_rule<Verb> block_rule{groups_of(options.axis_index_groups), options.scatter_dimension, options.tiled};
  auto scatter = [&](const auto& leaf) { return collective_leaf<Verb, false, true>(leaf, names, block_rule); };
  return detail::tree_map(x, traced_to_rule<rule::psum_scatter, Verb>(scatter, axes, options));
}

/// all_to_all of one named leaf as a view of its operand (all_to_all_view), which the result
/// keeps alive: where the operand lies in memory, a copy of its payload; else the array it is
/// evaluated into. Nothing where the rule must run.
template <class Verb, class X, class... Names>
auto all_to_all_in_place(const X& x, type_list<Names...>, bool grouped, int split_axis, int concat_axis, bool tiled,
                         std::string_view split_name) {
  using T = typename X::value_type;
  using Env = typename X::env_type;
  constexpr axis_mask varying = X::varying | Env::template mask_of<Names...>();
  std::optional<named<shared_window<T>, Env, varying>> out;
  require_bound<Verb, Env, Names...>();
  const auto axes = describe_named_axes<X, Names...>(Verb::name);
  const dims_t shape(x.payload().shape().begin(), x.payload().shape().end());
  const std::size_t positional_rank = shape.size() - Env::vectorized_count;
  if (!all_to_all_is_view(axes, grouped, tiled, shape, positional_rank)) return out;
  using P = std::remove_cvref_t<decltype(x.payload())>;
  std::shared_ptr<const void> owner;
  strided_block<T> in;
  if constexpr (StridedMemory<P> && std::is_same_v<typename P::value_type, T>) {
    auto payload = std::make_shared<const P>(x.payload());
    in = block_of(*payload);
    owner = std::move(payload);
  } else {
    auto evaluated = shared_storage(evaluate<T>(x.payload()));
    in = block_of(*evaluated);
    owner = std::move(evaluated);
  }
  if (auto view = all_to_all_view(Verb::name, std::move(in), positional_rank, std::span<const named_axis>(axes),
                                  split_axis, concat_axis, split_name))
    out = make_named<shared_window<T>, Env, varying>(share_window<T>(std::move(owner), *view));
  return out;
}

/// all_to_all of every leaf. pswapaxes is the untiled one with split_axis == concat_axis,
/// whose errors call that dimension `split_name` ("axis").
template <class Verb, class X, class A>
auto all_to_all_tree(const X& x, const A& axes, int split_axis, int concat_axis,
                     const std::vector<std::vector<int>>& axis_index_groups, bool tiled,
                     std::string_view split_name = "split_axis") {
  auto names = names_only(to_axis_list(axes));
  const exchange_rule<Verb> block_rule{groups_of(axis_index_groups), split_axis, concat_axis, tiled, split_name};
  auto exchange = [&](const auto& leaf) {
    using L = std::remove_cvref_t<decltype(leaf)>;
    if constexpr (NamedValue<L>)
      if (auto view = all_to_all_in_place<Verb>(leaf, names, block_rule.groups.has_value(), split_axis, concat_axis,
                                                tiled, split_name))
        return std::move(*view);
    return collective_leaf<Verb, false, false>(leaf, names, block_rule);
  };
  return detail::tree_map(x, traced_to_rule<rule::all_to_all, Verb>(exchange, axes, split_axis, concat_axis,
                                                                    axis_index_groups, tiled));
}

// Named so that a failing static_assert prints the permutation.
template <class Perm>
inline constexpr bool permutation_is_well_formed =
    Perm::pairs_complete && Perm::nonnegative && Perm::sources_unique && Perm::destinations_unique;

/// The static size of the single axis `Names` in `X`'s environment, or dynamic_extent.
template <class X, class... Names>
constexpr std::size_t static_axis_size() {
  if constexpr (NamedValue<X> && sizeof...(Names) == 1) {
    constexpr int k = (X::env_type::index_of(Names::name), ...);
    if constexpr (k >= 0) return X::env_type::extents[k];
  }
  return dynamic_extent;
}
template <class Perm, std::size_t Extent>
inline constexpr bool permutation_fits_axis_size = Extent == dynamic_extent || Perm::largest < static_cast<int>(Extent);

/// ppermute and pshuffle on one leaf; `pairs_of(axes)` gives the (source, destination) pairs.
/// An array moved among device threads only is handed over by reference (permute_by_reference).
template <class Verb, class X, class... Names, class PairsOf>
auto permute_leaf(const X& x, type_list<Names...> names, PairsOf pairs_of) {
  auto moved = [pairs_of](auto in, std::size_t rank, auto ax) {
    const permutation_t& pairs = pairs_of(ax);
    if (auto out = ppermute_across_processes(Verb::name, in, ax, pairs)) return std::move(*out);
    return ppermute_rule(Verb::name, std::move(in), rank, ax, pairs);
  };
  if constexpr (NamedValue<X>) {
    using Env = typename X::env_type;
    using T = typename X::value_type;
    require_bound<Verb, Env, Names...>();
    const auto axes = describe_named_axes<X, Names...>(Verb::name);
    // The path depends on what every device agrees on, never on how this device holds its
    // operand: a lazy or strided one is evaluated first, as the rule would copy it anyway.
    if (const auto threads = thread_axes(axes)) {
      const auto owned = namedax::eval(x);
      return make_named<shared_array<T>, Env, X::varying | Env::template mask_of<Names...>()>(std::get<0>(
          permute_by_reference<T>(Verb::name, std::tuple{&owned.payload()}, axes, *threads, pairs_of(std::span<const named_axis>(axes)))));
    }
  }
  return collective_leaf<Verb, false, false>(x, names, moved);
}

/// Whether every leaf of node X is a named value that varies along every name: then the
/// leaves, evaluated, can be moved among device threads in one exchange. The types say it,
/// never how a device holds a leaf, so that every device takes the same path.
template <class X, class... Names>
constexpr bool node_movable_by_reference(type_list<Names...>) {
  return every_child<X>([]<class L>(std::type_identity<L>) { return varies_along_all<L, Names...>(); });
}

/// ppermute and pshuffle of a node movable by reference, over device-thread axes alone: one
/// exchange for all the leaves. Nothing otherwise: the leaves then go one by one.
template <class Verb, class X, class... Names, class PairsOf>
auto permute_node(const X& x, type_list<Names...>, PairsOf pairs_of) {
  return [&]<std::size_t... I>(std::index_sequence<I...>) {
    // Leaf I's result: the array received, typed as permute_leaf types it.
    auto typed = []<class L>(std::type_identity<L>, shared_array<typename L::value_type> array) {
      using Env = typename L::env_type;
      return make_named<shared_array<typename L::value_type>, Env, L::varying | Env::template mask_of<Names...>()>(
          std::move(array));
    };
    using leaf = std::tuple<std::type_identity<child_t<X, I>>...>;
    std::optional<decltype(make_like<X>(typed(std::tuple_element_t<I, leaf>{}, std::declval<shared_array<
        typename std::tuple_element_t<I, leaf>::type::value_type>>())...))> out;
    using first = typename std::tuple_element_t<0, leaf>::type;
    const auto axes = describe_named_axes<first, Names...>(Verb::name);
    const auto threads = thread_axes(axes);
    if (!threads) return out;
    const auto owned = std::tuple{namedax::eval(std::get<I>(children(x)))...};
    auto moved = permute_by_reference(Verb::name, std::tuple{&std::get<I>(owned).payload()...}, axes, *threads,
                                      pairs_of(std::span<const named_axis>(axes)));
    out.emplace(make_like<X>(typed(std::tuple_element_t<I, leaf>{}, std::move(std::get<I>(moved)))...));
    return out;
  }(std::make_index_sequence<child_count<X>>{});
}

/// ppermute and pshuffle of every leaf: one exchange for a node movable by reference,
/// otherwise leaf by leaf. `pairs_of(axes)` gives the (source, destination) pairs, and may
/// refer to the caller's data (a call then copies nothing); a deferred leaf, which may outlive
/// the call, takes `owning_pairs_of()`, which owns its copy.
template <class Verb, class X, class... Names, class PairsOf, class OwningPairsOf>
auto permute_tree(const X& x, type_list<Names...> names, PairsOf pairs_of, OwningPairsOf owning_pairs_of) {
  if constexpr (node_movable_by_reference<X>(type_list<Names...>{}))
    if (auto moved = permute_node<Verb>(x, names, pairs_of)) return std::move(*moved);
  auto permute = [&](const auto& leaf) {
    if constexpr (DeferredValue<std::remove_cvref_t<decltype(leaf)>>)
      return permute_leaf<Verb>(leaf, names, owning_pairs_of());
    else
      return permute_leaf<Verb>(leaf, names, pairs_of);
  };
  return detail::tree_map(x, traced_to_rule<rule::permute, Verb>(permute, names, pairs_of));
}

/// axis_index over `Names`: the row-major index over them of each position, as int32, once
/// the environment is known.
template <std::size_t P, class... Names>
auto axis_index_value(const axis_list<P, Names...>&) {
  static_assert(P == 0, "namedax::axis_index: takes axis names only, no positional axes");
  static_assert(sizeof...(Names) > 0, "namedax::axis_index: give at least one axis name");
  return index_table<Names...>();
}

/// pvary on one leaf: the same payload, its type now varying along `Names` too. A vectorized
/// axis the value did not vary along keeps its size-1 dimension: every rule reads such a
/// dimension with stride 0, so each index sees the same data, which is what pvary means.
/// pvary of a plain value (JAX's pvary takes any value, as a loop carry that starts from a
/// constant): x on every index of the names, varying along them. Its type cannot know where
/// the enclosing maps place the names, so, as axis_index's, it waits for its environment: a
/// table of x with a size-1 dim per name, marked varying. Each name must be bound now.
template <class Verb, class X, class... Names>
auto pvary_plain(const X& x, type_list<Names...>) {
  (bound_frame(Verb::name, Names::name), ...);
  using T = value_type_of_t<X>;
  std::vector<std::size_t> shape;
  if constexpr (!std::is_arithmetic_v<X>) shape.assign(x.shape().begin(), x.shape().end());
  shape.resize(shape.size() + sizeof...(Names), 1);
  xt::xarray<T> table;
  if constexpr (std::is_arithmetic_v<X>) table = uninitialized_array<T>(shape), table.fill(x);
  else table = evaluate<T>(x), table.reshape(shape);
  constexpr axis_mask every_name = (axis_mask{1} << sizeof...(Names)) - 1;
  return deferred<T, every_name, Names...>(share_array(std::move(table)));
}

template <class Verb, class X, class... Names>
auto pvary_leaf(const X& x, type_list<Names...> names) {
  if constexpr (DeferredValue<X>) {
    return defer_with(x, names, [names](const auto& resolved) { return pvary_leaf<Verb>(resolved, names); });
  } else if constexpr (PlainValue<X>) {
    return pvary_plain<Verb>(x, names);
  } else {
    static_assert(NamedValue<X>, "namedax::pvary: takes named values (an argument of the function given to vmap "
                                 "or pmap, or a value computed from one), xtensor expressions or scalars");
    using Env = typename X::env_type;
    require_bound<Verb, Env, Names...>();
    return make_named<typename X::payload_type, Env, X::varying | Env::template mask_of<Names...>()>(x.payload());
  }
}

template <class Verb>
struct pvary_verb {
  template <class X, AxisArgument A>
  auto operator()(const X& x, const A& axes) const {
    auto names = names_only(to_axis_list(axes));
    auto vary = [&](const auto& leaf) { return pvary_leaf<Verb>(leaf, names); };
    return detail::tree_map(x, traced_to_rule<rule::pvary, Verb>(vary, axes));
  }
};
/// Whether namedax has a type for pcast's target: only `varying`. Named so that a failing
/// static_assert prints the target.
template <class To>
inline constexpr bool pcast_target_has_a_type = std::is_same_v<To, pcast_to::varying_t>;

/// pbroadcast from index `source` of every leaf.
template <class Verb, class X, class A>
auto pbroadcast_tree(const X& x, const A& axes, int source) {
  auto names = names_only(to_axis_list(axes));
  auto broadcast = [&](const auto& leaf) {
    return collective_leaf<Verb, true, false>(leaf, names, [=](auto in, std::size_t rank, auto ax) {
      if (auto out = pbroadcast_across_processes(Verb::name, in, ax, source)) return std::move(*out);
      return pbroadcast_rule(Verb::name, std::move(in), rank, ax, source);
    });
  };
  return detail::tree_map(x, traced_to_rule<rule::pbroadcast, Verb>(broadcast, axes, source));
}

/// The (extreme value, lowest linear index attaining it) of one leaf, as JAX computes pargmax:
/// the index of every position holding the extreme, else the largest int32, then the minimum.
/// Both reductions report errors in the name of `Verb`.
template <class Verb, reduction Extreme, class X, class A, class... Options>
auto extreme_and_index(const X& x, const A& axes, const Options&... options) {
  (void)names_only(to_axis_list(axes));
  auto value = all_reduce_verb<Verb, Extreme>{}(x, axes, options...);
  auto candidates = where(x == value, axis_index_value(to_axis_list(axes)), std::numeric_limits<std::int32_t>::max());
  auto index = all_reduce_verb<Verb, reduction::min>{}(candidates, axes, options...);
  return std::pair{value, index};
}

template <class Verb, reduction Extreme, bool WithValue>
struct arg_extreme_verb {
  template <class X, AxisArgument A>
  auto operator()(const X& x, const A& axes) const {
    return detail::tree_map(x, [&](const auto& leaf) { return pick(extreme_and_index<Verb, Extreme>(leaf, axes)); });
  }
  /// With groups, the index is the linear index (along the axes) of the extreme in the caller's group.
  template <class X, AxisArgument A>
  auto operator()(const X& x, const A& axes, const reduce_options& options) const {
    return detail::tree_map(x,
                            [&](const auto& leaf) { return pick(extreme_and_index<Verb, Extreme>(leaf, axes, options)); });
  }

 private:
  template <class Pair>
  static auto pick(Pair&& p) {
    if constexpr (WithValue) return std::forward<Pair>(p);
    else return std::forward<Pair>(p).second;
  }
};

/// dot_general of two operands with named axes, summing over no name: pdot's local product
/// (either operand may be a plain array), typed as varying where either does. On device
/// threads each product runs on the calling thread alone.
template <class X, class Y>
auto local_dot(std::string_view verb, const X& x, const Y& y, const dimension_pairs& contract,
               const dimension_pairs& batch) {
  using Env = typename merged_env<env<>, X, Y>::type;
  using TX = value_type_of_t<X>;
  using TY = value_type_of_t<Y>;
  using R = std::common_type_t<TX, TY>;
  auto px = payload_in<Env>(x);
  auto py = payload_in<Env>(y);
  xt::xarray<TX> x_storage;
  xt::xarray<TY> y_storage;
  auto bx = block_in_memory<TX>(px, x_storage);
  auto by = block_in_memory<TY>(py, y_storage);
  auto local = dot_general<R>(verb, bx, bx.shape.size() - Env::vectorized_count, by,
                              by.shape.size() - Env::vectorized_count, contract, batch, Env::device_mask != 0);
  return make_named<shared_array<R>, Env, mask_of<X>() | mask_of<Y>()>(share_array<R>(std::move(local)));
}

/// pdot's local product, once its names are checked against the operands' environment.
template <class Verb, class X, class Y, class A>
auto local_pdot(const X& x, const Y& y, const A& axes, const dimension_pairs& contract, const dimension_pairs& batch) {
  using Env = typename merged_env<env<>, X, Y>::type;
  [&]<class... Names>(type_list<Names...>) { require_bound<Verb, Env, Names...>(); }(names_only(to_axis_list(axes)));
  return local_dot(Verb::name, x, y, contract, batch);
}

/// pgather once src and idx are in one environment: src's payload read in place, idx's
/// integers as row-major indices over the axes of `list`.
template <class Verb, class S, class I, std::size_t P, class... Names>
auto pgather_values(const S& src, const I& idx, const axis_list<P, Names...>& list) {
  using Env = typename merged_env<env<>, S, I>::type;
  require_bound<Verb, Env, Names...>();
  using T = typename S::value_type;
  using Index = value_type_of_t<I>;
  static_assert(std::is_integral_v<Index> && !std::is_same_v<Index, bool>, "namedax::pgather: indices must be integers");
  auto lifted = make_named<decltype(payload_in<Env>(src)), Env, S::varying>(payload_in<Env>(src));
  xt::xarray<T> src_storage;
  auto block = block_in_memory<T>(lifted.payload(), src_storage);
  const std::size_t src_rank = block.shape.size() - Env::vectorized_count;
  auto dims = canonical_positional(Verb::name, list.positional, src_rank);

  // idx in the environment, kept alive while the rule reads it.
  auto idx_payload = [&] {
    if constexpr (std::is_arithmetic_v<I>) {
      std::array<std::size_t, Env::vectorized_count> ones;
      ones.fill(1);
      xt::xarray<Index> scalar = xt::xarray<Index>::from_shape(ones);
      scalar.fill(idx);
      return share_array<Index>(std::move(scalar));
    } else {
      return payload_in<Env>(idx);
    }
  }();
  xt::xarray<Index> idx_storage;
  auto index = block_in_memory<Index>(idx_payload, idx_storage);
  constexpr axis_mask names_mask = Env::template mask_of<Names...>();
  constexpr bool idx_varies = (mask_of<I>() & names_mask & Env::vectorized_mask) != 0;
  const auto axes = describe_named_axes<decltype(lifted), Names...>(Verb::name);
  auto out = pgather_rule<T, Index>(Verb::name, std::move(block), src_rank, axes, dims, list.names_before, index,
                                           index.shape.size() - Env::vectorized_count, idx_varies);
  constexpr axis_mask varying = (S::varying & ~names_mask) | mask_of<I>();
  return make_named<shared_array<T>, Env, varying>(share_array<T>(std::move(out)));
}

}  // namespace namedax::detail
