// SPDX-License-Identifier: MIT
// psum, pmean, pmax and pmin: the batching rule (a positional fold over the vectorized
// dimensions) and the device rule (an exchange of buffers among device threads) side by side,
// sharing one fold so that both modes combine values in the same order, bit for bit.
// IWYU pragma: private, include <namedax/namedax.hpp>
#pragma once

#include <namedax/detail/collective_frame.hpp>
#include <namedax/error.hpp>

#include <xtensor/xarray.hpp>

#include <cmath>
#include <numeric>
#include <optional>
#include <span>

namespace namedax::detail {

/// Reduces the positional dimensions `dims` of a strided block, in row-major order of them.
template <class T, class Op>
xt::xarray<T> reduce_positional(const strided_block<T>& a, std::span<const std::size_t> dims, Op op) {
  std::vector<std::size_t> kept, reduced;
  std::vector<std::ptrdiff_t> kept_strides, reduced_strides;
  for (std::size_t k = 0; k < a.shape.size(); ++k) {
    bool r = std::find(dims.begin(), dims.end(), k) != dims.end();
    (r ? reduced : kept).push_back(a.shape[k]);
    (r ? reduced_strides : kept_strides).push_back(a.strides[k]);
  }
  std::vector<const T*> members;
  for_each_line(reduced, reduced_strides, reduced_strides,
                [&](std::ptrdiff_t i, std::ptrdiff_t, std::size_t n, std::ptrdiff_t is, std::ptrdiff_t) {
                  for (std::size_t k = 0; k < n; ++k) members.push_back(a.data + i + static_cast<std::ptrdiff_t>(k) * is);
                });
  xt::xarray<T> out = xt::xarray<T>::from_shape(kept);
  if (members.empty()) {  // a reduction over an empty dimension gives the identity (-inf for a max), as XLA's do
    std::fill(out.begin(), out.end(), Op::template identity<T>());
    return out;
  }
  fold_members<T>(members, kept, kept_strides, out.data(), row_major_strides(kept), op);
  return out;
}

/// Folds a group's members (pointers to blocks shaped like `element`) into `target`. When the
/// operand does not vary along the axes every member is the same value: a sum is then
/// size * x, as JAX defines it, and max or min is x.
template <class T, class Op>
void fold_group(std::span<const T* const> members, const strided_block<T>& element, bool varies, bool is_sum,
                T* target, std::span<const std::ptrdiff_t> out_strides, Op op) {
  if (varies) return fold_members<T>(members, element.shape, element.strides, target, out_strides, op);
  fold_members<T>(members.first(1), element.shape, element.strides, target, out_strides, op);
  if (!is_sum || members.size() == 1) return;
  const auto size = static_cast<T>(members.size());
  for_each_line(element.shape, out_strides, out_strides,
                [&](std::ptrdiff_t, std::ptrdiff_t o, std::size_t n, std::ptrdiff_t, std::ptrdiff_t os) {
                  for (std::size_t k = 0; k < n; ++k) {
                    T& v = target[o + static_cast<std::ptrdiff_t>(k) * os];
                    v = wrapping_multiply(v, size);
                  }
                });
}

/// The reduction over named axes of the payload `in` (positional axes already reduced).
/// Members are combined in row-major order over the axes as given, or in each group's order.
/// Returns the result and, with `count_members` (for pmean), how many members each output
/// slice combined (else an empty array).
template <class T, class Op>
std::pair<xt::xarray<T>, xt::xarray<float>> reduce_named(std::string_view verb, strided_block<T> in,
                                                         std::size_t positional_rank,
                                                         std::span<const named_axis> axes,
                                                         const std::optional<groups_t>& groups, bool is_sum,
                                                         bool count_members, Op op) {
  collective_frame<T> frame(verb, std::move(in), positional_rank, axes, groups, false, "");
  const dims_t positional(frame.in_shape().begin(), frame.in_shape().begin() + static_cast<std::ptrdiff_t>(positional_rank));
  // With groups the results differ per group, so the reduced vectorized dims stay whole.
  const bool varies = groups.has_value();
  auto out = uninitialized_array<T>(frame.output_shape(positional, varies));
  // The divisor depends on the caller's group only: size 1 along every other dimension.
  auto divisor = count_members ? uninitialized_array<float>(with_axis_dims(
                                      dims_t(frame.in_shape().size(), 1), positional_rank, axes,
                                      [varies](const named_axis& a) { return varies ? a.size : std::size_t{1}; }))
                                : empty_array<float>();
  const auto out_strides = row_major_strides(out.shape());
  const auto divisor_strides = row_major_strides(divisor.shape());
  xt::svector<const T*, 16> members;
  if (frame.total() == 0) {  // an axis of size 0: no member, the identity (and pmean's 0 / 0)
    std::fill(out.begin(), out.end(), Op::template identity<T>());
    std::fill(divisor.begin(), divisor.end(), 0.f);
  }
  frame.for_each_owned(varies, [&](std::size_t rank) {
    T* target = frame.at_rank(out.data(), rank, out_strides, positional_rank);
    const auto& group = frame.groups().members[frame.groups().group_of[rank]];
    if (count_members)
      divisor.data()[frame.vectorized_offset(rank, divisor_strides, positional_rank)] = static_cast<float>(group.size());
    members.clear();
    for (std::size_t m : group) members.push_back(frame.member(m).data);
    fold_group<T>(std::span<const T* const>(members.data(), members.size()), frame.member(group.front()),
                  frame.any_varies(), is_sum, target, out_strides, op);
  });
  frame.release();
  return {std::move(out), std::move(divisor)};
}

#ifdef NAMEDAX_SEPARATE_COMPILATION  // defined once, by <namedax/separate_compilation.hpp>
#define NAMEDAX_INSTANTIATE(T, Op)                                                                                        \
  NAMEDAX_EXTERN template std::pair<xt::xarray<T>, xt::xarray<float>> reduce_named<T, Op>(                                \
      std::string_view, strided_block<T>, std::size_t, std::span<const named_axis>, const std::optional<groups_t>&, bool, \
      bool, Op);                                                                                                          \
  NAMEDAX_EXTERN template xt::xarray<T> reduce_positional<T, Op>(const strided_block<T>&, std::span<const std::size_t>, Op);
NAMEDAX_FOR_EACH_ELEMENT_FOLD(NAMEDAX_INSTANTIATE)
#undef NAMEDAX_INSTANTIATE
#endif

}  // namespace namedax::detail
