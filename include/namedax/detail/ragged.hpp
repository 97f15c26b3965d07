// SPDX-License-Identifier: MIT
// ragged_all_to_all's rule, both modes: every member's offsets and sizes are read first (one
// exchange of small integers), checked all together so that every index reports the same
// mistake, then each receiver copies the rows its peers send into a copy of its own output.
// Over process axes alone the rows travel by one MPI_Alltoallv instead. all_gather_v reads
// every member's count, then moves the rows by the same second step. The asynchronous forms
// leave both exchanges' blocks at start and run the same rules at wait.
// IWYU pragma: private
#pragma once

#include <namedax/collectives.hpp>
#include <namedax/detail/all_gather.hpp>
#include <namedax/detail/async.hpp>
#include <namedax/detail/compilation.hpp>
#include <namedax/detail/process_rules.hpp>
#include <namedax/detail/structure.hpp>
#include <namedax/named_array.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace namedax::detail {

/// The four integer arrays of ragged_all_to_all, in the order of its signature.
inline constexpr std::string_view ragged_fields[] = {"input_offsets", "send_sizes", "output_offsets", "recv_sizes"};

/// Every member's four arrays, read once: at(m, field, peer position, batch element), where
/// the batch elements are the payload's vectorized dims other than the collective's axes.
struct ragged_table {
  std::size_t members = 0, peers = 0, batch = 1;
  std::vector<std::int64_t> values;
  [[nodiscard]] std::int64_t at(std::size_t m, std::size_t field, std::size_t peer, std::size_t b) const {
    return values[((m * 4 + field) * peers + peer) * batch + b];
  }
};

/// Reads the packed arrays `ints` ([4, peers, vectorized dims...], full along the vectorized
/// collective axes) of every member through one exchange.
NAMEDAX_DECL ragged_table read_ragged_table(std::string_view verb, strided_block<std::int64_t> ints,
                                            std::span<const named_axis> axes, const std::optional<groups_t>& groups,
                                            std::string_view options, group_layout& layout);

/// The first inconsistency in the table, in the user's words; empty when there is none. Every
/// index computes it from the same table, so every index reports the same one. With K entries
/// over groups of g indices, entry e goes to the peer at position e / (K / g): each peer gets
/// K / g slices, and slice q from the peer at position p is entry p * (K / g) + q of recv_sizes.
NAMEDAX_DECL std::string ragged_mistake(std::string_view verb, const ragged_table& t, const group_layout& layout,
                                        std::span<const named_axis> axes, std::size_t operand_rows,
                                        std::size_t output_rows);

/// Calls f(sender, in, size, out) for every slice member `rank` receives, in sender order.
template <class F>
void for_each_received(const ragged_table& t, const group_layout& layout, std::size_t rank, std::size_t b, F&& f) {
  const std::size_t pr = layout.position_of[rank];
  const auto& group = layout.members[layout.group_of[rank]];
  const std::size_t slices = t.peers / group.size();
  for (std::size_t s : group)
    for (std::size_t q = 0; q < slices; ++q) {
      const std::size_t e = pr * slices + q;
      f(s, t.at(s, 0, e, b), t.at(s, 1, e, b), t.at(s, 2, e, b));
    }
}

/// The output rows of each member it receives, in sender order: a later sender's rows win
/// where chunks overlap.
template <class T>
void write_received(const ragged_table& t, const group_layout& layout, std::size_t rank, std::size_t b,
                    std::span<const std::size_t> batch_index, T* target, std::span<const std::ptrdiff_t> out_strides,
                    std::size_t positional_rank, const auto& member_of) {
  for_each_received(t, layout, rank, b, [&](std::size_t s, std::int64_t in, std::int64_t size, std::int64_t out) {
    if (size == 0) return;
    strided_block<T> rows = member_of(s);
    rows.data += trailing_offset(batch_index, rows.strides, positional_rank) + static_cast<std::ptrdiff_t>(in) * rows.strides[0];
    rows.shape.resize(positional_rank), rows.strides.resize(positional_rank);
    rows.shape[0] = static_cast<std::size_t>(size);
    copy_strided(rows, target + static_cast<std::ptrdiff_t>(out) * out_strides[0], out_strides.first(positional_rank));
  });
}

