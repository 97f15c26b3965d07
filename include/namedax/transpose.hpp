// SPDX-License-Identifier: MIT
// Linear maps built from collectives and positional operations (namespace namedax::linear),
// their transposes (namedax::transpose) and pullbacks (namedax::vjp). See docs/adjoints.md.
#pragma once

#include <namedax/collective_matmul.hpp>
#include <namedax/collectives.hpp>
#include <namedax/detail/unpack.hpp>
#include <namedax/ragged.hpp>
#include <namedax/detail/traced.hpp>
#include <namedax/detail/transpose.hpp>

#include <tuple>
#include <utility>

namespace namedax {

namespace detail {
/// Every linear map below derives from this tag.
struct linear_map_base {};

template <class Op, class C>
concept TransposesAlone = requires(const Op& op, const C& ct) { op.transpose_of(ct); };

/// (op(x), its pullback): the pullback maps a cotangent of op(x) to one of x, with x's type.
/// The cotangent is first given y's type: summed where it varies and y does not (the pairing
/// with a value that is the same along a name counts that name once), marked varying where y
/// varies and it does not.
template <class Op, class X>
auto vjp_of(const Op& op, const X& x) {
  if constexpr (requires { op.vjp_at(x); }) {
    return op.vjp_at(x);
  } else {
    auto y = op(x);
    auto pullback = [&] {
      if constexpr (requires { op.pullback_at(x); }) return op.pullback_at(x);
      else return [op](const auto& ct) { return op.transpose_of(ct); };
    }();
    using Y = decltype(y);
    return std::pair{std::move(y),
                     [pullback](const auto& ct) { return match_variance<X>(pullback(match_variance<Y>(ct))); }};
  }
}

template <class A>
using names_of = decltype(names_only(to_axis_list(std::declval<A>())));

}  // namespace detail

/// A linear map of namedax::linear: `op(x)` applies it, `namedax::transpose(op, ct)` and
/// `namedax::vjp(op, x)` its transpose.
template <class T>
concept LinearMap = std::is_base_of_v<detail::linear_map_base, std::remove_cvref_t<T>>;

namespace linear {

// ---------------------------------------------------------------------------------------
// Reductions

/// x -> psum(x, axes) (with options: psum(x, axes, options)).
template <AxisArgument A, bool Grouped>
struct psum_map : detail::linear_map_base {
  A axes;
  reduce_options options;

  template <class X>
  auto operator()(const X& x) const {
    if constexpr (Grouped) return namedax::psum(x, axes, options);
    else return namedax::psum(x, axes);
  }
  /// Without groups the result is the same along the axes, so a cotangent is summed where it
  /// varies and then marked varying (pvary); with groups psum is symmetric, its own transpose.
  template <NamedValue C>
  auto transpose_of(const C& ct) const {
    if constexpr (Grouped) return namedax::psum(ct, axes, options);
    else return namedax::pvary(detail::sum_along_varying(ct, detail::names_of<A>{}), axes);
  }
};

/// x -> pmean(x, axes) (with options: pmean(x, axes, options)).
template <AxisArgument A, bool Grouped>
struct pmean_map : detail::linear_map_base {
  A axes;
  reduce_options options;

  template <class X>
  auto operator()(const X& x) const {
    if constexpr (Grouped) return namedax::pmean(x, axes, options);
    else return namedax::pmean(x, axes);
  }
  template <NamedValue C>
  auto transpose_of(const C& ct) const {
    if constexpr (Grouped) {
      return namedax::pmean(ct, axes, options);
    } else {
      using R = detail::reduction_result_t<detail::reduction::mean, typename C::value_type>;
      auto sum = detail::sum_along_varying(ct, detail::names_of<A>{});
      auto mean = namedax::eval(namedax::cast<R>(sum) / static_cast<R>(namedax::axis_size(axes)));
      return namedax::pvary(mean, axes);
    }
  }
};

/// Reductions over names only; positional sums are linear::reduce_sum.
template <AxisArgument A>
psum_map<A, false> psum(A axes) {
  return {{}, axes, {}};
}
template <AxisArgument A>
psum_map<A, false> psum(A axes, const detail::reduce_options_without_groups&) {
  return {{}, axes, {}};
}
template <AxisArgument A, class Options = reduce_options>
  requires std::same_as<Options, reduce_options>
psum_map<A, true> psum(A axes, const Options& options) {
  return {{}, axes, options};
}
template <AxisArgument A>
pmean_map<A, false> pmean(A axes) {
  return {{}, axes, {}};
}
template <AxisArgument A>
pmean_map<A, false> pmean(A axes, const detail::reduce_options_without_groups&) {
  return {{}, axes, {}};
}
template <AxisArgument A, class Options = reduce_options>
  requires std::same_as<Options, reduce_options>
pmean_map<A, true> pmean(A axes, const Options& options) {
  return {{}, axes, options};
}

// ---------------------------------------------------------------------------------------
// Gathers and scatters

/// How the transpose of all_gather treats a cotangent, chosen at compile time from its type.
enum class all_gather_transpose {
  own_chunk,       ///< the cotangent is the same along the names: each index slices its own chunk
  sum_then_chunk,  ///< it varies along some of the names: psum along those, then slice
  psum_scatter,    ///< it varies along every name: psum_scatter
};

/// x -> all_gather(x, axes) (with options: all_gather(x, axes, options)).
template <AxisArgument A, bool Grouped>
struct all_gather_map : detail::linear_map_base {
  A axes;
  all_gather_options options;

