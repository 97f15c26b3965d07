// SPDX-License-Identifier: MIT
// Contractions that are matrix products, through OpenBLAS's gemm: the dims of a contraction
// grouped into batch / left (M) / contracted (K) / right (N), one gemm per batch item.
#pragma once
// IWYU pragma: private

#include <namedax/detail/compilation.hpp>
#include <namedax/detail/kernels.hpp>
#include <namedax/detail/thread_sanitizer.hpp>

#include <cblas.h>
#if NAMEDAX_DEFINITIONS  // with separate compilation, only the unit that defines for_each_task parses oneTBB
#include <tbb/parallel_for.h>
#endif

#include <algorithm>
#include <array>
#include <climits>
#include <cstddef>
#include <mutex>
#include <span>
#include <type_traits>
#include <vector>

namespace namedax::detail {

/// The element types that go through gemm; every other type keeps the element loops.
template <class T>
concept GemmScalar = std::is_same_v<T, float> || std::is_same_v<T, double>;

/// One dim of a contraction: its size and its strides in x, y and the output (0 where the
/// operand lacks it; the output's is 0 for a contracted dim).
struct gemm_dim {
  std::size_t size;
  std::ptrdiff_t x, y, out;
};

/// A contraction as gemm sees it. Each group is flattened row-major in the order given:
/// that order is part of the summation order, so every placement must give the same one.
struct gemm_problem {
  std::vector<gemm_dim> batch;       // in x, y (stride 0 where broadcast) and out: a loop of gemms
  std::vector<gemm_dim> left;        // in x and out: gemm's M
  std::vector<gemm_dim> right;       // in y and out: gemm's N
  std::vector<gemm_dim> contracted;  // in x and y: gemm's K
};

// OpenBLAS's sum depends on how many threads share a gemm (measured: 1 and 2 threads give
// different bits for 1000 x 700 x 33), and a pmap device must not start threads of its own.
// So namedax runs every gemm on one OpenBLAS thread, over a fixed grid of output tiles that
// does not depend on the thread count, and spreads the tiles over threads itself (off device
// threads). OpenBLAS keeps one thread count for the whole process: the first namedax gemm to
// start sets it to 1 and the last to finish restores the count it found.
class blas_one_thread {
 public:
  blas_one_thread();
  ~blas_one_thread();
  blas_one_thread(const blas_one_thread&) = delete;
  blas_one_thread& operator=(const blas_one_thread&) = delete;

