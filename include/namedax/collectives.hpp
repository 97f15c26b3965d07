// SPDX-License-Identifier: MIT
// The public collectives: psum, pmean, pmax, pmin, all_gather, all_gather_invariant,
// psum_scatter, all_to_all, pswapaxes, ppermute, pshuffle, pbroadcast, pargmax, pargmin,
// axis_index, axis_size, pvary, pcast, pdot and pgather.
// Each runs one rule (detail/) that serves both placements: vectorized axes are read in
// place, device axes through the exchange among device threads.
#pragma once

#include <namedax/axis.hpp>
#include <namedax/detail/all_gather.hpp>
#include <namedax/detail/all_to_all.hpp>
#include <namedax/detail/device_rules.hpp>
#include <namedax/detail/pbroadcast.hpp>
#include <namedax/detail/pdot.hpp>
#include <namedax/detail/pgather.hpp>
#include <namedax/detail/ppermute.hpp>
#include <namedax/detail/process_rules.hpp>
#include <namedax/detail/psum_scatter.hpp>
#include <namedax/detail/reduction.hpp>
#include <namedax/elementwise.hpp>
#include <namedax/named_array.hpp>

#include <xtensor/xnoalias.hpp>

#include <algorithm>
#include <array>
#include <concepts>
#include <limits>
#include <optional>
#include <tuple>

