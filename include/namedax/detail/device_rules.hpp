// SPDX-License-Identifier: MIT
// The large-message path among device threads: when every axis of a reduction is placed on
// device threads and the operand varies along all of them, a large payload is reduced by
// reduce-scatter then all-gather in one exchange, so that each device reads 1/N of every
// member instead of every member whole. Returns nothing when its case does not apply; the
// rule (reduction.hpp) then runs, one-shot.
#pragma once

#include <namedax/detail/collective_frame.hpp>

#include <algorithm>
#include <optional>

namespace namedax::detail {

/// Below this payload size the one-shot rule is faster: each device reads every member,
/// with no second pass over the others' outputs.
inline constexpr std::size_t chunked_reduction_bytes = std::size_t{256} << 10;

/// psum, pmean, pmax, pmin. Device r folds chunk r of the members, in rank order (the rule's
/// order, so the bits are the same), and writes it into every member's output; after the
/// second barrier every output is whole. Returns the result and pmean's divisor.
template <class T, class Op>
std::optional<std::pair<xt::xarray<T>, xt::xarray<float>>> reduce_among_threads(
    std::string_view verb, const strided_block<T>& in, std::span<const named_axis> axes,
    const std::optional<groups_t>& groups, Op op) {
  const std::size_t count = element_count(in.shape);
  if (groups || axes.empty() || count * sizeof(T) < chunked_reduction_bytes ||
      in.strides != row_major_strides(in.shape))
    return std::nullopt;
  std::vector<std::string_view> names;
  for (const auto& ax : axes) {
    if (ax.place != placement::devices || !ax.varies || !find_frame(ax.name)->shared) return std::nullopt;
    names.push_back(ax.name);
  }
  auto out = uninitialized_array<T>(in.shape);
  struct buffers {
    const T* in;
    T* out;
  } mine{in.data, out.data()};
  pointer_exchange exchange(join(names), &mine, call_of<T>(verb, axes, "", std::nullopt, in.shape));
  const std::size_t n = exchange.size(), r = exchange.rank();
  auto member = [&](std::size_t m) { return static_cast<const buffers*>(exchange.slot(m)); };
  // Chunk r, folded by the rule's own loop in pieces that stay in cache while they are then
  // copied into the other members' outputs.
  constexpr std::size_t piece = std::size_t{1} << 16;
  const std::ptrdiff_t unit[] = {1};
  std::vector<const T*> sources(n);
  for (std::size_t lo = r * count / n, end = (r + 1) * count / n; lo < end; lo += piece) {
    const std::size_t length[] = {std::min(piece, end - lo)};
    for (std::size_t m = 0; m < n; ++m) sources[m] = member(m)->in + lo;
    fold_members<T>(sources, length, unit, out.data() + lo, unit, op);
    for (std::size_t m = 0; m < n; ++m)
      if (m != r) std::copy_n(out.data() + lo, length[0], member(m)->out + lo);
  }
  exchange.release();
  xt::xarray<float> divisor = xt::xarray<float>::from_shape(std::vector<std::size_t>(in.shape.size(), 1));
  divisor.fill(static_cast<float>(n));
  return std::pair{std::move(out), std::move(divisor)};
}

}  // namespace namedax::detail
