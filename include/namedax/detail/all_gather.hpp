// SPDX-License-Identifier: MIT
// all_gather's rule, both modes: the output at a rank stacks (or, tiled, concatenates) its
// group's members along a positional axis, in group order.
// IWYU pragma: private, include <namedax/namedax.hpp>
#pragma once

#include <namedax/detail/collective_frame.hpp>
#include <namedax/detail/compilation.hpp>

namespace namedax::detail {

/// A positional axis in [0, count), negative counting from the end, or an error naming the verb.
NAMEDAX_DECL std::size_t positional_axis(std::string_view verb, std::string_view what, int axis, std::size_t count,
                                         std::span<const named_axis> axes);

/// The length of one of `g` chunks of positional dim `dim` (named `what` = `axis` by the
/// user): untiled, the dim must have exactly `g` elements; tiled, a multiple of `g` (the only
/// multiple of 0, for a vmap axis of size 0, is 0: then chunks are empty).
NAMEDAX_DECL std::size_t chunk_length(std::string_view verb, std::string_view what, int axis, std::size_t size,
                                      std::size_t g, bool tiled, std::span<const named_axis> axes, bool grouped);

/// A block without dimension `dim`, at index `index` along it.
template <class T>
strided_block<T> drop_dim(strided_block<T> b, std::size_t dim, std::size_t index) {
  if (b.data) b.data += static_cast<std::ptrdiff_t>(index) * b.strides[dim];  // empty: maybe no memory
  b.shape.erase(b.shape.begin() + static_cast<std::ptrdiff_t>(dim));
  b.strides.erase(b.strides.begin() + static_cast<std::ptrdiff_t>(dim));
  return b;
}

/// A block narrowed to [index * length, (index + 1) * length) along `dim`.
template <class T>
strided_block<T> chunk_of(strided_block<T> b, std::size_t dim, std::size_t index, std::size_t length) {
  if (b.data) b.data += static_cast<std::ptrdiff_t>(index * length) * b.strides[dim];  // empty: maybe no memory
  b.shape[dim] = length;
  return b;
}

/// Members `0..count-1` of a vectorized collective as one block with a last dim more, when
/// they are evenly spaced in the payload: one copy then moves them all, walking memory in
/// order, where a copy per member would read every cache line of the payload once per member.
template <class T>
std::optional<strided_block<T>> members_as_block(const collective_frame<T>& frame, std::span<const named_axis> axes,
                                                 const std::optional<groups_t>& groups, std::size_t count) {
  const bool vectorized = std::all_of(axes.begin(), axes.end(), [](const named_axis& a) { return a.place == placement::vectorized; });
  if (groups || !vectorized || count < 2) return std::nullopt;
  std::vector<const T*> starts;
  for (std::size_t k = 0; k < count; ++k) starts.push_back(frame.member(k).data);
  const auto spacing = even_spacing<T>(starts);
  if (!spacing) return std::nullopt;
  strided_block<T> block = frame.member(0);
  block.shape.push_back(count), block.strides.push_back(*spacing);
  return block;
}

/// all_gather's options in the user's words, as its call's signature shows them.
NAMEDAX_DECL std::string_view gather_options(int axis, bool tiled);

/// all_gather's positional output dims: dim `a` times `g` (tiled), or `g` inserted at `a`.
NAMEDAX_DECL dims_t gathered_positional(dims_t positional, std::size_t a, std::size_t g, bool tiled);

/// Where member k goes in an all_gather output of `out_shape` (row-major): at k * step, with
/// the strides returned (untiled: without the gathered dim).
NAMEDAX_DECL std::pair<strides_t, std::ptrdiff_t> gathered_slots(std::span<const std::size_t> out_shape, std::size_t a,
                                                                 std::size_t tile, bool tiled);

template <class T>
xt::xarray<T> all_gather_rule(std::string_view verb, strided_block<T> in, std::size_t positional_rank,
                              std::span<const named_axis> axes, const std::optional<groups_t>& groups, int axis,
                              bool tiled, bool varies) {
  collective_frame<T> frame(verb, std::move(in), positional_rank, axes, groups, true, gather_options(axis, tiled));
  const std::size_t g = frame.groups().members.front().size();
  dims_t positional(frame.in_shape().begin(), frame.in_shape().begin() + static_cast<std::ptrdiff_t>(positional_rank));
  const std::size_t a = positional_axis(verb, "axis", axis, tiled ? positional_rank : positional_rank + 1, axes);
  const std::size_t tile = tiled ? positional[a] : 1;
  positional = gathered_positional(std::move(positional), a, g, tiled);
  auto out = uninitialized_array<T>(frame.output_shape(positional, varies));
  if (out.size() == 0) {  // nothing to copy, and an empty array may have no memory to point into
    frame.release();
    return out;
  }
  const auto out_strides = row_major_strides(out.shape());
  const std::size_t out_rank = positional.size();

  // Member k of the group goes to index k (tiled: block k) along the gathered axis.
  auto slots = gathered_slots(out.shape(), a, tile, tiled);
  auto& slot_strides = slots.first;
  const std::ptrdiff_t step = slots.second;
  if (auto whole = varies ? std::nullopt : members_as_block(frame, axes, groups, g)) {
    slot_strides.push_back(step);
    copy_strided(*whole, frame.at_rank(out.data(), 0, out_strides, out_rank), slot_strides);
    frame.release();
    return out;
  }
  frame.for_each_owned(varies, [&](std::size_t rank) {
    T* base = frame.at_rank(out.data(), rank, out_strides, out_rank);
    const auto& group = frame.groups().members[frame.groups().group_of[rank]];
    for (std::size_t k = 0; k < group.size(); ++k)
      copy_strided(frame.member(group[k]), base + static_cast<std::ptrdiff_t>(k) * step, slot_strides);
  });
  frame.release();
  return out;
}

#if NAMEDAX_DEFINITIONS  // the bodies of the functions declared above (see detail/compilation.hpp)
NAMEDAX_DECL std::size_t positional_axis(std::string_view verb, std::string_view what, int axis, std::size_t count,
                                         std::span<const named_axis> axes) {
  const int d = axis < 0 ? axis + static_cast<int>(count) : axis;
  if (d < 0 || d >= static_cast<int>(count))
    fail("namedax::", verb, ": ", what, " ", axis, " is out of range for ", count, " positions (axis ",
         describe_axes(axes), ")");
  return static_cast<std::size_t>(d);
}

NAMEDAX_DECL std::size_t chunk_length(std::string_view verb, std::string_view what, int axis, std::size_t size,
                                      std::size_t g, bool tiled, std::span<const named_axis> axes, bool grouped) {
  const bool divisible = g == 0 ? size == 0 : size % g == 0;
  if (tiled ? !divisible : size != g)
    fail("namedax::", verb, ": the size of ", what, " ", axis, " (", size, ") must ", tiled ? "be divisible by" : "equal",
         " the size of axis ", describe_axes(axes), " (", g, grouped ? " in each group" : "", ")");
  return g == 0 ? 0 : size / g;
}

NAMEDAX_DECL std::string_view gather_options(int axis, bool tiled) {
  return option_text(" at axis ", axis, tiled ? ", tiled" : "");
}

NAMEDAX_DECL dims_t gathered_positional(dims_t positional, std::size_t a, std::size_t g, bool tiled) {
  if (tiled) positional[a] *= g;
  else insert_dim(positional, a, g);
  return positional;
}

NAMEDAX_DECL std::pair<strides_t, std::ptrdiff_t> gathered_slots(std::span<const std::size_t> out_shape, std::size_t a,
                                                                 std::size_t tile, bool tiled) {
  const auto out_strides = row_major_strides(out_shape);
  strides_t slot_strides = out_strides;
  if (!tiled) slot_strides.erase(slot_strides.begin() + static_cast<std::ptrdiff_t>(a));
  return {std::move(slot_strides), static_cast<std::ptrdiff_t>(tile) * out_strides[a]};
}
#endif  // NAMEDAX_DEFINITIONS

#ifdef NAMEDAX_SEPARATE_COMPILATION  // defined once, by <namedax/separate_compilation.hpp>
#define NAMEDAX_INSTANTIATE(T)                                                                                              \
  NAMEDAX_EXTERN template xt::xarray<T> all_gather_rule<T>(std::string_view, strided_block<T>, std::size_t,                 \
                                                          std::span<const named_axis>, const std::optional<groups_t>&, int, \
                                                          bool, bool);
NAMEDAX_FOR_EACH_ELEMENT_TYPE(NAMEDAX_INSTANTIATE)
#undef NAMEDAX_INSTANTIATE
#endif

}  // namespace namedax::detail
