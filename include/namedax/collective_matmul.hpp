// SPDX-License-Identifier: MIT
// Collective matmuls, the patterns of JAX's shard_map tutorial as building blocks: a product
// whose left operand is gathered, or whose result is reduce-scattered, along a ring of
// asynchronous ppermutes, so that each device multiplies one block while the next travels.
// Both run in every placement (under vmap the ring is computed in place) with the same bits.
#pragma once

#include <namedax/async.hpp>
#include <namedax/collective_options.hpp>
#include <namedax/detail/collective_matmul.hpp>
#include <namedax/detail/traced.hpp>

namespace namedax {

/// `all_gather(x, axis, {.tiled = true})` times `w`, without gathering first: x is this
/// index's block of rows (b x k), w is k x c (it may vary along the axis), and the result is
/// the (n b) x c product of the gathered rows, in index order. Each of the n steps multiplies
/// the block held (first this index's own, then its predecessors') while that block moves on
/// to the next index. Each block's product is the one matmul the gathered product computes
/// for its rows; bit for bit the same in every placement. Among the device threads of one
/// process, where a block is read where it is, the devices meet once instead (all_gather)
/// and each block's product is written into its rows of the result by that same matmul.
/// With `{.bidirectional = true}` blocks travel both ways at once (n / 2 steps of two blocks
/// each): the same result, bits included, since every block's product is the same matmul.
///   auto y = all_gather_matmul(x_rows, w, "data"_ax);  // = xeinsum<"ij,jk->ik">(all_gather(x_rows, ...), w)
///   auto z = all_gather_matmul(x_rows, w, "data"_ax, {.bidirectional = true});  // == y
/// Its transpose in x is matmul_reduce_scatter(ct, w transposed), see namedax::linear.
struct all_gather_matmul_fn {
  static constexpr std::string_view name = "all_gather_matmul";
  template <NamedValue X, Operand W, Axis A>
  auto operator()(const X& x, const W& w, const A& axis, const collective_matmul_options& options = {}) const {
    return detail::all_gather_matmul_ring<all_gather_matmul_fn>(x, w, axis, options.bidirectional);
  }
  /// Differentiated (namedax::grad) in x, w or both.
  template <class X, class W, Axis A>
    requires((Traced<X> || Traced<W>) && (Traced<X> || NamedValue<X>) && (Traced<W> || Operand<W>))
  auto operator()(const X& x, const W& w, const A& axis, const collective_matmul_options& options = {}) const {
    return detail::derivative<detail::rule::collective_matmul, typename detail::dependent<X, all_gather_matmul_fn>::type>::apply(
        x, w, axis, options);
  }
};
inline constexpr all_gather_matmul_fn all_gather_matmul{};

/// `psum_scatter(x @ w, axis, {.tiled = true})`, without the full product on any index: x is
/// m x k and w is k x c on every index (each a part of a sum, as when k is sharded along the
/// axis), and index p gets rows [p m / n, (p + 1) m / n) of the sum over the indices of x w.
/// A partial sum travels the ring, each index adding its product for that block of rows while
/// the next partial sum is in flight. m must be divisible by the axis size (a namedax::error
/// names the sizes). Sums in ring order, so it equals psum_scatter up to the rounding of the
/// sum; bit for bit the same in every placement. With `{.bidirectional = true}` two partial
/// sums per block of rows travel, one each way, and meet at their index after n / 2 steps:
/// the same sum in another order (so it may differ from the unidirectional one in rounding).
///   auto y = matmul_reduce_scatter(h, w_rows, "model"_ax);  // = psum_scatter(h @ w_rows, "model"_ax, tiled)
/// Its transpose in x is all_gather_matmul(ct, w transposed), see namedax::linear.
struct matmul_reduce_scatter_fn {
  static constexpr std::string_view name = "matmul_reduce_scatter";
  template <NamedValue X, Operand W, Axis A>
  auto operator()(const X& x, const W& w, const A& axis, const collective_matmul_options& options = {}) const {
    return detail::matmul_reduce_scatter_ring<matmul_reduce_scatter_fn>(x, w, axis, options.bidirectional);
  }
  /// Differentiated (namedax::grad) in x, w or both.
  template <class X, class W, Axis A>
    requires((Traced<X> || Traced<W>) && (Traced<X> || NamedValue<X>) && (Traced<W> || Operand<W>))
  auto operator()(const X& x, const W& w, const A& axis, const collective_matmul_options& options = {}) const {
    return detail::derivative<detail::rule::collective_matmul, typename detail::dependent<X, matmul_reduce_scatter_fn>::type>::apply(
        x, w, axis, options);
  }
};
inline constexpr matmul_reduce_scatter_fn matmul_reduce_scatter{};

}  // namespace namedax
