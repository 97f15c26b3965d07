// SPDX-License-Identifier: MIT
// Loops every rule shares: strided line iteration, the fixed-order fold of several members,
// and strided copies, on raw pointers so that no xtensor stepper sits on a hot path.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

namespace namedax::detail {

struct sum_op {
  template <class T>
  T operator()(T a, T b) const { return static_cast<T>(a + b); }
};
// max and min propagate NaN, as XLA's do.
struct max_op {
  template <class T>
  T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>)
      if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
    return a < b ? b : a;
  }
};
struct min_op {
  template <class T>
  T operator()(T a, T b) const {
    if constexpr (std::is_floating_point_v<T>)
      if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
    return b < a ? b : a;
  }
};

/// Calls `line(in, out, length, in_step, out_step)` for each innermost line of `shape`.
/// Dimensions of size 1 are dropped first, so that a trailing one never makes lines of length 1.
template <class Line>
void for_each_line(std::span<const std::size_t> full_shape, std::span<const std::ptrdiff_t> full_in,
                   std::span<const std::ptrdiff_t> full_out, Line&& line) {
  std::vector<std::size_t> shape;
  std::vector<std::ptrdiff_t> in_strides, out_strides;
  for (std::size_t k = 0; k < full_shape.size(); ++k) {
    if (full_shape[k] == 0) return;
    if (full_shape[k] == 1) continue;
    shape.push_back(full_shape[k]), in_strides.push_back(full_in[k]), out_strides.push_back(full_out[k]);
  }
  const std::size_t rank = shape.size();
  if (rank == 0) return line(std::ptrdiff_t{0}, std::ptrdiff_t{0}, std::size_t{1}, std::ptrdiff_t{0}, std::ptrdiff_t{0});
  std::vector<std::size_t> index(rank, 0);
  std::ptrdiff_t in = 0, out = 0;
  while (true) {
    line(in, out, shape[rank - 1], in_strides[rank - 1], out_strides[rank - 1]);
    std::size_t k = rank - 1;
    while (true) {
      if (k == 0) return;
      --k;
      if (++index[k] < shape[k]) {
        in += in_strides[k], out += out_strides[k];
        break;
      }
      in -= in_strides[k] * static_cast<std::ptrdiff_t>(shape[k] - 1);
      out -= out_strides[k] * static_cast<std::ptrdiff_t>(shape[k] - 1);
      index[k] = 0;
    }
  }
}

/// out[e] = op(...op(m0[e], m1[e])..., mk[e]): the members combined in the order given, for
/// every element e of `shape`. The order is fixed, so every mode and chunking gives the same bits.
template <class T, class Op>
void fold_members(std::span<const T* const> members, std::span<const std::size_t> shape,
                  std::span<const std::ptrdiff_t> in_strides, T* out, std::span<const std::ptrdiff_t> out_strides,
                  Op op) {
  for (std::size_t m = 0; m < members.size(); ++m) {
    const T* src = members[m];
    for_each_line(shape, in_strides, out_strides,
                  [&](std::ptrdiff_t i, std::ptrdiff_t o, std::size_t n, std::ptrdiff_t is, std::ptrdiff_t os) {
                    const T* a = src + i;
                    T* b = out + o;
                    if (m == 0 && is == 1 && os == 1)
                      std::copy(a, a + n, b);
                    else if (m == 0)
                      for (std::size_t k = 0; k < n; ++k) b[k * os] = a[k * is];
                    else if (is == 1 && os == 1)  // the common case, kept simple so that it vectorizes
                      for (std::size_t k = 0; k < n; ++k) b[k] = op(b[k], a[k]);
                    else
                      for (std::size_t k = 0; k < n; ++k) b[k * os] = op(b[k * os], a[k * is]);
                  });
  }
}

/// Row-major strides, 0 for dimensions of size 1 so that they broadcast when read.
inline std::vector<std::ptrdiff_t> row_major_strides(std::span<const std::size_t> shape) {
  std::vector<std::ptrdiff_t> strides(shape.size());
  std::ptrdiff_t s = 1;
  for (std::size_t k = shape.size(); k-- > 0;) strides[k] = shape[k] == 1 ? 0 : s, s *= static_cast<std::ptrdiff_t>(shape[k]);
  return strides;
}

/// For each element of `shape` (addressed by `out_strides` from 0), its offset with `strides`:
/// a table that lets one loop walk two layouts at once.
inline void element_offsets(std::span<const std::size_t> shape, std::span<const std::ptrdiff_t> strides,
                            std::span<const std::ptrdiff_t> out_strides, std::vector<std::ptrdiff_t>& into) {
  for_each_line(shape, strides, out_strides,
                [&](std::ptrdiff_t i, std::ptrdiff_t o, std::size_t n, std::ptrdiff_t is, std::ptrdiff_t os) {
                  for (std::size_t k = 0; k < n; ++k)
                    into[static_cast<std::size_t>(o + static_cast<std::ptrdiff_t>(k) * os)] = i + static_cast<std::ptrdiff_t>(k) * is;
                });
}

/// A strided block of memory: what a container or a strided view of one exposes.
template <class T>
struct strided_block {
  const T* data;
  std::vector<std::size_t> shape;
  std::vector<std::ptrdiff_t> strides;  // 0 for dimensions of size 1
};

/// Expressions whose elements sit in memory at data() + data_offset() with strides().
template <class E>
concept StridedMemory = requires(const E& e) {
  e.data();
  e.data_offset();
  e.strides();
};

template <StridedMemory E>
auto block_of(const E& e) {
  using T = std::remove_cvref_t<decltype(*e.data())>;
  strided_block<T> b{e.data() + e.data_offset(), {e.shape().begin(), e.shape().end()}, {}};
  for (std::size_t k = 0; k < b.shape.size(); ++k) b.strides.push_back(b.shape[k] == 1 ? 0 : e.strides()[k]);
  return b;
}

/// Copies (converting to `T`) a strided block to `out`, laid out with `out_strides`.
template <class T, class S>
void copy_strided(const strided_block<S>& in, T* out, std::span<const std::ptrdiff_t> out_strides) {
  for_each_line(in.shape, in.strides, out_strides,
                [&](std::ptrdiff_t i, std::ptrdiff_t o, std::size_t n, std::ptrdiff_t is, std::ptrdiff_t os) {
                  const S* a = in.data + i;
                  T* b = out + o;
                  if (is == 1 && os == 1)
                    for (std::size_t k = 0; k < n; ++k) b[k] = static_cast<T>(a[k]);
                  else
                    for (std::size_t k = 0; k < n; ++k) b[k * os] = static_cast<T>(a[k * is]);
                });
}

/// Copies (converting to `T`) a strided block into row-major memory at `out`.
template <class T, class S>
void copy_strided(const strided_block<S>& in, T* out) {
  copy_strided(in, out, row_major_strides(in.shape));
}

}  // namespace namedax::detail