namespace namedax {

/// Options of psum, pmean, pmax and pmin (JAX's keyword arguments).
struct reduce_options {
  /// Reduce within each group of axis indices; the groups must partition 0..N-1.
  std::vector<std::vector<int>> axis_index_groups{};
};

namespace detail {
enum class reduction { sum, mean, max, min };

template <reduction K>
constexpr fold_kind fold_of() {
  return K == reduction::max ? fold_kind::max : K == reduction::min ? fold_kind::min : fold_kind::sum;
}

template <reduction K>
auto reduction_op() {
  if constexpr (K == reduction::max) return max_op{};
  else if constexpr (K == reduction::min) return min_op{};
  else return sum_op{};
}

/// The element type a reduction accumulates in: bool sums as int32, as in JAX.
template <reduction K, class T>
using accumulate_t = std::conditional_t<(K == reduction::sum || K == reduction::mean) && std::is_same_v<T, bool>,
                                        std::int32_t, T>;
/// pmean of integers and bools gives float32.
template <reduction K, class T>
using reduction_result_t =
    std::conditional_t<K == reduction::mean && !std::is_floating_point_v<T>, float, accumulate_t<K, T>>;

inline std::vector<std::size_t> canonical_positional(std::string_view verb, std::span<const int> positional,
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

/// The value of a reduction from its result and pmean's divisor, typed for leaf X.
template <reduction K, bool Grouped, class X, class... Names, class Sum>
auto reduced_value(Sum sum, xt::xarray<float>&& divisor, float positional_count) {
  using Env = typename X::env_type;
  using R = reduction_result_t<K, typename X::value_type>;
  constexpr axis_mask reduced = Env::template mask_of<Names...>();
  // Without groups the result is the same along the reduced axes; with groups it is not.
  constexpr axis_mask out_varying = Grouped ? (X::varying | reduced) : (X::varying & ~reduced);
  if constexpr (K == reduction::mean) {
    auto mean = uninitialized_array<R>(sum.shape());
    xt::noalias(mean) = xt::cast<R>(sum) / (xt::cast<R>(divisor) * static_cast<R>(positional_count));
    recycle(std::move(divisor));
    if constexpr (!std::is_same_v<Sum, shared_array<typename Sum::value_type>>) recycle(std::move(sum));
    return make_named<shared_array<R>, Env, out_varying>(share_array<R>(std::move(mean)));
  } else if constexpr (std::is_same_v<Sum, shared_array<R>>) {
    return make_named<shared_array<R>, Env, out_varying>(std::move(sum));
  } else {
    return make_named<shared_array<R>, Env, out_varying>(share_array<R>(std::move(sum)));
  }
}

/// psum / pmean / pmax / pmin over `Names` and positional axes, for one leaf.
/// `Grouped` (options were given) makes the result vary along the reduced axes: groups
/// are runtime values, the result's type cannot depend on them.
template <class Verb, reduction K, bool Grouped, class X, std::size_t P, class... Names>
auto all_reduce_leaf(const X& x, const axis_list<P, Names...>& list, const std::optional<groups_t>& groups) {
  constexpr std::string_view verb = Verb::name;
  if (groups && P > 0)
    fail("namedax::", verb, ": axis_index_groups cannot be combined with positional axes; reduce the positional "
         "axes in a separate call");
  if constexpr (DeferredValue<X>) {
    auto later = [x, list, groups]<class Env>(Env) {
      return all_reduce_leaf<Verb, K, Grouped>(x.template resolve<Env>(), list, groups);
    };
    using awaited = typename type_list_cat<names_awaited_t<X>, type_list<Names...>>::type;
    return typename deferred_from<decltype(later), awaited>::type{later};
  } else if constexpr (NamedValue<X>) {
    using Env = typename X::env_type;
    require_bound<Verb, Env, Names...>();
    using T = accumulate_t<K, typename X::value_type>;
    auto op = reduction_op<K>();

    xt::xarray<T> storage = empty_array<T>();
    strided_block<T> in = block_in_memory<T>(x.payload(), storage);
    const std::size_t rank = in.shape.size() - Env::vectorized_count;
    auto dims = canonical_positional(verb, list.positional, rank);
    float positional_count = 1;
    for (auto d : dims) positional_count *= static_cast<float>(in.shape[d]);
    if constexpr (P > 0) {  // the axis list's type says whether positional axes are reduced
      storage = reduce_positional<T>(in, dims, op);
      in = block_of(storage);
    }
    const std::size_t kept_rank = rank - dims.size();

    auto named_axes = describe_named_axes<X, Names...>(verb);
    if (auto shared = reduce_among_threads<T>(verb, in, named_axes, groups, K == reduction::mean, op))
      return reduced_value<K, Grouped, X, Names...>(std::move(shared->first), std::move(shared->second), positional_count);
    auto across = reduce_across_processes<T>(verb, in, named_axes, groups, fold_of<K>());
    auto [sum, divisor] = across ? std::move(*across)
                                 : reduce_named<T>(verb, std::move(in), kept_rank, named_axes, groups,
                                                   K == reduction::sum || K == reduction::mean, K == reduction::mean, op);

    return reduced_value<K, Grouped, X, Names...>(std::move(sum), std::move(divisor), positional_count);
  } else {
    static_assert(PlainValue<X>, "namedax: a collective takes named values, xtensor expressions or scalars");
    // A plain value varies along no axis: it is replicated, psum gives size * x.
    std::size_t size = 1;
    (..., (size *= bound_frame(verb, Names::name).size));
    if (groups) fail("namedax::", verb, ": axis_index_groups need a mapped value; this value is not mapped");
    using V = value_type_of_t<X>;
    using T = accumulate_t<K, V>;
    if constexpr (std::is_arithmetic_v<X>) {
      if constexpr (P > 0) fail("namedax::", verb, ": a scalar has no positional axes");
      if constexpr (K == reduction::sum) return wrapping_multiply(static_cast<T>(x), static_cast<T>(size));
      else return static_cast<reduction_result_t<K, V>>(x);
    } else {
      xt::xarray<T> a = evaluate<T>(x);
      auto dims = canonical_positional(verb, list.positional, a.dimension());
      float count = 1;
      for (auto d : dims) count *= static_cast<float>(a.shape()[d]);
      if (!dims.empty()) a = reduce_positional<T>(block_of(a), dims, reduction_op<K>());
      if constexpr (K == reduction::sum) {
        for (T& v : a) v = wrapping_multiply(v, static_cast<T>(size));
        return a;
      } else if constexpr (K == reduction::mean) {
        return xt::xarray<reduction_result_t<K, V>>(xt::cast<reduction_result_t<K, V>>(a) / count);
      } else {
        return a;
      }
    }
  }
}

/// Whether `holds(std::type_identity<L>{})` for every child type L of node X; false for a
/// leaf. The predicate is instantiated for every child, so it must accept any type.
template <class X, class Holds>
constexpr bool every_child(Holds holds) {
  if constexpr (!is_node<X>) {
    return false;
  } else {
    using parts = decltype(children(std::declval<const X&>()));
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return (holds(std::type_identity<std::remove_cvref_t<std::tuple_element_t<I, parts>>>{}) && ...);
    }(std::make_index_sequence<std::tuple_size_v<parts>>{});
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

/// Whether the leaves of node X can share one exchange or MPI_Allreduce: named values of one
/// accumulated element type that vary along every reduced name (so that each is a member's
/// whole payload).
template <reduction K, class X, class... Names>
constexpr bool fusable_leaves() {
  if constexpr (!is_node<X>) {
    return false;
  } else {
    using first = std::remove_cvref_t<std::tuple_element_t<0, decltype(children(std::declval<const X&>()))>>;
    return every_child<X>([]<class L>(std::type_identity<L>) {
      if constexpr (varies_along_all<L, Names...>() && NamedValue<first>)
        return std::is_same_v<accumulate_t<K, typename L::value_type>, accumulate_t<K, typename first::value_type>>;
      else
        return false;
    });
  }
}

/// The leaves of node X as blocks of T in memory (copied into `storage` where they are not).
template <class T, class X, std::size_t N>
std::array<strided_block<T>, N> leaf_blocks(const X& x, std::array<xt::xarray<T>, N>& storage) {
  std::array<strided_block<T>, N> blocks;
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    ((blocks[I] = block_in_memory<T>(std::get<I>(children(x)).payload(), storage[I])), ...);
  }(std::make_index_sequence<N>{});
  return blocks;
}

/// A reduction of node X in one exchange for all its leaves, when `applies(axes)`:
/// `reduce(axes, blocks)` returns each leaf's result and pmean's divisors, or nothing. Leaves
/// of one accumulated type that vary along every name (fusable_leaves).
template <class Verb, reduction K, bool Grouped, class X, class... Names, class Applies, class Reduce>
auto fused_reduction(const X& x, const std::optional<groups_t>& groups, Applies applies, Reduce reduce) {
  using parts = decltype(children(x));
  using first = std::remove_cvref_t<std::tuple_element_t<0, parts>>;
  using T = accumulate_t<K, typename first::value_type>;
  using result = decltype(tree_map(x, [&](const auto& leaf) {
    return all_reduce_leaf<Verb, K, Grouped>(leaf, axis_list<0, Names...>{}, groups);
  }));
  constexpr std::size_t count = std::tuple_size_v<parts>;
  std::optional<result> out;
  const auto axes = describe_named_axes<first, Names...>(Verb::name);
  if (!applies(std::span<const named_axis>(axes))) return out;
  auto storage = empty_arrays<T, count>();
  auto reduced = reduce(std::span<const named_axis>(axes), leaf_blocks<T>(x, storage));
  if (!reduced) return out;
  out.emplace([&]<std::size_t... I>(std::index_sequence<I...>) {
    return make_like<X>(reduced_value<K, Grouped, std::remove_cvref_t<std::tuple_element_t<I, parts>>, Names...>(
        std::move(reduced->first[I]), std::move(reduced->second[I]), 1.0f)...);
  }(std::make_index_sequence<count>{}));
  return out;
}

/// A node reduced over process axes alone: one agreement and one MPI_Allreduce for all its
/// leaves, on their payloads laid end to end.
template <class Verb, reduction K, bool Grouped, class X, class... Names>
auto fused_across_processes(const X& x, const std::optional<groups_t>& groups) {
  auto applies = [](std::span<const named_axis> axes) { return placed_on_processes(axes); };
  return fused_reduction<Verb, K, Grouped, X, Names...>(x, groups, applies, [&]<class T, std::size_t N>(
      std::span<const named_axis> axes, std::array<strided_block<T>, N> blocks) {
    std::optional<std::pair<std::array<xt::xarray<T>, N>, std::array<xt::xarray<float>, N>>> out;
    std::array<std::size_t, N + 1> offsets{};
    for (std::size_t k = 0; k < N; ++k) offsets[k + 1] = offsets[k] + element_count(blocks[k].shape);
    auto laid = xt::xarray<T>::from_shape({offsets[N]});
    for (std::size_t k = 0; k < N; ++k) copy_strided(blocks[k], laid.data() + offsets[k]);
    auto sum = reduce_across_processes<T>(Verb::name, block_of(laid), axes, groups, fold_of<K>(),
                                          message(" of ", N, " leaves"));
    auto& [parts, divisors] = out.emplace();
    for (std::size_t k = 0; k < N; ++k) {
      parts[k] = uninitialized_array<T>(blocks[k].shape);
      std::copy_n(sum->first.data() + offsets[k], parts[k].size(), parts[k].data());
      divisors[k] = sum->second;
    }
    return out;
  });
}

/// A node reduced over device threads alone: one exchange for all its leaves.
template <class Verb, reduction K, bool Grouped, class X, class... Names>
auto fused_among_threads(const X& x, const std::optional<groups_t>& groups) {
  std::optional<xt::svector<std::string_view, 8>> names;  // the device-thread axes, once they apply
  auto applies = [&](std::span<const named_axis> axes) {
    if (!groups) names = thread_axes(axes);
    return names.has_value();
  };
  return fused_reduction<Verb, K, Grouped, X, Names...>(x, groups, applies, [&]<class T, std::size_t N>(
      std::span<const named_axis> axes, std::array<strided_block<T>, N> blocks) {
    std::optional<std::pair<std::array<shared_array<T>, N>, std::array<xt::xarray<float>, N>>> out;
    auto done = reduce_leaves_among_threads<T, N>(Verb::name, blocks, axes, *names, reduction_op<K>());
    if (!done) return out;
    out.emplace([&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::pair{std::array{shared_array<T>(std::move(done->first[I]))...},
                       std::array{members_divisor(blocks[I].shape.size(), done->second, K == reduction::mean)...}};
    }(std::make_index_sequence<N>{}));
    return out;
  });
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

/// False for every type: a static_assert on it fires only when the overload is chosen.
template <class Options>
inline constexpr bool wrong_options = false;

/// What `{}` binds to in `psum(x, axes, {})`: options that cannot carry groups, so the
/// result is known at compile time to be the same along the reduced axes.
struct reduce_options_without_groups {};

/// The shared body of psum, pmean, pmax and pmin.
template <class Verb, reduction K>
struct all_reduce_verb {
  template <class X, AxisArgument A>
  auto operator()(const X& x, const A& axes) const {
    return reduce_tree<false>(x, to_axis_list(axes), std::nullopt);
  }
  /// `{}`: no groups, so the result does not vary along the axes (chosen over the overload
  /// below, which is a template in its last parameter, whenever both fit).
  template <class X, AxisArgument A>
  auto operator()(const X& x, const A& axes, const reduce_options_without_groups&) const {
    return (*this)(x, axes);
  }
  /// Options that name groups, or a reduce_options object: groups are runtime values, so
  /// the result's type says it may vary along the axes.
  template <class X, AxisArgument A, class Options = reduce_options>
    requires std::same_as<Options, reduce_options>
  auto operator()(const X& x, const A& axes, const Options& options) const {
    std::optional<groups_t> groups;
    if (!options.axis_index_groups.empty()) groups = options.axis_index_groups;
    return reduce_tree<true>(x, to_axis_list(axes), groups);
  }
  /// Another collective's options: the first error line says which options these take.
  template <class X, AxisArgument A, class Options = detail::foreign_option_fields>
    requires(!std::convertible_to<const Options&, reduce_options> &&
             !std::convertible_to<const Options&, reduce_options_without_groups>)
  X operator()(const X& x, const A&, const Options&) const {
    static_assert(wrong_options<Options>,
                  "namedax: psum, pmean, pmax and pmin take namedax::reduce_options ({.axis_index_groups = ...})");
    return x;  // only the assertion above is reported
  }

 private:
  template <bool Grouped, class X, std::size_t P, class... Names>
  static auto reduce_tree(const X& x, const axis_list<P, Names...>& list, const std::optional<groups_t>& groups) {
    if constexpr (P == 0 && fusable_leaves<K, X, Names...>()) {
      if (auto fused = fused_across_processes<Verb, K, Grouped, X, Names...>(x, groups)) return std::move(*fused);
      if (auto fused = fused_among_threads<Verb, K, Grouped, X, Names...>(x, groups)) return std::move(*fused);
    }
    return tree_map(x, [&](const auto& leaf) { return all_reduce_leaf<Verb, K, Grouped>(leaf, list, groups); });
  }
};
}  // namespace detail

/// All-reduce sum over named axes (and positional ones): `psum(x, "i"_ax)`,
/// `psum(x, axes("i"_ax, 0))`, `psum(x, "i"_ax, {.axis_index_groups = {{0, 1}, {2, 3}}})`.
/// With x = [0, 1, 2, 3] mapped along "i": [6, 6, 6, 6]. Bool sums as int32.
struct psum_fn : detail::all_reduce_verb<psum_fn, detail::reduction::sum> {
  static constexpr std::string_view name = "psum";
};
/// All-reduce mean: psum(x) divided by the size of the caller's group (times the number of
/// reduced positional elements); integers and bools give float32. [0, 1, 2, 3] -> [1.5, ...].
struct pmean_fn : detail::all_reduce_verb<pmean_fn, detail::reduction::mean> {
  static constexpr std::string_view name = "pmean";
};
/// All-reduce maximum; NaN propagates.
struct pmax_fn : detail::all_reduce_verb<pmax_fn, detail::reduction::max> {
  static constexpr std::string_view name = "pmax";
};
/// All-reduce minimum; NaN propagates.
struct pmin_fn : detail::all_reduce_verb<pmin_fn, detail::reduction::min> {
  static constexpr std::string_view name = "pmin";
};
inline constexpr psum_fn psum{};
inline constexpr pmean_fn pmean{};
inline constexpr pmax_fn pmax{};
inline constexpr pmin_fn pmin{};

namespace detail {
/// Runs a collective's rule on one leaf: a deferred value waits for its environment, a named
/// value's names are checked at compile time and its payload read where it lies. `Sums`
/// makes bool add up as int32; `Invariant` says the result is the same along the names.
template <class Verb, bool Invariant, bool Sums, class X, class... Names, class Rule>
auto collective_leaf(const X& x, type_list<Names...> names, Rule rule) {
  if constexpr (DeferredValue<X>) {
    auto later = [x, names, rule]<class Env>(Env) {
      return collective_leaf<Verb, Invariant, Sums>(x.template resolve<Env>(), names, rule);
    };
    using awaited = typename type_list_cat<names_awaited_t<X>, type_list<Names...>>::type;
    return typename deferred_from<decltype(later), awaited>::type{later};
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
    if constexpr (std::is_same_v<decltype(out), shared_array<R>>) return make_named<shared_array<R>, Env, varying>(std::move(out));
    else return make_named<shared_array<R>, Env, varying>(share_array<R>(std::move(out)));
  }
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
}  // namespace detail

/// Options of all_gather (JAX's keyword arguments).
struct all_gather_options {
  std::vector<std::vector<int>> axis_index_groups{};  ///< gather within each group; equal sizes
  int axis = 0;                                     ///< where the gathered axis goes (tiled: which axis grows)
  bool tiled = false;                               ///< concatenate along `axis` instead of stacking
};

namespace detail {
/// What `{.axis = 1, .tiled = true}` binds to in all_gather: options without groups, so the
/// result is known at compile time to be the same along the gathered axes.
struct all_gather_options_without_groups {
  int axis = 0;
  bool tiled = false;
};

/// all_gather of every leaf, reported in the name of `Verb`; `Invariant` types the result as
/// the same along the axes.
template <class Verb, bool Invariant, class X, class A>
auto gather_tree(const X& x, const A& axes, const all_gather_options& options) {
  auto names = names_only(to_axis_list(axes));
  auto groups = groups_of(options.axis_index_groups);
  return tree_map(x, [&](const auto& leaf) {
    return collective_leaf<Verb, Invariant, false>(leaf, names, [=](auto in, std::size_t rank, auto ax) {
      constexpr std::string_view verb = Verb::name;
      if (auto out = all_gather_across_processes(verb, in, rank, ax, groups, options.axis, options.tiled))
        return share_array(std::move(*out));
      if (auto out = gather_among_threads(verb, in, rank, ax, groups, options.axis, options.tiled)) return std::move(*out);
      return share_array(all_gather_rule(verb, std::move(in), rank, ax, groups, options.axis, options.tiled,
                                         groups.has_value()));
    });
  });
}
}  // namespace detail

/// Gathers the values of every index along the axes: `all_gather(x, "i"_ax)` stacks them in
/// a new positional axis 0. With x = [0, 1, 2, 3] along "i": [0, 1, 2, 3] on every index.
/// Several names gather row-major over them (beyond JAX).
struct all_gather_fn {
  static constexpr std::string_view name = "all_gather";
  /// Without options the result is the same along the axes.
  template <class X, AxisArgument A>
  auto operator()(const X& x, const A& axes) const {
    return gather<true>(x, axes, all_gather_options{});
  }
  /// Options written without groups (`{.axis = 1}`, `{}`): the result is the same along the
  /// axes, as without options (chosen over the overload below whenever both fit).
  template <class X, AxisArgument A>
  auto operator()(const X& x, const A& axes, const detail::all_gather_options_without_groups& options) const {
    return gather<true>(x, axes, all_gather_options{.axis = options.axis, .tiled = options.tiled});
  }
  /// Options that name groups, or an all_gather_options object: the result's type varies
  /// along the axes, since groups (runtime values) may make it differ.
  template <class X, AxisArgument A, class Options = all_gather_options>
    requires std::same_as<Options, all_gather_options>
  auto operator()(const X& x, const A& axes, const Options& options) const {
    return gather<false>(x, axes, options);
  }
  template <class X, AxisArgument A, class Options = detail::foreign_option_fields>
    requires(!std::convertible_to<const Options&, all_gather_options> &&
             !std::convertible_to<const Options&, detail::all_gather_options_without_groups>)
  X operator()(const X& x, const A&, const Options&) const {
    static_assert(detail::wrong_options<Options>,
                  "namedax: all_gather takes namedax::all_gather_options ({.axis_index_groups, .axis, .tiled})");
    return x;  // only the assertion above is reported
  }

 private:
  template <bool Invariant, class X, class A>
  static auto gather(const X& x, const A& axes, const all_gather_options& options) {
    return detail::gather_tree<all_gather_fn, Invariant>(x, axes, options);
  }
};
inline constexpr all_gather_fn all_gather{};

/// Options of all_gather_invariant: all_gather's without groups, as JAX's all_gather_invariant
/// takes none (each group would gather its own value, which is not the same on every index).
struct all_gather_invariant_options {
  int axis = 0;        ///< where the gathered axis goes (tiled: which axis grows)
  bool tiled = false;  ///< concatenate along `axis` instead of stacking
};

/// all_gather whose result is typed as the same on every index along the axes (invariant),
/// as JAX's `all_gather_invariant(x, axis_name, axis=0, tiled=False)`. JAX's all_gather types
/// its result as varying; namedax's all_gather without groups already gives an invariant one,
/// so the two differ only in their options: this one takes no groups.
///   all_gather_invariant(shard, "model"_ax, {.tiled = true})  // the whole weight on every index
struct all_gather_invariant_fn {
  static constexpr std::string_view name = "all_gather_invariant";
  template <class X, AxisArgument A>
  auto operator()(const X& x, const A& axes, const all_gather_invariant_options& options = {}) const {
    return detail::gather_tree<all_gather_invariant_fn, true>(x, axes,
                                                              all_gather_options{.axis = options.axis, .tiled = options.tiled});
  }
  /// all_gather's options with groups: each group's result differs, so it cannot be invariant.
  template <class X, AxisArgument A, class Options = all_gather_options>
    requires(std::same_as<Options, all_gather_options> ||
             (!std::convertible_to<const Options&, all_gather_invariant_options>))
  X operator()(const X& x, const A&, const Options&) const {
    static_assert(detail::wrong_options<Options>,
                  "namedax: all_gather_invariant takes namedax::all_gather_invariant_options ({.axis, .tiled}), no "
                  "axis_index_groups: with groups the result differs between groups; use namedax::all_gather");
    return x;  // only the assertion above is reported
  }
};
inline constexpr all_gather_invariant_fn all_gather_invariant{};

/// Options of psum_scatter (JAX's keyword arguments).
struct psum_scatter_options {
  int scatter_dimension = 0;                        ///< the positional axis split among the indices
  std::vector<std::vector<int>> axis_index_groups{};  ///< reduce-scatter within each group; equal sizes
  bool tiled = false;                               ///< keep scatter_dimension, divided, instead of removing it
};

/// Reduce-scatter: index p gets the sum over the axes of chunk p along scatter_dimension.
/// With x the rows of arange(16).reshape(4, 4) along "i": [24, 28, 32, 36] on index 0..3.
struct psum_scatter_fn {
  static constexpr std::string_view name = "psum_scatter";
  template <class X, AxisArgument A>
  auto operator()(const X& x, const A& axes, const psum_scatter_options& options = {}) const {
    auto names = detail::names_only(detail::to_axis_list(axes));
    auto groups = detail::groups_of(options.axis_index_groups);
    return detail::tree_map(x, [&](const auto& leaf) {
      return detail::collective_leaf<psum_scatter_fn, false, true>(leaf, names, [=](auto in, std::size_t rank, auto ax) {
        if (auto out = detail::psum_scatter_across_processes(name, in, rank, ax, groups, options.scatter_dimension,
                                                             options.tiled))
          return std::move(*out);
        return detail::psum_scatter_rule(name, std::move(in), rank, ax, groups, options.scatter_dimension, options.tiled);
      });
    });
  }
  template <class X, AxisArgument A, class Options = detail::foreign_option_fields>
    requires(!std::convertible_to<const Options&, psum_scatter_options>)
  X operator()(const X& x, const A&, const Options&) const {
    static_assert(detail::wrong_options<Options>, "namedax: psum_scatter takes namedax::psum_scatter_options "
                                                  "({.scatter_dimension, .axis_index_groups, .tiled})");
    return x;  // only the assertion above is reported
  }
};
inline constexpr psum_scatter_fn psum_scatter{};

/// Options of all_to_all (JAX's keyword arguments).
struct all_to_all_options {
  std::vector<std::vector<int>> axis_index_groups{};  ///< exchange within each group; equal sizes
  bool tiled = false;  ///< split split_axis into chunks and concatenate them along concat_axis
};

/// Materializes the mapped axis at concat_axis and maps split_axis instead: index p gets
/// chunk p of every index's split_axis, stacked (tiled: concatenated) along concat_axis.
struct all_to_all_fn {
  static constexpr std::string_view name = "all_to_all";
  template <class X, AxisArgument A>
  auto operator()(const X& x, const A& axes, int split_axis, int concat_axis, const all_to_all_options& options = {}) const {
    auto names = detail::names_only(detail::to_axis_list(axes));
    auto groups = detail::groups_of(options.axis_index_groups);
    return detail::tree_map(x, [&](const auto& leaf) {
      return detail::collective_leaf<all_to_all_fn, false, false>(leaf, names, [=](auto in, std::size_t rank, auto ax) {
        if (auto out = detail::all_to_all_across_processes(name, in, rank, ax, groups, split_axis, concat_axis,
                                                           options.tiled))
          return std::move(*out);
        return detail::all_to_all_rule(name, std::move(in), rank, ax, groups, split_axis, concat_axis, options.tiled);
      });
    });
  }
  template <class X, AxisArgument A, class Options = detail::foreign_option_fields>
    requires(!std::convertible_to<const Options&, all_to_all_options>)
  X operator()(const X& x, const A&, int, int, const Options&) const {
    static_assert(detail::wrong_options<Options>,
                  "namedax: all_to_all takes namedax::all_to_all_options ({.axis_index_groups, .tiled})");
    return x;  // only the assertion above is reported
  }
};
inline constexpr all_to_all_fn all_to_all{};

/// Options of pswapaxes.
struct pswapaxes_options {
  std::vector<std::vector<int>> axis_index_groups{};  ///< swap within each group; equal sizes
};

/// Swaps the mapped axis with the positional axis `axis`: all_to_all(x, axes, axis, axis).
struct pswapaxes_fn {
  static constexpr std::string_view name = "pswapaxes";
  template <class X, AxisArgument A>
  auto operator()(const X& x, const A& axes, int axis, const pswapaxes_options& options = {}) const {
    auto names = detail::names_only(detail::to_axis_list(axes));
    auto groups = detail::groups_of(options.axis_index_groups);
    return detail::tree_map(x, [&](const auto& leaf) {
      return detail::collective_leaf<pswapaxes_fn, false, false>(leaf, names, [=](auto in, std::size_t rank, auto ax) {
        if (auto out = detail::all_to_all_across_processes(name, in, rank, ax, groups, axis, axis, false))
          return std::move(*out);
        return detail::all_to_all_rule(name, std::move(in), rank, ax, groups, axis, axis, false, "axis");
      });
    });
  }
  template <class X, AxisArgument A, class Options = detail::foreign_option_fields>
    requires(!std::convertible_to<const Options&, pswapaxes_options>)
  X operator()(const X& x, const A&, int, const Options&) const {
    static_assert(detail::wrong_options<Options>, "namedax: pswapaxes takes namedax::pswapaxes_options ({.axis_index_groups})");
    return x;  // only the assertion above is reported
  }
};
inline constexpr pswapaxes_fn pswapaxes{};

/// A permutation known at compile time, as flat (source, destination) pairs:
/// `ppermute(x, "i"_ax, namedax::static_perm<0, 1, 1, 2, 2, 0>)`. Repeated or negative
/// indices do not compile, nor indices past a static axis size (`vmap<"i", 3>`).
template <int... SourceDestination>
struct static_permutation {
  static constexpr std::array<int, sizeof...(SourceDestination)> flat{SourceDestination...};
  static constexpr bool pairs_complete = sizeof...(SourceDestination) % 2 == 0;
  static constexpr bool nonnegative = ((SourceDestination >= 0) && ...);
  static constexpr bool unique_at(std::size_t offset) {
    for (std::size_t a = offset; a < flat.size(); a += 2)
      for (std::size_t b = a + 2; b < flat.size(); b += 2)
        if (flat[a] == flat[b]) return false;
    return true;
  }
  static constexpr bool sources_unique = unique_at(0);
  static constexpr bool destinations_unique = unique_at(1);
  static constexpr int largest = std::max({0, SourceDestination...});
  static std::vector<std::pair<int, int>> pairs() {
    std::vector<std::pair<int, int>> out;
    for (std::size_t k = 0; k + 1 < flat.size(); k += 2) out.emplace_back(flat[k], flat[k + 1]);
    return out;
  }
};
template <int... SourceDestination>
inline constexpr static_permutation<SourceDestination...> static_perm{};

namespace detail {
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
  using parts = decltype(children(x));
  return [&]<std::size_t... I>(std::index_sequence<I...>) {
    // Leaf I's result: the array received, typed as permute_leaf types it.
    auto typed = []<class L>(std::type_identity<L>, shared_array<typename L::value_type> array) {
      using Env = typename L::env_type;
      return make_named<shared_array<typename L::value_type>, Env, L::varying | Env::template mask_of<Names...>()>(
          std::move(array));
    };
    using leaf = std::tuple<std::type_identity<std::remove_cvref_t<std::tuple_element_t<I, parts>>>...>;
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
  }(std::make_index_sequence<std::tuple_size_v<parts>>{});
}
}  // namespace detail

/// Sends the value of index `source` to index `destination` for each pair; indices that
/// receive nothing get zeros: `ppermute(x, "i"_ax, {{0, 1}, {1, 2}, {2, 3}, {3, 0}})` shifts by one.
struct ppermute_fn {
  static constexpr std::string_view name = "ppermute";
  /// A permutation known at compile time: its mistakes do not compile.
  template <class X, AxisArgument A, int... P>
  auto operator()(const X& x, const A& axes, static_permutation<P...>) const {
    using perm = static_permutation<P...>;
    static_assert(detail::permutation_is_well_formed<perm>,
                  "namedax::ppermute: the static permutation needs (source, destination) pairs of indices >= 0 "
                  "with no source and no destination twice");
    [&]<class... Names>(detail::type_list<Names...>) {
      static_assert(detail::permutation_fits_axis_size<perm, detail::static_axis_size<X, Names...>()>,
                    "namedax::ppermute: the static permutation names an index past the axis's static size");
    }(detail::names_only(detail::to_axis_list(axes)));
    return (*this)(x, axes, perm::pairs());
  }
  template <class X, AxisArgument A>
  auto operator()(const X& x, const A& axes, const std::vector<std::pair<int, int>>& perm) const {
    auto names = detail::names_only(detail::to_axis_list(axes));
    if constexpr (detail::node_movable_by_reference<X>(decltype(names){}))
      if (auto moved = detail::permute_node<ppermute_fn>(x, names, [&perm](auto) -> const auto& { return perm; }))
        return std::move(*moved);
    return detail::tree_map(x, [&](const auto& leaf) {
      // A deferred value keeps its own copy of the pairs until it is resolved.
      if constexpr (DeferredValue<std::remove_cvref_t<decltype(leaf)>>)
        return detail::permute_leaf<ppermute_fn>(leaf, names, [perm](auto) -> const auto& { return perm; });
      else
        return detail::permute_leaf<ppermute_fn>(leaf, names, [&perm](auto) -> const auto& { return perm; });
    });
  }
};
inline constexpr ppermute_fn ppermute{};

/// The output at index i comes from the input at index perm[i]; perm is a permutation of 0..N-1.
struct pshuffle_fn {
  static constexpr std::string_view name = "pshuffle";
  template <class X, AxisArgument A>
  auto operator()(const X& x, const A& axes, const std::vector<int>& perm) const {
    auto names = detail::names_only(detail::to_axis_list(axes));
    auto pairs_of = [perm](auto ax) { return detail::shuffle_pairs(name, ax, perm); };
    if constexpr (detail::node_movable_by_reference<X>(decltype(names){}))
      if (auto moved = detail::permute_node<pshuffle_fn>(x, names, pairs_of)) return std::move(*moved);
    return detail::tree_map(x, [&](const auto& leaf) { return detail::permute_leaf<pshuffle_fn>(leaf, names, pairs_of); });
  }
};
inline constexpr pshuffle_fn pshuffle{};

namespace detail {
/// A tuple of names as the axis list `axes(names...)`.
template <class... Names>
constexpr auto axis_list_of(const std::tuple<Names...>& names) {
  return std::apply([](const auto&... n) { return namedax::axes(n...); }, names);
}
}  // namespace detail

/// The index of this position along the axis (several names: row-major over them, in the
/// order given), as int32. Under pmap<"i"> over 4 devices: 0, 1, 2, 3 on the devices.
/// The value waits for its environment until it meets a mapped value or leaves the map.
struct axis_index_fn {
  static constexpr std::string_view name = "axis_index";
  template <AxisArgument A>
  auto operator()(const A& axes) const {
    return make(detail::to_axis_list(axes));
  }
  /// A tuple of names, as JAX's `axis_index(('i', 'j'))`: the same as `axes("i"_ax, "j"_ax)`.
  template <Axis... Names>
  auto operator()(const std::tuple<Names...>& names) const {
    return make(detail::axis_list_of(names));
  }

 private:
  template <std::size_t P, class... Names>
  static auto make(const axis_list<P, Names...>&) {
    static_assert(P == 0, "namedax::axis_index: takes axis names only, no positional axes");
    static_assert(sizeof...(Names) > 0, "namedax::axis_index: give at least one axis name");
    auto resolve = []<class Env>(Env) {
      std::array<std::size_t, Env::vectorized_count> shape;
      shape.fill(1);
      std::array<std::size_t, sizeof...(Names)> sizes{detail::bound_frame(name, Names::name).size...};
      std::array<int, sizeof...(Names)> env_index{Env::index_of(Names::name)...};
      for (std::size_t k = 0; k < sizes.size(); ++k)
        if (Env::places[env_index[k]] == placement::vectorized) shape[Env::vectorized_slot(env_index[k])] = sizes[k];
      xt::xarray<std::int32_t> index = xt::xarray<std::int32_t>::from_shape(shape);
      // Element strides of the contiguous result, to find each element's coordinates.
      std::array<std::size_t, Env::vectorized_count> strides;
      for (std::size_t k = shape.size(), s = 1; k-- > 0;) strides[k] = s, s *= shape[k];
      for (std::size_t flat = 0; flat < index.size(); ++flat) {
        std::int64_t value = 0;
        for (std::size_t k = 0; k < sizes.size(); ++k) {
          const auto e = static_cast<std::size_t>(env_index[k]);
          std::size_t coordinate = Env::places[e] == placement::devices
                                       ? detail::bound_frame(name, Env::names[e]).index
                                       : (flat / strides[Env::vectorized_slot(e)]) % sizes[k];
          value = value * static_cast<std::int64_t>(sizes[k]) + static_cast<std::int64_t>(coordinate);
        }
        index.data()[flat] = static_cast<std::int32_t>(value);
      }
      return detail::make_named<detail::shared_array<std::int32_t>, Env, Env::template mask_of<Names...>()>(
          detail::share_array<std::int32_t>(std::move(index)));
    };
    return deferred<decltype(resolve), Names...>{resolve};
  }
};
inline constexpr axis_index_fn axis_index{};

/// The size of the axis (several names: the product), as JAX's `psum(1, axes)`.
struct axis_size_fn {
  static constexpr std::string_view name = "axis_size";
  template <AxisArgument A>
  int operator()(const A& axes) const {
    return count(detail::to_axis_list(axes));
  }
  /// A tuple of names, as JAX's `axis_size(('i', 'j'))`: the product of their sizes.
  template <Axis... Names>
  int operator()(const std::tuple<Names...>& names) const {
    return count(detail::axis_list_of(names));
  }

 private:
  template <std::size_t P, class... Names>
  static int count(const axis_list<P, Names...>&) {
    static_assert(P == 0, "namedax::axis_size: takes axis names only, no positional axes");
    return static_cast<int>((std::size_t{1} * ... * detail::bound_frame(name, Names::name).size));
  }
};
inline constexpr axis_size_fn axis_size{};

namespace detail {
/// pvary on one leaf: the same payload, its type now varying along `Names` too. A vectorized
/// axis the value did not vary along keeps its size-1 dimension: every rule reads such a
/// dimension with stride 0, so each index sees the same data, which is what pvary means.
template <class Verb, class X, class... Names>
auto pvary_leaf(const X& x, type_list<Names...> names) {
  if constexpr (DeferredValue<X>) {
    auto later = [x, names]<class Env>(Env) { return pvary_leaf<Verb>(x.template resolve<Env>(), names); };
    using awaited = typename type_list_cat<names_awaited_t<X>, type_list<Names...>>::type;
    return typename deferred_from<decltype(later), awaited>::type{later};
  } else {
    static_assert(NamedValue<X>, "namedax::pvary: takes a mapped value (an argument of the function given to vmap "
                                 "or pmap, or a value computed from one)");
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
    return tree_map(x, [&](const auto& leaf) { return pvary_leaf<Verb>(leaf, names); });
  }
};
}  // namespace detail

/// Marks a value as varying along the axes, without touching its data: on every index it
/// holds what it held. A value that is the same along "i" (a psum, an unmapped argument)
/// becomes one typed as varying along "i": `pvary(psum(x, "i"_ax), "i"_ax)`. It is the
/// transpose of psum of a varying value, and psum is its transpose (see docs/adjoints.md).
struct pvary_fn : detail::pvary_verb<pvary_fn> {
  static constexpr std::string_view name = "pvary";
};
inline constexpr pvary_fn pvary{};

/// Broadcasts from one index: every index of the axes gets the value that index `source` holds
/// (several names: `source` is the row-major index over them, as axis_index gives). JAX's
/// `pbroadcast(x, axis_name, source)`, i.e. `psum(where(axis_index(axes) == source, x, 0))`
/// done by copying: exact for NaN and infinities, and for every element type, bool included.
/// The result is the same on every index (invariant along the axes). With x = [0, 1, 2, 3]
/// along "i" and source 2: [2, 2, 2, 2]. A source outside 0..size-1 is a namedax::error.
///   pbroadcast(params, "data"_ax, 0)  // index 0's parameters on every index
struct pbroadcast_fn {
  static constexpr std::string_view name = "pbroadcast";
  template <class X, AxisArgument A>
  auto operator()(const X& x, const A& axes, int source) const {
    auto names = detail::names_only(detail::to_axis_list(axes));
    return detail::tree_map(x, [&](const auto& leaf) {
      return detail::collective_leaf<pbroadcast_fn, true, false>(leaf, names, [=](auto in, std::size_t rank, auto ax) {
        if (auto out = detail::pbroadcast_across_processes(name, in, ax, source)) return std::move(*out);
        return detail::pbroadcast_rule(name, std::move(in), rank, ax, source);
      });
    });
  }
  /// JAX's earlier pbroadcast, without a source, which JAX now calls pvary: still pvary here.
  template <class X, AxisArgument A>
  [[deprecated("namedax::pbroadcast(x, axes) is JAX's earlier name of pvary: use namedax::pvary(x, axes), or "
               "namedax::pbroadcast(x, axes, source) to broadcast the value of one index")]]
  auto operator()(const X& x, const A& axes) const {
    return detail::pvary_verb<pbroadcast_fn>{}(x, axes);
  }
};
inline constexpr pbroadcast_fn pbroadcast{};

/// The targets of pcast, as JAX's `to` strings: `pcast(x, "i"_ax, pcast_to::varying)`.
/// namedax types a value as varying or invariant along each name; JAX's `reduced` and
/// `unreduced` have no type here, so a cast to them does not compile (see pcast).
namespace pcast_to {
struct varying_t {
  static constexpr std::string_view name = "varying";
};
struct reduced_t {
  static constexpr std::string_view name = "reduced";
};
struct unreduced_t {
  static constexpr std::string_view name = "unreduced";
};
inline constexpr varying_t varying{};
inline constexpr reduced_t reduced{};
inline constexpr unreduced_t unreduced{};
}  // namespace pcast_to

namespace detail {
/// Whether namedax has a type for pcast's target: only `varying`. Named so that a failing
/// static_assert prints the target.
template <class To>
inline constexpr bool pcast_target_has_a_type = std::is_same_v<To, pcast_to::varying_t>;
}  // namespace detail

/// Casts a value's type along the axes, as JAX's `pcast(x, axis_name, to=...)`, moving no
/// data. `pcast_to::varying` is pvary: `pcast(psum(x, "i"_ax), "i"_ax, pcast_to::varying)`.
/// JAX's `reduced` and `unreduced` targets do not compile: namedax has no such types, and
/// the nearest meanings need a check or communication (an invariant value is what a psum
/// gives, a partial sum is a varying value).
struct pcast_fn {
  static constexpr std::string_view name = "pcast";
  template <class X, AxisArgument A>
  auto operator()(const X& x, const A& axes, pcast_to::varying_t) const {
    return detail::pvary_verb<pcast_fn>{}(x, axes);
  }
  template <class X, AxisArgument A, class To>
    requires(std::same_as<To, pcast_to::reduced_t> || std::same_as<To, pcast_to::unreduced_t>)
  X operator()(const X& x, const A&, To) const {
    static_assert(detail::pcast_target_has_a_type<To>,
                  "namedax::pcast: namedax types a value as varying or invariant along a name and has no reduced or "
                  "unreduced type; cast with pcast_to::varying (pvary), make a value invariant with psum, or keep a "
                  "partial sum varying until its psum");
    return x;  // only the assertion above is reported
  }
};
inline constexpr pcast_fn pcast{};

}  // namespace namedax

namespace namedax {
namespace detail {
/// The (extreme value, lowest linear index attaining it) of one leaf, as JAX computes pargmax:
/// the index of every position holding the extreme, else the largest int32, then the minimum.
/// Both reductions report errors in the name of `Verb`.
template <class Verb, reduction Extreme, class X, class A, class... Options>
auto extreme_and_index(const X& x, const A& axes, const Options&... options) {
  (void)names_only(to_axis_list(axes));
  auto value = all_reduce_verb<Verb, Extreme>{}(x, axes, options...);
  auto candidates = where(x == value, axis_index(axes), std::numeric_limits<std::int32_t>::max());
  auto index = all_reduce_verb<Verb, reduction::min>{}(candidates, axes, options...);
  return std::pair{value, index};
}

template <class Verb, reduction Extreme, bool WithValue>
struct arg_extreme_verb {
  template <class X, AxisArgument A>
  auto operator()(const X& x, const A& axes) const {
    return tree_map(x, [&](const auto& leaf) { return pick(extreme_and_index<Verb, Extreme>(leaf, axes)); });
  }
  /// With groups, the index is the linear index (along the axes) of the extreme in the caller's group.
  template <class X, AxisArgument A>
  auto operator()(const X& x, const A& axes, const reduce_options& options) const {
    return tree_map(x, [&](const auto& leaf) { return pick(extreme_and_index<Verb, Extreme>(leaf, axes, options)); });
  }

