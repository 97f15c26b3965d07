// SPDX-License-Identifier: MIT
// Loops every rule shares: strided line iteration, the fixed-order fold of several members,
// strided copies, and the allocation of outputs, on raw pointers so that no xtensor stepper
// sits on a hot path; the hot loops on xsimd batches, with the scalar loops' bits.
// IWYU pragma: private, include <namedax/namedax.hpp>
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <optional>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include <namedax/detail/buffers.hpp>
#include <namedax/detail/compilation.hpp>
#include <namedax/detail/fault.hpp>
#include <namedax/detail/progress.hpp>
#include <namedax/error.hpp>

#include <xtensor/xbuffer_adaptor.hpp>
#include <xtensor/xarray.hpp>
#include <xsimd/xsimd.hpp>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace namedax::detail {

/// Dimensions and strides as the kernels and rules pass them around: kept inline up to 8
/// dims, so that describing a block or a member of a collective allocates nothing.
using dims_t = xt::svector<std::size_t, 8>;

/// Inserts `value` into `dims` before position `at`. Not svector's one-value insert, whose
/// aliasing check g++ 12 reports as an out-of-bounds read (-Warray-bounds) when inlined.
inline void insert_dim(dims_t& dims, std::size_t at, std::size_t value) {
  dims.push_back(value);
  std::rotate(dims.begin() + static_cast<std::ptrdiff_t>(at), dims.end() - 1, dims.end());
}
using strides_t = xt::svector<std::ptrdiff_t, 8>;

/// The number of elements of an array of `shape`, after checking that it and its size in bytes
/// (`element_size` each) fit in a std::size_t: a product that wrapped would allocate too little
/// and let the caller write past the end. Otherwise a namedax::error naming `verb` (the
/// operation whose result it is; empty for an output of any operation) and the shape.
NAMEDAX_DECL std::size_t checked_element_count(std::string_view verb, std::span<const std::size_t> shape,
                                               std::size_t element_size);

/// A row-major array of `shape` whose elements are not initialized yet. A large one asks the
/// kernel for transparent huge pages: a fresh 64 MiB output is 16384 first-touch faults of
/// 4 KiB (about 0.2 s on virtual machines), against 32 of 2 MiB.
template <class T>
xt::xarray<T> uninitialized_array(std::span<const std::size_t> shape) {
  at_fault_point(fault_point::allocation, {});
  (void)checked_element_count({}, shape, sizeof(T));
  xt::xarray<T> a = empty_array<T>();
  if (reuse_array(shape, a)) return a;  // pages already touched: no faults at all
  a.resize(shape);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr std::uintptr_t page = 4096, huge = std::uintptr_t{2} << 20;
  const auto begin = reinterpret_cast<std::uintptr_t>(a.data());
  const std::uintptr_t end = begin + a.size() * sizeof(T);
  // From the page that holds the first element: where the kernel aligned malloc's mapping to
  // 2 MiB, the block starts a few bytes into it, and a range from the next page would leave
  // that whole first 2 MiB to 512 faults of 4 KiB.
  const std::uintptr_t first = begin & ~(page - 1);
  if (end > first + 2 * huge) {
    void* const range = reinterpret_cast<void*>(first);
    const std::size_t length = (end - first + page - 1) & ~(page - 1);
    madvise(range, length, MADV_HUGEPAGE);
#if defined(MADV_POPULATE_WRITE)
    // The caller writes every element: fault the pages in one call instead of one trap each
    // (a fresh 64 MiB output, whose first and last 2 MiB stay small pages, took 10 ms instead of 7).
    madvise(range, length, MADV_POPULATE_WRITE);
#endif
  }
#endif
  return a;
}
/// The same for any other sequence of extents: one instantiation per element type, whatever
/// the shape's type.
template <class T, class Shape>
  requires(!std::is_convertible_v<const Shape&, std::span<const std::size_t>>)
xt::xarray<T> uninitialized_array(const Shape& shape) {
  const dims_t extents(std::begin(shape), std::end(shape));
  return uninitialized_array<T>(std::span<const std::size_t>(extents));
}

/// Whether xsimd has batches of T for the architecture the code is compiled for (bool is
/// left to scalar loops: its batches do not do arithmetic).
template <class T>
inline constexpr bool has_batch =
    !std::is_same_v<T, bool> && xsimd::types::has_simd_register<T, xsimd::default_arch>::value;

