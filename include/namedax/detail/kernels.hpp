// SPDX-License-Identifier: MIT
// Loops every rule shares: strided line iteration, the fixed-order fold of several members,
// strided copies, and the allocation of outputs, on raw pointers so that no xtensor stepper
// sits on a hot path.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

#include <namedax/detail/buffers.hpp>

#include <xtensor/xarray.hpp>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace namedax::detail {

/// A row-major array of `shape` whose elements are not initialized yet. A large one asks the
/// kernel for transparent huge pages: a fresh 64 MiB output is 16384 first-touch faults of
/// 4 KiB (about 0.2 s on virtual machines), against 32 of 2 MiB.
template <class T, class Shape>
xt::xarray<T> uninitialized_array(const Shape& shape) {
  xt::xarray<T> a;
  if (reuse_array(shape, a)) return a;  // pages already touched: no faults at all
  a = xt::xarray<T>::from_shape(shape);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr std::uintptr_t page = 4096, huge = std::uintptr_t{2} << 20;
  const auto begin = reinterpret_cast<std::uintptr_t>(a.data());
  const std::uintptr_t end = begin + a.size() * sizeof(T);
  const std::uintptr_t first = (begin + page - 1) & ~(page - 1);
  if (end > first + 2 * huge) madvise(reinterpret_cast<void*>(first), (end - first) & ~(page - 1), MADV_HUGEPAGE);
#endif
  return a;
}