  template <class X>
  auto operator()(const X& x) const {
    if constexpr (Grouped) return namedax::all_gather(x, axes, options);
    else return namedax::all_gather(x, axes, {.axis = options.axis, .tiled = options.tiled});
  }

  /// The transpose chosen for a cotangent of type `C`: a cotangent that does not vary along
  /// the names needs no exchange. With groups the result of all_gather varies, so its
  /// cotangent pairs with every index and a partly varying one takes psum_scatter.
  template <class C>
  static constexpr all_gather_transpose path() {
    constexpr axis_mask names = []<class... N>(detail::type_list<N...>) {
      return C::env_type::template mask_of<N...>();
    }(detail::names_of<A>{});
    constexpr axis_mask varies = names & C::varying;
    if constexpr (varies == 0) return all_gather_transpose::own_chunk;
    else if constexpr (varies == names || Grouped) return all_gather_transpose::psum_scatter;
    else return all_gather_transpose::sum_then_chunk;
  }

  template <NamedValue C>
  auto transpose_of(const C& ct) const {
    constexpr auto how = path<C>();
    if constexpr (how == all_gather_transpose::psum_scatter) {
      return namedax::psum_scatter(ct, axes, {.scatter_dimension = options.axis,
                                              .axis_index_groups = options.axis_index_groups,
                                              .tiled = options.tiled});
    } else {
      return own_chunk(detail::sum_along_varying(ct, detail::names_of<A>{}));
    }
  }

 private:
  struct verb {
    static constexpr std::string_view name = "transpose of all_gather";
  };
  template <class C>
  auto own_chunk(const C& ct) const {
    auto groups = detail::groups_of(options.axis_index_groups);
    const int axis = options.axis;
    const bool tiled = options.tiled;
    return detail::collective_leaf<verb, false, false>(ct, detail::names_of<A>{}, [=](auto in, std::size_t rank, auto ax) {
      return detail::own_chunk_rule(verb::name, std::move(in), rank, ax, groups, axis, tiled, Grouped);
    });
  }
};

template <AxisArgument A>
all_gather_map<A, false> all_gather(A axes) {
  return {{}, axes, {}};
}
template <AxisArgument A>
all_gather_map<A, false> all_gather(A axes, const without_groups::all_gather_options& options) {
  return {{}, axes, {.axis = options.axis, .tiled = options.tiled}};
}
template <AxisArgument A, class Options = all_gather_options>
  requires std::same_as<Options, all_gather_options>
all_gather_map<A, true> all_gather(A axes, const Options& options) {
  return {{}, axes, options};
}
/// x -> all_gather_invariant(x, axes, options): all_gather without groups, the same transpose.
template <AxisArgument A>
all_gather_map<A, false> all_gather_invariant(A axes, const all_gather_invariant_options& options = {}) {
  return {{}, axes, {.axis = options.axis, .tiled = options.tiled}};
}

/// x -> psum_scatter(x, axes, options); its transpose is all_gather with the same groups,
/// at axis scatter_dimension, tiled alike.
template <AxisArgument A>
struct psum_scatter_map : detail::linear_map_base {
  A axes;
  psum_scatter_options options;