/// The unsigned type in which integers of type T wrap: signed overflow is undefined in C++, and
/// narrow types would be promoted to int (whose products overflow); at least unsigned int.
template <class T>
using wrapping_t = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;

/// a + b; integers wrap as JAX's do (computed in wrapping_t, then converted back, which C++20
/// defines as modular), with the bits of the batches' wrapping adds.
template <class T>
constexpr T wrapping_add(T a, T b) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    using U = wrapping_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return static_cast<T>(a + b);
  }
}
/// a * b, wrapping the same way: `size * x` for a sum over copies of x.
template <class T>
constexpr T wrapping_multiply(T a, T b) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    using U = wrapping_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  } else {
    return static_cast<T>(a * b);
  }
}

// Each operation on two scalars, and on two batches (the kernels' SIMD loops). The batch form
// gives the scalar form's bits lane by lane, except where the second operand holds a NaN:
// `checks_nan` operations leave that to the kernels, which redo such lanes with the scalar
// form, so that the common case is one instruction instead of a chain of selects.
// `identity<T>()` is the result of an operation over no members, as XLA's reductions give it.
struct sum_op {
  static constexpr bool checks_nan = false;
  template <class T>
  T operator()(T a, T b) const { return wrapping_add(a, b); }
  template <class T>
  static constexpr T identity() { return T{}; }
};
// max and min propagate NaN, as XLA's do: a NaN already folded in stays (comparisons with it
// are false), a new one replaces the result. Written as selects, without an early return, so
// that loops over them vectorize.
struct max_op {
  static constexpr bool checks_nan = true;
  template <class T>
  T operator()(T a, T b) const {
    const T larger = a < b ? b : a;
    if constexpr (std::is_floating_point_v<T>) return b != b ? b : larger;
    else return larger;
  }
  template <class T>
  static constexpr T identity() {
    if constexpr (std::numeric_limits<T>::has_infinity) return -std::numeric_limits<T>::infinity();
    else return std::numeric_limits<T>::lowest();
  }
  template <class T, class A>
  xsimd::batch<T, A> operator()(const xsimd::batch<T, A>& a, const xsimd::batch<T, A>& b) const {
#if XSIMD_WITH_SSE2
    return xsimd::max(b, a);  // maxps(b, a) is `b > a ? b : a`, ties (+0, -0) and a NaN in a included
#else
    return xsimd::select(a < b, b, a);
#endif
  }
};
struct min_op {
  static constexpr bool checks_nan = true;
  template <class T>
  T operator()(T a, T b) const {
    const T smaller = b < a ? b : a;
    if constexpr (std::is_floating_point_v<T>) return b != b ? b : smaller;
    else return smaller;
  }
  template <class T>
  static constexpr T identity() {
    if constexpr (std::numeric_limits<T>::has_infinity) return std::numeric_limits<T>::infinity();
    else return std::numeric_limits<T>::max();
  }
  template <class T, class A>
  xsimd::batch<T, A> operator()(const xsimd::batch<T, A>& a, const xsimd::batch<T, A>& b) const {
#if XSIMD_WITH_SSE2
    return xsimd::min(b, a);  // minps(b, a) is `b < a ? b : a`
#else
    return xsimd::select(b < a, b, a);
#endif
  }
};

/// Lanes of `b` that the batch form of `op` may get wrong (NaN), when it has any.
template <class Op, class B>
auto nan_lanes(const B& b) {
  if constexpr (Op::checks_nan && std::is_floating_point_v<typename B::value_type>) return xsimd::isnan(b);
  else return typename B::batch_bool_type(false);
}

/// Whether W batches of W lanes of T can be transposed in registers: interleaves do it for
/// 16-byte registers; wider ones interleave each 16-byte half apart (there scalar loops run).
template <class T>
inline constexpr bool transposes_in_batches = has_batch<T> && xsimd::batch<T>::size * sizeof(T) == 16;

/// Transposes W batches of W lanes: log2(W) rounds of interleaving rows g and g + W/2.
template <class B>
void transpose_batches(std::array<B, B::size>& r) {
  constexpr std::size_t W = B::size;
  [&]<std::size_t... G>(std::index_sequence<G...>) {
    for (std::size_t round = 1; round < W; round *= 2)
      r = std::array<B, W>{(G % 2 == 0 ? xsimd::zip_lo(r[G / 2], r[G / 2 + W / 2]) : xsimd::zip_hi(r[G / 2], r[G / 2 + W / 2]))...};
  }(std::make_index_sequence<W>{});
}

