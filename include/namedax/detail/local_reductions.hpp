// SPDX-License-Identifier: MIT
// The bodies of the local reductions and scans over positional dims (namedax/reductions.hpp):
// walks over strided blocks that keep the trailing vectorized dims of a payload, so that each
// operation is batched over vmap axes by construction, and accumulate every output element in
// the same order (index 0, 1, ... along the reduced dims, row-major over several) whatever the
// layout, so that vmap and pmap give the same bits.
// IWYU pragma: private
#pragma once

#include <namedax/detail/compilation.hpp>
#include <namedax/detail/kernels.hpp>
#include <namedax/error.hpp>
#include <namedax/named_array.hpp>

#include <xtensor/xarray.hpp>
#include <xtensor/xmanipulation.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace namedax::detail {

/// a * b over products, as the kernels' operations are: integers wrap, as JAX's do.
struct prod_op {
  static constexpr bool checks_nan = false;
  template <class T>
  T operator()(T a, T b) const { return wrapping_multiply(a, b); }
  template <class T>
  static constexpr T identity() { return T{1}; }
};

/// The type sum, prod, cumsum and cumprod accumulate in: bool and integers narrower than 32
/// bits widen to JAX's default int (int32, or uint32 for unsigned ones), as jnp.sum does.
template <class T>
using sum_accumulate_t =
    std::conditional_t<std::is_same_v<T, bool>, std::int32_t,
                       std::conditional_t<std::is_integral_v<T> && (sizeof(T) < 4),
                                          std::conditional_t<std::is_signed_v<T>, std::int32_t, std::uint32_t>, T>>;

/// Dims as given to a reduction: a list (negative from the end), or every positional dim.
struct dim_list {
  std::vector<int> dims;
  bool all = false;
};

/// The dims of `list` in 0..rank-1, in the order given, checked for range and repetition.
NAMEDAX_DECL std::vector<std::size_t> canonical_dims(std::string_view verb, const dim_list& list,
                                                     std::span<const std::size_t> shape);

/// Dims of the positional shape as the walks see them: sorted, so that members are visited
/// row-major over the reduced dims whatever order they were given in (as jnp does).
NAMEDAX_DECL std::vector<std::size_t> sorted_dims(std::vector<std::size_t> dims);

/// A reduction's layout: the kept dims in payload order, the reduced ones row-major, merged
/// where one steps evenly into the next, so that a reduction over a whole contiguous slice
/// is one line of members.
struct reduction_plan {
  dims_t kept_shape;
  strides_t kept_in;
  dims_t reduced_shape;  // size-1 dims dropped
  strides_t reduced_in;
  std::size_t count = 1;  // members per output element; 0 when a reduced dim is empty
};

template <class T>
reduction_plan plan_reduction(const strided_block<T>& in, std::span<const std::size_t> dims) {
  reduction_plan p;
  for (std::size_t k = 0; k < in.shape.size(); ++k) {
    if (std::find(dims.begin(), dims.end(), k) == dims.end()) {
      p.kept_shape.push_back(in.shape[k]), p.kept_in.push_back(in.strides[k]);
      continue;
    }
    p.count *= in.shape[k];
    if (in.shape[k] == 1) continue;
    const auto size = static_cast<std::ptrdiff_t>(in.shape[k]);
    if (!p.reduced_shape.empty() && p.reduced_in.back() == in.strides[k] * size) {
      p.reduced_shape.back() *= in.shape[k];
      p.reduced_in.back() = in.strides[k];
    } else {
      p.reduced_shape.push_back(in.shape[k]), p.reduced_in.push_back(in.strides[k]);
    }
  }
  return p;
}

inline std::ptrdiff_t magnitude(std::ptrdiff_t s) { return s < 0 ? -s : s; }

/// The offsets of the members of one output element, row-major over the reduced dims: for a
/// walk that visits them one at a time (`member(offset)`).
template <class Member>
void for_each_member(const reduction_plan& p, Member&& member) {
  for_each_line(p.reduced_shape, p.reduced_in, p.reduced_in,
                [&](std::ptrdiff_t i, std::ptrdiff_t, std::size_t n, std::ptrdiff_t is, std::ptrdiff_t) {
                  for (std::size_t k = 0; k < n; ++k) member(i + static_cast<std::ptrdiff_t>(k) * is);
                });
}

/// Each output element's members as one evenly spaced row: `in` itself when the reduced dims
/// merged into one (or none), else a copy with the kept dims first and the reduced ones last,
/// in their order (members stay in row-major order, now adjacent).
template <class T>
struct member_rows {
  strided_block<T> kept;  // data: the first member of output element 0; strides over the kept dims
  std::ptrdiff_t step;    // between consecutive members
  std::size_t count;
  xt::xarray<T> storage;
};

