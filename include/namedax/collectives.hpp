// SPDX-License-Identifier: MIT
// The public collectives: psum, pmean, pmax, pmin, all_gather, all_gather_invariant,
// psum_scatter, all_to_all, pswapaxes, ppermute, pshuffle, pbroadcast, pargmax, pargmin,
// axis_index, axis_size, pvary, pcast, pdot and pgather. Their options are in
// collective_options.hpp, their bodies in detail/all_reduce.hpp and detail/collective_verbs.hpp:
// each runs one rule (detail/<primitive>.hpp) that serves every placement, reading vectorized
// axes in place and exchanging among device threads or MPI processes.
#pragma once

#include <namedax/axis.hpp>
#include <namedax/collective_options.hpp>
#include <namedax/detail/all_reduce.hpp>
#include <namedax/detail/collective_verbs.hpp>
#include <namedax/elementwise.hpp>
#include <namedax/named_array.hpp>

#include <concepts>
#include <tuple>

namespace namedax {

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
  auto operator()(const X& x, const A& axes, const without_groups::all_gather_options& options) const {
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
    requires detail::ForeignOptions<Options, all_gather_options, without_groups::all_gather_options>
  X operator()(const X& x, const A&, const Options&) const {
    static_assert(detail::always_false<Options>,
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
    requires(std::same_as<Options, all_gather_options> || detail::ForeignOptions<Options, all_gather_invariant_options>)
  X operator()(const X& x, const A&, const Options&) const {
    static_assert(detail::always_false<Options>,
                  "namedax: all_gather_invariant takes namedax::all_gather_invariant_options ({.axis, .tiled}), no "
                  "axis_index_groups: with groups the result differs between groups; use namedax::all_gather");
    return x;  // only the assertion above is reported
  }
};
inline constexpr all_gather_invariant_fn all_gather_invariant{};

/// Reduce-scatter: index p gets the sum over the axes of chunk p along scatter_dimension.
/// With x the rows of arange(16).reshape(4, 4) along "i": [24, 28, 32, 36] on index 0..3.
struct psum_scatter_fn {
  static constexpr std::string_view name = "psum_scatter";
  template <class X, AxisArgument A>
  auto operator()(const X& x, const A& axes, const psum_scatter_options& options = {}) const {
    return detail::psum_scatter_tree<psum_scatter_fn>(x, axes, options);
  }
  template <class X, AxisArgument A, class Options = detail::foreign_option_fields>
    requires detail::ForeignOptions<Options, psum_scatter_options>
  X operator()(const X& x, const A&, const Options&) const {
    static_assert(detail::always_false<Options>, "namedax: psum_scatter takes namedax::psum_scatter_options "
                                                  "({.scatter_dimension, .axis_index_groups, .tiled})");
    return x;  // only the assertion above is reported
  }
};
inline constexpr psum_scatter_fn psum_scatter{};

/// Materializes the mapped axis at concat_axis and maps split_axis instead: index p gets
/// chunk p of every index's split_axis, stacked (tiled: concatenated) along concat_axis.
struct all_to_all_fn {
  static constexpr std::string_view name = "all_to_all";
  template <class X, AxisArgument A>
  auto operator()(const X& x, const A& axes, int split_axis, int concat_axis, const all_to_all_options& options = {}) const {
    return detail::all_to_all_tree<all_to_all_fn>(x, axes, split_axis, concat_axis, options.axis_index_groups,
                                                  options.tiled);
  }
  template <class X, AxisArgument A, class Options = detail::foreign_option_fields>
    requires detail::ForeignOptions<Options, all_to_all_options>
  X operator()(const X& x, const A&, int, int, const Options&) const {
    static_assert(detail::always_false<Options>,
                  "namedax: all_to_all takes namedax::all_to_all_options ({.axis_index_groups, .tiled})");
    return x;  // only the assertion above is reported
  }
};
inline constexpr all_to_all_fn all_to_all{};

/// Swaps the mapped axis with the positional axis `axis`: all_to_all(x, axes, axis, axis).
struct pswapaxes_fn {
  static constexpr std::string_view name = "pswapaxes";
  template <class X, AxisArgument A>
  auto operator()(const X& x, const A& axes, int axis, const pswapaxes_options& options = {}) const {
    return detail::all_to_all_tree<pswapaxes_fn>(x, axes, axis, axis, options.axis_index_groups, false, "axis");
  }
  template <class X, AxisArgument A, class Options = detail::foreign_option_fields>
    requires detail::ForeignOptions<Options, pswapaxes_options>
  X operator()(const X& x, const A&, int, const Options&) const {
    static_assert(detail::always_false<Options>, "namedax: pswapaxes takes namedax::pswapaxes_options ({.axis_index_groups})");
    return x;  // only the assertion above is reported
  }
};
inline constexpr pswapaxes_fn pswapaxes{};

/// Sends the value of index `source` to index `destination` for each pair; indices that
/// receive nothing get zeros: `ppermute(x, "i"_ax, {{0, 1}, {1, 2}, {2, 3}, {3, 0}})` shifts by one.
struct ppermute_fn {
  static constexpr std::string_view name = "ppermute";
  /// A permutation known at compile time: its mistakes do not compile.
  template <class X, AxisArgument A, StaticPermutation Perm>
  auto operator()(const X& x, const A& axes, Perm) const {
    static_assert(detail::permutation_is_well_formed<Perm>,
                  "namedax::ppermute: the static permutation needs (source, destination) pairs of indices >= 0 "
                  "with no source and no destination twice");
    [&]<class... Names>(detail::type_list<Names...>) {
      static_assert(detail::permutation_fits_axis_size<Perm, detail::static_axis_size<X, Names...>()>,
                    "namedax::ppermute: the static permutation names an index past the axis's static size");
    }(detail::names_only(detail::to_axis_list(axes)));
    return (*this)(x, axes, Perm::pairs());
  }
  template <class X, AxisArgument A>
  auto operator()(const X& x, const A& axes, const std::vector<std::pair<int, int>>& perm) const {
    // The pairs are read where they are; only a deferred value, kept past this call, copies them.
    auto pairs_of = [&perm](auto) -> const auto& { return perm; };
    auto owning_pairs_of = [&perm] { return [perm](auto) -> const auto& { return perm; }; };
    return detail::permute_tree<ppermute_fn>(x, detail::names_only(detail::to_axis_list(axes)), pairs_of,
                                             owning_pairs_of);
  }
};
inline constexpr ppermute_fn ppermute{};

/// The output at index i comes from the input at index perm[i]; perm is a permutation of 0..N-1.
struct pshuffle_fn {
  static constexpr std::string_view name = "pshuffle";
  template <class X, AxisArgument A>
  auto operator()(const X& x, const A& axes, const std::vector<int>& perm) const {
    auto pairs_of = [perm](auto ax) { return detail::shuffle_pairs(name, ax, perm); };
    return detail::permute_tree<pshuffle_fn>(x, detail::names_only(detail::to_axis_list(axes)), pairs_of,
                                             [&pairs_of] { return pairs_of; });
  }
};
inline constexpr pshuffle_fn pshuffle{};

/// The index of this position along the axis (several names: row-major over them, in the
/// order given), as int32. Under pmap<"i"> over 4 devices: 0, 1, 2, 3 on the devices.
/// The value waits for its environment until it meets a mapped value or leaves the map.
struct axis_index_fn {
  static constexpr std::string_view name = "axis_index";
  template <AxisArgument A>
  auto operator()(const A& axes) const {
    return detail::axis_index_value(detail::to_axis_list(axes));
  }
  /// A tuple of names, as JAX's `axis_index(('i', 'j'))`: the same as `axes("i"_ax, "j"_ax)`.
  template <Axis... Names>
  auto operator()(const std::tuple<Names...>& names) const {
    return detail::axis_index_value(detail::axis_list_of(names));
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

/// Marks a value as varying along the axes, without touching its data: on every index it
/// holds what it held. A value that is the same along "i" (a psum, an unmapped argument)
/// becomes one typed as varying along "i": `pvary(psum(x, "i"_ax), "i"_ax)`. It is the
/// transpose of psum of a varying value, and psum is its transpose (see docs/adjoints.md).
/// A plain xtensor value or scalar, as JAX's `pvary(jnp.zeros(3), 'i')`, gives that value at
/// every index, varying along the axes: `auto acc = pvary(xt::zeros<float>({3}), "i"_ax);`.
/// Like an axis_index value, it waits for the environment of the named values it meets (or
/// of the map that returns it); the axes must be bound by an enclosing map.
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
    return detail::pbroadcast_tree<pbroadcast_fn>(x, axes, source);
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
    requires((NamedOperand<X> || NamedOperand<Y>) && !std::is_arithmetic_v<X> && !std::is_arithmetic_v<Y> &&
             !Traced<X> && !Traced<Y>)
  auto operator()(const X& x, const Y& y, const A& axes, const detail::dimension_pairs& pos_contract = {},
                  const detail::dimension_pairs& pos_batch = {}) const {
    return detail::when_resolved(
        [=](const auto& a, const auto& b) {
          return psum(detail::local_pdot<pdot_fn>(a, b, axes, pos_contract, pos_batch), axes);
        },
        x, y);
  }
  /// Differentiated (namedax::grad): bilinear, each operand's pullback is pdot's transpose in it.
  template <class X, class Y, AxisArgument A>
    requires((Traced<X> || Traced<Y>) && !std::is_arithmetic_v<X> && !std::is_arithmetic_v<Y>)
  auto operator()(const X& x, const Y& y, const A& axes, const detail::dimension_pairs& pos_contract = {},
                  const detail::dimension_pairs& pos_batch = {}) const {
    return detail::derivative<detail::rule::pdot, typename detail::dependent<X, pdot_fn>::type>::apply(x, y, axes, pos_contract, pos_batch);
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
    return detail::when_resolved(
        [list = detail::to_axis_list(axes)](const auto& s, const auto& i) {
          return detail::pgather_values<pgather_fn>(s, i, list);
        },
        src, idx);
  }
  template <class S, class I, AxisArgument A>
    requires Traced<S>
  auto operator()(const S& src, const I& idx, const A& axes) const {
    return detail::derivative<detail::rule::pgather, typename detail::dependent<S, pgather_fn>::type>::apply(
        src, idx, detail::to_axis_list(axes));
  }
};
inline constexpr pgather_fn pgather{};

}  // namespace namedax