/// Whether the chunks some index receives overlap (then the later sender's rows win, which
/// MPI_Alltoallv does not promise). The same answer on every index: the table is everyone's.
NAMEDAX_DECL bool ragged_chunks_overlap(const ragged_table& t, const group_layout& layout);

/// Over process axes alone (one slice per peer, one batch element, chunks apart): one MPI_Alltoallv from the
/// operand straight into the output.
template <class T>
std::optional<xt::xarray<T>> ragged_across_processes(std::string_view verb, const strided_block<T>& operand,
                                                     xt::xarray<T>& output, const ragged_table& t,
                                                     const group_layout& layout, std::span<const named_axis> axes,
                                                     const std::optional<groups_t>& groups) {
  if (!placed_on_processes(axes) || t.batch != 1 || layout.members.empty() || t.peers != layout.members.front().size() ||
      ragged_chunks_overlap(t, layout))
    return std::nullopt;
  auto call = whole_payloads<T>(verb, operand, axes, groups, true, "");
  if (!call) return std::nullopt;
  std::size_t me = 0;
  for (const auto& ax : axes) me = me * ax.size + ax.index;
  const auto& group = layout.members[layout.group_of[me]];
  const std::size_t pr = layout.position_of[me];
  std::size_t inner = 1;
  for (std::size_t d = 1; d < operand.shape.size(); ++d) inner *= operand.shape[d];
  const std::size_t row_bytes = inner * sizeof(T);
  std::vector<std::size_t> send_bytes, send_at, recv_bytes, recv_at;
  for (std::size_t p = 0; p < group.size(); ++p) {
    send_bytes.push_back(static_cast<std::size_t>(t.at(me, 1, p, 0)) * row_bytes);
    send_at.push_back(static_cast<std::size_t>(t.at(me, 0, p, 0)) * row_bytes);
    recv_bytes.push_back(static_cast<std::size_t>(t.at(group[p], 1, pr, 0)) * row_bytes);
    recv_at.push_back(static_cast<std::size_t>(t.at(group[p], 2, pr, 0)) * row_bytes);
  }
  call_keeping([&] { call->channel->alltoallv(call->in.data, send_bytes, send_at, output.data(), recv_bytes, recv_at); },
               output, call->contiguous);
  return std::move(output);
}

/// The rows of a ragged all-to-all, once every member's arrays are in `table`: checked, then
/// each receiver copies the rows its peers send into `output` (its own, row-major, with
/// `positional_rank` positional dims and the vectorized dims of `operand`).
template <class T>
xt::xarray<T> ragged_rows(std::string_view verb, strided_block<T> operand, xt::xarray<T> output, const ragged_table& table,
                          const group_layout& layout, std::size_t positional_rank, std::span<const named_axis> axes,
                          const std::optional<groups_t>& groups) {
  if (auto mistake = ragged_mistake(verb, table, layout, axes, operand.shape[0], output.shape()[0]); !mistake.empty())
    fail(mistake);
  if (auto moved = ragged_across_processes<T>(verb, operand, output, table, layout, axes, groups))
    return std::move(*moved);
  collective_frame<T> frame(verb, std::move(operand), positional_rank, axes, groups, true, "");
  const auto out_strides = row_major_strides(output.shape());
  const dims_t batch_shape = [&] {
    dims_t s(output.shape().begin() + static_cast<std::ptrdiff_t>(positional_rank), output.shape().end());
    for (const auto& ax : axes)
      if (ax.place == placement::vectorized) s[ax.slot] = 1;
    return s;
  }();
  frame.for_each_owned(true, [&](std::size_t rank) {
    T* base = frame.at_rank(output.data(), rank, out_strides, positional_rank);
    std::size_t b = 0;
    for_each_index(batch_shape, [&](std::span<const std::size_t> v) {
      write_received<T>(table, layout, rank, b++, v, base + trailing_offset(v, out_strides, positional_rank), out_strides,
                        positional_rank, [&](std::size_t m) { return frame.member(m); });
    });
  });
  frame.release();
  return output;
}

