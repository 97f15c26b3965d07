// SPDX-License-Identifier: MIT
// ppermute's rule, both modes: each rank receives the member its (source, destination) pair
// names, or zeros when no pair sends to it.
#pragma once

#include <namedax/detail/all_gather.hpp>

#include <utility>

namespace namedax::detail {

using permutation_t = std::vector<std::pair<int, int>>;

/// ppermute's options in the user's words, as its call's signature shows them.
inline std::string_view pairs_options(const permutation_t& perm) { return option_text(" with pairs ", perm); }

/// For each rank, the rank it receives from, or -1; sources and destinations must be unique.
/// Written into a buffer of this thread that keeps its capacity (valid until its next call).
inline std::span<const long> senders(std::string_view verb, std::span<const named_axis> axes,
                                     const permutation_t& perm, std::size_t total) {
  thread_local std::vector<long> from;
  thread_local std::vector<bool> sends;
  from.assign(total, -1);
  sends.assign(total, false);
  for (auto [source, destination] : perm) {
    for (int i : {source, destination})
      if (i < 0 || static_cast<std::size_t>(i) >= total)
        fail("namedax::", verb, ": the pair (", source, ", ", destination, ") is out of range for axis ",
             describe_axes(axes), " of size ", total, "; use indices 0..", total - 1);
    if (sends[static_cast<std::size_t>(source)])
      fail("namedax::", verb, ": source ", source, " appears twice in the permutation over axis ", describe_axes(axes),
           " of size ", total, "; each index may send once");
    if (from[static_cast<std::size_t>(destination)] >= 0)
      fail("namedax::", verb, ": destination ", destination, " appears twice in the permutation over axis ",
           describe_axes(axes), " of size ", total, "; each index may receive once");
    sends[static_cast<std::size_t>(source)] = true;
    from[static_cast<std::size_t>(destination)] = source;
  }
  return from;
}

/// pshuffle's permutation as ppermute's pairs (perm[i], i); it must permute 0..N-1.
inline permutation_t shuffle_pairs(std::string_view verb, std::span<const named_axis> axes,
                                   const std::vector<int>& perm) {
  std::size_t total = 1;
  for (const auto& a : axes) total *= a.size;
  std::vector<bool> seen(total, false);
  bool valid = perm.size() == total;
  for (std::size_t i = 0; valid && i < perm.size(); ++i) {
    const int p = perm[i];
    valid = p >= 0 && static_cast<std::size_t>(p) < total && !seen[static_cast<std::size_t>(p)];
    if (valid) seen[static_cast<std::size_t>(p)] = true;
  }
  if (!valid)
    fail("namedax::", verb, ": ", message(perm), " is not a permutation of 0..", total - 1, " for axis ",
         describe_axes(axes), " of size ", total);
  permutation_t pairs;
  for (std::size_t i = 0; i < perm.size(); ++i) pairs.emplace_back(perm[i], static_cast<int>(i));
  return pairs;
}

template <class T>
xt::xarray<T> ppermute_rule(std::string_view verb, strided_block<T> in, std::size_t positional_rank,
                            std::span<const named_axis> axes, const permutation_t& perm) {
  collective_frame<T> frame(verb, std::move(in), positional_rank, axes, std::nullopt, false,
                            pairs_options(perm));
  const auto from = senders(verb, axes, perm, frame.total());
  dims_t positional(frame.in_shape().begin(), frame.in_shape().begin() + static_cast<std::ptrdiff_t>(positional_rank));
  auto out = uninitialized_array<T>(frame.output_shape(positional, true));
  const auto out_strides = row_major_strides(out.shape());
  frame.for_each_owned(true, [&](std::size_t rank) {
    T* target = out.data() + frame.vectorized_offset(rank, out_strides, positional_rank);
    auto element = frame.member(rank);
    if (from[rank] >= 0) {
      copy_strided(frame.member(static_cast<std::size_t>(from[rank])), target, out_strides);
    } else {
      for_each_line(element.shape, out_strides, out_strides,
                    [&](std::ptrdiff_t, std::ptrdiff_t o, std::size_t n, std::ptrdiff_t, std::ptrdiff_t os) {
                      for (std::size_t k = 0; k < n; ++k) target[o + static_cast<std::ptrdiff_t>(k) * os] = T{};
                    });
    }
  });
  frame.release();
  return out;
}

/// ppermute among device threads of a whole array: the receiver gets the sender's array
/// itself. Values are never written once made, so a move between threads is a move of a
/// reference, as a move between variables would be; indices that receive nothing get zeros.
/// `names` are `axes`' names, all device-thread axes along which `mine` varies (thread_axes).
template <class T>
shared_array<T> permute_by_reference(std::string_view verb, const shared_array<T>& mine,
                                     std::span<const named_axis> axes, std::span<const std::string_view> names,
                                     const permutation_t& perm) {
  const auto from = senders(verb, axes, perm, member_count(axes));
  const dims_t shape(mine.shape().begin(), mine.shape().end());
  pointer_exchange exchange(join(names), &mine, call_of<T>(verb, axes, pairs_options(perm), std::nullopt, shape));
  const long source = from[exchange.rank()];
  if (source < 0) {
    exchange.release();
    auto zeros = uninitialized_array<T>(shape);
    std::fill(zeros.data(), zeros.data() + zeros.size(), T{});
    return share_array<T>(std::move(zeros));
  }
  shared_array<T> received = *static_cast<const shared_array<T>*>(exchange.slot(static_cast<std::size_t>(source)));
  exchange.release();
  return received;
}

}  // namespace namedax::detail
