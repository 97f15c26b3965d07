// SPDX-License-Identifier: MIT
// all_to_all's rule, both modes: the rank at position p of its group takes chunk p (along
// split_axis) of every member k of the group and puts it at position k along concat_axis.
// IWYU pragma: private, include <namedax/namedax.hpp>
#pragma once

#include <namedax/detail/all_gather.hpp>
#include <namedax/detail/compilation.hpp>

namespace namedax::detail {

/// all_to_all's options in the user's words, as its call's signature shows them.
NAMEDAX_DECL std::string_view split_options(int split_axis, int concat_axis, bool tiled);

/// Whether all_to_all moves no element: under vmap over one axis, untiled and without groups,
/// of an operand of payload shape `shape` that holds every member along it (a value typed as
/// varying may still be one member broadcast), only the dims change roles (index p of the
/// result along the axis, member k along concat_axis, is member k's piece p along split_axis),
/// so the result is a view of the operand (all_to_all_view).
inline bool all_to_all_is_view(std::span<const named_axis> axes, bool grouped, bool tiled, const dims_t& shape,
                               std::size_t positional_rank) {
  return axes.size() == 1 && !grouped && !tiled && axes[0].place == placement::vectorized && axes[0].varies &&
         shape[positional_rank + axes[0].slot] == axes[0].size;
}

/// The view, where all_to_all_is_view and the operand's strides are not negative; checks the
/// call as the rule does. Nothing in every other case.
template <class T>
std::optional<strided_block<T>> all_to_all_view(std::string_view verb, strided_block<T> in, std::size_t positional_rank,
                                                std::span<const named_axis> axes, int split_axis, int concat_axis,
                                                std::string_view split_name) {
  const std::size_t g = axes[0].size, slot = positional_rank + axes[0].slot;
  if (std::any_of(in.strides.begin(), in.strides.end(), [](std::ptrdiff_t s) { return s < 0; })) return std::nullopt;
  const std::size_t split = positional_axis(verb, split_name, split_axis, positional_rank, axes);
  const std::size_t concat = positional_axis(verb, "concat_axis", concat_axis, positional_rank, axes);
  chunk_length(verb, split_name, split_axis, in.shape[split], g, false, axes, false);
  const std::ptrdiff_t member_step = in.strides[slot];
  in.strides[slot] = in.strides[split];  // the piece index becomes the axis index
  in.shape.erase(in.shape.begin() + static_cast<std::ptrdiff_t>(split));
  in.strides.erase(in.strides.begin() + static_cast<std::ptrdiff_t>(split));
  insert_dim(in.shape, concat, g);
  in.strides.push_back(g == 1 ? 0 : member_step);
  std::rotate(in.strides.begin() + static_cast<std::ptrdiff_t>(concat), in.strides.end() - 1, in.strides.end());
  return in;
}

template <class T>
xt::xarray<T> all_to_all_rule(std::string_view verb, strided_block<T> in, std::size_t positional_rank,
                              std::span<const named_axis> axes, const std::optional<groups_t>& groups, int split_axis,
                              int concat_axis, bool tiled, std::string_view split_name = "split_axis") {
  collective_frame<T> frame(verb, std::move(in), positional_rank, axes, groups, true,
                            split_options(split_axis, concat_axis, tiled));
  const std::size_t g = frame.groups().members.front().size();
  dims_t positional(frame.in_shape().begin(), frame.in_shape().begin() + static_cast<std::ptrdiff_t>(positional_rank));
  const std::size_t split = positional_axis(verb, split_name, split_axis, positional_rank, axes);
  const std::size_t concat = positional_axis(verb, "concat_axis", concat_axis, positional_rank, axes);
  const std::size_t chunk = chunk_length(verb, split_name, split_axis, positional[split], g, tiled, axes, groups.has_value());
  // Untiled: the split axis goes and the gathered one is inserted at concat_axis.
  if (tiled) {
    positional[split] = chunk;
  } else {
    positional.erase(positional.begin() + static_cast<std::ptrdiff_t>(split));
    insert_dim(positional, concat, g);
  }
  const std::size_t block = tiled ? positional[concat] : 1;  // the length of one member's piece along concat
  if (tiled) positional[concat] *= g;
  auto out = uninitialized_array<T>(frame.output_shape(positional, true));
  if (out.size() == 0) {  // nothing to copy, and an empty array may have no memory to point into
    frame.release();
    return out;
  }
  const auto out_strides = row_major_strides(out.shape());
  strides_t slot_strides = out_strides;
  if (!tiled) slot_strides.erase(slot_strides.begin() + static_cast<std::ptrdiff_t>(concat));
  const std::ptrdiff_t step = static_cast<std::ptrdiff_t>(block) * out_strides[concat];

  auto piece_of = [&](strided_block<T> member, std::size_t p) {
    return tiled ? chunk_of(std::move(member), split, p, chunk) : drop_dim(std::move(member), split, p);
  };
  // Vectorized without groups: the pieces of every member for every rank are one block with two
  // dims more (member, then rank), moved by one copy in memory order.
  if (auto members = members_as_block(frame, axes, groups, g)) {
    std::vector<const T*> targets;
    for (std::size_t rank = 0; rank < g; ++rank) targets.push_back(frame.at_rank(out.data(), rank, out_strides, positional.size()));
    if (const auto rank_step = even_spacing<T>(targets)) {
      const std::ptrdiff_t member_step = members->strides.back();
      members->shape.pop_back(), members->strides.pop_back();
      strided_block<T> block = piece_of(*members, 0);
      const std::ptrdiff_t piece_step = piece_of(*members, 1).data - block.data;
      block.shape.insert(block.shape.end(), {g, g});
      block.strides.insert(block.strides.end(), {member_step, piece_step});
      slot_strides.insert(slot_strides.end(), {step, *rank_step});
      copy_strided(block, frame.at_rank(out.data(), 0, out_strides, positional.size()), slot_strides);
      frame.release();
      return out;
    }
  }
  frame.for_each_owned(true, [&](std::size_t rank) {
    const std::size_t p = frame.groups().position_of[rank];
    const auto& group = frame.groups().members[frame.groups().group_of[rank]];
    T* base = frame.at_rank(out.data(), rank, out_strides, positional.size());
    for (std::size_t k = 0; k < group.size(); ++k)
      copy_strided(piece_of(frame.member(group[k]), p), base + static_cast<std::ptrdiff_t>(k) * step, slot_strides);
  });
  frame.release();
  return out;
}

#if NAMEDAX_DEFINITIONS  // the bodies of the functions declared above (see detail/compilation.hpp)
NAMEDAX_DECL std::string_view split_options(int split_axis, int concat_axis, bool tiled) {
  return option_text(" with split_axis ", split_axis, " and concat_axis ", concat_axis, tiled ? ", tiled" : "");
}
#endif  // NAMEDAX_DEFINITIONS

#ifdef NAMEDAX_SEPARATE_COMPILATION  // defined once, by <namedax/separate_compilation.hpp>
#define NAMEDAX_INSTANTIATE(T)                                                                                              \
  NAMEDAX_EXTERN template xt::xarray<T> all_to_all_rule<T>(std::string_view, strided_block<T>, std::size_t,                 \
                                                          std::span<const named_axis>, const std::optional<groups_t>&, int, \
                                                          int, bool, std::string_view);                                     \
  NAMEDAX_EXTERN template std::optional<strided_block<T>> all_to_all_view<T>(std::string_view, strided_block<T>,            \
                                                                            std::size_t, std::span<const named_axis>,       \
                                                                            int, int, std::string_view);
NAMEDAX_FOR_EACH_ELEMENT_TYPE(NAMEDAX_INSTANTIATE)
#undef NAMEDAX_INSTANTIATE
#endif

}  // namespace namedax::detail
