// SPDX-License-Identifier: MIT
// Sharded contractions with xeinsum. First a matmul whose contracted dimension is split
// over 3 devices along "model" (a row-parallel layer of a tensor-parallel model); then the
// same matmul on a 2 x 3 mesh, its rows split along "data" too. Checked against plain loops.
#include <namedax/namedax.hpp>

#include <xtensor/xrandom.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>

using namespace namedax::literals;

int main() {
  constexpr std::size_t rows = 4, inner = 6, cols = 5, model = 3, data = 2;
  xt::random::seed(17);
  xt::xarray<float> x = xt::random::randn<float>({rows, inner});
  xt::xarray<float> w = xt::random::randn<float>({inner, cols});

  // The product by plain loops, on the whole matrices.
  xt::xarray<float> expected = xt::zeros<float>({rows, cols});
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c)
      for (std::size_t k = 0; k < inner; ++k) expected(r, c) += x(r, k) * w(k, c);

  bool ok = true;
  // result(..., r, c) against expected(row_offset(...) + r, c), over every leading index.
  auto check = [&](const char* what, const xt::xarray<float>& result, auto row_offset) {
    float max_diff = 0.f;
    const std::size_t n = result.size() / cols, block = result.shape()[result.dimension() - 2];
    for (std::size_t k = 0; k < n; ++k)
      for (std::size_t c = 0; c < cols; ++c)
        max_diff = std::max(max_diff, std::abs(result.flat(k * cols + c) - expected(row_offset(k / block) + k % block, c)));
    const bool match = max_diff < 1e-5f;  // the shards sum their parts in another order than the loop
    std::printf("%-40s max |difference| = %.3g%s\n", what, max_diff, match ? "" : "  MISMATCH");
    ok = ok && match;
  };

  // 1. The contracted dimension (6) split over "model": device m holds columns
  // [2m, 2m + 2) of x, as x seen (rows, model, 2) mapped along dimension 1, and the
  // matching rows of w, as w seen (model, 2, cols) mapped along dimension 0.
  xt::xarray<float> x_shards = xt::reshape_view(x, {rows, model, inner / model});
  xt::xarray<float> w_shards = xt::reshape_view(w, {model, inner / model, cols});
  // k is a positional subscript in both operands and {model} a named axis in both: both
  // are missing from the output, so each device multiplies its blocks and the partial
  // products are summed over "model". Every device ends with the whole (rows, cols).
  auto row_parallel = [](auto x, auto w) { return namedax::xeinsum<"rk{model},kc{model}->rc">(x, w); };
  const auto in_axes = std::tuple{1, 0};
  // Results are stacked over devices: (model, rows, cols); every slice is the whole product.
  check("pmap, contracted dim over \"model\":", namedax::pmap<"model">(row_parallel, in_axes)(x_shards, w_shards),
        [](std::size_t) { return 0; });
  check("vmap, contracted dim over \"model\":", namedax::vmap<"model">(row_parallel, in_axes)(x_shards, w_shards),
        [](std::size_t) { return 0; });

  // 2. A 2 x 3 mesh: rows split over "data" too. x's block (2 rows, 2 of 6) varies along
  // both names; w's block along "model" only. {data} stays in the output: each "data" row of
  // the mesh gets its own rows of the product; {model} is contracted away.
  xt::xarray<float> x_mesh = xt::reshape_view(x, {data, rows / data, model, inner / model});
  auto mesh_matmul = [](auto x, auto w) { return namedax::xeinsum<"rk{data,model},kc{model}->rc{data}">(x, w); };
  // The outer map splits x's dimension 0 over "data" and gives w whole to every index; the
  // inner one splits x's (now) dimension 1 and w's dimension 0 over "model".
  auto mesh = namedax::pmap<"data">(namedax::pmap<"model">(mesh_matmul, in_axes), std::tuple{0, namedax::none});
  // Stacked (data, model, rows / data, cols): the slice at (d, m) holds rows [2d, 2d + 2).
  check("pmap x pmap, rows over \"data\":", mesh(x_mesh, w_shards), [](std::size_t k) { return (k / model) * (rows / data); });
  auto mixed = namedax::pmap<"data">(namedax::vmap<"model">(mesh_matmul, in_axes), std::tuple{0, namedax::none});
  check("pmap x vmap, rows over \"data\":", mixed(x_mesh, w_shards), [](std::size_t k) { return (k / model) * (rows / data); });

  if (!ok) return 1;
  std::printf("sharded contractions match the plain loops\n");
  return 0;
}