 private:
  struct shared {
    std::mutex mutex;
    int active = 0;
    int saved = 1;
  };
  static shared& state() {
    static shared s;
    return s;
  }
};

/// The output of one gemm is cut along its longer side (M or N) into strips of gemm_tile, the
/// other side whole: a cut fixed by M and N alone, wide enough for OpenBLAS's blocking, and
/// narrow enough that a 512 x 512 product keeps two cores busy.
inline constexpr std::size_t gemm_tile = 256;

inline std::size_t group_size(std::span<const gemm_dim> dims) {
  std::size_t n = 1;
  for (const auto& d : dims) n *= d.size;
  return n;
}

/// The stride of the group flattened row-major, when one stride walks it; 0 for a group of
/// size-1 dims; -1 when the group is not one strided line.
template <std::ptrdiff_t gemm_dim::*Stride>
std::ptrdiff_t merged_stride(std::span<const gemm_dim> dims) {
  bool first = true;
  std::ptrdiff_t inner = 0, next = 0;  // the line's stride, and the one the next dim out must have
  for (std::size_t k = dims.size(); k-- > 0;) {
    if (dims[k].size == 1) continue;
    const std::ptrdiff_t s = dims[k].*Stride;
    if (first) inner = s, first = false;
    else if (s != next) return -1;
    next = s * static_cast<std::ptrdiff_t>(dims[k].size);
  }
  return inner;
}

/// The smallest |stride| of the group's dims of size > 1 (the dim read fastest).
template <std::ptrdiff_t gemm_dim::*Stride>
std::ptrdiff_t inner_stride(std::span<const gemm_dim> dims) {
  std::ptrdiff_t best = PTRDIFF_MAX;
  for (const auto& d : dims)
    if (d.size > 1) best = std::min(best, d.*Stride < 0 ? -(d.*Stride) : d.*Stride);
  return best;
}

/// How gemm reads one operand (rows x cols): transposed or not, in place with a leading
/// dimension, or packed into a buffer of that layout first.
struct gemm_operand {
  bool trans = false;
  bool in_place = false;
  std::size_t ld = 1;
};

// The transpose flag depends only on the sizes and on which group is read fastest, not on the
// strides' values, so that a vmap (whose positional strides are a pmap device's times n, or
// the same) and a pmap device choose the same flags and so the same gemm; only whether the
// operand is read in place or packed first may differ, and gemm packs its inputs either way.
template <std::ptrdiff_t gemm_dim::*Stride>
gemm_operand choose_layout(std::span<const gemm_dim> rows, std::span<const gemm_dim> cols) {
  const std::size_t r = group_size(rows), c = group_size(cols);
  gemm_operand op;
  op.trans = r > 1 && c > 1 && inner_stride<Stride>(rows) < inner_stride<Stride>(cols);
  const std::ptrdiff_t sr = merged_stride<Stride>(rows), sc = merged_stride<Stride>(cols);
  const std::ptrdiff_t unit = op.trans ? sr : sc, lead = op.trans ? sc : sr;
  const std::size_t minor = op.trans ? r : c, major = op.trans ? c : r;
  op.ld = std::max<std::size_t>(minor, 1);
  if ((unit == 1 || minor <= 1) && (major <= 1 || (lead >= static_cast<std::ptrdiff_t>(op.ld) && lead <= INT_MAX)))
    op.in_place = true, op.ld = major <= 1 ? op.ld : static_cast<std::size_t>(lead);
  return op;
}

/// The shape and strides, for copy_strided, that copy rows x cols from an operand
/// (`in_strides`) into a packed buffer of the layout `trans` (`out_strides`).
template <std::ptrdiff_t gemm_dim::*Stride>
void packed_strides(std::span<const gemm_dim> rows, std::span<const gemm_dim> cols, bool trans, strides_t& in_strides,
                    dims_t& shape, strides_t& out_strides) {
  const std::size_t r = group_size(rows), c = group_size(cols);
  auto add = [&](std::span<const gemm_dim> dims, std::ptrdiff_t scale) {
    std::ptrdiff_t s = scale;
    const std::size_t first = shape.size();
    for (const auto& d : dims) shape.push_back(d.size), in_strides.push_back(d.size == 1 ? 0 : d.*Stride);
    out_strides.resize(shape.size());
    for (std::size_t k = shape.size(); k-- > first;)
      out_strides[k] = shape[k] == 1 ? 0 : s, s *= static_cast<std::ptrdiff_t>(shape[k]);
  };
  add(rows, trans ? 1 : static_cast<std::ptrdiff_t>(c));
  add(cols, trans ? static_cast<std::ptrdiff_t>(r) : 1);
}

template <GemmScalar T>
void gemm_call(bool ta, bool tb, std::size_t m, std::size_t n, std::size_t k, const T* a, std::size_t lda, const T* b,
               std::size_t ldb, T* c, std::size_t ldc) {
  const auto i = [](std::size_t v) { return static_cast<int>(v); };
  const auto t = [](bool trans) { return trans ? CblasTrans : CblasNoTrans; };
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, t(ta), t(tb), i(m), i(n), i(k), 1.0f, a, i(lda), b, i(ldb), 0.0f, c, i(ldc));
  else
    cblas_dgemm(CblasRowMajor, t(ta), t(tb), i(m), i(n), i(k), 1.0, a, i(lda), b, i(ldb), 0.0, c, i(ldc));
}

/// One gemm's inputs, as gemm_call takes them; the output is given per strip.
template <class T>
struct gemm_args {
  bool ta, tb;
  std::size_t m, n, k;
  const T* a;
  std::size_t lda;
  const T* b;
  std::size_t ldb;
};

/// One strip of a gemm's output: rows [r, r + m) and columns [c, c + n).
struct gemm_strip {
  std::size_t r, c, m, n;
};

inline std::size_t strip_count(std::size_t m, std::size_t n) {
  return (std::max(m, n) + gemm_tile - 1) / gemm_tile;
}

inline gemm_strip strip_of(std::size_t m, std::size_t n, std::size_t t) {
  const std::size_t from = t * gemm_tile;
  if (m >= n) return {from, 0, std::min(gemm_tile, m - from), n};
  return {0, from, m, std::min(gemm_tile, n - from)};
}