 private:
  template <class Pair>
  static auto pick(Pair&& p) {
    if constexpr (WithValue) return std::forward<Pair>(p);
    else return std::forward<Pair>(p).second;
  }
};
}  // namespace detail

/// The index along the axes (several names: row-major) of the maximum, as int32; ties go to
/// the lowest index, a NaN anywhere gives the largest int32, as in JAX.
struct pargmax_fn : detail::arg_extreme_verb<pargmax_fn, detail::reduction::max, false> {
  static constexpr std::string_view name = "pargmax";
};
/// The index along the axes of the minimum, as int32; ties go to the lowest index.
struct pargmin_fn : detail::arg_extreme_verb<pargmin_fn, detail::reduction::min, false> {
  static constexpr std::string_view name = "pargmin";
};
/// `std::pair{pmax(x, axes), pargmax(x, axes)}`, computing the maximum once.
struct pmax_with_index_fn : detail::arg_extreme_verb<pmax_with_index_fn, detail::reduction::max, true> {
  static constexpr std::string_view name = "pmax_with_index";
};
/// `std::pair{pmin(x, axes), pargmin(x, axes)}`, computing the minimum once.
struct pmin_with_index_fn : detail::arg_extreme_verb<pmin_with_index_fn, detail::reduction::min, true> {
  static constexpr std::string_view name = "pmin_with_index";
};
inline constexpr pargmax_fn pargmax{};
inline constexpr pargmin_fn pargmin{};
inline constexpr pmax_with_index_fn pmax_with_index{};
inline constexpr pmin_with_index_fn pmin_with_index{};

/// A contraction over positional dims (pos_contract: pairs of x and y dims) with batch dims
/// (pos_batch), that also sums over the named `axes`: JAX's pdot. The result's dims are the
/// batch dims, then x's free dims, then y's. Either operand may be a plain xtensor array.
///   pdot(x, w, "model"_ax, {{1}, {0}})  // x (batch, features) @ w (features, out), summed over "model"
struct pdot_fn {
  static constexpr std::string_view name = "pdot";
  template <class X, class Y, AxisArgument A>
    requires((NamedOperand<X> || NamedOperand<Y>) && !std::is_arithmetic_v<X> && !std::is_arithmetic_v<Y>)
  auto operator()(const X& x, const Y& y, const A& axes, const detail::dimension_pairs& pos_contract = {},
                  const detail::dimension_pairs& pos_batch = {}) const {
    return detail::when_resolved(
        [axes, pos_contract, pos_batch](const auto& a, const auto& b) { return contract(a, b, axes, pos_contract, pos_batch); },
                                 x, y);
  }

