// SPDX-License-Identifier: MIT
// ragged_all_to_all: the all-to-all of ragged arrays (rows at offsets, with sizes), as used to
// dispatch tokens to experts, under vmap, pmap and MPI processes alike.
#pragma once

#include <namedax/async.hpp>
#include <namedax/collectives.hpp>
#include <namedax/detail/ragged.hpp>

namespace namedax {

/// Options of ragged_all_to_all (JAX's keyword arguments).
struct ragged_all_to_all_options {
  /// Exchange within each group of axis indices; the groups partition 0..N-1, equal sizes.
  std::vector<std::vector<int>> axis_index_groups{};
};

/// `ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes,
/// axis, {.axis_index_groups})`, JAX's `jax.lax.ragged_all_to_all`: index i sends rows
/// `operand[input_offsets[j] : input_offsets[j] + send_sizes[j]]` to peer j, where they are
/// written into j's `output` from row `output_offsets[j]` on (the sender says where its chunk
/// lands in the receiver). `recv_sizes[j]` is what i receives from j and must equal what j
/// sends to i. Rows of `output` that nobody writes keep their values. The four integer arrays
/// (named values or plain arrays, int32 as in JAX) have one length K, a multiple of the axis
/// (or group) size N: entry e concerns the peer at position e / (K / N), so each pair of
/// indices may exchange K / N slices. Where received chunks overlap, the later sender wins.
///
/// JAX's example, two indices along "x", each row a scalar:
///   index 0: operand [1, 2, 2], output [0, 0, 0, 0], input_offsets [0, 1], send_sizes [1, 2],
///            output_offsets [0, 0], recv_sizes [1, 1]
///   index 1: operand [3, 4, 0], output [0, 0, 0, 0], input_offsets [0, 1], send_sizes [1, 1],
///            output_offsets [1, 2], recv_sizes [2, 1]
///   result:  index 0 [1, 3, 0, 0], index 1 [2, 2, 4, 0]
///
/// Beyond JAX it runs under vmap (JAX's batching rule asks for a feature request). Offsets
/// and sizes that are negative, reach past the operand or the output, or disagree with the
/// senders are a namedax::error on every index, naming the index, the peer and the numbers.
struct ragged_all_to_all_fn {
  static constexpr std::string_view name = "ragged_all_to_all";
  template <class X, class O, class IO, class SS, class OO, class RS, AxisArgument A>
    requires(NamedOperand<X> || NamedOperand<O>)
  auto operator()(const X& operand, const O& output, const IO& input_offsets, const SS& send_sizes,
                  const OO& output_offsets, const RS& recv_sizes, const A& axes,
                  const ragged_all_to_all_options& options = {}) const {
    return detail::when_resolved(detail::ragged_all_to_all_op<ragged_all_to_all_fn, A>{axes, options.axis_index_groups},
                                 operand, output, input_offsets, send_sizes, output_offsets, recv_sizes);
  }
  /// Under grad (detail/autodiff.hpp): linear in the operand and the output together.
  template <class X, class O, class IO, class SS, class OO, class RS, AxisArgument A>
    requires(Traced<X> || Traced<O>)
  auto operator()(const X& operand, const O& output, const IO& input_offsets, const SS& send_sizes,
                  const OO& output_offsets, const RS& recv_sizes, const A& axes,
                  const ragged_all_to_all_options& options = {}) const {
    return detail::derivative<detail::rule::ragged_all_to_all, typename detail::dependent<X, ragged_all_to_all_fn>::type>::
        apply(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, axes, options);
  }
  /// Another collective's options: the first error line says which options this one takes.
  template <class X, class O, class IO, class SS, class OO, class RS, AxisArgument A,
            class Options = detail::foreign_option_fields>
    requires detail::ForeignOptions<Options, ragged_all_to_all_options>
  X operator()(const X& operand, const O&, const IO&, const SS&, const OO&, const RS&, const A&, const Options&) const {
    static_assert(detail::always_false<Options>,
                  "namedax: ragged_all_to_all takes namedax::ragged_all_to_all_options ({.axis_index_groups})");
    return operand;  // only the assertion above is reported
  }
};
inline constexpr ragged_all_to_all_fn ragged_all_to_all{};

/// The v-variant of all_gather (MPI_Allgatherv): each index contributes its first `count`
/// rows of `x` (its other rows are padding), and every index gets all of them concatenated
/// along dim 0 in index order, `count_0 + count_1 + ...` rows. The counts, int32 named values,
/// are learned in the exchange. Every index holds the same result. Under a vmap over other axes
/// whose elements gather different totals, each element's rows are padded with zeros to the
/// largest total. The indices meet twice: for the counts, then for the rows.
///   // along "i" of size 3: x = [[a, b], [c, _], [d, e]], count = [2, 1, 2]
///   all_gather_v(x, count, "i"_ax)  // [a, b, c, d, e] on every index
struct all_gather_v_fn {
  static constexpr std::string_view name = "all_gather_v";
  template <class X, class C, AxisArgument A>
    requires NamedOperand<X>
  auto operator()(const X& x, const C& count, const A& axes) const {
    // Every index's count first (small), then the rows by one ragged all-to-all.
    if constexpr (!detail::count_is_checked<C>()) return x;  // only the assertion is reported
    else return detail::when_resolved(detail::all_gather_v_op<all_gather_v_fn, A>{axes}, x, count);
  }
  /// Differentiated (namedax::grad) in x: each row's cotangent goes back to the row it came
  /// from, and the rows past an index's count get zero.
  template <class X, class C, AxisArgument A>
    requires Traced<X>
  auto operator()(const X& x, const C& count, const A& axes) const {
    if constexpr (!detail::count_is_checked<C>())
      return x;  // only the assertion is reported
    else
      return detail::derivative<detail::rule::all_gather_v, typename detail::dependent<X, all_gather_v_fn>::type>::apply(
          x, count, axes);
  }
};
inline constexpr all_gather_v_fn all_gather_v{};

namespace async {

/// ragged_all_to_all started now and waited later, with the blocking form's arguments:
/// `wait()` gives namedax::ragged_all_to_all(...) bit for bit, and reports its mistakes (bad
/// offsets and sizes) on every index. Among device threads the start lays the operands out and
/// leaves the operand rows and the four arrays for every peer, without waiting for any; the
/// wait copies the rows sent to this index from its peers' blocks: MoE token dispatch can hide
/// behind the router's other work. Under vmap, over MPI processes and with a mix of
/// placements it runs at start.
///   auto h = namedax::async::ragged_all_to_all(tokens, buffer, in_off, sizes, out_off, recv, "expert"_ax);
///   auto gate = namedax::eval(scores * scale);  // computed meanwhile
///   auto dispatched = h.wait();
struct ragged_all_to_all_fn {
  static constexpr std::string_view name = "async::ragged_all_to_all";
  template <class X, class O, class IO, class SS, class OO, class RS, AxisArgument A>
    requires((NamedOperand<X> || NamedOperand<O>) && !Traced<X> && !Traced<O>)
  [[nodiscard]] auto operator()(const X& operand, const O& output, const IO& input_offsets, const SS& send_sizes,
                                const OO& output_offsets, const RS& recv_sizes, const A& axes,
                                const ragged_all_to_all_options& options = {}) const {
    return detail::handle_of(namedax::detail::start_ragged<ragged_all_to_all_fn>(
        namedax::detail::ragged_all_to_all_op<ragged_all_to_all_fn, A>{axes, options.axis_index_groups}, operand, output,
        input_offsets, send_sizes, output_offsets, recv_sizes));
  }
  /// Under grad (operand or output traced): namedax::ragged_all_to_all at start, whose rule
  /// records the derivative.
  template <class X, class O, class IO, class SS, class OO, class RS, AxisArgument A>
    requires(Traced<X> || Traced<O>)
  [[nodiscard]] auto operator()(const X& operand, const O& output, const IO& input_offsets, const SS& send_sizes,
                                const OO& output_offsets, const RS& recv_sizes, const A& axes,
                                const ragged_all_to_all_options& options = {}) const {
    return detail::handle_of(namedax::detail::computed_at_start<ragged_all_to_all_fn>(operand, axes, [&] {
      return namedax::ragged_all_to_all(operand, output, input_offsets, send_sizes, output_offsets, recv_sizes, axes,
                                        options);
    }));
  }
};
inline constexpr ragged_all_to_all_fn ragged_all_to_all{};

/// all_gather_v started now and waited later: `wait()` gives namedax::all_gather_v(x, count,
/// axes) bit for bit. Among device threads the start leaves x and its count for every index
/// and the wait reads them all (the devices meet once, where the blocking form meets them
/// twice); a bad count is reported by wait(). Under vmap, over MPI processes and with a mix of
/// placements it runs at start.
struct all_gather_v_fn {
  static constexpr std::string_view name = "async::all_gather_v";
  template <class X, class C, AxisArgument A>
    requires NamedOperand<X>
  [[nodiscard]] auto operator()(const X& x, const C& count, const A& axes) const {
    if constexpr (!namedax::detail::count_is_checked<C>())
      return x;  // only the assertion is reported
    else
      return detail::handle_of(namedax::detail::start_ragged<all_gather_v_fn>(
          namedax::detail::all_gather_v_op<all_gather_v_fn, A>{axes}, x, count));
  }
  /// Under grad (x traced): namedax::all_gather_v at start, whose rule records the derivative.
  template <class X, class C, AxisArgument A>
    requires Traced<X>
  [[nodiscard]] auto operator()(const X& x, const C& count, const A& axes) const {
    return detail::handle_of(
        namedax::detail::computed_at_start<all_gather_v_fn>(x, axes, [&] { return namedax::all_gather_v(x, count, axes); }));
  }
};
inline constexpr all_gather_v_fn all_gather_v{};

}  // namespace async

}  // namespace namedax