template <class T>
member_rows<T> rows_of(const strided_block<T>& in, const reduction_plan& p, std::span<const std::size_t> dims) {
  member_rows<T> r{{in.data, p.kept_shape, p.kept_in}, p.reduced_in.empty() ? 0 : p.reduced_in[0], p.count, empty_array<T>()};
  if (p.reduced_shape.size() <= 1) return r;
  dims_t order;  // kept dims, then reduced ones, as the copy lays them out
  for (std::size_t k = 0; k < in.shape.size(); ++k)
    if (std::find(dims.begin(), dims.end(), k) == dims.end()) order.push_back(k);
  for (std::size_t d : dims) order.push_back(d);
  dims_t shape;
  strides_t strides;
  for (std::size_t k : order) shape.push_back(in.shape[k]), strides.push_back(in.strides[k]);
  r.storage = uninitialized_array<T>(shape);
  copy_strided(strided_block<T>{in.data, shape, strides}, r.storage.data());
  const auto copied = row_major_strides(shape);
  r.kept = {r.storage.data(), p.kept_shape, strides_t(copied.begin(), copied.begin() + static_cast<std::ptrdiff_t>(p.kept_shape.size()))};
  r.step = 1;
  return r;
}

/// Calls `row(first, step, count, out_offset)` for every output element, row-major over the
/// kept dims. With no members (an empty reduced dim) `first` is not to be read, and the data
/// may be null, so no offset is applied to it.
template <class T, class Row>
void for_each_row(const member_rows<T>& r, Row&& row) {
  const auto out_strides = row_major_strides(r.kept.shape);
  for_each_line(r.kept.shape, r.kept.strides, out_strides,
                [&](std::ptrdiff_t i, std::ptrdiff_t o, std::size_t n, std::ptrdiff_t is, std::ptrdiff_t os) {
                  for (std::size_t k = 0; k < n; ++k)
                    row(r.count == 0 ? r.kept.data : r.kept.data + i + static_cast<std::ptrdiff_t>(k) * is, r.step,
                        r.count, o + static_cast<std::ptrdiff_t>(k) * os);
                });
}

/// Output elements per tile of a line fold: the partial results stay in L2 while every member
/// is folded in.
template <class T>
inline constexpr std::size_t fold_tile = (std::size_t{64} << 10) / sizeof(T);

/// Folds lines of members into lines of outputs when a kept dim is the one the input steps
/// through fastest (a reduction over a leading dim): the output is built in the input's
/// order (`scratch`), a member at a time over a tile of a line, with the SIMD fold of the
/// collectives; then laid out row-major.
template <class T, class Op>
void fold_along_kept(const strided_block<T>& in, const reduction_plan& p, T* out, Op op) {
  dims_t order(p.kept_shape.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return magnitude(p.kept_in[a]) > magnitude(p.kept_in[b]); });
  dims_t scratch_shape;
  for (std::size_t k : order) scratch_shape.push_back(p.kept_shape[k]);
  const bool in_place = std::is_sorted(order.begin(), order.end());
  xt::xarray<T> scratch = in_place ? empty_array<T>() : uninitialized_array<T>(scratch_shape);
  T* target = in_place ? out : scratch.data();
  const auto scratch_rm = row_major_strides(scratch_shape);
  strides_t scratch_strides(order.size());  // along each kept dim, in payload order
  for (std::size_t j = 0; j < order.size(); ++j) scratch_strides[order[j]] = scratch_rm[j];
  const std::span<const std::ptrdiff_t> layouts[] = {scratch_strides, p.kept_in};
  const auto nest = output_order<2>(p.kept_shape, layouts);
  for_each_line(nest.shape, nest.strides[1], nest.strides[0],
                [&](std::ptrdiff_t i, std::ptrdiff_t o, std::size_t n, std::ptrdiff_t is, std::ptrdiff_t os) {
                  for (std::size_t start = 0; start < n; start += fold_tile<T>) {
                    const std::size_t len = std::min(fold_tile<T>, n - start);
                    const auto skip = static_cast<std::ptrdiff_t>(start);
                    T* b = target + o + skip * os;
                    const T* a0 = in.data + i + skip * is;
                    bool first = true;
                    for_each_member(p, [&](std::ptrdiff_t m) {
                      const T* a = a0 + m;
                      if (first && is == 1 && os == 1) std::copy(a, a + len, b);
                      else if (first) for (std::ptrdiff_t k = 0; k < static_cast<std::ptrdiff_t>(len); ++k) b[k * os] = a[k * is];
                      else if (is == 1 && os == 1) fold_line(b, a, len, op);
                      else for (std::ptrdiff_t k = 0; k < static_cast<std::ptrdiff_t>(len); ++k) b[k * os] = op(b[k * os], a[k * is]);
                      first = false;
                    });
                  }
                });
  if (!in_place) copy_strided(strided_block<T>{scratch.data(), p.kept_shape, scratch_strides}, out);
}