/// ragged_all_to_all on blocks in one environment: `operand` and `output` row-major with
/// `positional_rank` positional dims and the same vectorized dims (full along the vectorized
/// collective axes), `ints` the four arrays packed as [4, peers, those vectorized dims].
/// `axes` must say that every operand varies along every axis. Two exchanges: the arrays,
/// then the rows.
template <class T>
xt::xarray<T> ragged_all_to_all_rule(std::string_view verb, strided_block<T> operand, xt::xarray<T> output,
                                     strided_block<std::int64_t> ints, std::size_t positional_rank,
                                     std::span<const named_axis> axes, const std::optional<groups_t>& groups) {
  group_layout layout;
  const ragged_table table = read_ragged_table(verb, std::move(ints), axes, groups, "", layout);
  return ragged_rows<T>(verb, std::move(operand), std::move(output), table, layout, positional_rank, axes, groups);
}

/// all_gather_v on blocks in one environment: `operand` row-major with `positional_rank`
/// positional dims and its vectorized dims, `counts` its count per vectorized element (those
/// dims), both full along the vectorized collective axes. Every member's counts are read
/// through one exchange; from them every index lays out the ragged all-to-all that gathers the
/// rows (member s sends its first count_s rows to every peer, after the rows of the members
/// before it), which the second exchange moves. The rows of the result are the largest total
/// over the batch elements (shorter totals pad with zeros).
template <class T>
xt::xarray<T> all_gather_v_rule(std::string_view verb, strided_block<T> operand, strided_block<std::int64_t> counts,
                                std::size_t positional_rank, std::span<const named_axis> axes) {
  collective_frame<std::int64_t> frame(verb, std::move(counts), 0, axes, std::nullopt, true, "");
  const group_layout layout = frame.groups();
  ragged_table t;
  t.members = t.peers = frame.total();
  const dims_t batch_shape = frame.member(0).shape;
  t.batch = element_count(batch_shape);
  std::vector<std::int64_t> count(t.members * t.batch);
  for (std::size_t m = 0; m < t.members; ++m) {
    const auto block = frame.member(m);
    std::size_t b = 0;
    for_each_index(batch_shape, [&](std::span<const std::size_t> v) {
      count[m * t.batch + b++] = block.data[trailing_offset(v, block.strides, 0)];
    });
  }
  frame.release();
  // Every index sees every count: a bad one is the same error everywhere.
  std::int64_t rows = 0;
  t.values.resize(t.members * 4 * t.peers * t.batch);
  for (std::size_t b = 0; b < t.batch; ++b) {
    std::int64_t before = 0;
    for (std::size_t s = 0; s < t.members; ++s) {
      const std::int64_t c = count[s * t.batch + b];
      if (c < 0 || c > static_cast<std::int64_t>(operand.shape[0]))
        fail("namedax::", verb, " over axis ", describe_axes(axes), ": index ", s, " gives count ", c, ", outside 0..",
             operand.shape[0], " (the rows of x); give each index's number of valid leading rows");
      for (std::size_t p = 0; p < t.peers; ++p) {
        const std::int64_t fields[] = {0, c, before, count[p * t.batch + b]};
        for (std::size_t f = 0; f < 4; ++f) t.values[((s * 4 + f) * t.peers + p) * t.batch + b] = fields[f];
      }
      before += c;
    }
    rows = std::max(rows, before);
  }
  dims_t out_shape = operand.shape;
  out_shape[0] = static_cast<std::size_t>(rows);
  xt::xarray<T> zeros = xt::xarray<T>::from_shape(out_shape);
  zeros.fill(T{});
  return ragged_rows<T>(verb, std::move(operand), std::move(zeros), t, layout, positional_rank, axes, std::nullopt);
}

