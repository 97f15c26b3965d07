// SPDX-License-Identifier: MIT
// psum, pmean, pmax and pmin: the typed result of a reduction, the rule on one leaf, the
// fused paths that reduce every leaf of a pytree in one exchange or one MPI_Allreduce, and
// the overload set the four verbs share.
// IWYU pragma: private, include <namedax/namedax.hpp>
#pragma once

#include <namedax/collective_options.hpp>
#include <namedax/detail/collective_leaf.hpp>
#include <namedax/detail/device_rules.hpp>
#include <namedax/detail/process_rules.hpp>
#include <namedax/detail/reduction.hpp>
#include <namedax/detail/traced.hpp>

#include <xtensor/xadapt.hpp>
#include <xtensor/xnoalias.hpp>

#include <concepts>

namespace namedax::detail {
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
/// pmean of integers and bools gives float32, of complex values their complex type.
template <reduction K, class T>
using reduction_result_t = std::conditional_t<K == reduction::mean, inexact_t<T>, accumulate_t<K, T>>;

/// pmean's value: the sum over the reduced axes divided by the divisor (the number of members,
/// per group) and the count of reduced positional elements. One function per element type,
/// not one per leaf type.
template <class R, class T>
xt::xarray<R> mean_of(const T* sum, const dims_t& shape, xt::xarray<float>&& divisor, float positional_count) {
  auto mean = uninitialized_array<R>(shape);
  auto summed = xt::adapt(sum, mean.size(), xt::no_ownership(), shape);  // its shape and strides on the stack
  xt::noalias(mean) = xt::cast<R>(summed) / (xt::cast<R>(divisor) * static_cast<R>(positional_count));
  recycle(std::move(divisor));
  return mean;
}
#ifdef NAMEDAX_SEPARATE_COMPILATION  // defined once, by <namedax/separate_compilation.hpp>
NAMEDAX_EXTERN template xt::xarray<float> mean_of<float>(const float*, const dims_t&, xt::xarray<float>&&, float);
NAMEDAX_EXTERN template xt::xarray<double> mean_of<double>(const double*, const dims_t&, xt::xarray<float>&&, float);
#endif

/// The value of a reduction from its result and pmean's divisor, typed for leaf X.
template <reduction K, bool Grouped, class X, class... Names, class Sum>
auto reduced_value(Sum sum, xt::xarray<float>&& divisor, float positional_count) {
  using Env = typename X::env_type;
  using R = reduction_result_t<K, typename X::value_type>;
  constexpr axis_mask reduced = Env::template mask_of<Names...>();
  // Without groups the result is the same along the reduced axes; with groups it is not.
  constexpr axis_mask out_varying = Grouped ? (X::varying | reduced) : (X::varying & ~reduced);
  if constexpr (K == reduction::mean) {
    constexpr bool shared = std::is_same_v<Sum, shared_array<typename Sum::value_type>>;
    const dims_t shape(sum.shape().begin(), sum.shape().end());
    auto mean = mean_of<R>(sum.data(), shape, std::move(divisor), positional_count);
    if constexpr (!shared) recycle(std::move(sum));
    return make_named<shared_array<R>, Env, out_varying>(share_array<R>(std::move(mean)));
  } else if constexpr (std::is_same_v<Sum, shared_array<R>>) {
    return make_named<shared_array<R>, Env, out_varying>(std::move(sum));
  } else {
    return make_named<shared_array<R>, Env, out_varying>(share_array<R>(std::move(sum)));
  }
}

/// A reduction's result: the sum (or extreme) over the reduced axes, pmean's divisor (the
/// members reduced, per element) and the count of positional elements reduced.
template <class T>
struct all_reduced {
  shared_array<T> sum;
  xt::xarray<float> divisor;
  float positional_count;
};

/// The reduction of block `in` (its elements in `storage` or in the leaf it views) over the
/// positional dims `positional` and the named axes, among device threads, in one thread's
/// wait, across processes or in the vectorized dims, whichever holds the axes. One function
/// per element type and operation: a leaf's type only decides how its block is made.
template <class T, class Op>
all_reduced<T> all_reduce_block(std::string_view verb, strided_block<T> in, xt::xarray<T>&& storage,
                                std::size_t vectorized_count, std::span<const int> positional,
                                std::span<const named_axis> named_axes, const std::optional<groups_t>& groups,
                                fold_kind fold, bool is_sum, bool count_members, Op op) {
  const std::size_t rank = in.shape.size() - vectorized_count;
  auto dims = canonical_positional(verb, positional, rank);
  float positional_count = 1;
  for (auto d : dims) positional_count *= static_cast<float>(in.shape[d]);
  if (!dims.empty()) {
    storage = reduce_positional<T>(in, dims, op);
    in = block_of(storage);
  }
  const std::size_t kept_rank = rank - dims.size();
  auto shared = reduce_among_threads<T>(verb, in, named_axes, groups, count_members, op);
  if (!shared) shared = reduce_in_wait<T>(in, named_axes, groups, count_members, op);
  if (shared) return {std::move(shared->first), std::move(shared->second), positional_count};
  auto across = reduce_across_processes<T>(verb, in, named_axes, groups, fold);
  auto [sum, divisor] = across ? std::move(*across)
                               : reduce_named<T>(verb, std::move(in), kept_rank, named_axes, groups, is_sum,
                                                 count_members, op);
  return {share_array<T>(std::move(sum)), std::move(divisor), positional_count};
}
#ifdef NAMEDAX_SEPARATE_COMPILATION  // defined once, by <namedax/separate_compilation.hpp>
#define NAMEDAX_INSTANTIATE(T, Op)                                                                            \
  NAMEDAX_EXTERN template all_reduced<T> all_reduce_block<T, Op>(                                               \
      std::string_view, strided_block<T>, xt::xarray<T>&&, std::size_t, std::span<const int>,                   \
      std::span<const named_axis>, const std::optional<groups_t>&, fold_kind, bool, bool, Op);
NAMEDAX_FOR_EACH_ELEMENT_FOLD(NAMEDAX_INSTANTIATE)
#undef NAMEDAX_INSTANTIATE
#endif

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
    return defer_with(x, type_list<Names...>{}, [list, groups](const auto& resolved) {
      return all_reduce_leaf<Verb, K, Grouped>(resolved, list, groups);
    });
  } else if constexpr (NamedValue<X>) {
    using Env = typename X::env_type;
    require_bound<Verb, Env, Names...>();
    using T = accumulate_t<K, typename X::value_type>;
    xt::xarray<T> storage = empty_array<T>();
    strided_block<T> in = block_in_memory<T>(x.payload(), storage);
    auto named_axes = describe_named_axes<X, Names...>(verb);
    auto reduced = all_reduce_block<T>(verb, std::move(in), std::move(storage), Env::vectorized_count, list.positional,
                                       named_axes, groups, fold_of<K>(), K == reduction::sum || K == reduction::mean,
                                       K == reduction::mean, reduction_op<K>());
    return reduced_value<K, Grouped, X, Names...>(std::move(reduced.sum), std::move(reduced.divisor),
                                                  reduced.positional_count);
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
        using R = reduction_result_t<K, V>;
        return xt::xarray<R>(xt::cast<R>(a) / static_cast<R>(count));
      } else {
        return a;
      }
    }
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
    using first = child_t<X, 0>;
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
  using first = child_t<X, 0>;
  using T = accumulate_t<K, typename first::value_type>;
  using result = decltype(detail::tree_map(x, [&](const auto& leaf) {
    return all_reduce_leaf<Verb, K, Grouped>(leaf, axis_list<0, Names...>{}, groups);
  }));
  constexpr std::size_t count = child_count<X>;
  std::optional<result> out;
  const auto axes = describe_named_axes<first, Names...>(Verb::name);
  if (!applies(std::span<const named_axis>(axes))) return out;
  auto storage = empty_arrays<T, count>();
  auto reduced = reduce(std::span<const named_axis>(axes), leaf_blocks<T>(x, storage));
  if (!reduced) return out;
  out.emplace([&]<std::size_t... I>(std::index_sequence<I...>) {
    return make_like<X>(reduced_value<K, Grouped, child_t<X, I>, Names...>(
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
/// What `{}` binds to in `psum(x, axes, {})`: options that cannot carry groups, so the
/// result is known at compile time to be the same along the reduced axes.
struct reduce_options_without_groups {};

/// The shared body of psum, pmean, pmax and pmin.
template <class Verb, reduction K>
struct all_reduce_verb {
  template <class X, AxisArgument A>
  auto operator()(const X& x, const A& axes) const {
    if constexpr (!axis_argument_fits<X, A>()) return misnamed_axis_result<Verb>(x, axes);
    else return reduce_tree<false>(x, to_axis_list(axes), std::nullopt);
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
    if constexpr (!axis_argument_fits<X, A>()) {
      return misnamed_axis_result<Verb>(x, axes);
    } else {
      std::optional<groups_t> groups;
      if (!options.axis_index_groups.empty()) groups = options.axis_index_groups;
      return reduce_tree<true>(x, to_axis_list(axes), groups);
    }
  }
  /// Another collective's options: the first error line says which options these take.
  template <class X, AxisArgument A, class Options = detail::foreign_option_fields>
    requires ForeignOptions<Options, reduce_options, reduce_options_without_groups>
  X operator()(const X& x, const A&, const Options&) const {
    static_assert(always_false<Options>,
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
    auto reduce = [&](const auto& leaf) { return all_reduce_leaf<Verb, K, Grouped>(leaf, list, groups); };
    return detail::tree_map(x, traced_to_rule<rule::all_reduce<K, Grouped>, Verb>(reduce, list, groups));
  }
};
}  // namespace namedax::detail