/// The fold of `op` over the positional dims `dims` of a block: row-major over the kept dims
/// (payload order, the trailing vectorized dims among them). Each element folds its members
/// in row-major order over `dims`; an empty reduction gives the operation's identity.
template <class T, class Op>
xt::xarray<T> fold_dims(const strided_block<T>& in, std::span<const std::size_t> dims, Op op) {
  const auto p = plan_reduction(in, dims);
  auto out = uninitialized_array<T>(p.kept_shape);
  if (out.size() == 0) return out;
  if (p.count == 0) {
    std::fill(out.begin(), out.end(), Op::template identity<T>());
    return out;
  }
  std::ptrdiff_t fastest_kept = 0, fastest_reduced = 0;
  for (std::size_t k = 0; k < p.kept_shape.size(); ++k)
    if (p.kept_shape[k] > 1 && (fastest_kept == 0 || magnitude(p.kept_in[k]) < fastest_kept)) fastest_kept = magnitude(p.kept_in[k]);
  for (auto s : p.reduced_in)
    if (fastest_reduced == 0 || magnitude(s) < fastest_reduced) fastest_reduced = magnitude(s);
  if (fastest_kept != 0 && fastest_reduced != 0 && fastest_kept < fastest_reduced) {
    fold_along_kept(in, p, out.data(), op);
    return out;
  }
  // Members closer together than output elements: each element folds its row, several rows at
  // a time in SIMD lanes when the members are adjacent.
  const auto r = rows_of(in, p, dims);
  const auto out_strides = row_major_strides(p.kept_shape);
  const std::span<const std::ptrdiff_t> layouts[] = {out_strides, r.kept.strides};
  const auto nest = output_order<2>(p.kept_shape, layouts);
  for_each_line(nest.shape, nest.strides[1], nest.strides[0],
                [&](std::ptrdiff_t i, std::ptrdiff_t o, std::size_t n, std::ptrdiff_t is, std::ptrdiff_t os) {
                  if (r.step == 1) return fold_adjacent(r.kept.data + i, is, n, r.count, out.data() + o, os, op);
                  for (std::size_t k = 0; k < n; ++k)
                    out.data()[o + static_cast<std::ptrdiff_t>(k) * os] =
                        fold_group(r.kept.data + i + static_cast<std::ptrdiff_t>(k) * is, r.step, r.count, op);
                });
  return out;
}

/// Whether `v`, met after `best`, takes its place in argmax (`Max`) or argmin: strictly
/// better, so ties keep the lower index; the first NaN wins and stays, as in JAX.
template <bool Max, class T>
bool replaces(T v, T best) {
  if constexpr (std::is_floating_point_v<T>) {
    if (best != best) return false;
    if (v != v) return true;
  }
  if constexpr (Max) return best < v;
  else return v < best;
}

template <bool Max, class T>
xt::xarray<std::int32_t> arg_extremum(const strided_block<T>& in, std::span<const std::size_t> dims) {
  const auto p = plan_reduction(in, dims);
  auto out = uninitialized_array<std::int32_t>(p.kept_shape);
  const auto r = rows_of(in, p, dims);
  for_each_row(r, [&](const T* a, std::ptrdiff_t step, std::size_t count, std::ptrdiff_t o) {
    T best = a[0];
    std::size_t at = 0;
    for (std::size_t m = 1; m < count; ++m) {
      const T v = a[static_cast<std::ptrdiff_t>(m) * step];
      if (replaces<Max>(v, best)) best = v, at = m;
    }
    out.data()[o] = static_cast<std::int32_t>(at);
  });
  return out;
}

/// log(sum(exp(x - m))) + m with m the max, replaced by 0 where it is not finite, as
/// jax.nn.logsumexp: exact for rows of -inf, and no overflow.
template <class T>
xt::xarray<T> logsumexp_dims(const strided_block<T>& in, std::span<const std::size_t> dims) {
  const auto p = plan_reduction(in, dims);
  auto out = uninitialized_array<T>(p.kept_shape);
  const auto r = rows_of(in, p, dims);
  for_each_row(r, [&](const T* a, std::ptrdiff_t step, std::size_t count, std::ptrdiff_t o) {
    T m = max_op::identity<T>();
    for (std::size_t k = 0; k < count; ++k) m = max_op{}(m, a[static_cast<std::ptrdiff_t>(k) * step]);
    if (!std::isfinite(m)) m = 0;
    T s = 0;
    for (std::size_t k = 0; k < count; ++k) s += std::exp(a[static_cast<std::ptrdiff_t>(k) * step] - m);
    out.data()[o] = std::log(std::abs(s)) + m;
  });
  return out;
}

// ---- operations along one dim (scans, softmax, sorts) ----

/// An output laid out like its input: dims in the order of decreasing input strides, so that a
/// walk in the input's order writes it contiguously (under vmap the mapped dim comes first).
template <class U>
struct like_layout {
  xt::xarray<U> storage;
  strides_t strides;               // along each payload dim
  std::vector<std::size_t> order;  // payload dims, outermost first in storage
};