  template <class X>
  auto operator()(const X& x) const {
    return namedax::psum_scatter(x, axes, options);
  }
  template <NamedValue C>
  auto transpose_of(const C& ct) const {
    return namedax::all_gather(ct, axes, all_gather_options{.axis_index_groups = options.axis_index_groups,
                                                            .axis = options.scatter_dimension,
                                                            .tiled = options.tiled});
  }
};
template <AxisArgument A>
psum_scatter_map<A> psum_scatter(A axes, const psum_scatter_options& options = {}) {
  return {{}, axes, options};
}

/// x -> all_to_all(x, axes, split_axis, concat_axis, options); its transpose swaps the two axes.
template <AxisArgument A>
struct all_to_all_map : detail::linear_map_base {
  A axes;
  int split_axis;
  int concat_axis;
  all_to_all_options options;

  template <class X>
  auto operator()(const X& x) const {
    return namedax::all_to_all(x, axes, split_axis, concat_axis, options);
  }
  template <NamedValue C>
  auto transpose_of(const C& ct) const {
    return namedax::all_to_all(ct, axes, concat_axis, split_axis, options);
  }
};
template <AxisArgument A>
all_to_all_map<A> all_to_all(A axes, int split_axis, int concat_axis, const all_to_all_options& options = {}) {
  return {{}, axes, split_axis, concat_axis, options};
}

/// x -> pswapaxes(x, axes, axis, options), its own transpose.
template <AxisArgument A>
struct pswapaxes_map : detail::linear_map_base {
  A axes;
  int axis;
  pswapaxes_options options;

  template <class X>
  auto operator()(const X& x) const {
    return namedax::pswapaxes(x, axes, axis, options);
  }
  template <NamedValue C>
  auto transpose_of(const C& ct) const {
    return namedax::pswapaxes(ct, axes, axis, options);
  }
};
template <AxisArgument A>
pswapaxes_map<A> pswapaxes(A axes, int axis, const pswapaxes_options& options = {}) {
  return {{}, axes, axis, options};
}

// ---------------------------------------------------------------------------------------
// Permutations

/// x -> ppermute(x, axes, perm); its transpose sends every pair back (destination, source).
template <AxisArgument A>
struct ppermute_map : detail::linear_map_base {
  A axes;
  std::vector<std::pair<int, int>> perm;

  template <class X>
  auto operator()(const X& x) const {
    return namedax::ppermute(x, axes, perm);
  }
  template <NamedValue C>
  auto transpose_of(const C& ct) const {
    std::vector<std::pair<int, int>> inverse;
    for (auto [source, destination] : perm) inverse.emplace_back(destination, source);
    return namedax::ppermute(ct, axes, inverse);
  }
};
template <AxisArgument A>
ppermute_map<A> ppermute(A axes, std::vector<std::pair<int, int>> perm) {
  return {{}, axes, std::move(perm)};
}

/// x -> pshuffle(x, axes, perm); its transpose shuffles by the inverse permutation.
template <AxisArgument A>
struct pshuffle_map : detail::linear_map_base {
  A axes;
  std::vector<int> perm;

  template <class X>
  auto operator()(const X& x) const {
    return namedax::pshuffle(x, axes, perm);
  }
  template <NamedValue C>
  auto transpose_of(const C& ct) const {
    std::vector<int> inverse(perm.size(), -1);
    for (std::size_t k = 0; k < perm.size(); ++k) {
      const int p = perm[k];
      // Not a permutation: let pshuffle report it in its own words.
      if (p < 0 || static_cast<std::size_t>(p) >= perm.size() || inverse[static_cast<std::size_t>(p)] != -1)
        return namedax::pshuffle(ct, axes, perm);
      inverse[static_cast<std::size_t>(p)] = static_cast<int>(k);
    }
    return namedax::pshuffle(ct, axes, inverse);
  }
};
template <AxisArgument A>
pshuffle_map<A> pshuffle(A axes, std::vector<int> perm) {
  return {{}, axes, std::move(perm)};
}

/// x -> ragged_all_to_all(x, zeros, input_offsets, send_sizes, output_offsets, recv_sizes,
/// axes, options), with an output of `output_rows` zero rows: linear in x. Its transpose sends
/// the cotangent's rows back where they came from: a ragged_all_to_all into `operand_rows`
/// zero rows whose input offsets are the output offsets each peer gave (all_to_all of them),
/// whose output offsets are the input offsets likewise, and whose send and receive sizes
/// swap. The offsets and sizes are named values (all_to_all moves them).
template <AxisArgument A, class IO, class SS, class OO, class RS>
struct ragged_all_to_all_map : detail::linear_map_base {
  A axes;
  IO input_offsets;
  SS send_sizes;
  OO output_offsets;
  RS recv_sizes;
  std::size_t operand_rows;
  std::size_t output_rows;
  ragged_all_to_all_options options;