/// The W batches at `at + g * row` for g < W.
template <class B, class T>
std::array<B, B::size> load_rows(const T* at, std::ptrdiff_t row) {
  return [&]<std::size_t... G>(std::index_sequence<G...>) {
    return std::array<B, B::size>{B::load_unaligned(at + static_cast<std::ptrdiff_t>(G) * row)...};
  }(std::make_index_sequence<B::size>{});
}

/// Whether the batches `y` may hold a NaN that the batch form of `op` gets wrong, in one test:
/// their sum is NaN when any lane is (or when infinities of both signs meet: a needless redo).
template <class Op, class B, std::size_t U>
bool may_hold_nan(const std::array<B, U>& y) {
  if constexpr (Op::checks_nan && std::is_floating_point_v<typename B::value_type>) {
    B probe = y[0];
    for (std::size_t j = 1; j < U; ++j) probe = probe + y[j];
    return xsimd::any(xsimd::isnan(probe));
  } else {
    return false;
  }
}

/// b[k] = op(b[k], a[k]) for k < n, contiguous: eight batches at a time, redone with the scalar
/// form when their `a` may hold a NaN (rare), and the scalar form for the tail.
template <class T, class Op>
void fold_line(T* b, const T* a, std::size_t n, Op op) {
  std::size_t k = 0;
  if constexpr (has_batch<T>) {
    using B = xsimd::batch<T>;
    constexpr std::size_t unroll = 8, step = unroll * B::size;
    for (; k + step <= n; k += step) {
      std::array<B, unroll> y;
      for (std::size_t j = 0; j < unroll; ++j) y[j] = B::load_unaligned(a + k + j * B::size);
      if (may_hold_nan<Op>(y)) {
        for (std::size_t l = k; l < k + step; ++l) b[l] = op(b[l], a[l]);
        continue;
      }
      for (std::size_t j = 0; j < unroll; ++j) op(B::load_unaligned(b + k + j * B::size), y[j]).store_unaligned(b + k + j * B::size);
    }
  }
  for (; k < n; ++k) b[k] = op(b[k], a[k]);
}

/// b[k] = op(...op(op(b[k], a[0][k]), a[1][k])..., a[3][k]) for k < n, contiguous; with `Start`
/// the fold begins at a[0][k] instead. Four members in one pass: the partial results go
/// through the cache once per four members instead of once per member, with the same bits
/// as four fold_line passes.
template <bool Start, class T, class Op>
void fold_four_lines(T* b, const std::array<const T*, 4>& a, std::size_t n, Op op) {
  auto scalar = [&](std::size_t k) {
    T acc = Start ? a[0][k] : op(b[k], a[0][k]);
    for (std::size_t g = 1; g < 4; ++g) acc = op(acc, a[g][k]);
    b[k] = acc;
  };
  std::size_t k = 0;
  if constexpr (has_batch<T>) {
    using B = xsimd::batch<T>;
    constexpr std::size_t unroll = 2, step = unroll * B::size;
    for (; k + step <= n; k += step) {
      std::array<B, 4 * unroll> y;
      for (std::size_t g = 0; g < 4; ++g)
        for (std::size_t j = 0; j < unroll; ++j) y[g * unroll + j] = B::load_unaligned(a[g] + k + j * B::size);
      if (may_hold_nan<Op>(y)) {
        for (std::size_t l = k; l < k + step; ++l) scalar(l);
        continue;
      }
      for (std::size_t j = 0; j < unroll; ++j) {
        B acc = Start ? y[j] : op(B::load_unaligned(b + k + j * B::size), y[j]);
        for (std::size_t g = 1; g < 4; ++g) acc = op(acc, y[g * unroll + j]);
        acc.store_unaligned(b + k + j * B::size);
      }
    }
  }
  for (; k < n; ++k) scalar(k);
}

/// The fold of a[0], a[step], ..., a[(count - 1) * step], in that order. With adjacent members
/// pass the step as std::integral_constant: with a runtime step g++ 12 compiles max_op's
/// selects into a loop four times slower.
template <class T, class Step, class Op>
T fold_group(const T* a, Step step, std::size_t count, Op op) {
  T acc = a[0];
  for (std::size_t m = 1; m < count; ++m) acc = op(acc, a[static_cast<std::ptrdiff_t>(m) * step]);
  return acc;
}