template <class U>
like_layout<U> allocate_like(std::span<const std::size_t> shape, std::span<const std::ptrdiff_t> in_strides) {
  like_layout<U> l;
  l.order.resize(shape.size());
  std::iota(l.order.begin(), l.order.end(), std::size_t{0});
  std::stable_sort(l.order.begin(), l.order.end(),
                   [&](std::size_t a, std::size_t b) { return magnitude(in_strides[a]) > magnitude(in_strides[b]); });
  dims_t storage_shape;
  for (std::size_t k : l.order) storage_shape.push_back(shape[k]);
  l.storage = uninitialized_array<U>(storage_shape);
  const auto rm = row_major_strides(storage_shape);
  l.strides.resize(shape.size());
  for (std::size_t j = 0; j < l.order.size(); ++j) l.strides[l.order[j]] = rm[j];
  return l;
}

/// The payload of a result laid out like its input: its storage seen in payload order.
template <class U>
auto like_payload(like_layout<U>&& l) {
  std::vector<std::size_t> view(l.order.size());  // the storage dim of each payload dim
  for (std::size_t j = 0; j < l.order.size(); ++j) view[l.order[j]] = j;
  return xt::transpose(share_array(std::move(l.storage)), std::move(view));
}
template <class U>
using like_payload_t = decltype(like_payload(std::declval<like_layout<U>>()));

/// Calls `panel(in, o, in_step, in_col, out_step, out_col, n, width)` over the whole block:
/// `width` columns (1 when the dim is the one the input steps through fastest), each a line of
/// `n` elements along `dim`, at `in + j * in_step + c * in_col` and output offset
/// `o + j * out_step + c * out_col`. Panels of several columns (at most `widest`) keep the
/// SIMD lanes and the cache busy when the dim is not the innermost one.
template <class T, class Panel>
void for_each_panel(const strided_block<T>& in, std::size_t dim, std::span<const std::ptrdiff_t> out_strides,
                    std::size_t out_extent, std::size_t widest, Panel&& panel) {
  dims_t shape = in.shape;
  const std::size_t n = shape[dim];
  if (n == 0 || out_extent == 0) return;
  shape[dim] = 1;
  const std::ptrdiff_t sd = n == 1 ? 0 : in.strides[dim], od = out_strides[dim];
  const std::span<const std::ptrdiff_t> layouts[] = {out_strides, in.strides};
  const auto nest = output_order<2>(shape, layouts);
  if (nest.empty) return;
  for_each_line(nest.shape, nest.strides[1], nest.strides[0],
                [&](std::ptrdiff_t i, std::ptrdiff_t o, std::size_t w, std::ptrdiff_t is, std::ptrdiff_t os) {
                  if (w > 1 && (sd == 0 || magnitude(is) < magnitude(sd))) {
                    for (std::size_t c = 0; c < w; c += widest)
                      panel(in.data + i + static_cast<std::ptrdiff_t>(c) * is, o + static_cast<std::ptrdiff_t>(c) * os, sd, is,
                            od, os, n, std::min(widest, w - c));
                    return;
                  }
                  for (std::size_t c = 0; c < w; ++c)
                    panel(in.data + i + static_cast<std::ptrdiff_t>(c) * is, o + static_cast<std::ptrdiff_t>(c) * os, sd,
                          std::ptrdiff_t{0}, od, std::ptrdiff_t{0}, n, std::size_t{1});
                });
}

/// Calls `line(step_in, step_out)` with both steps as compile-time 1 when the line is
/// contiguous on both sides (the common case, whose loops the compiler then keeps tight),
/// else as they are.
template <class Line>
void with_steps(std::ptrdiff_t in_step, std::ptrdiff_t out_step, Line&& line) {
  using one = std::integral_constant<std::ptrdiff_t, 1>;
  if (in_step == 1 && out_step == 1) line(one{}, one{});
  else line(in_step, out_step);
}

/// An inclusive scan of one line: the running fold in index order.
template <class T, class Op, class In, class Out>
void scan_line(const T* a, In sd, T* b, Out od, std::size_t n, Op op) {
  T acc = a[0];
  b[0] = acc;
  for (std::size_t j = 1; j < n; ++j) {
    acc = op(acc, a[static_cast<std::ptrdiff_t>(j) * sd]);
    b[static_cast<std::ptrdiff_t>(j) * od] = acc;
  }
}

/// Inclusive scan: out[j] = op(out[j - 1], in[j]), element by element of a panel's columns.
template <class T, class Op>
like_layout<T> scan_dim(const strided_block<T>& in, std::size_t dim, Op op) {
  auto out = allocate_like<T>(in.shape, in.strides);
  T* to = out.storage.data();
  // Whole rows: one sequential pass over the block, as a hand-written loop makes.
  for_each_panel(in, dim, out.strides, 1, std::numeric_limits<std::size_t>::max(),
                 [&](const T* a, std::ptrdiff_t o, std::ptrdiff_t sd, std::ptrdiff_t is, std::ptrdiff_t od,
                     std::ptrdiff_t os, std::size_t n, std::size_t w) {
                   T* b = to + o;
                   if (w == 1) return with_steps(sd, od, [&](auto si, auto so) { scan_line(a, si, b, so, n, op); });
                   for (std::size_t c = 0; c < w; ++c) b[static_cast<std::ptrdiff_t>(c) * os] = a[static_cast<std::ptrdiff_t>(c) * is];
                   for (std::size_t j = 1; j < n; ++j) {
                     const T* row = a + static_cast<std::ptrdiff_t>(j) * sd;
                     T* into = b + static_cast<std::ptrdiff_t>(j) * od;
                     const T* prev = into - od;
                     if (is == 1 && os == 1)
                       for (std::size_t c = 0; c < w; ++c) into[c] = op(prev[c], row[c]);
                     else
                       for (std::size_t c = 0; c < w; ++c) {
                         const auto ci = static_cast<std::ptrdiff_t>(c);
                         into[ci * os] = op(prev[ci * os], row[ci * is]);
                       }
                   }
                 });
  return out;
}

