// SPDX-License-Identifier: MIT
// psum, pmean, pmax and pmin: the batching rule (a positional fold over the vectorized
// dimensions) and the device rule (an exchange of buffers among device threads) side by side,
// sharing one fold so that both modes combine values in the same order, bit for bit.
#pragma once

#include <namedax/detail/kernels.hpp>
#include <namedax/detail/rendezvous.hpp>
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
  if (members.empty()) {  // a reduction over an empty dimension gives the identity; only sums allow it
    std::fill(out.begin(), out.end(), T{});
    return out;
  }
  fold_members<T>(members, kept, kept_strides, out.data(), row_major_strides(kept), op);
  return out;
}

/// One named axis of a reduction, as the rule needs it.
struct reduced_axis {
  std::string_view name;
  placement place;
  std::size_t size;
  bool varies;       // does the operand vary along it (else every index holds the same value)
  std::size_t dim;   // its payload dimension (vectorized axes)
  std::size_t index; // this device's index (device axes)
};

using groups_t = std::vector<std::vector<int>>;

/// The element type in the user's words, for messages.
template <class T>
constexpr std::string_view dtype_name() {
  if constexpr (std::is_same_v<T, bool>) return "bool";
  else if constexpr (std::is_floating_point_v<T>) return sizeof(T) == 4 ? "float32" : sizeof(T) == 8 ? "float64" : "float";
  else if constexpr (std::is_signed_v<T>) return sizeof(T) == 4 ? "int32" : sizeof(T) == 8 ? "int64" : "int";
  else return sizeof(T) == 4 ? "uint32" : sizeof(T) == 8 ? "uint64" : "uint";
}

inline std::string describe_axes(std::span<const reduced_axis> axes) {
  std::vector<std::string> names;
  for (const auto& a : axes) names.push_back(message('\'', a.name, '\''));
  return message(names);
}

/// Checks that `groups` partition 0..total-1; returns, for each index, its group.
inline std::vector<std::size_t> group_of_each(std::string_view verb, std::span<const reduced_axis> axes,
                                              const groups_t& groups, std::size_t total) {
  std::vector<std::size_t> owner(total, groups.size());
  for (std::size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].empty()) fail("namedax::", verb, ": axis_index_groups over axis ", describe_axes(axes), " has an empty group");
    for (int i : groups[g]) {
      if (i < 0 || static_cast<std::size_t>(i) >= total)
        fail("namedax::", verb, ": axis_index_groups over axis ", describe_axes(axes), " of size ", total,
             " contains index ", i, ", which is out of range; use indices 0..", total - 1);
      if (owner[static_cast<std::size_t>(i)] != groups.size())
        fail("namedax::", verb, ": axis_index_groups over axis ", describe_axes(axes), " of size ", total,
             " contains index ", i, " twice; every index must be in exactly one group");
      owner[static_cast<std::size_t>(i)] = g;
    }
  }
  for (std::size_t i = 0; i < total; ++i)
    if (owner[i] == groups.size())
      fail("namedax::", verb, ": axis_index_groups over axis ", describe_axes(axes), " of size ", total,
           " do not contain index ", i, "; every index must be in exactly one group");
  return owner;
}

