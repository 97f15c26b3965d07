// SPDX-License-Identifier: MIT
// psum_scatter's rule, both modes: the rank at position p of its group sums chunk p of its
// group's members along scatter_dimension (a reduce-scatter).
// IWYU pragma: private, include <namedax/namedax.hpp>
#pragma once

#include <namedax/detail/all_gather.hpp>
#include <namedax/detail/compilation.hpp>
#include <namedax/detail/reduction.hpp>

namespace namedax::detail {

/// psum_scatter's options in the user's words, as its call's signature shows them.
NAMEDAX_DECL std::string_view scatter_options(int scatter_dimension, bool tiled);

template <class T>
xt::xarray<T> psum_scatter_rule(std::string_view verb, strided_block<T> in, std::size_t positional_rank,
                                std::span<const named_axis> axes, const std::optional<groups_t>& groups,
                                int scatter_dimension, bool tiled) {
  collective_frame<T> frame(verb, std::move(in), positional_rank, axes, groups, true,
                            scatter_options(scatter_dimension, tiled));
  const std::size_t g = frame.groups().members.front().size();
  dims_t positional(frame.in_shape().begin(), frame.in_shape().begin() + static_cast<std::ptrdiff_t>(positional_rank));
  const std::size_t d = positional_axis(verb, "scatter_dimension", scatter_dimension, positional_rank, axes);
  const std::size_t chunk =
      chunk_length(verb, "scatter_dimension", scatter_dimension, positional[d], g, tiled, axes, groups.has_value());
  if (tiled) positional[d] = chunk;
  else positional.erase(positional.begin() + static_cast<std::ptrdiff_t>(d));
  auto out = uninitialized_array<T>(frame.output_shape(positional, true));
  const auto out_strides = row_major_strides(out.shape());

  xt::svector<const T*, 16> members;
  frame.for_each_owned(true, [&](std::size_t rank) {
    const std::size_t p = frame.groups().position_of[rank];
    const auto& group = frame.groups().members[frame.groups().group_of[rank]];
    auto piece = [&](std::size_t m) { return tiled ? chunk_of(frame.member(m), d, p, chunk) : drop_dim(frame.member(m), d, p); };
    members.clear();
    for (std::size_t m : group) members.push_back(piece(m).data);
    fold_group<T>(std::span<const T* const>(members.data(), members.size()), piece(group.front()), frame.any_varies(), true,
                  frame.at_rank(out.data(), rank, out_strides, positional.size()), out_strides, sum_op{});
  });
  frame.release();
  return out;
}

#if NAMEDAX_DEFINITIONS  // the bodies of the functions declared above (see detail/compilation.hpp)
NAMEDAX_DECL std::string_view scatter_options(int scatter_dimension, bool tiled) {
  return option_text(" at scatter_dimension ", scatter_dimension, tiled ? ", tiled" : "");
}
#endif  // NAMEDAX_DEFINITIONS

#ifdef NAMEDAX_SEPARATE_COMPILATION  // defined once, by <namedax/separate_compilation.hpp>
#define NAMEDAX_INSTANTIATE(T)                                                                                           \
  NAMEDAX_EXTERN template xt::xarray<T> psum_scatter_rule<T>(std::string_view, strided_block<T>, std::size_t,            \
                                                            std::span<const named_axis>, const std::optional<groups_t>&, \
                                                            int, bool);
NAMEDAX_FOR_EACH_ELEMENT_TYPE(NAMEDAX_INSTANTIATE)
#undef NAMEDAX_INSTANTIATE
#endif

}  // namespace namedax::detail