/// The strip `s` of C = A B, written at `c` with leading dimension `ldc`.
template <GemmScalar T>
void gemm_strip_call(const gemm_args<T>& g, const gemm_strip& s, T* c, std::size_t ldc) {
  gemm_call<T>(g.ta, g.tb, s.m, s.n, g.k, g.a + (g.ta ? s.r : s.r * g.lda), g.lda, g.b + (g.tb ? s.c * g.ldb : s.c),
               g.ldb, c, ldc);
}

/// How many consecutive batch items (the innermost batch dims, merged while they are
/// contiguous in the output) sit closer together in the output than the elements of one
/// item's M x N block (strides `out_m`, `out_n`): a vmap's lanes, innermost in the payload.
/// 1 when they do not.
inline std::size_t interleaved_lanes(const std::vector<gemm_dim>& batch, std::ptrdiff_t out_m, std::ptrdiff_t out_n) {
  if (batch.empty() || batch.back().out <= 0) return 1;
  std::size_t lanes = 1;
  std::ptrdiff_t next = batch.back().out;  // where the merged dims would continue
  for (std::size_t d = batch.size(); d-- > 0 && batch[d].out == next;) {
    lanes *= batch[d].size;
    next = batch[d].out * static_cast<std::ptrdiff_t>(batch[d].size);
  }
  const std::ptrdiff_t span = next;  // the merged lanes' extent in the output
  return lanes > 1 && span <= out_m && span <= out_n ? lanes : 1;
}

/// f(0), ..., f(count - 1): in parallel on the calling thread's tbb arena, or in turn on a
/// device thread (which must not start threads of its own) and under ThreadSanitizer.
NAMEDAX_DECL void for_each_task(std::size_t count, bool on_device, index_body f);

/// An operand of one gemm: where it is read from, packing it first when its layout needs it.
template <GemmScalar T, std::ptrdiff_t gemm_dim::*Stride>
class gemm_input {
 public:
  gemm_input(std::span<const gemm_dim> rows, std::span<const gemm_dim> cols)
      : layout_(choose_layout<Stride>(rows, cols)) {
    if (!layout_.in_place) {
      packed_strides<Stride>(rows, cols, layout_.trans, in_strides_, shape_, out_strides_);
      size_ = group_size(rows) * group_size(cols);
      buffer_.resize(size_);
    }
  }
  const T* at(const T* base) {
    if (layout_.in_place) return base;
    copy_strided(strided_block<T>{base, shape_, in_strides_}, buffer_.data(), out_strides_);
    return buffer_.data();
  }
  /// The operands at `bases` (one per lane of an interleaved batch), each where gemm reads it.
  /// Packed, the distinct ones are copied in one pass when they are evenly spaced (lanes that
  /// interleave in memory: each cache line is read once for all of them), and lanes that
  /// share an operand (broadcast along them) share its copy.
  std::vector<const T*> at_lanes(const std::vector<const T*>& bases) {
    if (layout_.in_place) return bases;
    std::vector<const T*> distinct;
    std::vector<std::size_t> which;
    for (const T* base : bases) {
      const auto seen = std::find(distinct.begin(), distinct.end(), base);
      which.push_back(static_cast<std::size_t>(seen - distinct.begin()));
      if (seen == distinct.end()) distinct.push_back(base);
    }
    const std::size_t size = size_;
    buffer_.resize(distinct.size() * size);
    const std::ptrdiff_t spacing = distinct.size() > 1 ? distinct[1] - distinct[0] : 0;
    bool even = true;
    for (std::size_t d = 1; d < distinct.size(); ++d) even = even && distinct[d] - distinct[d - 1] == spacing;
    if (even && distinct.size() > 1) {
      dims_t shape{distinct.size()};
      strides_t in{spacing}, out{static_cast<std::ptrdiff_t>(size)};
      shape.insert(shape.end(), shape_.begin(), shape_.end());
      in.insert(in.end(), in_strides_.begin(), in_strides_.end());
      out.insert(out.end(), out_strides_.begin(), out_strides_.end());
      copy_strided(strided_block<T>{distinct[0], shape, in}, buffer_.data(), out);
    } else {
      for (std::size_t d = 0; d < distinct.size(); ++d)
        copy_strided(strided_block<T>{distinct[d], shape_, in_strides_}, buffer_.data() + d * size, out_strides_);
    }
    std::vector<const T*> packed;
    for (const std::size_t d : which) packed.push_back(buffer_.data() + d * size);
    return packed;
  }
  [[nodiscard]] bool trans() const { return layout_.trans; }
  [[nodiscard]] bool in_place() const { return layout_.in_place; }
  [[nodiscard]] std::size_t ld() const { return layout_.ld; }