/// jax.nn.softmax (`Log` false): exp(x - max) / sum(exp(x - max)); jax.nn.log_softmax (`Log`
/// true): (x - max) - log(sum(exp(x - max))). The max is subtracted for stability; sums run
/// in index order.
template <bool Log, class T, class In, class Out>
void softmax_line(const T* a, In sd, T* b, Out od, std::size_t n) {
  auto in = [&](std::size_t j) { return a[static_cast<std::ptrdiff_t>(j) * sd]; };
  auto out = [&](std::size_t j) -> T& { return b[static_cast<std::ptrdiff_t>(j) * od]; };
  T m = max_op::identity<T>();
  for (std::size_t j = 0; j < n; ++j) m = max_op{}(m, in(j));
  T s = 0;
  for (std::size_t j = 0; j < n; ++j) {
    const T shifted = in(j) - m;
    const T e = std::exp(shifted);
    out(j) = Log ? shifted : e;
    s += e;
  }
  if constexpr (Log) {
    const T log_s = std::log(s);
    for (std::size_t j = 0; j < n; ++j) out(j) = out(j) - log_s;
  } else {
    for (std::size_t j = 0; j < n; ++j) out(j) = out(j) / s;
  }
}

template <bool Log, class T>
like_layout<T> softmax_dim(const strided_block<T>& in, std::size_t dim) {
  auto out = allocate_like<T>(in.shape, in.strides);
  T* to = out.storage.data();
  std::vector<T> m, s;
  // Panels of 512 columns: their running maxima and sums stay in L1.
  for_each_panel(in, dim, out.strides, 1, 512,
                 [&](const T* a, std::ptrdiff_t o, std::ptrdiff_t sd, std::ptrdiff_t is, std::ptrdiff_t od,
                     std::ptrdiff_t os, std::size_t n, std::size_t w) {
                   if (w == 1)
                     return with_steps(sd, od, [&](auto si, auto so) { softmax_line<Log>(a, si, to + o, so, n); });
                   m.assign(w, max_op::identity<T>());
                   s.assign(w, T{0});
                   T* b = to + o;
                   auto at = [](auto* p, std::size_t j, std::ptrdiff_t step, std::size_t c, std::ptrdiff_t col) -> auto& {
                     return p[static_cast<std::ptrdiff_t>(j) * step + static_cast<std::ptrdiff_t>(c) * col];
                   };
                   for (std::size_t j = 0; j < n; ++j)
                     for (std::size_t c = 0; c < w; ++c) m[c] = max_op{}(m[c], at(a, j, sd, c, is));
                   for (std::size_t j = 0; j < n; ++j)
                     for (std::size_t c = 0; c < w; ++c) {
                       const T shifted = at(a, j, sd, c, is) - m[c];
                       const T e = std::exp(shifted);
                       at(b, j, od, c, os) = Log ? shifted : e;
                       s[c] += e;
                     }
                   if constexpr (Log)
                     for (std::size_t c = 0; c < w; ++c) s[c] = std::log(s[c]);
                   for (std::size_t j = 0; j < n; ++j)
                     for (std::size_t c = 0; c < w; ++c) {
                       T& v = at(b, j, od, c, os);
                       v = Log ? v - s[c] : v / s[c];
                     }
                 });
  return out;
}

/// The order of a sort: NaN after every number, -0 equal to +0 (as lax.sort compares).
template <class T>
bool sorts_before(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (b != b) return a == a;
    if (a != a) return false;
  }
  return a < b;
}

/// Sorts each line along `dim` (stable); with `Indices` the output is the permutation
/// (argsort), else the values.
template <bool Indices, class T>
like_layout<std::conditional_t<Indices, std::int32_t, T>> sort_dim(const strided_block<T>& in, std::size_t dim) {
  using U = std::conditional_t<Indices, std::int32_t, T>;
  auto out = allocate_like<U>(in.shape, in.strides);
  U* to = out.storage.data();
  std::vector<std::int32_t> index;
  for_each_panel(in, dim, out.strides, 1, 1,
                 [&](const T* a, std::ptrdiff_t o, std::ptrdiff_t sd, std::ptrdiff_t is, std::ptrdiff_t od,
                     std::ptrdiff_t os, std::size_t n, std::size_t w) {
                   for (std::size_t c = 0; c < w; ++c) {
                     const T* line = a + static_cast<std::ptrdiff_t>(c) * is;
                     index.resize(n);
                     std::iota(index.begin(), index.end(), 0);
                     std::stable_sort(index.begin(), index.end(), [&](std::int32_t x, std::int32_t y) {
                       return sorts_before(line[x * sd], line[y * sd]);
                     });
                     U* b = to + o + static_cast<std::ptrdiff_t>(c) * os;
                     for (std::size_t j = 0; j < n; ++j) {
                       if constexpr (Indices) b[static_cast<std::ptrdiff_t>(j) * od] = index[j];
                       else b[static_cast<std::ptrdiff_t>(j) * od] = line[index[j] * sd];
                     }
                   }
                 });
  return out;
}