/// An operand of ragged_all_to_all as an array in environment Env: positional dims, then
/// Env's vectorized dims (size 1 where it does not vary, and for a plain value).
template <class Env, class T, class Y>
xt::xarray<T> ragged_payload(const Y& y) {
  if constexpr (is_named<Y>) {
    return evaluate<T>(payload_in<Env>(y));
  } else {
    xt::xarray<T> a = evaluate<T>(y);
    dims_t shape(a.shape().begin(), a.shape().end());
    for (std::size_t k = 0; k < Env::vectorized_count; ++k) shape.push_back(1);
    a.reshape(shape);
    return a;
  }
}

/// `a` broadcast to positional dims `positional` and vectorized dims `trailing`, in memory.
template <class T>
xt::xarray<T> ragged_broadcast(xt::xarray<T> a, dims_t positional, const dims_t& trailing) {
  positional.insert(positional.end(), trailing.begin(), trailing.end());
  if (std::equal(positional.begin(), positional.end(), a.shape().begin(), a.shape().end())) return a;
  return xt::xarray<T>(xt::broadcast(a, positional));
}

/// The collective's axes as its rules read them, every operand varying along each.
template <class Verb, class Env, class... Names>
std::array<named_axis, sizeof...(Names)> ragged_axes() {
  return {[] {
    constexpr int k = Env::index_of(Names::name);
    const frame& f = bound_frame(Verb::name, Names::name);
    return named_axis{Names::name, Env::places[k], f.size, true, Env::vectorized_slot(k), f.index};
  }()...};
}

/// The mask of the collective's axes (the names of A) in Env.
template <class Env, class A>
constexpr axis_mask ragged_axes_mask() {
  using names = decltype(names_only(to_axis_list(std::declval<A>())));
  return []<class... Names>(type_list<Names...>) { return Env::template mask_of<Names...>(); }(names{});
}

/// ragged_all_to_all's or all_gather_v's operands in their merged environment, as the rule
/// reads them: positional dims, then the result's vectorized dims, whole along the exchanged axes.
template <class T, std::size_t AxisCount>
struct ragged_operands {
  xt::xarray<T> operand;
  xt::xarray<T> output;           // ragged_all_to_all's; all_gather_v makes its own
  xt::xarray<std::int64_t> ints;  // the four arrays packed as [4, peers, vectorized dims]; all_gather_v's counts
  std::array<named_axis, AxisCount> axes;
  std::size_t positional_rank = 0;
};

/// The operation once every operand is resolved: prepare() lays the operands out (no
/// exchange), rule() exchanges, typed() gives the named result.
template <class Verb, class A>
struct ragged_all_to_all_op {
  A axes;
  groups_t groups;

  template <class X, class O, class... Ints>
  auto operator()(const X& operand, const O& output, const Ints&... ints) const {
    auto in = prepare(operand, output, ints...);
    return typed<X, O, Ints...>(rule(in, block_of(in.operand), block_of(in.ints)));
  }

  template <class X, class O, class... Ints>
  auto prepare(const X& operand, const O& output, const Ints&... ints) const {
    return prepare_in(operand, output, names_only(to_axis_list(axes)), ints...);
  }

  /// The exchanges, the operand and the integer arrays read from `operand` and `ints` (where
  /// their frames find them); `in.output` is moved into the result.
  template <class T, class In>
  xt::xarray<T> rule(In& in, strided_block<T> operand, strided_block<std::int64_t> ints) const {
    return ragged_all_to_all_rule<T>(Verb::name, std::move(operand), std::move(in.output), std::move(ints),
                                     in.positional_rank, in.axes, given_groups());
  }
  [[nodiscard]] std::optional<groups_t> given_groups() const {
    return groups.empty() ? std::nullopt : std::optional<groups_t>(groups);
  }