/// out[k * out_step] = the fold of in[k * stride + 0 .. count-1] in member order, for k < n:
/// each element's members are adjacent (the named axis is the innermost dimension). With
/// 16-byte batches of W lanes, W elements at a time: W members of each are loaded as W
/// batches and transposed, so that lane g holds element g and the fold runs on whole batches,
/// member after member, with the scalar loop's bits. (The transposition is interleaves, which
/// wider registers do per 16-byte half; there the scalar loop runs.) A block with a NaN, for a
/// `checks_nan` operation, is redone by the scalar loop.
template <class T, class Op>
void fold_adjacent(const T* in, std::ptrdiff_t stride, std::size_t n, std::size_t count, T* out,
                   std::ptrdiff_t out_step, Op op) {
  auto scalar = [&](std::size_t k) {
    out[static_cast<std::ptrdiff_t>(k) * out_step] =
        fold_group(in + static_cast<std::ptrdiff_t>(k) * stride, std::integral_constant<std::ptrdiff_t, 1>{}, count, op);
  };
  std::size_t k = 0;
  if constexpr (transposes_in_batches<T>) {
    using B = xsimd::batch<T>;
    constexpr std::size_t W = B::size;
    for (; count >= W && k + W <= n; k += W) {
      const T* a = in + static_cast<std::ptrdiff_t>(k) * stride;
      B acc;
      auto nan = typename B::batch_bool_type(false);
      std::size_t m = 0;
      for (; m + W <= count; m += W) {
        auto r = load_rows<B>(a + m, stride);
        transpose_batches(r);
        [&]<std::size_t... G>(std::index_sequence<G...>) {
          ((nan = nan | nan_lanes<Op>(r[G])), ...);
          ((acc = G == 0 && m == 0 ? r[G] : op(acc, r[G])), ...);
        }(std::make_index_sequence<W>{});
      }
      const bool redo = xsimd::any(nan);
      if (!redo && m == count && out_step == 1) {
        acc.store_unaligned(out + k);
        continue;
      }
      // A NaN, members left over or a strided output: finish lane by lane.
      alignas(16) std::array<T, W> lanes;
      acc.store_aligned(lanes.data());
      for (std::size_t g = 0; g < W; ++g) {
        if (redo) {
          scalar(k + g);
          continue;
        }
        const T* e = a + static_cast<std::ptrdiff_t>(g) * stride;
        T v = lanes[g];
        for (std::size_t j = m; j < count; ++j) v = op(v, e[j]);
        out[static_cast<std::ptrdiff_t>(k + g) * out_step] = v;
      }
    }
  }
  for (; k < n; ++k) scalar(k);
}