 private:
  gemm_operand layout_;
  std::size_t size_ = 0;  // of one packed operand
  dims_t shape_;
  strides_t in_strides_, out_strides_;
  std::vector<T> buffer_;
};

/// Whether gemm can take the problem: the sizes fit BLAS's int.
NAMEDAX_DECL bool gemm_fits(const gemm_problem& p);

/// out = the contraction of x and y, one gemm per batch item with the same M, N, K and
/// transpose flags wherever the item comes from (a vmap's slice or a pmap device's payload),
/// cut into the same strips. `out` is the row-major output of `out_size` elements;
/// `on_device`: called on a device thread.
template <GemmScalar T>
void gemm_contract(const gemm_problem& p, const T* x, const T* y, T* out, std::size_t out_size, bool on_device) {
  const std::size_t m = group_size(p.left), n = group_size(p.right), k = group_size(p.contracted);
  const std::size_t items = group_size(p.batch), strips = strip_count(m, n);
  if (out_size == 0) return;
  if (k == 0) {  // an empty sum
    std::fill_n(out, out_size, T{});
    return;
  }
  gemm_input<T, &gemm_dim::x> a(p.left, p.contracted);
  gemm_input<T, &gemm_dim::y> b(p.contracted, p.right);
  // The output is fresh row-major memory: gemm writes it in place when its M x N block is
  // row-major; else each strip goes to a buffer of its task and is scattered from there, or,
  // when M or N is not one line of the output, the whole item goes to a buffer first.
  const gemm_operand c = choose_layout<&gemm_dim::out>(p.left, p.right);
  const bool c_in_place = c.in_place && !c.trans;
  const std::ptrdiff_t out_m = merged_stride<&gemm_dim::out>(p.left), out_n = merged_stride<&gemm_dim::out>(p.right);
  const bool scatter_strips = !c_in_place && out_m >= 0 && out_n >= 0;
  std::vector<T> c_buffer(c_in_place || scatter_strips ? 0 : m * n);
  dims_t c_shape;
  strides_t c_strides, c_out_strides;
  if (!c_in_place && !scatter_strips)
    packed_strides<&gemm_dim::out>(p.left, p.right, false, c_out_strides, c_shape, c_strides);

  auto offsets = [&](std::size_t item) {  // of batch item `item` (row-major) in x, y and out
    std::array<std::ptrdiff_t, 3> o{};
    for (std::size_t d = p.batch.size(); d-- > 0;) {
      const auto i = static_cast<std::ptrdiff_t>(item % p.batch[d].size);
      item /= p.batch[d].size;
      o[0] += i * p.batch[d].x, o[1] += i * p.batch[d].y, o[2] += i * p.batch[d].out;
    }
    return o;
  };
  auto strip = [&](std::ptrdiff_t to, std::size_t t, const T* pa, const T* pb) {
    const gemm_args<T> g{a.trans(), b.trans(), m, n, k, pa, a.ld(), pb, b.ld()};
    const gemm_strip s = strip_of(m, n, t);
    if (c_in_place) return gemm_strip_call<T>(g, s, out + to + s.r * c.ld + s.c, c.ld);
    gemm_strip_call<T>(g, s, c_buffer.data() + s.r * n + s.c, std::max<std::size_t>(n, 1));
  };

  const blas_one_thread one_thread;
  if (scatter_strips) {
    // Each strip goes to a buffer of its task and is scattered from there. The items of the
    // innermost batch dims that interleave in every line of the output (a vmap's lanes) go
    // together: their operands are packed together, and a task computes one strip of all of
    // them, each into a buffer of its own, then writes them out in one pass that fills each
    // line of the output whole. Other items are lanes of one.
    const std::size_t lanes = interleaved_lanes(p.batch, out_m, out_n);
    const std::ptrdiff_t lane_stride = lanes > 1 ? p.batch.back().out : 0;
    auto lane_strip = [&](std::size_t t, std::ptrdiff_t to, const std::vector<const T*>& pa,
                          const std::vector<const T*>& pb) {
      const gemm_strip s = strip_of(m, n, t);
      const std::size_t size = s.m * s.n;
      thread_local std::vector<T> local;
      local.resize(lanes * size);
      for (std::size_t l = 0; l < lanes; ++l)
        gemm_strip_call<T>({a.trans(), b.trans(), m, n, k, pa[l], a.ld(), pb[l], b.ld()}, s, local.data() + l * size,
                           std::max<std::size_t>(s.n, 1));
      const strided_block<T> from{local.data(), {lanes, s.m, s.n},
                                  {static_cast<std::ptrdiff_t>(size), s.m == 1 ? 0 : static_cast<std::ptrdiff_t>(s.n),
                                   s.n == 1 ? 0 : 1}};
      const std::ptrdiff_t at[] = {lane_stride, s.m == 1 ? 0 : out_m, s.n == 1 ? 0 : out_n};
      const auto r = static_cast<std::ptrdiff_t>(s.r), col = static_cast<std::ptrdiff_t>(s.c);
      copy_strided(from, out + to + r * out_m + col * out_n, at);
    };
    auto bases = [&](std::size_t first, std::size_t operand) {  // of the lanes from item `first` on
      std::vector<const T*> at(lanes);
      for (std::size_t l = 0; l < lanes; ++l) at[l] = (operand == 0 ? x : y) + offsets(first + l)[operand];
      return at;
    };
    const std::size_t groups = items / lanes;
    if (a.in_place() && b.in_place()) {
      // Nothing to pack: every strip of every group is a task of its own. A strip's groups
      // are consecutive tasks, so that where they interleave in the output their scatters
      // fill lines still in cache.
      for_each_task(groups * strips, on_device, [&](std::size_t task) {
        const std::size_t first = task % groups * lanes;
        lane_strip(task / groups, offsets(first)[2], bases(first, 0), bases(first, 1));
      });
      return;
    }
    for (std::size_t first = 0; first < items; first += lanes) {
      const std::vector<const T*> pa = a.at_lanes(bases(first, 0)), pb = b.at_lanes(bases(first, 1));
      for_each_task(strips, on_device, [&](std::size_t t) { lane_strip(t, offsets(first)[2], pa, pb); });
    }
    return;
  }
  if (a.in_place() && b.in_place() && c_in_place) {  // nothing to pack: every strip of every item a task
    for_each_task(items * strips, on_device, [&](std::size_t task) {
      const auto o = offsets(task % items);
      strip(o[2], task / items, x + o[0], y + o[1]);
    });
    return;
  }
  for (std::size_t item = 0; item < items; ++item) {
    const auto o = offsets(item);
    const T* pa = a.at(x + o[0]);
    const T* pb = b.at(y + o[1]);
    for_each_task(strips, on_device, [&](std::size_t t) { strip(o[2], t, pa, pb); });
    if (!c_in_place) copy_strided(strided_block<T>{c_buffer.data(), c_shape, c_strides}, out + o[2], c_out_strides);
  }
}