  template <class X, class O, class... Ints, class T>
  static auto typed(xt::xarray<T> out) {
    using Env = typename merged_env<env<>, X, O, Ints...>::type;
    constexpr axis_mask varying = mask_of<X>() | mask_of<O>() | (mask_of<Ints>() | ...) | ragged_axes_mask<Env, A>();
    return make_named<shared_array<T>, Env, varying>(share_array(std::move(out)));
  }

 private:
  template <class X, class O, class... Names, class... Ints>
  auto prepare_in(const X& operand, const O& output, type_list<Names...>, const Ints&... ints) const {
    constexpr std::string_view verb = Verb::name;
    using Env = typename merged_env<env<>, X, O, Ints...>::type;
    require_bound<Verb, Env, Names...>();
    using T = value_type_of_t<X>;
    static_assert(std::is_same_v<T, value_type_of_t<O>>,
                  "namedax::ragged_all_to_all: operand and output must have one element type");
    static_assert((... && (std::is_integral_v<value_type_of_t<Ints>> && !std::is_same_v<value_type_of_t<Ints>, bool>)),
                  "namedax::ragged_all_to_all: offsets and sizes must be integers (int32, as in JAX)");
    constexpr std::size_t vec = Env::vectorized_count;
    ragged_operands<T, sizeof...(Names)> in{ragged_payload<Env, T>(operand), ragged_payload<Env, T>(output), {},
                                            ragged_axes<Verb, Env, Names...>(), 0};
    std::array<xt::xarray<std::int64_t>, 4> arrays{ragged_payload<Env, std::int64_t>(ints)...};
    const dims_t xs(in.operand.shape().begin(), in.operand.shape().end() - vec),
        os(in.output.shape().begin(), in.output.shape().end() - vec);
    if (xs.empty())
      fail("namedax::", verb, ": the operand is a scalar; give an operand whose positional dim 0 holds the rows");
    if (xs.size() != os.size() || !std::equal(xs.begin() + 1, xs.end(), os.begin() + 1))
      fail("namedax::", verb, ": operand of positional shape ", xs, " and output of shape ", os,
           " differ past dim 0; rows of one shape travel");
    // The result's vectorized dims: every operand's, and whole along the exchanged axes.
    dims_t trailing(vec, 1);
    auto widen = [&](const auto& a) {
      for (std::size_t k = 0; k < vec; ++k) trailing[k] = broadcast_extent(trailing[k], a.shape()[a.dimension() - vec + k]);
    };
    widen(in.operand), widen(in.output);
    for (const auto& a : arrays) widen(a);
    for (const auto& ax : in.axes)
      if (ax.place == placement::vectorized) trailing[ax.slot] = ax.size;
    const std::size_t peers = arrays[0].dimension() == vec + 1 ? arrays[0].shape()[0] : 0;
    for (std::size_t f = 0; f < 4; ++f)
      if (arrays[f].dimension() != vec + 1 || arrays[f].shape()[0] != peers)
        fail("namedax::", verb, ": ", ragged_fields[f], " has positional shape ",
             dims_t(arrays[f].shape().begin(), arrays[f].shape().end() - vec), " and input_offsets ", dims_t{peers},
             "; give four 1-D integer arrays of one length, a multiple of the axis (or group) size");
    dims_t packed_shape{4, peers};
    packed_shape.insert(packed_shape.end(), trailing.begin(), trailing.end());
    in.ints = xt::xarray<std::int64_t>::from_shape(packed_shape);
    for (std::size_t f = 0; f < 4; ++f)
      xt::view(in.ints, f) = ragged_broadcast(std::move(arrays[f]), dims_t{peers}, trailing);
    in.operand = ragged_broadcast(std::move(in.operand), xs, trailing);
    in.output = ragged_broadcast(std::move(in.output), os, trailing);
    in.positional_rank = xs.size();
    return in;
  }
};