/// lax.top_k along the last positional dim: the k largest, descending, NaN largest, ties to
/// the lower index.
template <class T>
std::pair<like_layout<T>, like_layout<std::int32_t>> top_k_dim(const strided_block<T>& in, std::size_t dim,
                                                                std::size_t k) {
  dims_t shape = in.shape;
  shape[dim] = k;
  auto values = allocate_like<T>(shape, in.strides);
  auto indices = allocate_like<std::int32_t>(shape, in.strides);
  std::vector<std::int32_t> index;
  for_each_panel(in, dim, values.strides, k, 1,
                 [&](const T* a, std::ptrdiff_t o, std::ptrdiff_t sd, std::ptrdiff_t is, std::ptrdiff_t od,
                     std::ptrdiff_t os, std::size_t n, std::size_t w) {
                   for (std::size_t c = 0; c < w; ++c) {
                     const T* line = a + static_cast<std::ptrdiff_t>(c) * is;
                     index.resize(n);
                     std::iota(index.begin(), index.end(), 0);
                     // (value, index) pairs are all distinct, so the first k are one set in one order.
                     std::partial_sort(index.begin(), index.begin() + static_cast<std::ptrdiff_t>(k), index.end(),
                                       [&](std::int32_t x, std::int32_t y) {
                                         const T u = line[x * sd], v = line[y * sd];
                                         if (sorts_before(v, u)) return true;
                                         return !sorts_before(u, v) && x < y;
                                       });
                     const std::ptrdiff_t at = o + static_cast<std::ptrdiff_t>(c) * os;
                     for (std::size_t j = 0; j < k; ++j) {
                       values.storage.data()[at + static_cast<std::ptrdiff_t>(j) * od] = line[index[j] * sd];
                       indices.storage.data()[at + static_cast<std::ptrdiff_t>(j) * od] = index[j];
                     }
                   }
                 });
  return {std::move(values), std::move(indices)};
}

// ---- the verbs on named values ----

/// The positional shape of a resolved named value (its payload without the vectorized dims).
template <class Y>
std::vector<std::size_t> positional_shape(const Y& y) {
  return y.shape();
}

template <class Y, class U>
auto named_like(xt::xarray<U>&& a) {
  return make_named<shared_array<U>, typename Y::env_type, Y::varying>(share_array(std::move(a)));
}
template <class Y, class U>
auto named_like(like_layout<U>&& l) {
  return make_named<like_payload_t<U>, typename Y::env_type, Y::varying>(like_payload(std::move(l)));
}

/// With keepdims, the reduced dims come back with size 1 (the kept ones keep their places).
template <class U>
void keep_reduced_dims(xt::xarray<U>& a, std::span<const std::size_t> payload_shape, std::span<const std::size_t> dims) {
  std::vector<std::size_t> shape(payload_shape.begin(), payload_shape.end());
  for (std::size_t d : dims) shape[d] = 1;
  a.reshape(shape);
}

enum class local_kind { sum, prod, mean, max, min, any, all, argmax, argmin, logsumexp };

inline constexpr std::string_view name_of(local_kind k) {
  constexpr std::string_view names[] = {"sum", "prod", "mean", "max", "min", "any", "all", "argmax", "argmin", "logsumexp"};
  return names[static_cast<int>(k)];
}

/// The element type a reduction reads its input as.
template <local_kind K, class V>
using read_as_t = std::conditional_t<
    K == local_kind::sum || K == local_kind::prod, sum_accumulate_t<V>,
    std::conditional_t<K == local_kind::mean || K == local_kind::logsumexp, inexact_t<V>,
                       std::conditional_t<K == local_kind::any || K == local_kind::all, bool, V>>>;

template <local_kind K, class T>
auto reduce_block(const strided_block<T>& in, std::span<const std::size_t> dims, std::size_t count) {
  if constexpr (K == local_kind::sum) return fold_dims(in, dims, sum_op{});
  else if constexpr (K == local_kind::prod) return fold_dims(in, dims, prod_op{});
  else if constexpr (K == local_kind::max || K == local_kind::any) return fold_dims(in, dims, max_op{});
  else if constexpr (K == local_kind::min || K == local_kind::all) return fold_dims(in, dims, min_op{});
  else if constexpr (K == local_kind::argmax) return arg_extremum<true>(in, dims);
  else if constexpr (K == local_kind::argmin) return arg_extremum<false>(in, dims);
  else if constexpr (K == local_kind::logsumexp) return logsumexp_dims(in, dims);
  else {  // mean: the sum in the result type, divided by the count there, as jnp.mean
    auto a = fold_dims(in, dims, sum_op{});
    const T n = static_cast<T>(count);
    for (T& v : a) v = v / n;
    return a;
  }
}