  template <class X>
  auto operator()(const X& x) const {
    return namedax::ragged_all_to_all(x, detail::ragged_zeros(x, output_rows), input_offsets, send_sizes,
                                      output_offsets, recv_sizes, axes, options);
  }
  template <NamedValue C>
  auto transpose_of(const C& ct) const {
    const all_to_all_options swap{.axis_index_groups = options.axis_index_groups, .tiled = true};
    return namedax::ragged_all_to_all(ct, detail::ragged_zeros(ct, operand_rows),
                                      namedax::all_to_all(output_offsets, axes, 0, 0, swap), recv_sizes,
                                      namedax::all_to_all(input_offsets, axes, 0, 0, swap), send_sizes, axes, options);
  }
};
template <AxisArgument A, NamedValue IO, NamedValue SS, NamedValue OO, NamedValue RS>
ragged_all_to_all_map<A, IO, SS, OO, RS> ragged_all_to_all(A axes, IO input_offsets, SS send_sizes, OO output_offsets,
                                                            RS recv_sizes, std::size_t operand_rows,
                                                            std::size_t output_rows,
                                                            const ragged_all_to_all_options& options = {}) {
  return {{}, axes, std::move(input_offsets), std::move(send_sizes), std::move(output_offsets), std::move(recv_sizes),
          operand_rows, output_rows, options};
}

/// x -> pvary(x, axes); its transpose sums a cotangent over the names it varies along.
template <AxisArgument A>
struct pvary_map : detail::linear_map_base {
  A axes;

  template <class X>
  auto operator()(const X& x) const {
    return namedax::pvary(x, axes);
  }
  template <NamedValue C>
  auto transpose_of(const C& ct) const {
    return detail::sum_along_varying(ct, detail::names_of<A>{});
  }
  /// At x: the cotangent summed only where x does not vary (vjp's fit to x's type does that);
  /// pvary of a value that already varies is the identity, and so is its pullback.
  template <NamedValue X>
  auto pullback_at(const X&) const {
    return [](const auto& ct) { return ct; };
  }
};
template <AxisArgument A>
pvary_map<A> pvary(A axes) {
  return {{}, axes};
}
/// pcast to varying is pvary; pcast's other targets have no type in namedax.
template <AxisArgument A>
pvary_map<A> pcast(A axes, pcast_to::varying_t) {
  return {{}, axes};
}
/// JAX's earlier pbroadcast, without a source: pvary.
template <AxisArgument A>
[[deprecated("namedax::linear::pbroadcast(axes) is JAX's earlier name of pvary: use namedax::linear::pvary(axes), "
             "or namedax::linear::pbroadcast(axes, source) to broadcast the value of one index")]]
pvary_map<A> pbroadcast(A axes) {
  return {{}, axes};
}

/// x -> pbroadcast(x, axes, source): every index gets the value of index source, the same
/// along the names. Its transpose takes a cotangent (summed where it varies along the names,
/// as for psum) to index source and zeros to every other index: nothing is exchanged.
template <AxisArgument A>
struct pbroadcast_map : detail::linear_map_base {
  A axes;
  int source;

  template <class X>
  auto operator()(const X& x) const {
    return namedax::pbroadcast(x, axes, source);
  }
  template <NamedValue C>
  auto transpose_of(const C& ct) const {
    return detail::at_source_only(detail::sum_along_varying(ct, detail::names_of<A>{}), axes, source);
  }
};
template <AxisArgument A>
pbroadcast_map<A> pbroadcast(A axes, int source) {
  return {{}, axes, source};
}

// ---------------------------------------------------------------------------------------
// Contractions

/// x -> pdot(x, y, axes, pos_contract, pos_batch) with y fixed (YFixed), or y -> pdot(x, y, ...)
/// with x fixed; the fixed operand is a named value or a plain array. Its transpose contracts
/// the cotangent with the fixed operand over that operand's free dims.
template <class Fixed, AxisArgument A, bool YFixed>
struct pdot_map : detail::linear_map_base {
  Fixed fixed;
  A axes;
  detail::dimension_pairs pos_contract, pos_batch;

