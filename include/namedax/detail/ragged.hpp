// SPDX-License-Identifier: MIT
// ragged_all_to_all's rule, both modes: every member's offsets and sizes are read first (one
// exchange of small integers), checked all together so that every index reports the same
// mistake, then each receiver copies the rows its peers send into a copy of its own output.
// Over process axes alone the rows travel by one MPI_Alltoallv instead.
// IWYU pragma: private
#pragma once

#include <namedax/collectives.hpp>
#include <namedax/detail/all_gather.hpp>
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
inline ragged_table read_ragged_table(std::string_view verb, strided_block<std::int64_t> ints,
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

/// The first inconsistency in the table, in the user's words; empty when there is none. Every
/// index computes it from the same table, so every index reports the same one. With K entries
/// over groups of g indices, entry e goes to the peer at position e / (K / g): each peer gets
/// K / g slices, and slice q from the peer at position p is entry p * (K / g) + q of recv_sizes.
inline std::string ragged_mistake(std::string_view verb, const ragged_table& t, const group_layout& layout,
                                  std::span<const named_axis> axes, std::size_t operand_rows, std::size_t output_rows) {
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
            if (in + size > static_cast<std::int64_t>(operand_rows))
              return message(peer, " sends rows ", in, "..", in + size, " (input_offsets ", in, ", send_sizes ", size,
                             "), past the operand's ", operand_rows, " rows");
            if (out + size > static_cast<std::int64_t>(output_rows))
              return message(peer, " writes rows ", out, "..", out + size, " (output_offsets ", out, ", send_sizes ",
                             size, "), past the output's ", output_rows, " rows");
            if (recv != size)
              return message(peer, " sends ", size, " rows but the peer's recv_sizes[", f, "] is ", recv,
                             "; recv_sizes must be what each peer sends");
          }
  return {};
}

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
inline bool ragged_chunks_overlap(const ragged_table& t, const group_layout& layout) {
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

/// ragged_all_to_all on blocks in one environment: `operand` and `output` row-major with
/// `positional_rank` positional dims and the same vectorized dims (full along the vectorized
/// collective axes), `ints` the four arrays packed as [4, peers, those vectorized dims].
/// `axes` must say that every operand varies along every axis.
template <class T>
xt::xarray<T> ragged_all_to_all_rule(std::string_view verb, strided_block<T> operand, xt::xarray<T> output,
                                     strided_block<std::int64_t> ints, std::size_t positional_rank,
                                     std::span<const named_axis> axes, const std::optional<groups_t>& groups) {
  group_layout layout;
  const std::string_view options = "";
  const ragged_table table = read_ragged_table(verb, std::move(ints), axes, groups, options, layout);
  if (auto mistake = ragged_mistake(verb, table, layout, axes, operand.shape[0], output.shape()[0]); !mistake.empty())
    fail(mistake);
  if (auto moved = ragged_across_processes<T>(verb, operand, output, table, layout, axes, groups))
    return std::move(*moved);
  collective_frame<T> frame(verb, std::move(operand), positional_rank, axes, groups, true, options);
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
xt::xarray<T> ragged_broadcast(const xt::xarray<T>& a, dims_t positional, const dims_t& trailing) {
  positional.insert(positional.end(), trailing.begin(), trailing.end());
  if (std::equal(positional.begin(), positional.end(), a.shape().begin(), a.shape().end())) return a;
  return xt::xarray<T>(xt::broadcast(a, positional));
}

/// The operation once every operand is resolved: the operands in their merged environment,
/// broadcast to the result's vectorized dims, then the rule.
template <class Verb, class A>
struct ragged_all_to_all_op {
  A axes;
  groups_t groups;

  template <class X, class O, class... Ints>
  auto operator()(const X& operand, const O& output, const Ints&... ints) const {
    return run(operand, output, names_only(to_axis_list(axes)), ints...);
  }

 private:
  template <class X, class O, class... Names, class... Ints>
  auto run(const X& operand, const O& output, type_list<Names...>, const Ints&... ints) const {
    constexpr std::string_view verb = Verb::name;
    using Env = typename merged_env<env<>, X, O, Ints...>::type;
    require_bound<Verb, Env, Names...>();
    using T = value_type_of_t<X>;
    static_assert(std::is_same_v<T, value_type_of_t<O>>,
                  "namedax::ragged_all_to_all: operand and output must have one element type");
    static_assert((... && (std::is_integral_v<value_type_of_t<Ints>> && !std::is_same_v<value_type_of_t<Ints>, bool>)),
                  "namedax::ragged_all_to_all: offsets and sizes must be integers (int32, as in JAX)");
    constexpr std::size_t vec = Env::vectorized_count;
    auto x = ragged_payload<Env, T>(operand);
    auto o = ragged_payload<Env, T>(output);
    std::array<xt::xarray<std::int64_t>, 4> arrays{ragged_payload<Env, std::int64_t>(ints)...};
    const dims_t xs(x.shape().begin(), x.shape().end() - vec), os(o.shape().begin(), o.shape().end() - vec);
    if (xs.empty())
      fail("namedax::", verb, ": the operand is a scalar; give an operand whose positional dim 0 holds the rows");
    if (xs.size() != os.size() || !std::equal(xs.begin() + 1, xs.end(), os.begin() + 1))
      fail("namedax::", verb, ": operand of positional shape ", xs, " and output of shape ", os,
           " differ past dim 0; rows of one shape travel");
    const named_axis described[] = {[&] {
      constexpr int k = Env::index_of(Names::name);
      const frame& f = bound_frame(verb, Names::name);
      return named_axis{Names::name, Env::places[k], f.size, true, Env::vectorized_slot(k), f.index};
    }()...};
    // The result's vectorized dims: every operand's, and whole along the exchanged axes.
    dims_t trailing(vec, 1);
    auto widen = [&](const auto& a) {
      for (std::size_t k = 0; k < vec; ++k) trailing[k] = broadcast_extent(trailing[k], a.shape()[a.dimension() - vec + k]);
    };
    widen(x), widen(o);
    for (const auto& a : arrays) widen(a);
    for (const auto& ax : described)
      if (ax.place == placement::vectorized) trailing[ax.slot] = ax.size;
    const std::size_t peers = arrays[0].dimension() == vec + 1 ? arrays[0].shape()[0] : 0;
    for (std::size_t f = 0; f < 4; ++f)
      if (arrays[f].dimension() != vec + 1 || arrays[f].shape()[0] != peers)
        fail("namedax::", verb, ": ", ragged_fields[f], " has positional shape ",
             dims_t(arrays[f].shape().begin(), arrays[f].shape().end() - vec), " and input_offsets ", dims_t{peers},
             "; give four 1-D integer arrays of one length, a multiple of the axis (or group) size");
    dims_t packed_shape{4, peers};
    packed_shape.insert(packed_shape.end(), trailing.begin(), trailing.end());
    auto packed = xt::xarray<std::int64_t>::from_shape(packed_shape);
    for (std::size_t f = 0; f < 4; ++f)
      xt::view(packed, f) = ragged_broadcast(arrays[f], dims_t{peers}, trailing);
    auto operand_full = ragged_broadcast(x, xs, trailing);
    auto out = ragged_all_to_all_rule<T>(verb, block_of(operand_full), ragged_broadcast(o, os, trailing),
                                         block_of(packed), xs.size(), described,
                                         groups.empty() ? std::nullopt : std::optional<groups_t>(groups));
    constexpr axis_mask varying = mask_of<X>() | mask_of<O>() | (mask_of<Ints>() | ...) | Env::template mask_of<Names...>();
    return make_named<shared_array<T>, Env, varying>(share_array(std::move(out)));
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

/// all_gather_v once its operands are resolved: `counts` holds every index's count (an
/// all_gather of them). Index r sends rows [0, count_r) of x to every peer, where they land
/// after the rows of the indices before r: the ragged all-to-all of an all-gather.
template <class Verb, class A>
struct all_gather_v_op {
  A axes;

  template <class X, class C>
  auto operator()(const X& x, const C& counts) const {
    return run(x, counts, names_only(to_axis_list(axes)));
  }

 private:
  template <class X, class C, class... Names>
  auto run(const X& x_value, const C& counts_value, type_list<Names...>) const {
    constexpr std::string_view verb = Verb::name;
    using Env = typename merged_env<env<>, X, C>::type;
    require_bound<Verb, Env, Names...>();
    using T = value_type_of_t<X>;
    constexpr std::size_t vec = Env::vectorized_count;
    auto x = ragged_payload<Env, T>(x_value);
    auto counts = ragged_payload<Env, std::int64_t>(counts_value);
    const dims_t xs(x.shape().begin(), x.shape().end() - vec);
    if (xs.empty()) fail("namedax::", verb, ": x is a scalar; give x whose positional dim 0 holds the rows");
    const named_axis described[] = {[&] {
      constexpr int k = Env::index_of(Names::name);
      const frame& f = bound_frame(verb, Names::name);
      return named_axis{Names::name, Env::places[k], f.size, true, Env::vectorized_slot(k), f.index};
    }()...};
    const std::size_t n = member_count(described);
    dims_t trailing(vec, 1);
    for (std::size_t k = 0; k < vec; ++k)
      trailing[k] = broadcast_extent(x.shape()[xs.size() + k], counts.shape()[1 + k]);
    for (const auto& ax : described)
      if (ax.place == placement::vectorized) trailing[ax.slot] = ax.size;
    const auto all = ragged_broadcast(counts, dims_t{n}, trailing);
    // Every index sees every count: a bad one is the same error everywhere, and the rows of
    // the result are the largest total over the batch elements (shorter totals pad with zeros).
    std::int64_t rows = 0;
    for_each_index(trailing, [&](std::span<const std::size_t> v) {
      std::int64_t total = 0;
      for (std::size_t j = 0; j < n; ++j) {
        const std::int64_t c = all.data()[static_cast<std::ptrdiff_t>(j) * static_cast<std::ptrdiff_t>(all.strides()[0]) +
                                          trailing_offset(v, all.strides(), 1)];
        if (c < 0 || c > static_cast<std::int64_t>(xs[0]))
          fail("namedax::", verb, " over axis ", describe_axes(described), ": index ", j, " gives count ", c,
               ", outside 0..", xs[0], " (the rows of x); give each index's number of valid leading rows");
        total += c;
      }
      rows = std::max(rows, total);
    });
    dims_t packed_shape{4, n};
    packed_shape.insert(packed_shape.end(), trailing.begin(), trailing.end());
    auto packed = xt::xarray<std::int64_t>::from_shape(packed_shape);
    const auto ps = packed.strides();
    for_each_index(trailing, [&](std::span<const std::size_t> v) {
      std::size_t r = 0;  // this element's rank along the axes
      for (const auto& ax : described) r = r * ax.size + (ax.place == placement::vectorized ? v[ax.slot] : ax.index);
      auto count = [&](std::size_t j) {
        return all.data()[static_cast<std::ptrdiff_t>(j) * static_cast<std::ptrdiff_t>(all.strides()[0]) +
                          trailing_offset(v, all.strides(), 1)];
      };
      std::int64_t before = 0;
      for (std::size_t j = 0; j < r; ++j) before += count(j);
      for (std::size_t j = 0; j < n; ++j) {
        std::int64_t* at = packed.data() + trailing_offset(v, ps, 2) + static_cast<std::ptrdiff_t>(j * ps[1]);
        at[0] = 0, at[ps[0]] = count(r), at[2 * ps[0]] = before, at[3 * ps[0]] = count(j);
      }
    });
    dims_t out_shape = xs;
    out_shape[0] = static_cast<std::size_t>(rows);
    out_shape.insert(out_shape.end(), trailing.begin(), trailing.end());
    xt::xarray<T> zeros = xt::xarray<T>::from_shape(out_shape);
    zeros.fill(T{});
    auto operand = ragged_broadcast(x, xs, trailing);
    auto out = ragged_all_to_all_rule<T>(verb, block_of(operand), std::move(zeros), block_of(packed), xs.size(),
                                         described, std::nullopt);
    constexpr axis_mask varying = (mask_of<X>() | mask_of<C>()) & ~Env::template mask_of<Names...>();
    return make_named<shared_array<T>, Env, varying>(share_array(std::move(out)));
  }
};

}  // namespace namedax::detail