/// The reduction over named axes of the payload `in` (positional axes already reduced).
/// Vectorized axes are folded in place; device axes exchange pointers to each device's `a`.
/// The members are combined in row-major order over the axes as given (or in each group's
/// order), reading a member's slice of another device's buffer where the axis is a device axis.
/// Returns the result and, per output slice, how many members it combined (for pmean).
template <class T, class Op>
std::pair<xt::xarray<T>, xt::xarray<float>> reduce_named(std::string_view verb, strided_block<T> in,
                                                         std::span<const reduced_axis> axes,
                                                         const std::optional<groups_t>& groups, bool is_sum, Op op) {
  const std::vector<std::size_t> shape = in.shape;
  std::size_t total = 1;
  for (const auto& ax : axes) total *= ax.size;
  std::vector<std::size_t> group_index;
  if (groups) group_index = group_of_each(verb, axes, *groups, total);

  // Output: the reduced vectorized dims become 1, or stay whole with groups (results differ per group).
  std::vector<std::size_t> out_shape = shape, element_shape = shape, divisor_shape(shape.size(), 1);
  for (const auto& ax : axes)
    if (ax.place == placement::vectorized)
      out_shape[ax.dim] = groups ? ax.size : 1, element_shape[ax.dim] = 1, divisor_shape[ax.dim] = out_shape[ax.dim];
  xt::xarray<T> out = xt::xarray<T>::from_shape(out_shape);
  xt::xarray<float> divisor = xt::xarray<float>::from_shape(divisor_shape);
  const auto out_strides = row_major_strides(out_shape);
  const auto divisor_strides = row_major_strides(divisor_shape);

  // Device axes along which the operand varies need the other devices' buffers.
  std::vector<std::string_view> exchanged;
  std::vector<std::size_t> exchanged_sizes;
  for (const auto& ax : axes)
    if (ax.place == placement::devices && ax.varies) exchanged.push_back(ax.name), exchanged_sizes.push_back(ax.size);
  std::optional<pointer_exchange> exchange;
  xt::xarray<T> contiguous;
  if (!exchanged.empty() && in.strides != row_major_strides(shape)) {
    // Devices read each other's buffers with one set of strides: make this one row-major.
    contiguous = xt::xarray<T>::from_shape(shape);
    copy_strided(in, contiguous.data());
    in.data = contiguous.data();
    in.strides = row_major_strides(shape);
  }
  const auto& in_strides = in.strides;
  if (!exchanged.empty()) {
    std::string groups_text = groups ? message(" groups ", *groups) : std::string();
    std::string signature = message(verb, " over ", describe_axes(axes), groups_text, " of payload shape ", shape,
                                    " and type ", dtype_name<T>());
    exchange.emplace(join(exchanged), in.data, signature, message("namedax::", verb, " over ", describe_axes(axes)));
  }

  auto coordinates = [&](std::size_t rank) {
    std::vector<std::size_t> c(axes.size());
    for (std::size_t k = axes.size(); k-- > 0;) c[k] = rank % axes[k].size, rank /= axes[k].size;
    return c;
  };
  auto rank_of = [&](const std::vector<std::size_t>& c) {
    std::size_t r = 0;
    for (std::size_t k = 0; k < axes.size(); ++k) r = r * axes[k].size + c[k];
    return r;
  };
  auto member_pointer = [&](std::size_t rank) {
    auto c = coordinates(rank);
    std::size_t device = 0;
    std::ptrdiff_t offset = 0;
    for (std::size_t k = 0; k < axes.size(); ++k) {
      if (!axes[k].varies) continue;
      if (axes[k].place == placement::devices) device = device * axes[k].size + c[k];
      else offset += static_cast<std::ptrdiff_t>(c[k]) * in_strides[axes[k].dim];
    }
    const T* base = exchange ? static_cast<const T*>(exchange->slot(device)) : in.data;
    return base + offset;
  };

  bool any_varies = false;
  for (const auto& ax : axes) any_varies |= ax.varies;

  // One output slice per combination of the vectorized axes' coordinates (just one without groups).
  std::vector<std::size_t> own(axes.size(), 0), slice_sizes;
  for (std::size_t k = 0; k < axes.size(); ++k) {
    own[k] = axes[k].place == placement::devices ? axes[k].index : 0;
    slice_sizes.push_back(axes[k].place == placement::vectorized && groups ? axes[k].size : 1);
  }
  std::size_t slices = std::accumulate(slice_sizes.begin(), slice_sizes.end(), std::size_t{1}, std::multiplies<>{});
  std::vector<const T*> members;
  for (std::size_t s = 0; s < slices; ++s) {
    auto c = own;
    std::ptrdiff_t out_offset = 0, divisor_offset = 0;
    for (std::size_t k = axes.size(), rest = s; k-- > 0;) {
      if (slice_sizes[k] == 1) continue;
      c[k] = rest % slice_sizes[k], rest /= slice_sizes[k];
      out_offset += static_cast<std::ptrdiff_t>(c[k]) * out_strides[axes[k].dim];
      divisor_offset += static_cast<std::ptrdiff_t>(c[k]) * divisor_strides[axes[k].dim];
    }
    members.clear();
    if (groups) {
      for (int r : (*groups)[group_index[rank_of(c)]]) members.push_back(member_pointer(static_cast<std::size_t>(r)));
    } else {
      for (std::size_t r = 0; r < total; ++r) members.push_back(member_pointer(r));
    }
    divisor.data()[divisor_offset] = static_cast<float>(members.size());
    if (!any_varies) {
      // A value that does not vary along the axes: psum gives size * x, pmax and pmin give x.
      const T factor = is_sum ? static_cast<T>(members.size()) : T{1};
      fold_members<T>(std::span<const T* const>(members.data(), 1), element_shape, in_strides, out.data() + out_offset,
                      out_strides, op);
      if (is_sum && factor != T{1})
        for_each_line(element_shape, out_strides, out_strides,
                      [&](std::ptrdiff_t, std::ptrdiff_t o, std::size_t n, std::ptrdiff_t, std::ptrdiff_t os) {
                        T* b = out.data() + out_offset + o;
                        for (std::size_t k = 0; k < n; ++k) b[k * os] = static_cast<T>(b[k * os] * factor);
                      });
    } else {
      fold_members<T>(members, element_shape, in_strides, out.data() + out_offset, out_strides, op);
    }
  }
  if (exchange) exchange->release();
  return {std::move(out), std::move(divisor)};
}

}  // namespace namedax::detail