  template <class V>
  auto operator()(const V& v) const {
    if constexpr (YFixed) return namedax::pdot(v, fixed, axes, pos_contract, pos_batch);
    else return namedax::pdot(fixed, v, axes, pos_contract, pos_batch);
  }
  template <NamedValue C>
  auto transpose_of(const C& ct) const {
    auto c = detail::sum_along_varying(ct, detail::names_of<A>{});
    const auto& fixed_contract = YFixed ? pos_contract.second : pos_contract.first;
    const auto& own_contract = YFixed ? pos_contract.first : pos_contract.second;
    const auto& fixed_batch = YFixed ? pos_batch.second : pos_batch.first;
    const std::size_t own_rank = c.dimension() -
                                 (detail::positional_rank_of(fixed) - fixed_batch.size() - fixed_contract.size()) +
                                 own_contract.size();
    return namedax::pvary(
        detail::dot_transpose("transpose of pdot", c, fixed, own_rank, pos_contract, pos_batch, !YFixed), axes);
  }
};
/// x -> pdot(x, y, axes, pos_contract, pos_batch), y fixed.
template <class Y, AxisArgument A>
using pdot_lhs_map = pdot_map<Y, A, true>;
/// y -> pdot(x, y, axes, pos_contract, pos_batch), x fixed.
template <class X, AxisArgument A>
using pdot_rhs_map = pdot_map<X, A, false>;
template <class Y, AxisArgument A>
pdot_lhs_map<Y, A> pdot_lhs(Y y, A axes, detail::dimension_pairs pos_contract = {}, detail::dimension_pairs pos_batch = {}) {
  return {{}, std::move(y), axes, std::move(pos_contract), std::move(pos_batch)};
}
template <class X, AxisArgument A>
pdot_rhs_map<X, A> pdot_rhs(X x, A axes, detail::dimension_pairs pos_contract = {}, detail::dimension_pairs pos_batch = {}) {
  return {{}, std::move(x), axes, std::move(pos_contract), std::move(pos_batch)};
}

/// x -> Forward(x, w, axis), w fixed, a collective matmul; its transpose is Transposed of the
/// cotangent by w transposed. all_gather_matmul and matmul_reduce_scatter are each other's.
template <class Forward, class Transposed, class W, Axis A>
struct collective_matmul_map : detail::linear_map_base {
  W w;
  A axis;
  collective_matmul_options options;

  template <class X>
  auto operator()(const X& x) const {
    return Forward{}(x, w, axis, options);
  }
  template <NamedValue C>
  auto transpose_of(const C& ct) const {
    return Transposed{}(namedax::pvary(ct, axis), detail::matrix_transpose(w), axis, options);
  }
};
/// x -> all_gather_matmul(x, w, axis, options); its transpose is matmul_reduce_scatter(ct,
/// w^T, axis, options), a ring in the same directions.
template <class W, Axis A>
auto all_gather_matmul(W w, A axis, const collective_matmul_options& options = {}) {
  return collective_matmul_map<all_gather_matmul_fn, matmul_reduce_scatter_fn, W, A>{{}, std::move(w), axis, options};
}
/// x -> matmul_reduce_scatter(x, w, axis, options); its transpose is all_gather_matmul(ct,
/// w^T, axis, options).
template <class W, Axis A>
auto matmul_reduce_scatter(W w, A axis, const collective_matmul_options& options = {}) {
  return collective_matmul_map<matmul_reduce_scatter_fn, all_gather_matmul_fn, W, A>{{}, std::move(w), axis, options};
}

// ---------------------------------------------------------------------------------------
// Positional linear maps

/// x -> x * c for a constant c; its own transpose.
template <class C>
struct scale_map : detail::linear_map_base {
  C c;

  template <class X>
  auto operator()(const X& x) const {
    return namedax::eval(x * c);
  }
  template <NamedValue Ct>
  auto transpose_of(const Ct& ct) const {
    return namedax::eval(ct * c);
  }
};
template <class C>
  requires std::is_arithmetic_v<C>
scale_map<C> scale(C c) {
  return {{}, c};
}

/// Permutes the positional dims: dim k of the result is dim perm[k] of x (numpy.transpose).
struct permute_dims_map : detail::linear_map_base {
  std::vector<int> perm;