/// A reduction over positional dims: the result varies along what the operand varies along.
template <local_kind K>
struct reduce_fn {
  dim_list dims;
  bool keepdims;

  template <NamedValue Y>
  auto operator()(const Y& y) const {
    using T = read_as_t<K, typename Y::value_type>;
    constexpr std::string_view verb = name_of(K);
    const auto shape = positional_shape(y);
    const auto dims_given = canonical_dims(verb, dims, shape);
    const auto walk = sorted_dims(dims_given);
    std::size_t count = 1;
    for (std::size_t d : walk) count *= shape[d];
    constexpr bool needs_members = K == local_kind::max || K == local_kind::min || K == local_kind::argmax ||
                                   K == local_kind::argmin;
    if constexpr (needs_members) {
      for (std::size_t d : walk)
        if (shape[d] == 0)
          fail("namedax::", verb, ": dim ", d, " of positional shape ", shape, " is empty and ", verb,
               " has no identity; reduce a non-empty dim, or mask the value first");
    }
    xt::xarray<T> storage = empty_array<T>();
    const strided_block<T> in = block_in_memory<T>(y.payload(), storage);
    auto a = reduce_block<K>(in, walk, count);
    if (keepdims) {
      const std::vector<std::size_t> payload_shape(in.shape.begin(), in.shape.end());
      keep_reduced_dims(a, payload_shape, walk);
    }
    return named_like<Y>(std::move(a));
  }
};

template <local_kind K, class X>
auto reduce(const X& x, dim_list dims, bool keepdims) {
  return when_resolved(reduce_fn<K>{std::move(dims), keepdims}, x);
}

/// The one dim of an operation along a dim, checked against the positional shape.
inline std::size_t canonical_dim(std::string_view verb, int dim, std::span<const std::size_t> shape) {
  return canonical_dims(verb, dim_list{{dim}}, shape)[0];
}

/// The payload, flattened over its positional dims (jnp's axis=None for scans).
template <class T>
xt::xarray<T> flattened(const strided_block<T>& in, std::size_t rank) {
  auto a = uninitialized_array<T>(in.shape);
  copy_strided(in, a.data());
  std::vector<std::size_t> shape{1};
  for (std::size_t k = 0; k < in.shape.size(); ++k) {
    if (k < rank) shape[0] *= in.shape[k];
    else shape.push_back(in.shape[k]);
  }
  a.reshape(shape);
  return a;
}

enum class scan_kind { cumsum, cumprod };

template <scan_kind K>
struct scan_fn {
  int dim;
  bool flatten;

  template <NamedValue Y>
  auto operator()(const Y& y) const {
    using T = sum_accumulate_t<typename Y::value_type>;
    constexpr std::string_view verb = K == scan_kind::cumsum ? "cumsum" : "cumprod";
    const auto shape = positional_shape(y);
    xt::xarray<T> storage = empty_array<T>();
    strided_block<T> in = block_in_memory<T>(y.payload(), storage);
    std::size_t d = 0;
    if (flatten) {
      storage = flattened(in, shape.size());
      in = block_of(storage);
    } else {
      d = canonical_dim(verb, dim, shape);
    }
    if constexpr (K == scan_kind::cumsum) return named_like<Y>(scan_dim(in, d, sum_op{}));
    else return named_like<Y>(scan_dim(in, d, prod_op{}));
  }
};

template <bool Log>
struct softmax_fn {
  int dim;

  template <NamedValue Y>
  auto operator()(const Y& y) const {
    using T = inexact_t<typename Y::value_type>;
    const std::size_t d = canonical_dim(Log ? "log_softmax" : "softmax", dim, positional_shape(y));
    xt::xarray<T> storage = empty_array<T>();
    return named_like<Y>(softmax_dim<Log>(block_in_memory<T>(y.payload(), storage), d));
  }
};

template <bool Indices>
struct sort_fn {
  int dim;

  template <NamedValue Y>
  auto operator()(const Y& y) const {
    using T = typename Y::value_type;
    const std::size_t d = canonical_dim(Indices ? "argsort" : "sort", dim, positional_shape(y));
    xt::xarray<T> storage = empty_array<T>();
    return named_like<Y>(sort_dim<Indices>(block_in_memory<T>(y.payload(), storage), d));
  }
};

struct top_k_fn {
  long long k;

