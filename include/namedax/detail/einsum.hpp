// SPDX-License-Identifier: MIT
// xeinsum's positional part, the same on every caller: the sum over the subscripts missing
// from the output of the product of the operands, elementwise over the vectorized dims.
#pragma once

#include <namedax/detail/kernels.hpp>
#include <namedax/error.hpp>

#include <xtensor/xarray.hpp>

#include <array>
#include <string_view>

namespace namedax::detail {

/// out[output subscripts..., vectorized...] = sum over the other subscripts (row-major in
/// order of first appearance) of the product of the operands. Each block has as many
/// positional dims as its subscripts, then `vec` vectorized dims (of size n or 1).
template <class R>
xt::xarray<R> einsum_product(std::string_view verb, std::span<const strided_block<R>> blocks,
                             std::span<const std::string_view> subscripts, std::string_view output, std::size_t vec) {
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
  auto out = xt::xarray<R>::from_shape(shape);
  const auto out_strides = row_major_strides(shape);

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

}  // namespace namedax::detail