  template <class X>
  auto operator()(const X& x) const {
    return detail::permute_positional("linear::permute_dims", x, perm);
  }
  template <NamedValue C>
  auto transpose_of(const C& ct) const {
    return detail::permute_positional(
        "linear::permute_dims", ct, detail::inverse_permutation(detail::checked_permutation("linear::permute_dims", perm, perm.size())));
  }
};
inline permute_dims_map permute_dims(std::vector<int> perm) {
  return {{}, std::move(perm)};
}

/// Reshapes the positional dims (row-major, as numpy.reshape). Its transpose reshapes back,
/// so it needs the input's shape: transpose it with namedax::vjp.
struct reshape_map : detail::linear_map_base {
  std::vector<std::size_t> shape;

  template <class X>
  auto operator()(const X& x) const {
    return detail::reshape_positional("linear::reshape", x, shape);
  }
  template <class X>
  auto pullback_at(const X& x) const {
    return [from = x.shape()](const auto& ct) { return detail::reshape_positional("linear::reshape", ct, from); };
  }
};
inline reshape_map reshape(std::vector<std::size_t> shape) {
  return {{}, std::move(shape)};
}

/// Sums over positional dims: `reduce_sum(0, 2)` is psum(x, axes(0, 2)). Its transpose
/// repeats the cotangent along those dims, so it needs the input's shape: use namedax::vjp.
template <std::size_t K>
struct reduce_sum_map : detail::linear_map_base {
  std::array<int, K> dims;

  template <class X>
  auto operator()(const X& x) const {
    return namedax::psum(x, axis_list<K>{dims});
  }
  template <class X>
  auto pullback_at(const X& x) const {
    auto canonical = detail::canonical_positional("linear::reduce_sum", dims, x.dimension());
    return [canonical, shape = x.shape()](const auto& ct) { return detail::broadcast_positional(ct, canonical, shape); };
  }
};
template <class... Dims>
  requires(std::is_integral_v<Dims> && ...)
reduce_sum_map<sizeof...(Dims)> reduce_sum(Dims... dims) {
  return {{}, {static_cast<int>(dims)...}};
}

// ---------------------------------------------------------------------------------------
// Composites

/// compose(f, g, h)(x) == f(g(h(x))), as boost::hana::compose; its transpose is
/// compose(transpose(h), transpose(g), transpose(f)): the adjoints in reverse order.
template <class... Ops>
struct compose_map : detail::linear_map_base {
  std::tuple<Ops...> ops;

  template <class X>
  auto operator()(const X& x) const {
    return apply_from<sizeof...(Ops)>(x);
  }
  /// Without the primal: every step's transpose must need nothing of its input.
  template <NamedValue C>
    requires(... && detail::TransposesAlone<Ops, C>)
  auto transpose_of(const C& ct) const {
    return transpose_from<0>(ct);
  }
  /// Runs the maps on x, last first, keeping each one's pullback; the pullback runs them
  /// first to last, giving each intermediate cotangent its primal's type.
  template <class X>
  auto vjp_at(const X& x) const {
    return vjp_from<sizeof...(Ops)>(x);
  }

 private:
  template <std::size_t N, class X>
  auto apply_from(const X& x) const {
    if constexpr (N == 0) return x;
    else return apply_from<N - 1>(std::get<N - 1>(ops)(x));
  }
  template <std::size_t I, class C>
  auto transpose_from(const C& ct) const {
    if constexpr (I == sizeof...(Ops)) return ct;
    else return transpose_from<I + 1>(std::get<I>(ops).transpose_of(ct));
  }
  template <std::size_t N, class X>
  auto vjp_from(const X& x) const {
    if constexpr (N == 0) {
      return std::pair{x, [](const auto& ct) { return ct; }};
    } else {
      auto [y, inner] = detail::vjp_of(std::get<N - 1>(ops), x);
      auto [z, outer] = vjp_from<N - 1>(y);
      // Init-captures: clang++ 14 cannot capture a structured binding.
      return std::pair{std::move(z), [inner = inner, outer = outer](const auto& ct) { return inner(outer(ct)); }};
    }
  }
};
template <LinearMap... Ops>
  requires(sizeof...(Ops) > 0)
compose_map<std::remove_cvref_t<Ops>...> compose(Ops&&... ops) {
  return {{}, {std::forward<Ops>(ops)...}};
}

/// add(f, g)(x) == f(x) + g(x); its transpose is the sum of the transposes. The sum varies
/// along every name a term varies along, so a term that does not vary along a name enters it
/// through an implicit pvary, whose transpose sums the cotangent over that name: to know
/// each term's type, transpose it with namedax::vjp.
template <class... Ops>
struct add_map : detail::linear_map_base {
  std::tuple<Ops...> ops;

