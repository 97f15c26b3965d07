// SPDX-License-Identifier: MIT
// xeinsum's positional part, the same on every caller: the sum over the subscripts missing
// from the output of the product of the operands, elementwise over the vectorized dims.
// IWYU pragma: private, include <namedax/namedax.hpp>
#pragma once

#include <namedax/detail/blas.hpp>
#include <namedax/detail/kernels.hpp>
#include <namedax/error.hpp>

#include <xtensor/xarray.hpp>

#include <array>
#include <optional>
#include <string_view>

namespace namedax::detail {

/// Two operands as a gemm: output subscripts in both are batch dims, in x only M, in y only N;
/// contracted ones (in both, in order of first appearance) K; vectorized dims batch. None when
/// a subscript is summed in one operand alone, or the sizes do not fit BLAS.
template <class R>
std::optional<gemm_problem> einsum_as_gemm(std::span<const strided_block<R>> blocks,
                                           std::span<const std::string_view> subscripts, std::string_view output,
                                           std::string_view contracted, std::size_t vec,
                                           std::span<const std::size_t> shape,
                                           std::span<const std::ptrdiff_t> out_strides) {
  if (blocks.size() != 2) return std::nullopt;
  const auto &x = blocks[0], &y = blocks[1];
  const std::string_view xs = subscripts[0], ys = subscripts[1];
  auto stride = [](const strided_block<R>& b, std::string_view subs, char c) {
    const auto d = subs.find(c);
    return d == std::string_view::npos ? std::ptrdiff_t{0} : b.strides[d];
  };
  auto has = [](std::string_view subs, char c) { return subs.find(c) != std::string_view::npos; };
  gemm_problem p;
  for (char c : contracted) {
    if (!has(xs, c) || !has(ys, c)) return std::nullopt;
    p.contracted.push_back({x.shape[xs.find(c)], stride(x, xs, c), stride(y, ys, c), 0});
  }
  // M and N in the order of x's and y's own dims, the order most likely to be one strided line.
  for (std::size_t d = 0; d < output.size(); ++d) {
    const char c = output[d];
    if (has(xs, c) && has(ys, c)) p.batch.push_back({shape[d], stride(x, xs, c), stride(y, ys, c), out_strides[d]});
  }
  for (char c : xs)
    if (!has(ys, c)) {
      const std::size_t d = output.find(c);
      p.left.push_back({shape[d], stride(x, xs, c), 0, out_strides[d]});
    }
  for (char c : ys)
    if (!has(xs, c)) {
      const std::size_t d = output.find(c);
      p.right.push_back({shape[d], 0, stride(y, ys, c), out_strides[d]});
    }
  for (std::size_t v = 0; v < vec; ++v) {
    const std::size_t d = output.size() + v, dx = xs.size() + v, dy = ys.size() + v;
    p.batch.push_back(
        {shape[d], x.shape[dx] == 1 ? 0 : x.strides[dx], y.shape[dy] == 1 ? 0 : y.strides[dy], out_strides[d]});
  }
  if (!gemm_fits(p)) return std::nullopt;
  return p;
}

/// out[output subscripts..., vectorized...] = sum over the other subscripts (row-major in
/// order of first appearance) of the product of the operands. Each block has as many
/// positional dims as its subscripts, then `vec` vectorized dims (of size n or 1). Two float or
/// double operands whose every subscript is in the output or in both go through gemm (see
/// gemm_contract); the rest sum in that row-major order. `on_device`: on a pmap device thread.
template <class R>
xt::xarray<R> einsum_product(std::string_view verb, std::span<const strided_block<R>> blocks,
                             std::span<const std::string_view> subscripts, std::string_view output, std::size_t vec,
                             bool on_device = false) {
  std::array<std::size_t, 26> size{};
  std::array<int, 26> first_operand;
  first_operand.fill(-1);
  for (std::size_t k = 0; k < blocks.size(); ++k) {
    if (blocks[k].shape.size() != subscripts[k].size() + vec)
      fail("namedax::", verb, ": operand ", k, " has positional rank ", blocks[k].shape.size() - vec,
           " but its spec '", subscripts[k], "' names ", subscripts[k].size(), " dims");
    for (std::size_t d = 0; d < subscripts[k].size(); ++d) {
      const auto letter = static_cast<std::size_t>(subscripts[k][d] - 'a');
      if (first_operand[letter] >= 0 && size[letter] != blocks[k].shape[d])
        fail("namedax::", verb, ": subscript '", subscripts[k][d], "' has size ", size[letter], " in operand ",
             first_operand[letter], " and ", blocks[k].shape[d], " in operand ", k);
      if (first_operand[letter] < 0) first_operand[letter] = static_cast<int>(k), size[letter] = blocks[k].shape[d];
    }
  }
  std::vector<std::size_t> shape, contracted_shape;
  std::string contracted;
  for (char c : output) shape.push_back(size[static_cast<std::size_t>(c - 'a')]);
  for (auto subs : subscripts)
    for (char c : subs)
      if (output.find(c) == std::string_view::npos && contracted.find(c) == std::string::npos)
        contracted += c, contracted_shape.push_back(size[static_cast<std::size_t>(c - 'a')]);
  for (std::size_t v = 0; v < vec; ++v) {
    std::size_t n = 1;
    for (const auto& b : blocks) n = broadcast_extent(n, b.shape[b.shape.size() - vec + v]);
    shape.push_back(n);
  }
  auto out = uninitialized_array<R>(shape);  // every element is written; a recycled array has its pages
  const auto out_strides = row_major_strides(shape);
  if constexpr (GemmScalar<R>) {
    if (auto p = einsum_as_gemm(blocks, subscripts, output, contracted, vec, shape, out_strides)) {
      gemm_contract<R>(*p, blocks[0].data, blocks[1].data, out.data(), out.size(), on_device);
      return out;
    }
  }

  // Per operand: offsets of each output element, and of each contracted position.
  std::size_t contracted_size = 1;
  for (auto s : contracted_shape) contracted_size *= s;
  std::vector<std::vector<std::ptrdiff_t>> base(blocks.size(), std::vector<std::ptrdiff_t>(out.size())),
      along(blocks.size(), std::vector<std::ptrdiff_t>(contracted_size));
  for (std::size_t k = 0; k < blocks.size(); ++k) {
    const auto& b = blocks[k];
    auto stride_of = [&](char c) {
      const auto d = subscripts[k].find(c);
      return d == std::string_view::npos ? std::ptrdiff_t{0} : b.strides[d];
    };
    std::vector<std::ptrdiff_t> strides, contracted_strides;
    for (char c : output) strides.push_back(stride_of(c));
    for (std::size_t v = 0; v < vec; ++v) {
      const std::size_t d = subscripts[k].size() + v;
      strides.push_back(b.shape[d] == 1 ? 0 : b.strides[d]);
    }
    for (char c : contracted) contracted_strides.push_back(stride_of(c));
    element_offsets(shape, strides, out_strides, base[k]);
    element_offsets(contracted_shape, contracted_strides, row_major_strides(contracted_shape), along[k]);
  }
  for_each_line(shape, out_strides, out_strides,
                [&](std::ptrdiff_t, std::ptrdiff_t o, std::size_t n, std::ptrdiff_t, std::ptrdiff_t os) {
                  for (std::size_t i = 0; i < n; ++i) {
                    const auto e = static_cast<std::size_t>(o + static_cast<std::ptrdiff_t>(i) * os);
                    R acc{};
                    for (std::size_t c = 0; c < contracted_size; ++c) {
                      R product{1};
                      for (std::size_t k = 0; k < blocks.size(); ++k)
                        product = wrapping_multiply(product, blocks[k].data[base[k][e] + along[k][c]]);
                      acc = wrapping_add(acc, product);  // integers wrap, as JAX's do
                    }
                    out.data()[e] = acc;
                  }
                });
  return out;
}

#ifdef NAMEDAX_SEPARATE_COMPILATION  // defined once, by <namedax/separate_compilation.hpp>
#define NAMEDAX_INSTANTIATE(T)                                                                                   \
  NAMEDAX_EXTERN template xt::xarray<T> einsum_product<T>(std::string_view, std::span<const strided_block<T>>, \
                                                          std::span<const std::string_view>, std::string_view,   \
                                                          std::size_t, bool);
NAMEDAX_FOR_EACH_ELEMENT_TYPE(NAMEDAX_INSTANTIATE)
#undef NAMEDAX_INSTANTIATE
#endif

}  // namespace namedax::detail