  template <NamedValue Y>
  auto operator()(const Y& y) const {
    using T = typename Y::value_type;
    const auto shape = positional_shape(y);
    if (shape.empty())
      fail("namedax::top_k: the value has no positional dim; top_k selects along the last positional dim, so give "
           "it a vector or more");
    const std::size_t n = shape.back();
    if (k < 0 || static_cast<unsigned long long>(k) > n)
      fail("namedax::top_k: k = ", k, " is out of range for a last dim of size ", n, " (positional shape ", shape,
           "); use 0 <= k <= ", n);
    xt::xarray<T> storage = empty_array<T>();
    auto [values, indices] = top_k_dim(block_in_memory<T>(y.payload(), storage), shape.size() - 1, static_cast<std::size_t>(k));
    return std::pair{named_like<Y>(std::move(values)), named_like<Y>(std::move(indices))};
  }
};

#if NAMEDAX_DEFINITIONS  // the bodies of the functions declared above (see detail/compilation.hpp)
NAMEDAX_DECL std::vector<std::size_t> canonical_dims(std::string_view verb, const dim_list& list,
                                                     std::span<const std::size_t> shape) {
  const auto rank = static_cast<int>(shape.size());
  std::vector<std::size_t> out;
  if (list.all) {
    out.resize(shape.size());
    std::iota(out.begin(), out.end(), std::size_t{0});
    return out;
  }
  for (int d : list.dims) {
    const int k = d < 0 ? d + rank : d;
    if (k < 0 || k >= rank)
      fail("namedax::", verb, ": dim ", d, " is out of range for a value of positional shape ",
           std::vector<std::size_t>(shape.begin(), shape.end()), "; use a dim in [", -rank, ", ", rank, ")");
    if (std::find(out.begin(), out.end(), static_cast<std::size_t>(k)) != out.end())
      fail("namedax::", verb, ": dim ", d, " is given twice; list each dim once");
    out.push_back(static_cast<std::size_t>(k));
  }
  return out;
}

NAMEDAX_DECL std::vector<std::size_t> sorted_dims(std::vector<std::size_t> dims) {
  std::sort(dims.begin(), dims.end());
  return dims;
}
#endif  // NAMEDAX_DEFINITIONS

// The kernels of the common element types, compiled once with the library: a unit calls them.
// Reductions and cumsum of the four element types; products, sorts, top_k and the softmaxes of
// float and double only (what else a unit uses, it compiles itself).
#ifdef NAMEDAX_SEPARATE_COMPILATION  // defined once, by <namedax/separate_compilation.hpp>
#define NAMEDAX_INSTANTIATE_FOLD(T, Op) \
  NAMEDAX_EXTERN template xt::xarray<T> fold_dims<T, Op>(const strided_block<T>&, std::span<const std::size_t>, Op);
#define NAMEDAX_INSTANTIATE(T)                                                                                \
  NAMEDAX_EXTERN template xt::xarray<std::int32_t> arg_extremum<true, T>(const strided_block<T>&,           \
                                                                         std::span<const std::size_t>);     \
  NAMEDAX_EXTERN template xt::xarray<std::int32_t> arg_extremum<false, T>(const strided_block<T>&,          \
                                                                          std::span<const std::size_t>);    \
  NAMEDAX_EXTERN template like_layout<T> scan_dim<T, sum_op>(const strided_block<T>&, std::size_t, sum_op);
#define NAMEDAX_INSTANTIATE_INEXACT(T)                                                                          \
  NAMEDAX_INSTANTIATE_FOLD(T, prod_op)                                                                          \
  NAMEDAX_EXTERN template like_layout<T> scan_dim<T, prod_op>(const strided_block<T>&, std::size_t, prod_op);   \
  NAMEDAX_EXTERN template like_layout<T> sort_dim<false, T>(const strided_block<T>&, std::size_t);              \
  NAMEDAX_EXTERN template like_layout<std::int32_t> sort_dim<true, T>(const strided_block<T>&, std::size_t);    \
  NAMEDAX_EXTERN template std::pair<like_layout<T>, like_layout<std::int32_t>> top_k_dim<T>(                    \
      const strided_block<T>&, std::size_t, std::size_t);                                                       \
  NAMEDAX_EXTERN template xt::xarray<T> logsumexp_dims<T>(const strided_block<T>&, std::span<const std::size_t>); \
  NAMEDAX_EXTERN template like_layout<T> softmax_dim<false, T>(const strided_block<T>&, std::size_t);            \
  NAMEDAX_EXTERN template like_layout<T> softmax_dim<true, T>(const strided_block<T>&, std::size_t);
NAMEDAX_FOR_EACH_ELEMENT_FOLD(NAMEDAX_INSTANTIATE_FOLD)
NAMEDAX_FOR_EACH_ELEMENT_TYPE(NAMEDAX_INSTANTIATE)
NAMEDAX_INSTANTIATE_INEXACT(float)
NAMEDAX_INSTANTIATE_INEXACT(double)
NAMEDAX_INSTANTIATE_FOLD(bool, max_op)  // any
NAMEDAX_INSTANTIATE_FOLD(bool, min_op)  // all
#undef NAMEDAX_INSTANTIATE_FOLD
#undef NAMEDAX_INSTANTIATE
#undef NAMEDAX_INSTANTIATE_INEXACT
#endif

}  // namespace namedax::detail