#if NAMEDAX_DEFINITIONS  // the bodies of the functions declared above (see detail/compilation.hpp)
NAMEDAX_DECL blas_one_thread::blas_one_thread() {
  std::lock_guard lock(state().mutex);
  if (state().active++ == 0) {
    state().saved = openblas_get_num_threads();
    openblas_set_num_threads(1);
  }
}

NAMEDAX_DECL blas_one_thread::~blas_one_thread() {
  std::lock_guard lock(state().mutex);
  if (--state().active == 0) openblas_set_num_threads(state().saved);
}

NAMEDAX_DECL void for_each_task(std::size_t count, bool on_device, index_body f) {
  drive_progress();
#if defined(NAMEDAX_THREAD_SANITIZER)
  on_device = true;
#endif
  if (on_device || count <= 1) {
    for (std::size_t t = 0; t < count; ++t) f(t);
  } else {
    tbb::parallel_for(std::size_t{0}, count, f);
  }
}

NAMEDAX_DECL bool gemm_fits(const gemm_problem& p) {
  for (std::size_t n : {group_size(p.left), group_size(p.right), group_size(p.contracted)})
    if (n > static_cast<std::size_t>(INT_MAX)) return false;
  return true;
}
#endif  // NAMEDAX_DEFINITIONS

#ifdef NAMEDAX_SEPARATE_COMPILATION  // defined once, by <namedax/separate_compilation.hpp>
NAMEDAX_EXTERN template void gemm_contract<float>(const gemm_problem&, const float*, const float*, float*, std::size_t, bool);
NAMEDAX_EXTERN template void gemm_contract<double>(const gemm_problem&, const double*, const double*, double*, std::size_t,
                                                   bool);
#endif

}  // namespace namedax::detail
