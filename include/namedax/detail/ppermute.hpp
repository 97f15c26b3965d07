// SPDX-License-Identifier: MIT
// ppermute's rule, both modes: each rank receives the member its (source, destination) pair
// names, or zeros when no pair sends to it.
// IWYU pragma: private, include <namedax/namedax.hpp>
#pragma once

#include <namedax/detail/all_gather.hpp>
#include <namedax/detail/compilation.hpp>
#include <namedax/detail/unpack.hpp>

#include <array>
#include <string>
#include <tuple>
#include <utility>

namespace namedax::detail {

using permutation_t = std::vector<std::pair<int, int>>;

/// ppermute's options in the user's words, as its call's signature shows them.
NAMEDAX_DECL std::string_view pairs_options(const permutation_t& perm);

/// For each rank, the rank it receives from, or -1; sources and destinations must be unique.
/// Written into a buffer of this thread that keeps its capacity (valid until its next call).
NAMEDAX_DECL std::span<const long> senders(std::string_view verb, std::span<const named_axis> axes,
                                           const permutation_t& perm, std::size_t total);

/// pshuffle's permutation as ppermute's pairs (perm[i], i); it must permute 0..N-1.
NAMEDAX_DECL permutation_t shuffle_pairs(std::string_view verb, std::span<const named_axis> axes,
                                         const std::vector<int>& perm);

#if NAMEDAX_DEFINITIONS  // the bodies of the functions declared above (see detail/compilation.hpp)
NAMEDAX_DECL std::string_view pairs_options(const permutation_t& perm) { return option_text(" with pairs ", perm); }

NAMEDAX_DECL std::span<const long> senders(std::string_view verb, std::span<const named_axis> axes,
                                           const permutation_t& perm, std::size_t total) {
  thread_local std::vector<long> from;
  thread_local std::vector<bool> sends;
  from.assign(total, -1);
  sends.assign(total, false);
  for (auto [source, destination] : perm) {
    for (int i : {source, destination})
      if (i < 0 || static_cast<std::size_t>(i) >= total)
        fail("namedax::", verb, ": the pair (", source, ", ", destination, ") is out of range for axis ",
             describe_axes(axes), " of size ", total, "; ", valid_indices(total));
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

NAMEDAX_DECL permutation_t shuffle_pairs(std::string_view verb, std::span<const named_axis> axes,
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
    fail("namedax::", verb, ": ", message(perm), " is not a permutation of ",
         total == 0 ? std::string("no index") : message("0..", total - 1), " for axis ",
         describe_axes(axes), " of size ", total);
  permutation_t pairs;
  for (std::size_t i = 0; i < perm.size(); ++i) pairs.emplace_back(perm[i], static_cast<int>(i));
  return pairs;
}
#endif  // NAMEDAX_DEFINITIONS

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
    T* target = frame.at_rank(out.data(), rank, out_strides, positional_rank);
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

#ifdef NAMEDAX_SEPARATE_COMPILATION  // defined once, by <namedax/separate_compilation.hpp>
#define NAMEDAX_INSTANTIATE(T)                                                                              \
  NAMEDAX_EXTERN template xt::xarray<T> ppermute_rule<T>(std::string_view, strided_block<T>, std::size_t, \
                                                        std::span<const named_axis>, const permutation_t&);
NAMEDAX_FOR_EACH_ELEMENT_TYPE(NAMEDAX_INSTANTIATE)
#undef NAMEDAX_INSTANTIATE
#endif

/// ppermute among device threads of whole arrays: the receiver gets the sender's arrays
/// themselves. Values are never written once made, so a move between threads is a move of a
/// reference, as a move between variables would be; indices that receive nothing get zeros.
/// `names` are `axes`' names, all device-thread axes along which every array varies
/// (thread_axes). The leaves of a pytree go in one exchange, whose signature lists them.
template <class... T>
std::tuple<shared_array<T>...> permute_by_reference(std::string_view verb, const std::tuple<const shared_array<T>*...>& mine,
                                                    std::span<const named_axis> axes,
                                                    std::span<const std::string_view> names, const permutation_t& perm) {
  constexpr std::size_t count = sizeof...(T);
  const auto from = senders(verb, axes, perm, member_count(axes));
  const auto& first = *std::get<0>(mine);
  const dims_t shape(first.shape().begin(), first.shape().end());
  std::string_view options = pairs_options(perm);
  if constexpr (count > 1) {
    thread_local std::string leaves;  // keeps its capacity
    leaves.assign(options), write_part(leaves, " of "), write_part(leaves, count), leaves += " leaves:";
    const char* separator = " ";
    unpack(mine, [&](const auto*... leaf) {
      ((leaves += separator, write_part(leaves, dims_t(leaf->shape().begin(), leaf->shape().end())), leaves += ' ',
        leaves += dtype_name<typename std::remove_cvref_t<decltype(*leaf)>::value_type>(), separator = ", "), ...);
    });
    options = leaves;
  }
  const auto offered = unpack(mine, [](const auto*... leaf) { return std::array<const void*, count>{leaf...}; });
  using first_type = std::tuple_element_t<0, std::tuple<T...>>;
  pointer_exchange exchange(join(names), &offered, call_of<first_type>(verb, axes, options, std::nullopt, shape), 0,
                            exchange_form::references);
  const long source = from[exchange.rank()];
  auto received = [&]<class U>(const shared_array<U>* own, std::size_t k) {
    if (source < 0) {
      auto zeros = uninitialized_array<U>(own->shape());
      std::fill(zeros.data(), zeros.data() + zeros.size(), U{});
      return share_array<U>(std::move(zeros));
    }
    const auto& theirs = *static_cast<const std::array<const void*, count>*>(exchange.slot(static_cast<std::size_t>(source)));
    return *static_cast<const shared_array<U>*>(theirs[k]);
  };
  auto out = [&]<std::size_t... I>(std::index_sequence<I...>) {
    return std::tuple<shared_array<T>...>{received(std::get<I>(mine), I)...};
  }(std::make_index_sequence<count>{});
  exchange.release();
  return out;
}

}  // namespace namedax::detail