struct sum_op {
  template <class T>
  T operator()(T a, T b) const { return static_cast<T>(a + b); }
};
// max and min propagate NaN, as XLA's do: a NaN already folded in stays (comparisons with it
// are false), a new one replaces the result. Written as selects, without an early return, so
// that loops over them vectorize.
struct max_op {
  template <class T>
  T operator()(T a, T b) const {
    const T larger = a < b ? b : a;
    if constexpr (std::is_floating_point_v<T>) return b != b ? b : larger;
    else return larger;
  }
};
struct min_op {
  template <class T>
  T operator()(T a, T b) const {
    const T smaller = b < a ? b : a;
    if constexpr (std::is_floating_point_v<T>) return b != b ? b : smaller;
    else return smaller;
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

/// The walk over the elements of `shape` for a loop in which each element is independent, so
/// that any order will do: dimensions of size 1 dropped, the rest ordered by decreasing output
/// stride (the innermost line writes contiguously), and neighbours merged where every layout
/// is contiguous across them (so that lines are long). `strides[j][d]`: layout j along dim d,
/// the output first. Empty when `shape` has no element.
struct loop_nest {
  std::vector<std::size_t> shape;
  std::vector<std::vector<std::ptrdiff_t>> strides;
  bool empty = false;
};

inline loop_nest output_order(std::span<const std::size_t> shape, std::vector<std::span<const std::ptrdiff_t>> layouts) {
  loop_nest nest{{}, std::vector<std::vector<std::ptrdiff_t>>(layouts.size()), false};
  std::vector<std::size_t> dims;
  for (std::size_t k = 0; k < shape.size(); ++k) {
    if (shape[k] == 0) return {{}, {}, true};
    if (shape[k] > 1) dims.push_back(k);
  }
  auto magnitude = [](std::ptrdiff_t s) { return s < 0 ? -s : s; };
  const auto& out = layouts.front();
  std::stable_sort(dims.begin(), dims.end(), [&](std::size_t a, std::size_t b) {
    if (magnitude(out[a]) != magnitude(out[b])) return magnitude(out[a]) > magnitude(out[b]);
    return layouts.size() > 1 && magnitude(layouts[1][a]) > magnitude(layouts[1][b]);
  });
  for (std::size_t k : dims) {
    const auto size = static_cast<std::ptrdiff_t>(shape[k]);
    bool merges = !nest.shape.empty();
    for (std::size_t j = 0; merges && j < layouts.size(); ++j) merges = nest.strides[j].back() == layouts[j][k] * size;
    if (merges) nest.shape.back() *= shape[k];
    else nest.shape.push_back(shape[k]);
    for (std::size_t j = 0; j < layouts.size(); ++j) {
      if (merges) nest.strides[j].back() = layouts[j][k];
      else nest.strides[j].push_back(layouts[j][k]);
    }
  }
  return nest;
}

/// The distance between consecutive members when they are evenly spaced in one block (the
/// members of a vectorized axis), else nothing (device buffers, groups in another order).
template <class T>
std::optional<std::ptrdiff_t> even_spacing(std::span<const T* const> members) {
  if (members.size() < 2) return std::nullopt;
  // Integer addresses: members may sit in unrelated buffers, whose pointers do not subtract.
  auto address = [](const T* p) { return static_cast<std::ptrdiff_t>(reinterpret_cast<std::uintptr_t>(p)); };
  const std::ptrdiff_t bytes = address(members[1]) - address(members[0]);
  if (bytes == 0 || bytes % static_cast<std::ptrdiff_t>(sizeof(T)) != 0) return std::nullopt;
  for (std::size_t m = 2; m < members.size(); ++m)
    if (address(members[m]) - address(members[m - 1]) != bytes) return std::nullopt;
  return bytes / static_cast<std::ptrdiff_t>(sizeof(T));
}

/// out[e] = op(...op(m0[e], m1[e])..., mk[e]): the members combined in the order given, for
/// every element e of `shape`. The order is fixed, so every mode and chunking gives the same
/// bits; only the order in which elements are visited adapts to the layout.
template <class T, class Op>
void fold_members(std::span<const T* const> members, std::span<const std::size_t> shape,
                  std::span<const std::ptrdiff_t> in_strides, T* out, std::span<const std::ptrdiff_t> out_strides,
                  Op op) {
  if (members.empty()) return;
  const loop_nest nest = output_order(shape, {out_strides, in_strides});
  if (nest.empty) return;
  const auto &nest_out = nest.strides[0], &nest_in = nest.strides[1];
  const auto spacing = even_spacing(members);
  const T* first = members.front();
  // Members of one element closer together than consecutive elements (the named axis is the
  // innermost dimension): fold each element's contiguous group in a register, as a hand loop does.
  const auto gather_groups = [&](std::ptrdiff_t is) {
    return spacing && (is == 0 || (*spacing < 0 ? -*spacing : *spacing) < (is < 0 ? -is : is));
  };
  // Otherwise a member at a time over tiles of a line, so that the partial results stay in the
  // second-level cache while every member is added; long enough for the prefetcher to stream.
  constexpr std::size_t tile = std::size_t{1} << 16;
  for_each_line(nest.shape, nest_in, nest_out,
                [&](std::ptrdiff_t i, std::ptrdiff_t o, std::size_t n, std::ptrdiff_t is, std::ptrdiff_t os) {
                  if (gather_groups(is)) {
                    auto fold_groups = [&](auto step) {
                      for (std::size_t k = 0; k < n; ++k) {
                        const T* a = first + i + static_cast<std::ptrdiff_t>(k) * is;
                        T acc = a[0];
                        for (std::size_t m = 1; m < members.size(); ++m) acc = op(acc, a[static_cast<std::ptrdiff_t>(m) * step]);
                        out[o + static_cast<std::ptrdiff_t>(k) * os] = acc;
                      }
                    };
                    // Adjacent members, the usual case, with the step known to the compiler: with a
                    // runtime step g++ 12 compiles max_op's selects into a loop four times slower.
                    if (*spacing == 1) fold_groups(std::integral_constant<std::ptrdiff_t, 1>{});
                    else fold_groups(*spacing);
                    return;
                  }
                  for (std::size_t start = 0; start < n; start += tile) {
                    const std::size_t len = std::min(tile, n - start);
                    const auto skip = static_cast<std::ptrdiff_t>(start);
                    T* b = out + o + skip * os;
                    for (std::size_t m = 0; m < members.size(); ++m) {
                      const T* a = members[m] + i + skip * is;
                      if (m == 0 && is == 1 && os == 1)
                        std::copy(a, a + len, b);
                      else if (m == 0)
                        for (std::size_t k = 0; k < len; ++k) b[k * os] = a[k * is];
                      else if (is == 1 && os == 1)  // the common case, kept simple so that it vectorizes
                        for (std::size_t k = 0; k < len; ++k) b[k] = op(b[k], a[k]);
                      else
                        for (std::size_t k = 0; k < len; ++k) b[k * os] = op(b[k * os], a[k * is]);
                    }
                  }
                });
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

/// Copies (converting to `T`) a strided block to `out`, laid out with `out_strides`. Lines
/// follow the output; when the input is contiguous along another dimension (a transposition,
/// such as stacking slabs along a new leading axis) the two are walked in square tiles, so
/// that every cache line read or written is used whole.
template <class T, class S>
void copy_strided(const strided_block<S>& in, T* out, std::span<const std::ptrdiff_t> out_strides) {
  loop_nest nest = output_order(in.shape, {out_strides, in.strides});
  if (nest.empty) return;
  const auto &nest_out = nest.strides[0], &nest_in = nest.strides[1];
  auto magnitude = [](std::ptrdiff_t s) { return s < 0 ? -s : s; };
  std::size_t across = nest.shape.size();  // the dim read contiguously, when it is not the innermost
  for (std::size_t k = 0; k + 1 < nest.shape.size(); ++k)
    if (nest_in[k] != 0 && magnitude(nest_in[k]) < magnitude(nest_in.back()) &&
        (across == nest.shape.size() || magnitude(nest_in[k]) < magnitude(nest_in[across])))
      across = k;
  if (across == nest.shape.size()) {
    for_each_line(nest.shape, nest_in, nest_out,
                  [&](std::ptrdiff_t i, std::ptrdiff_t o, std::size_t n, std::ptrdiff_t is, std::ptrdiff_t os) {
                    const S* a = in.data + i;
                    T* b = out + o;
                    if (is == 1 && os == 1)
                      for (std::size_t k = 0; k < n; ++k) b[k] = static_cast<T>(a[k]);
                    else
                      for (std::size_t k = 0; k < n; ++k) b[k * os] = static_cast<T>(a[k * is]);
                  });
    return;
  }
  // A tile's inner loop runs along the dim whose strides on both sides are small: the lines
  // it touches on the side that is walked again for the next outer index form one compact
  // block that stays in cache. (Lines a power of two apart would share cache sets instead,
  // and evict each other.)
  struct walk {
    std::size_t size;
    std::ptrdiff_t in, out;
  };
  walk outer{nest.shape[across], nest_in[across], nest_out[across]};
  walk inner{nest.shape.back(), nest_in.back(), nest_out.back()};
  if (std::max(magnitude(outer.in), magnitude(outer.out)) < std::max(magnitude(inner.in), magnitude(inner.out)))
    std::swap(outer, inner);
  nest.shape[across] = 1, nest.shape.back() = 1;
  constexpr std::size_t tile = 64;
  for_each_line(nest.shape, nest_in, nest_out,
                [&](std::ptrdiff_t i, std::ptrdiff_t o, std::size_t n, std::ptrdiff_t is, std::ptrdiff_t os) {
                  for (std::size_t k = 0; k < n; ++k) {
                    const S* a = in.data + i + static_cast<std::ptrdiff_t>(k) * is;
                    T* b = out + o + static_cast<std::ptrdiff_t>(k) * os;
                    for (std::size_t u0 = 0; u0 < outer.size; u0 += tile)
                      for (std::size_t v0 = 0; v0 < inner.size; v0 += tile)
                        for (std::size_t u = u0; u < std::min(outer.size, u0 + tile); ++u) {
                          const S* from = a + static_cast<std::ptrdiff_t>(u) * outer.in;
                          T* to = b + static_cast<std::ptrdiff_t>(u) * outer.out;
                          for (std::size_t v = v0; v < std::min(inner.size, v0 + tile); ++v)
                            to[static_cast<std::ptrdiff_t>(v) * inner.out] = static_cast<T>(from[static_cast<std::ptrdiff_t>(v) * inner.in]);
                        }
                  }
                });
}

/// Copies (converting to `T`) a strided block into row-major memory at `out`.
template <class T, class S>
void copy_strided(const strided_block<S>& in, T* out) {
  copy_strided(in, out, row_major_strides(in.shape));
}

}  // namespace namedax::detail
