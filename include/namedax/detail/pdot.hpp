// SPDX-License-Identifier: MIT
// pdot's positional part, the same on every caller: a dot_general of two payloads that share
// their trailing vectorized dims (broadcast by name); the named contraction is a psum after it.
// IWYU pragma: private, include <namedax/namedax.hpp>
#pragma once

#include <namedax/detail/blas.hpp>
#include <namedax/detail/collective_frame.hpp>

#include <utility>

namespace namedax::detail {

/// Pairs of positional dims of x and y, as JAX's ((x dims...), (y dims...)).
using dimension_pairs = std::pair<std::vector<int>, std::vector<int>>;

/// out[batch..., x free..., y free..., vectorized...] = sum over the contracted dims, in
/// row-major order of them, of x * y. `x` and `y` have `x_rank` and `y_rank` positional dims
/// followed by the same number of vectorized dims (each of size n or 1). Two float or two
/// double operands go through gemm, one call per batch item (positional batch dims and vectorized dims alike),
/// which sums in its own order; other types sum in row-major order of the contracted dims.
/// `on_device`: called on a pmap device thread.
template <class T, class X, class Y>
xt::xarray<T> dot_general(std::string_view verb, const strided_block<X>& x, std::size_t x_rank,
                          const strided_block<Y>& y, std::size_t y_rank, const dimension_pairs& contract,
                          const dimension_pairs& batch, bool on_device = false) {
  if (contract.first.size() != contract.second.size() || batch.first.size() != batch.second.size())
    fail("namedax::", verb, ": pos_contract and pos_batch need as many dims of x as of y; got contract ", contract,
         " and batch ", batch);
  auto canonical = [&](int d, std::size_t rank, const char* which) {
    const int c = d < 0 ? d + static_cast<int>(rank) : d;
    if (c < 0 || c >= static_cast<int>(rank))
      fail("namedax::", verb, ": dimension ", d, " of ", which, " is out of range for positional rank ", rank);
    return static_cast<std::size_t>(c);
  };
  std::vector<bool> x_used(x_rank, false), y_used(y_rank, false);
  std::vector<std::size_t> shape, contract_shape;
  std::vector<std::ptrdiff_t> xs, ys, xc, yc;  // strides along output dims, and along contracted dims
  auto pair_up = [&](const dimension_pairs& pairs, bool contracted) {
    for (std::size_t k = 0; k < pairs.first.size(); ++k) {
      const std::size_t a = canonical(pairs.first[k], x_rank, "x"), b = canonical(pairs.second[k], y_rank, "y");
      if (x_used[a] || y_used[b]) fail("namedax::", verb, ": dimension ", pairs.first[k], " of x or ", pairs.second[k], " of y is used twice");
      x_used[a] = y_used[b] = true;
      if (x.shape[a] != y.shape[b])
        fail("namedax::", verb, ": ", contracted ? "contracting" : "batch", " dimension ", a, " of x (size ", x.shape[a],
             ") does not match dimension ", b, " of y (size ", y.shape[b], ")");
      (contracted ? contract_shape : shape).push_back(x.shape[a]);
      (contracted ? xc : xs).push_back(x.strides[a]);
      (contracted ? yc : ys).push_back(y.strides[b]);
    }
  };
  pair_up(batch, false);
  pair_up(contract, true);
  for (std::size_t a = 0; a < x_rank; ++a)
    if (!x_used[a]) shape.push_back(x.shape[a]), xs.push_back(x.strides[a]), ys.push_back(0);
  for (std::size_t b = 0; b < y_rank; ++b)
    if (!y_used[b]) shape.push_back(y.shape[b]), xs.push_back(0), ys.push_back(y.strides[b]);
  for (std::size_t v = 0; v + x_rank < x.shape.size(); ++v) {
    const std::size_t nx = x.shape[x_rank + v], ny = y.shape[y_rank + v];
    shape.push_back(broadcast_extent(nx, ny));
    xs.push_back(nx == 1 ? 0 : x.strides[x_rank + v]);
    ys.push_back(ny == 1 ? 0 : y.strides[y_rank + v]);
  }

  auto out = uninitialized_array<T>(shape);  // every element is written; a recycled array has its pages
  const auto out_strides = row_major_strides(shape);
  if constexpr (GemmScalar<T> && std::is_same_v<X, T> && std::is_same_v<Y, T>) {
    // The output's dims: batch pairs, x's free dims (M), y's free dims (N), vectorized dims.
    const std::size_t free_x_end = x_rank - contract.first.size();
    const std::size_t free_y_end = free_x_end + y_rank - batch.first.size() - contract.first.size();
    gemm_problem p;
    for (std::size_t d = 0; d < shape.size(); ++d) {
      const gemm_dim g{shape[d], xs[d], ys[d], out_strides[d]};
      (d < batch.first.size() || d >= free_y_end ? p.batch : d < free_x_end ? p.left : p.right).push_back(g);
    }
    for (std::size_t k = 0; k < contract_shape.size(); ++k)
      p.contracted.push_back({contract_shape[k], xc[k], yc[k], 0});
    if (gemm_fits(p)) {
      gemm_contract<T>(p, x.data, y.data, out.data(), out.size(), on_device);
      return out;
    }
  }
  std::size_t contract_size = 1;
  for (auto s : contract_shape) contract_size *= s;
  // Offsets of every contracted position, in row-major order (the order of the sum).
  std::vector<std::ptrdiff_t> x_offsets, y_offsets;
  for (std::size_t flat = 0; flat < contract_size; ++flat) {
    std::ptrdiff_t ox = 0, oy = 0;
    for (std::size_t k = contract_shape.size(), rest = flat; k-- > 0;) {
      const auto i = static_cast<std::ptrdiff_t>(rest % contract_shape[k]);
      rest /= contract_shape[k];
      ox += i * xc[k], oy += i * yc[k];
    }
    x_offsets.push_back(ox), y_offsets.push_back(oy);
  }
  // Two input offsets per output element: walk the output with x's strides, then again with y's.
  std::vector<std::ptrdiff_t> x_base(out.size()), y_base(out.size());
  element_offsets(shape, xs, out_strides, x_base);
  element_offsets(shape, ys, out_strides, y_base);
  // Size-1 output dims have stride 0 in out_strides; the flat index covers each element once.
  for (std::size_t e = 0; e < out.size(); ++e) {
    T acc{};
    for (std::size_t c = 0; c < contract_size; ++c)
      acc = wrapping_add(acc, wrapping_multiply(static_cast<T>(x.data[x_base[e] + x_offsets[c]]),
                                                static_cast<T>(y.data[y_base[e] + y_offsets[c]])));  // integers wrap
    out.data()[e] = acc;
  }
  return out;
}

#ifdef NAMEDAX_SEPARATE_COMPILATION  // defined once, by <namedax/separate_compilation.hpp>
#define NAMEDAX_INSTANTIATE(T)                                                                                            \
  NAMEDAX_EXTERN template xt::xarray<T> dot_general<T, T, T>(std::string_view, const strided_block<T>&, std::size_t,      \
                                                            const strided_block<T>&, std::size_t, const dimension_pairs&, \
                                                            const dimension_pairs&, bool);
NAMEDAX_FOR_EACH_ELEMENT_TYPE(NAMEDAX_INSTANTIATE)
#undef NAMEDAX_INSTANTIATE
#endif

}  // namespace namedax::detail