/// A plain array of `rows` zero rows shaped like the rows of named value x (for the linear map).
template <class X>
auto ragged_zeros(const X& x, std::size_t rows) {
  using T = value_type_of_t<X>;
  const auto& shape = x.payload().shape();
  dims_t s(shape.begin(), shape.end() - static_cast<std::ptrdiff_t>(X::env_type::vectorized_count));
  if (s.empty()) fail("namedax::ragged_all_to_all: the operand is a scalar; give an operand whose positional dim 0 holds the rows");
  s[0] = rows;
  xt::xarray<T> z = xt::xarray<T>::from_shape(s);
  z.fill(T{});
  return z;
}

/// The condition of all_gather_v's static_assert on its count: it prints as itself.
template <bool Named>
inline constexpr bool count_is_a_named_value = Named;
/// Whether all_gather_v's count is of a kind it takes: a plain number stops at one assertion
/// that says what to give instead, not deep in the exchange.
template <class C>
constexpr bool count_is_checked() {
  static_assert(count_is_a_named_value<!std::is_arithmetic_v<C>>,
                "namedax::all_gather_v: the count must be a named value of integers, each index's own number of rows "
                "(from axis_index, a collective or a mapped argument); for the same count on every index, all_gather "
                "with .tiled = true of namedax::view(x, xt::range(0, count)) gathers those rows");
  return !std::is_arithmetic_v<C>;
}

/// all_gather_v once its operands are resolved, in the same three steps: index r sends rows
/// [0, count_r) of x to every peer, where they land after the rows of the indices before r.
template <class Verb, class A>
struct all_gather_v_op {
  A axes;

  template <class X, class C>
  auto operator()(const X& x, const C& count) const {
    auto in = prepare(x, count);
    return typed<X, C>(rule(in, block_of(in.operand), block_of(in.ints)));
  }

  template <class X, class C>
  auto prepare(const X& x, const C& count) const {
    return prepare_in(x, count, names_only(to_axis_list(axes)));
  }

  template <class T, class In>
  xt::xarray<T> rule(const In& in, strided_block<T> operand, strided_block<std::int64_t> counts) const {
    return all_gather_v_rule<T>(Verb::name, std::move(operand), std::move(counts), in.positional_rank, in.axes);
  }
  [[nodiscard]] std::optional<groups_t> given_groups() const { return std::nullopt; }

  /// The result, the same along the axes: every index gathers the same rows.
  template <class X, class C, class T>
  static auto typed(xt::xarray<T> out) {
    using Env = typename merged_env<env<>, X, C>::type;
    constexpr axis_mask varying = (mask_of<X>() | mask_of<C>()) & ~ragged_axes_mask<Env, A>();
    return make_named<shared_array<T>, Env, varying>(share_array(std::move(out)));
  }

 private:
  template <class X, class C, class... Names>
  auto prepare_in(const X& x, const C& count, type_list<Names...>) const {
    constexpr std::string_view verb = Verb::name;
    using Env = typename merged_env<env<>, X, C>::type;
    require_bound<Verb, Env, Names...>();
    using T = value_type_of_t<X>;
    static_assert(std::is_integral_v<value_type_of_t<C>> && !std::is_same_v<value_type_of_t<C>, bool>,
                  "namedax::all_gather_v: the count must be an integer (int32)");
    constexpr std::size_t vec = Env::vectorized_count;
    ragged_operands<T, sizeof...(Names)> in{ragged_payload<Env, T>(x), {}, ragged_payload<Env, std::int64_t>(count),
                                            ragged_axes<Verb, Env, Names...>(), 0};
    const dims_t xs(in.operand.shape().begin(), in.operand.shape().end() - vec);
    if (xs.empty()) fail("namedax::", verb, ": x is a scalar; give x whose positional dim 0 holds the rows");
    if (in.ints.dimension() != vec)
      fail("namedax::", verb, ": the count has positional shape ",
           dims_t(in.ints.shape().begin(), in.ints.shape().end() - vec), "; give one integer per index");
    dims_t trailing(vec, 1);
    for (std::size_t k = 0; k < vec; ++k)
      trailing[k] = broadcast_extent(in.operand.shape()[xs.size() + k], in.ints.shape()[k]);
    for (const auto& ax : in.axes)
      if (ax.place == placement::vectorized) trailing[ax.slot] = ax.size;
    in.operand = ragged_broadcast(std::move(in.operand), xs, trailing);
    in.ints = ragged_broadcast(std::move(in.ints), dims_t{}, trailing);
    in.positional_rank = xs.size();
    return in;
  }
};