  template <class X>
  auto operator()(const X& x) const {
    return detail::unpack(ops, [&](const auto&... op) { return namedax::eval((op(x) + ...)); });
  }
  template <class X>
  auto vjp_at(const X& x) const {
    return detail::unpack(ops, [&](const auto&... op) {
      auto parts = std::tuple{detail::vjp_of(op, x)...};
      auto y = detail::unpack(parts, [](const auto&... p) { return namedax::eval((p.first + ...)); });
      auto pullbacks = detail::unpack(parts, [](const auto&... p) {
        return std::tuple{[pb = p.second](const auto& ct) {
          return pb(detail::match_variance<std::remove_cvref_t<decltype(p.first)>>(ct));
        }...};
      });
      using Y = decltype(y);
      return std::pair{std::move(y), [pullbacks](const auto& ct) {
                         auto c = detail::match_variance<Y>(ct);
                         return detail::unpack(pullbacks, [&](const auto&... pb) { return namedax::eval((pb(c) + ...)); });
                       }};
    });
  }
};
template <LinearMap... Ops>
  requires(sizeof...(Ops) > 0)
add_map<std::remove_cvref_t<Ops>...> add(Ops&&... ops) {
  return {{}, {std::forward<Ops>(ops)...}};
}

}  // namespace linear

/// The transpose of a linear map applied to a cotangent:
///   namedax::transpose(linear::all_gather("i"_ax), ct)   // psum_scatter(ct), or a local slice
/// The primal is taken to vary along the map's names (a shard, as in SPMD code); the result
/// varies along them. For the primal's exact type, or maps that need its shape (reshape,
/// reduce_sum), use namedax::vjp.
struct transpose_fn {
  template <LinearMap Op, class C>
  auto operator()(const Op& op, const C& ct) const {
    detail::require_named_cotangent<C>();
    static_assert(detail::TransposesAlone<Op, C>,
                  "namedax::transpose: this linear map needs its input's shape to be transposed (linear::reshape, "
                  "linear::reduce_sum); use namedax::vjp(op, x), whose pullback knows the input");
    return op.transpose_of(ct);
  }
};
inline constexpr transpose_fn transpose{};

/// `auto [y, pullback] = namedax::vjp(op, x)`: y is op(x), and pullback(ct) is the transpose
/// of op applied to a cotangent of y, with x's type: where x does not vary along a name the
/// result is summed over it, as JAX's rule for an implicit pvary. Composites keep every
/// intermediate's type.
///
/// For any other function of named values (namedax/autodiff.hpp), `auto [y, pullback] =
/// namedax::vjp(f, xs...)`: y is f(xs...), and pullback(ct) gives a std::tuple with the
/// cotangent of each argument, each a pytree shaped as the argument.
/// Either pullback takes a cotangent of y's positional shape (leaf by leaf) and throws
/// namedax::error, naming both shapes, for any other. Higher-order derivatives (vjp of a
/// function that grad or vjp is differentiating, with traced arguments) are not supported yet.
struct vjp_fn {
  template <LinearMap Op, NamedValue X>
  auto operator()(const Op& op, const X& x) const {
    auto [y, pullback] = detail::vjp_of(op, x);
    auto checked = [pullback = std::move(pullback), shape = *detail::positional_shape_of(y)](const auto& ct) {
      const auto given = detail::positional_shape_of(ct);
      if (given && *given != shape)
        detail::fail_derivative_shape("namedax::vjp: the cotangent", detail::cotangent_stands_for, detail::cotangent_fix,
                                      *given, shape);
      return pullback(ct);
    };
    return std::pair{std::move(y), std::move(checked)};
  }
  template <class F, class... Xs>
    requires(!LinearMap<F>)
  auto operator()(const F& f, const Xs&... xs) const {
    return detail::ad::vjp_of_function(f, xs...);
  }
};
inline constexpr vjp_fn vjp{};

}  // namespace namedax