/// Calls `line(in, out, length, in_step, out_step)` for each innermost line of `shape`.
/// Dimensions of size 1 are dropped first, so that a trailing one never makes lines of length 1.
template <class Line>
void for_each_line(std::span<const std::size_t> full_shape, std::span<const std::ptrdiff_t> full_in,
                   std::span<const std::ptrdiff_t> full_out, Line&& line) {
  dims_t shape;
  strides_t in_strides, out_strides;
  for (std::size_t k = 0; k < full_shape.size(); ++k) {
    if (full_shape[k] == 0) return;
    if (full_shape[k] == 1) continue;
    shape.push_back(full_shape[k]), in_strides.push_back(full_in[k]), out_strides.push_back(full_out[k]);
  }
  const std::size_t rank = shape.size();
  if (rank == 0) return line(std::ptrdiff_t{0}, std::ptrdiff_t{0}, std::size_t{1}, std::ptrdiff_t{0}, std::ptrdiff_t{0});
  dims_t index(rank, 0);
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
/// the output first. Empty when `shape` has no element. `Layouts`: their number when it is
/// known (the kernels' two, kept inline), else 0.
template <std::size_t Layouts>
struct loop_nest {
  dims_t shape;
  std::conditional_t<Layouts == 0, std::vector<strides_t>, std::array<strides_t, Layouts>> strides;
  bool empty = false;
};

template <std::size_t Layouts = 0>
loop_nest<Layouts> output_order(std::span<const std::size_t> shape, std::span<const std::span<const std::ptrdiff_t>> layouts) {
  loop_nest<Layouts> nest;
  if constexpr (Layouts == 0) nest.strides.resize(layouts.size());
  dims_t dims;
  for (std::size_t k = 0; k < shape.size(); ++k) {
    if (shape[k] == 0) return {{}, {}, true};
    if (shape[k] > 1) dims.push_back(k);
  }
  auto magnitude = [](std::ptrdiff_t s) { return s < 0 ? -s : s; };
  const auto& out = layouts.front();
  auto before = [&](std::size_t a, std::size_t b) {
    if (magnitude(out[a]) != magnitude(out[b])) return magnitude(out[a]) > magnitude(out[b]);
    return layouts.size() > 1 && magnitude(layouts[1][a]) > magnitude(layouts[1][b]);
  };
  // A stable insertion sort: a handful of dims, and std::stable_sort would allocate.
  for (std::size_t k = 1; k < dims.size(); ++k)
    for (std::size_t j = k; j > 0 && before(dims[j], dims[j - 1]); --j) std::swap(dims[j], dims[j - 1]);
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
  const std::span<const std::ptrdiff_t> layouts[] = {out_strides, in_strides};
  auto nest = output_order<2>(shape, layouts);
  if (nest.empty) return;
  // A line of a few elements innermost (a vectorized axis inside the one folded, which parts
  // the other dims): lines along the dim outside it instead, long ones, so that the work per
  // line is not a handful of elements. Each element still folds its members in one order.
  if (const std::size_t d = nest.shape.size(); d >= 2 && nest.shape[d - 1] <= 4 && nest.shape[d - 2] > nest.shape[d - 1]) {
    std::swap(nest.shape[d - 1], nest.shape[d - 2]);
    for (auto& s : nest.strides) std::swap(s[d - 1], s[d - 2]);
  }
  const auto &nest_out = nest.strides[0], &nest_in = nest.strides[1];
  const auto spacing = even_spacing(members);
  const T* first = members.front();
  // Members of one element closer together than consecutive elements (the named axis is the
  // innermost dimension): fold each element's group in a register (adjacent members: several
  // elements at a time, one per lane of a batch).
  const auto gather_groups = [&](std::ptrdiff_t is) {
    return spacing && (is == 0 || (*spacing < 0 ? -*spacing : *spacing) < (is < 0 ? -is : is));
  };
  // Otherwise a member at a time over tiles of a line, so that the partial results (2 MiB) stay
  // in cache while every member is added; long, since each member's stream restarts the
  // prefetcher at every tile (tiles of 256 KiB made a 64 MiB psum 1.5 times slower).
  constexpr std::size_t tile = (std::size_t{2} << 20) / sizeof(T);
  for_each_line(nest.shape, nest_in, nest_out,
                [&](std::ptrdiff_t i, std::ptrdiff_t o, std::size_t n, std::ptrdiff_t is, std::ptrdiff_t os) {
                  if (gather_groups(is)) {
                    if (*spacing == 1) return fold_adjacent(first + i, is, n, members.size(), out + o, os, op);
                    for (std::size_t k = 0; k < n; ++k)
                      out[o + static_cast<std::ptrdiff_t>(k) * os] =
                          fold_group(first + i + static_cast<std::ptrdiff_t>(k) * is, *spacing, members.size(), op);
                    return;
                  }
                  for (std::size_t start = 0; start < n; start += tile) {
                    const std::size_t len = std::min(tile, n - start);
                    const auto skip = static_cast<std::ptrdiff_t>(start);
                    T* b = out + o + skip * os;
                    for (std::size_t m = 0; m < members.size(); ++m) {
                      const T* a = members[m] + i + skip * is;
                      if (is == 1 && os == 1 && m + 4 <= members.size()) {  // four at a time
                        const std::array<const T*, 4> four{a, members[m + 1] + i + skip, members[m + 2] + i + skip,
                                                           members[m + 3] + i + skip};
                        if (m == 0) fold_four_lines<true>(b, four, len, op);
                        else fold_four_lines<false>(b, four, len, op);
                        m += 3;
                      } else if (m == 0 && is == 1 && os == 1)
                        std::copy(a, a + len, b);
                      else if (m == 0)
                        for (std::ptrdiff_t k = 0; k < static_cast<std::ptrdiff_t>(len); ++k) b[k * os] = a[k * is];
                      else if (is == 1 && os == 1)  // the common case
                        fold_line(b, a, len, op);
                      else
                        for (std::ptrdiff_t k = 0; k < static_cast<std::ptrdiff_t>(len); ++k) b[k * os] = op(b[k * os], a[k * is]);
                    }
                  }
                });
}

/// Whether the number of elements of `shape` overflows std::size_t: lazy operands broadcast
/// together can describe more elements than can be counted, and the count would wrap.
template <class Shape>
bool element_count_overflows(const Shape& shape) {
  if (std::find(std::begin(shape), std::end(shape), std::size_t{0}) != std::end(shape)) return false;
  std::size_t count = 1;
  for (std::size_t extent : shape) {
    if (count > std::numeric_limits<std::size_t>::max() / extent) return true;
    count *= extent;
  }
  return false;
}

/// Fails an elementwise node whose operands (their payloads' shapes) do not broadcast, when
/// `result` is empty, or broadcast to `result`, a shape of more elements than std::size_t
/// counts; the message names positional shapes, without the `vectorized` dims at their end
/// (xtensor's own error would show the payloads' shapes).
[[noreturn]] NAMEDAX_DECL void fail_broadcast(std::span<const std::vector<std::size_t>> operands,
                                              std::span<const std::size_t> result, std::size_t vectorized);

/// The extent of two extents broadcast together (equal, or one of them 1): 0 with 1 is 0.
constexpr std::size_t broadcast_extent(std::size_t a, std::size_t b) { return a == 1 ? b : a; }

/// Row-major strides, 0 for dimensions of size 1 so that they broadcast when read.
inline strides_t row_major_strides(std::span<const std::size_t> shape) {
  strides_t strides(shape.size());
  std::ptrdiff_t s = 1;
  for (std::size_t k = shape.size(); k-- > 0;) strides[k] = shape[k] == 1 ? 0 : s, s *= static_cast<std::ptrdiff_t>(shape[k]);
  return strides;
}

/// For each element of `shape` (addressed by `out_strides` from 0), its offset with `strides`:
/// a table that lets one loop walk two layouts at once.
NAMEDAX_DECL void element_offsets(std::span<const std::size_t> shape, std::span<const std::ptrdiff_t> strides,
                                  std::span<const std::ptrdiff_t> out_strides, std::vector<std::ptrdiff_t>& into);

inline std::size_t element_count(std::span<const std::size_t> shape) {
  return std::accumulate(shape.begin(), shape.end(), std::size_t{1}, std::multiplies<>{});
}

/// A strided block of memory: what a container or a strided view of one exposes.
template <class T>
struct strided_block {
  const T* data;
  dims_t shape;
  strides_t strides;  // 0 for dimensions of size 1
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

/// The memory of a strided_window: the elements, with what keeps them alive; and, where the
/// window is an array of its own seen whole (row-major), that array, which `eval` then shares
/// instead of copying.
template <class T>
class window_storage : public xt::xbuffer_adaptor<T*, xt::no_ownership> {
 public:
  window_storage(T* data, std::size_t count, std::shared_ptr<const void> owner, std::shared_ptr<xt::xarray<T>> whole)
      : xt::xbuffer_adaptor<T*, xt::no_ownership>(data, count), owner_(std::move(owner)), whole_(std::move(whole)) {}
  [[nodiscard]] const std::shared_ptr<xt::xarray<T>>& whole() const noexcept { return whole_; }

 private:
  std::shared_ptr<const void> owner_;
  std::shared_ptr<xt::xarray<T>> whole_;
};

/// A strided window on memory that another object owns, kept alive with it: the payload of a
/// collective result that is a view of its operand (all_to_all under vmap moves no element)
/// or the rule's own array. Read-only, as every payload is.
template <class T>
using strided_window = xt::xarray_adaptor<window_storage<T>, xt::layout_type::dynamic, dims_t>;
template <class T>
using shared_window = xt::xshared_expression<strided_window<T>>;

/// The window on `b`, keeping `owner` (or `whole`, the array it shows whole) alive.
template <class T>
shared_window<T> make_window(const strided_block<T>& b, std::shared_ptr<const void> owner,
                             std::shared_ptr<xt::xarray<T>> whole) {
  // xtensor sizes the buffer as the element count, whatever the strides.
  return shared_window<T>(std::allocate_shared<strided_window<T>>(  // a recycled block: called again, nothing allocated
      recycling_allocator<strided_window<T>>{},
      window_storage<T>(const_cast<T*>(b.data), element_count(b.shape), std::move(owner), std::move(whole)), b.shape,
      b.strides));
}

/// The window on `b` that keeps `owner` alive.
template <class T>
shared_window<T> share_window(std::shared_ptr<const void> owner, const strided_block<T>& b) {
  return make_window<T>(b, std::move(owner), nullptr);
}

/// An array as a window on all of it, which it owns; the array goes back to the pool when
/// the last copy goes.
template <class T>
shared_window<T> share_window(xt::xarray<T>&& a) {
  std::shared_ptr<xt::xarray<T>> whole = shared_storage(std::move(a));
  return make_window<T>(block_of(*whole), nullptr, whole);
}

/// to[p * to_row + q] = from[q * from_row + p] for p < ps, q < qs: W x W blocks loaded as W
/// batches along p, transposed, stored as W batches along q; the edges element by element.
template <class T>
void transpose_tile(const T* from, std::ptrdiff_t from_row, T* to, std::ptrdiff_t to_row, std::size_t ps, std::size_t qs) {
  using B = xsimd::batch<T>;
  constexpr std::size_t W = B::size;
  auto one = [&](std::size_t p, std::size_t q) {
    to[static_cast<std::ptrdiff_t>(p) * to_row + static_cast<std::ptrdiff_t>(q)] =
        from[static_cast<std::ptrdiff_t>(q) * from_row + static_cast<std::ptrdiff_t>(p)];
  };
  std::size_t p0 = 0;
  for (; p0 + W <= ps; p0 += W) {
    std::size_t q0 = 0;
    for (; q0 + W <= qs; q0 += W) {
      auto r = load_rows<B>(from + static_cast<std::ptrdiff_t>(q0) * from_row + static_cast<std::ptrdiff_t>(p0), from_row);
      transpose_batches(r);
      for (std::size_t g = 0; g < W; ++g)
        r[g].store_unaligned(to + static_cast<std::ptrdiff_t>(p0 + g) * to_row + static_cast<std::ptrdiff_t>(q0));
    }
    for (std::size_t p = p0; p < p0 + W; ++p)
      for (std::size_t q = q0; q < qs; ++q) one(p, q);
  }
  for (; p0 < ps; ++p0)
    for (std::size_t q = 0; q < qs; ++q) one(p0, q);
}

/// Copies (converting to `T`) a strided block to `out`, laid out with `out_strides`. Lines
/// follow the output; when the input is contiguous along another dimension (a transposition,
/// such as stacking slabs along a new leading axis) the two are walked in square tiles, so
/// that every cache line read or written is used whole.
template <class T, class S>
void copy_strided(const strided_block<S>& in, T* out, std::span<const std::ptrdiff_t> out_strides) {
  const std::span<const std::ptrdiff_t> layouts[] = {out_strides, in.strides};
  auto nest = output_order<2>(in.shape, layouts);
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
                      for (std::ptrdiff_t k = 0; k < static_cast<std::ptrdiff_t>(n); ++k) b[k * os] = static_cast<T>(a[k * is]);
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
  // Read contiguously along one walk and written contiguously along the other: a plain
  // transposition, done in W x W blocks of batches.
  const bool outer_reads = outer.in == 1 && inner.out == 1, inner_reads = inner.in == 1 && outer.out == 1;
  for_each_line(nest.shape, nest_in, nest_out,
                [&](std::ptrdiff_t i, std::ptrdiff_t o, std::size_t n, std::ptrdiff_t is, std::ptrdiff_t os) {
                  for (std::size_t k = 0; k < n; ++k) {
                    const S* a = in.data + i + static_cast<std::ptrdiff_t>(k) * is;
                    T* b = out + o + static_cast<std::ptrdiff_t>(k) * os;
                    if constexpr (std::is_same_v<T, S> && transposes_in_batches<T>) {
                      if (outer_reads || inner_reads) {
                        const walk& p = outer_reads ? outer : inner;
                        const walk& q = outer_reads ? inner : outer;
                        for (std::size_t p0 = 0; p0 < p.size; p0 += tile)
                          for (std::size_t q0 = 0; q0 < q.size; q0 += tile)
                            transpose_tile(a + static_cast<std::ptrdiff_t>(p0) + static_cast<std::ptrdiff_t>(q0) * q.in, q.in,
                                           b + static_cast<std::ptrdiff_t>(p0) * p.out + static_cast<std::ptrdiff_t>(q0), p.out,
                                           std::min(tile, p.size - p0), std::min(tile, q.size - q0));
                        continue;
                      }
                    }
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

#if NAMEDAX_DEFINITIONS  // the bodies of the functions declared above (see detail/compilation.hpp)
NAMEDAX_DECL std::size_t checked_element_count(std::string_view verb, std::span<const std::size_t> shape,
                                               std::size_t element_size) {
  if (!element_count_overflows(shape)) {
    const std::size_t count = element_count(shape);
    if (!element_count_overflows(std::array{count, element_size})) return count;  // and its size in bytes
  }
  fail(verb.empty() ? std::string("namedax") : message("namedax::", verb), ": an array of shape ",
       std::vector<std::size_t>(shape.begin(), shape.end()), " with elements of ", element_size,
       " bytes has more bytes than memory can address; its size overflows std::size_t");
}

NAMEDAX_DECL void element_offsets(std::span<const std::size_t> shape, std::span<const std::ptrdiff_t> strides,
                                  std::span<const std::ptrdiff_t> out_strides, std::vector<std::ptrdiff_t>& into) {
  for_each_line(shape, strides, out_strides,
                [&](std::ptrdiff_t i, std::ptrdiff_t o, std::size_t n, std::ptrdiff_t is, std::ptrdiff_t os) {
                  for (std::size_t k = 0; k < n; ++k)
                    into[static_cast<std::size_t>(o + static_cast<std::ptrdiff_t>(k) * os)] = i + static_cast<std::ptrdiff_t>(k) * is;
                });
}

[[noreturn]] NAMEDAX_DECL void fail_broadcast(std::span<const std::vector<std::size_t>> operands,
                                              std::span<const std::size_t> result, std::size_t vectorized) {
  auto positional = [vectorized](std::span<const std::size_t> shape) { return shape.first(shape.size() - vectorized); };
  std::string shapes;
  for (std::size_t k = 0; k < operands.size(); ++k)
    shapes += message(k == 0 ? "" : k + 1 == operands.size() ? " and " : ", ", positional(operands[k]));
  if (result.empty())
    fail("namedax: operands of shapes ", shapes,
         " do not broadcast (aligned on the right, each dim must have extent 1 or the other's)");
  fail("namedax: operands of shapes ", shapes, " broadcast to shape ", positional(result),
       ", which has more elements than std::size_t counts; slice or reduce an operand first");
}
#endif  // NAMEDAX_DEFINITIONS

#ifdef NAMEDAX_SEPARATE_COMPILATION  // defined once, by <namedax/separate_compilation.hpp>
#define NAMEDAX_INSTANTIATE(T)                                                                \
  NAMEDAX_EXTERN template xt::xarray<T> uninitialized_array<T>(std::span<const std::size_t>); \
  NAMEDAX_EXTERN template void copy_strided<T, T>(const strided_block<T>&, T*, std::span<const std::ptrdiff_t>);
#define NAMEDAX_INSTANTIATE_FOLD(T, Op)                                                                     \
  NAMEDAX_EXTERN template void fold_members<T, Op>(std::span<const T* const>, std::span<const std::size_t>, \
                                                  std::span<const std::ptrdiff_t>, T*, std::span<const std::ptrdiff_t>, Op);
NAMEDAX_FOR_EACH_ELEMENT_TYPE(NAMEDAX_INSTANTIATE)
NAMEDAX_INSTANTIATE(bool)
// The loop order of any number of layouts (each elementwise evaluation asks for it once):
// 2.3 KB of code that every unit evaluating an expression compiled.
NAMEDAX_EXTERN template loop_nest<0> output_order<0>(std::span<const std::size_t>,
                                                     std::span<const std::span<const std::ptrdiff_t>>);
NAMEDAX_FOR_EACH_ELEMENT_FOLD(NAMEDAX_INSTANTIATE_FOLD)
#undef NAMEDAX_INSTANTIATE
#undef NAMEDAX_INSTANTIATE_FOLD
#endif

}  // namespace namedax::detail