 private:
  template <class X, class Y, class A>
  static auto contract(const X& x, const Y& y, const A& axes, const detail::dimension_pairs& pos_contract,
                       const detail::dimension_pairs& pos_batch) {
    using Env = typename detail::merged_env<env<>, X, Y>::type;
    [&]<class... Names>(detail::type_list<Names...>) {
      detail::require_bound<pdot_fn, Env, Names...>();
    }(detail::names_only(detail::to_axis_list(axes)));
    using TX = detail::value_type_of_t<X>;
    using TY = detail::value_type_of_t<Y>;
    using R = std::common_type_t<TX, TY>;
    auto px = detail::payload_in<Env>(x);
    auto py = detail::payload_in<Env>(y);
    xt::xarray<TX> x_storage;
    xt::xarray<TY> y_storage;
    auto bx = detail::block_in_memory<TX>(px, x_storage);
    auto by = detail::block_in_memory<TY>(py, y_storage);
    auto local = detail::dot_general<R>(name, bx, bx.shape.size() - Env::vectorized_count, by,
                                        by.shape.size() - Env::vectorized_count, pos_contract, pos_batch,
                                        Env::device_mask != 0);
    constexpr axis_mask varying = detail::mask_of<X>() | detail::mask_of<Y>();
    auto product = detail::make_named<detail::shared_array<R>, Env, varying>(detail::share_array<R>(std::move(local)));
    return psum(product, axes);
  }
};
inline constexpr pdot_fn pdot{};

/// Gathers along axes: each integer of `idx` is a row-major index over the named and
/// positional axes in the order written (`axes(0, "i"_ax)`: position * size_i + i); the result
/// has idx's positional dims, then src's remaining ones. Named axes go beyond JAX: the source
/// is read from whichever index (vmap slot or device) holds it. Out-of-range indices read NaN,
/// the lowest signed or the largest unsigned integer, or true.
///   pgather(table, ids, "shard"_ax)  // a sharded embedding lookup
struct pgather_fn {
  static constexpr std::string_view name = "pgather";
  template <class S, class I, AxisArgument A>
    requires(NamedOperand<S> && Operand<I>)
  auto operator()(const S& src, const I& idx, const A& axes) const {
    return detail::when_resolved([list = detail::to_axis_list(axes)](const auto& s, const auto& i) { return gather(s, i, list); },
                                 src, idx);
  }