/// Starts ragged_all_to_all or all_gather_v (`op`, one of the operations above, whose Verb is
/// the asynchronous form) of `xs`. Among device threads, when every axis is one, the start lays
/// the operands out as the blocking form does (no exchange) and leaves the integer arrays and
/// the operand for every member (start_arrays); the wait runs the blocking rule on the members'
/// blocks, so it gives the blocking result bit for bit, and reports its mistakes. Every other
/// case (vmap, processes, a mix of placements) runs the blocking form at start.
template <class Verb, class Op, class... Xs>
auto start_ragged(const Op& op, const Xs&... xs) {
  using R = decltype(when_resolved(op, xs...));
  return [&]<class... Names>(type_list<Names...> names) {
    if constexpr ((NamedValue<Xs> || ...) && !(DeferredValue<Xs> || ...)) {
      using Env = typename merged_env<env<>, Xs...>::type;
      require_bound<Verb, Env, Names...>();
      const auto axes = ragged_axes<Verb, Env, Names...>();
      if (const auto threads = thread_axes(axes)) {
        auto in = op.prepare(xs...);
        using T = typename decltype(in.operand)::value_type;
        auto ints = share_array(std::move(in.ints));
        auto operand = share_array(std::move(in.operand));
        auto rule = [op, in = std::move(in)](const shared_array<std::int64_t>& i, const shared_array<T>& o) mutable {
          return op.template typed<Xs...>(op.rule(in, block_of(o), block_of(i)));
        };
        return start_arrays<R, Verb>(names, axes, *threads, op.given_groups(), std::move(rule), std::move(ints),
                                     std::move(operand));
      }
    }
    return async_state<R>(&async_what<Verb, Names...>, when_resolved(op, xs...));
  }(names_only(to_axis_list(op.axes)));
}

#if NAMEDAX_DEFINITIONS  // the bodies of the functions declared above (see detail/compilation.hpp)
NAMEDAX_DECL ragged_table read_ragged_table(std::string_view verb, strided_block<std::int64_t> ints,
                                            std::span<const named_axis> axes, const std::optional<groups_t>& groups,
                                            std::string_view options, group_layout& layout) {
  collective_frame<std::int64_t> frame(verb, std::move(ints), 2, axes, groups, true, options);
  layout = frame.groups();
  ragged_table t;
  t.members = frame.total();
  t.peers = frame.in_shape()[1];
  if (t.members == 0) {
    frame.release();
    return t;
  }
  const auto first = frame.member(0);
  const dims_t trailing(first.shape.begin() + 2, first.shape.end());
  t.batch = element_count(trailing);
  t.values.resize(t.members * 4 * t.peers * t.batch);
  for (std::size_t m = 0; m < t.members; ++m) {
    const auto block = frame.member(m);
    std::size_t b = 0;
    for_each_index(trailing, [&](std::span<const std::size_t> v) {
      const std::ptrdiff_t o = trailing_offset(v, block.strides, 2);
      for (std::size_t f = 0; f < 4; ++f)
        for (std::size_t p = 0; p < t.peers; ++p)
          t.values[((m * 4 + f) * t.peers + p) * t.batch + b] =
              block.data[o + static_cast<std::ptrdiff_t>(f) * block.strides[0] + static_cast<std::ptrdiff_t>(p) * block.strides[1]];
      ++b;
    });
  }
  frame.release();
  return t;
}

