// SPDX-License-Identifier: MIT
// pbroadcast's rule, both modes: every rank gets the member at rank `source`, copied, never
// computed, so that NaN, infinities and every element type (bool too) arrive as they left.
// IWYU pragma: private
#pragma once

#include <namedax/detail/collective_frame.hpp>
#include <namedax/detail/compilation.hpp>

namespace namedax::detail {

/// pbroadcast's parameter in the user's words, as its call's signature shows it: devices
/// that name different sources meet a mismatch, not a broadcast from two places.
NAMEDAX_DECL std::string_view source_options(int source);

/// The source must be an index of the axes (row-major over several names).
NAMEDAX_DECL void check_source(std::string_view verb, std::span<const named_axis> axes, int source);

/// Member `source`, once: the output is the same for every rank, so its dims along the
/// vectorized axes have size 1. Along a device axis each device lends its payload and copies
/// the source's; along an axis the operand does not vary along, the member is its own payload.
template <class T>
xt::xarray<T> pbroadcast_rule(std::string_view verb, strided_block<T> in, std::size_t positional_rank,
                              std::span<const named_axis> axes, int source) {
  check_source(verb, axes, source);
  collective_frame<T> frame(verb, std::move(in), positional_rank, axes, std::nullopt, false, source_options(source));
  dims_t positional(frame.in_shape().begin(), frame.in_shape().begin() + static_cast<std::ptrdiff_t>(positional_rank));
  auto out = uninitialized_array<T>(frame.output_shape(std::move(positional), false));
  copy_strided(frame.member(static_cast<std::size_t>(source)), out.data(), row_major_strides(out.shape()));
  frame.release();
  return out;
}

#if NAMEDAX_DEFINITIONS  // the bodies of the functions declared above (see detail/compilation.hpp)
NAMEDAX_DECL std::string_view source_options(int source) { return option_text(" from source ", source); }

NAMEDAX_DECL void check_source(std::string_view verb, std::span<const named_axis> axes, int source) {
  const std::size_t total = member_count(axes);
  if (source < 0 || static_cast<std::size_t>(source) >= total)
    fail("namedax::", verb, ": source ", source, " is out of range for axis ", describe_axes(axes), " of size ", total,
         "; ", valid_indices(total));
}
#endif  // NAMEDAX_DEFINITIONS

}  // namespace namedax::detail