 private:
  template <class S, class I, std::size_t P, class... Names>
  static auto gather(const S& src, const I& idx, const axis_list<P, Names...>& list) {
    using Env = typename detail::merged_env<env<>, S, I>::type;
    detail::require_bound<pgather_fn, Env, Names...>();
    using T = typename S::value_type;
    using Index = detail::value_type_of_t<I>;
    static_assert(std::is_integral_v<Index> && !std::is_same_v<Index, bool>, "namedax::pgather: indices must be integers");
    auto lifted = detail::make_named<decltype(detail::payload_in<Env>(src)), Env, S::varying>(detail::payload_in<Env>(src));
    xt::xarray<T> src_storage;
    auto block = detail::block_in_memory<T>(lifted.payload(), src_storage);
    const std::size_t src_rank = block.shape.size() - Env::vectorized_count;
    auto dims = detail::canonical_positional(name, list.positional, src_rank);

    // idx in the environment, kept alive while the rule reads it.
    auto idx_payload = [&] {
      if constexpr (std::is_arithmetic_v<I>) {
        std::array<std::size_t, Env::vectorized_count> ones;
        ones.fill(1);
        xt::xarray<Index> scalar = xt::xarray<Index>::from_shape(ones);
        scalar.fill(idx);
        return detail::share_array<Index>(std::move(scalar));
      } else {
        return detail::payload_in<Env>(idx);
      }
    }();
    xt::xarray<Index> idx_storage;
    auto index = detail::block_in_memory<Index>(idx_payload, idx_storage);
    constexpr axis_mask names_mask = Env::template mask_of<Names...>();
    constexpr bool idx_varies = (detail::mask_of<I>() & names_mask & Env::vectorized_mask) != 0;
    const auto axes = detail::describe_named_axes<decltype(lifted), Names...>(name);
    auto out = detail::pgather_rule<T, Index>(name, std::move(block), src_rank, axes, dims, list.names_before, index,
                                             index.shape.size() - Env::vectorized_count, idx_varies);
    constexpr axis_mask varying = (S::varying & ~names_mask) | detail::mask_of<I>();
    return detail::make_named<detail::shared_array<T>, Env, varying>(detail::share_array<T>(std::move(out)));
  }
};
inline constexpr pgather_fn pgather{};

}  // namespace namedax