NAMEDAX_DECL std::string ragged_mistake(std::string_view verb, const ragged_table& t, const group_layout& layout,
                                        std::span<const named_axis> axes, std::size_t operand_rows,
                                        std::size_t output_rows) {
  const std::string where = message("namedax::", verb, " over axis ", describe_axes(axes));
  const std::size_t g = layout.members.empty() ? 0 : layout.members.front().size();
  if (t.members != 0 && (g == 0 || t.peers % g != 0))
    return message(where, ": the offsets and sizes have ", t.peers, " entries, which the ", g,
                   " indices of a group do not divide; give arrays whose length is a multiple of ", g,
                   " (one run of slices per peer)");
  const std::size_t slices = g == 0 ? 0 : t.peers / g;
  for (const auto& group : layout.members)
    for (std::size_t ps = 0; ps < group.size(); ++ps)
      for (std::size_t pr = 0; pr < group.size(); ++pr)
        for (std::size_t q = 0; q < slices; ++q)
          for (std::size_t b = 0; b < t.batch; ++b) {
            const std::size_t s = group[ps], r = group[pr], e = pr * slices + q, f = ps * slices + q;
            const std::int64_t in = t.at(s, 0, e, b), size = t.at(s, 1, e, b), out = t.at(s, 2, e, b),
                               recv = t.at(r, 3, f, b);
            const std::string peer =
                message(where, ": index ", s, " sending to peer ", r, slices > 1 ? message(" (entry ", e, ")") : std::string(),
                        t.batch > 1 ? message(" (batch element ", b, ")") : std::string());
            if (size < 0 || in < 0 || out < 0 || recv < 0)
              return message(peer, " has input_offsets ", in, ", send_sizes ", size, ", output_offsets ", out,
                             " and the peer recv_sizes ", recv, "; offsets and sizes must be >= 0");
            // Both are >= 0 here: compared without computing in + size, which can pass INT64_MAX;
            // printed as the unsigned sum, which cannot wrap.
            const auto end = [size](std::int64_t at) { return static_cast<std::uint64_t>(at) + static_cast<std::uint64_t>(size); };
            if (size > static_cast<std::int64_t>(operand_rows) || in > static_cast<std::int64_t>(operand_rows) - size)
              return message(peer, " sends rows ", in, "..", end(in), " (input_offsets ", in, ", send_sizes ", size,
                             "), past the operand's ", operand_rows, " rows");
            if (size > static_cast<std::int64_t>(output_rows) || out > static_cast<std::int64_t>(output_rows) - size)
              return message(peer, " writes rows ", out, "..", end(out), " (output_offsets ", out, ", send_sizes ",
                             size, "), past the output's ", output_rows, " rows");
            if (recv != size)
              return message(peer, " sends ", size, " rows but the peer's recv_sizes[", f, "] is ", recv,
                             "; recv_sizes must be what each peer sends");
          }
  return {};
}

NAMEDAX_DECL bool ragged_chunks_overlap(const ragged_table& t, const group_layout& layout) {
  for (std::size_t r = 0; r < t.members; ++r)
    for (std::size_t b = 0; b < t.batch; ++b) {
      std::vector<std::pair<std::int64_t, std::int64_t>> chunks;
      for_each_received(t, layout, r, b, [&](std::size_t, std::int64_t, std::int64_t size, std::int64_t out) {
        if (size > 0) chunks.emplace_back(out, out + size);
      });
      std::sort(chunks.begin(), chunks.end());
      for (std::size_t k = 1; k < chunks.size(); ++k)
        if (chunks[k].first < chunks[k - 1].second) return true;
    }
  return false;
}
#endif  // NAMEDAX_DEFINITIONS

}  // namespace namedax::detail
