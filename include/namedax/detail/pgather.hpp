// SPDX-License-Identifier: MIT
// pgather's rule, both modes: each index value picks one element along the gathered axes
// (row-major over names and positional axes in the order written), from whichever member holds it.
// IWYU pragma: private, include <namedax/namedax.hpp>
#pragma once

#include <namedax/detail/all_gather.hpp>

#include <limits>

namespace namedax::detail {

/// What an out-of-range index reads, as lax.gather fills: NaN, the lowest signed integer, the
/// largest unsigned one, true.
template <class T>
constexpr T gather_fill() {
  if constexpr (std::is_same_v<T, bool>) return true;
  else if constexpr (std::is_floating_point_v<T>) return std::numeric_limits<T>::quiet_NaN();
  else if constexpr (std::is_unsigned_v<T>) return std::numeric_limits<T>::max();
  else return std::numeric_limits<T>::lowest();
}

/// One factor of a gathered index, which is row-major over the gathered axes in the order
/// written: its size, and the step it makes in the member's rank (a name) or in memory (a dim).
struct gather_factor {
  std::size_t size;
  bool named;
  std::ptrdiff_t step;
};

/// `src` (positional rank `src_rank`, then the environment's vectorized dims) gathered along
/// the named `axes` and the positional dims `dims` by the integer block `idx` (positional rank
/// `idx_rank`, then the same vectorized dims, each of size n or 1). `names_before[p]`: how
/// many of `axes` come before `dims[p]` as written. `idx_varies` says whether idx varies along
/// the named vectorized axes (then so does the output).
template <class T, class I>
xt::xarray<T> pgather_rule(std::string_view verb, strided_block<T> src, std::size_t src_rank,
                           std::span<const named_axis> axes, std::span<const std::size_t> dims,
                           std::span<const std::size_t> names_before, const strided_block<I>& idx, std::size_t idx_rank,
                           bool idx_varies) {
  collective_frame<T> frame(verb, std::move(src), src_rank, axes, std::nullopt, false, message(" along dims ", dims));
  const auto& in_shape = frame.in_shape();
  const std::size_t vec = in_shape.size() - src_rank;
  std::vector<bool> gathered(src_rank, false);
  std::size_t positional_size = 1;
  for (auto d : dims) gathered[d] = true, positional_size *= in_shape[d];
  const std::size_t range = frame.total() * positional_size;

  // Output: idx's positional dims, src's other positional dims, then the vectorized dims.
  std::vector<std::size_t> shape(idx.shape.begin(), idx.shape.begin() + static_cast<std::ptrdiff_t>(idx_rank));
  for (std::size_t d = 0; d < src_rank; ++d)
    if (!gathered[d]) shape.push_back(in_shape[d]);
  const std::size_t out_rank = shape.size();
  std::vector<bool> named_dim(vec, false);
  for (const auto& ax : axes)
    if (ax.place == placement::vectorized) named_dim[ax.slot] = true;
  for (std::size_t v = 0; v < vec; ++v)
    shape.push_back(named_dim[v] ? (idx_varies ? idx.shape[idx_rank + v] : 1)
                                 : broadcast_extent(in_shape[src_rank + v], idx.shape[idx_rank + v]));
  auto out = xt::xarray<T>::from_shape(shape);
  const auto out_strides = row_major_strides(shape);
  if (frame.total() == 0) {  // a named axis of size 0: every index is out of range
    std::fill(out.begin(), out.end(), gather_fill<T>());
    frame.release();
    return out;
  }

  // Strides of idx and of a member along the output's dims (0 where one does not have the dim).
  const auto member0 = frame.member(0);
  std::vector<std::ptrdiff_t> idx_strides, src_strides;
  for (std::size_t d = 0; d < idx_rank; ++d) idx_strides.push_back(idx.strides[d]), src_strides.push_back(0);
  for (std::size_t d = 0; d < src_rank; ++d)
    if (!gathered[d]) idx_strides.push_back(0), src_strides.push_back(member0.strides[d]);
  for (std::size_t v = 0; v < vec; ++v) {
    idx_strides.push_back(named_dim[v] || idx.shape[idx_rank + v] == 1 ? 0 : idx.strides[idx_rank + v]);
    src_strides.push_back(named_dim[v] || in_shape[src_rank + v] == 1 ? 0 : member0.strides[src_rank + v]);
  }
  std::vector<gather_factor> factors;
  std::size_t names_taken = 0;
  auto take_names = [&](std::size_t until) {
    for (; names_taken < until; ++names_taken) {
      std::size_t rank_step = 1;
      for (std::size_t k = names_taken + 1; k < axes.size(); ++k) rank_step *= axes[k].size;
      factors.push_back({axes[names_taken].size, true, static_cast<std::ptrdiff_t>(rank_step)});
    }
  };
  for (std::size_t p = 0; p < dims.size(); ++p) {
    take_names(names_before[p]);
    factors.push_back({in_shape[dims[p]], false, member0.strides[dims[p]]});
  }
  take_names(axes.size());

  std::vector<const T*> members;
  for (std::size_t m = 0; m < frame.total(); ++m) members.push_back(frame.member(m).data);
  std::vector<std::size_t> slab(shape);  // the part of the output one owned rank fills
  for (const auto& ax : axes)
    if (ax.place == placement::vectorized) slab[out_rank + ax.slot] = 1;
  std::vector<std::ptrdiff_t> idx_offset(out.size()), src_offset(out.size());
  element_offsets(slab, idx_strides, out_strides, idx_offset);
  element_offsets(slab, src_strides, out_strides, src_offset);

  frame.for_each_owned(idx_varies, [&](std::size_t rank) {
    T* target = frame.at_rank(out.data(), rank, out_strides, out_rank);
    const I* index = frame.at_rank(idx.data, rank, idx.strides, idx_rank);
    auto gather_one = [&](std::size_t e) {
      const auto f = static_cast<long long>(index[idx_offset[e]]);
      if (f < 0 || static_cast<std::size_t>(f) >= range) return gather_fill<T>();
      auto rest = static_cast<std::size_t>(f);
      std::size_t member = 0;
      std::ptrdiff_t within = 0;
      for (std::size_t g = factors.size(); g-- > 0;) {
        const auto q = static_cast<std::ptrdiff_t>(rest % factors[g].size);
        rest /= factors[g].size;
        if (factors[g].named) member += static_cast<std::size_t>(q * factors[g].step);
        else within += q * factors[g].step;
      }
      return members[member][src_offset[e] + within];
    };
    for_each_line(slab, out_strides, out_strides,
                  [&](std::ptrdiff_t, std::ptrdiff_t o, std::size_t n, std::ptrdiff_t, std::ptrdiff_t os) {
                    for (std::size_t k = 0; k < n; ++k) {
                      const auto e = static_cast<std::size_t>(o + static_cast<std::ptrdiff_t>(k) * os);
                      target[e] = gather_one(e);
                    }
                  });
  });
  frame.release();
  return out;
}

#ifdef NAMEDAX_SEPARATE_COMPILATION  // defined once, by <namedax/separate_compilation.hpp>
#define NAMEDAX_INSTANTIATE_WITH(T, I)                                                                               \
  NAMEDAX_EXTERN template xt::xarray<T> pgather_rule<T, I>(std::string_view, strided_block<T>, std::size_t,          \
                                                          std::span<const named_axis>, std::span<const std::size_t>, \
                                                          std::span<const std::size_t>, const strided_block<I>&,     \
                                                          std::size_t, bool);
#define NAMEDAX_INSTANTIATE(T) NAMEDAX_INSTANTIATE_WITH(T, std::int32_t) NAMEDAX_INSTANTIATE_WITH(T, std::int64_t)
NAMEDAX_FOR_EACH_ELEMENT_TYPE(NAMEDAX_INSTANTIATE)
#undef NAMEDAX_INSTANTIATE
#undef NAMEDAX_INSTANTIATE_WITH
#endif

}  // namespace namedax::detail
