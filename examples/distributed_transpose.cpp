// SPDX-License-Identifier: MIT
// A distributed matrix transpose with all_to_all: a matrix sharded by rows over 4 devices
// becomes its transpose sharded by rows (the matrix sharded by columns). Then the reshuffle
// at the heart of a 2-D FFT: a transform along the local dimension, the transpose, and a
// transform along the dimension that was sharded before.
#include <namedax/namedax.hpp>

#include <xtensor/xrandom.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numbers>

using namespace namedax::literals;

// The n x n matrix of a 1-D discrete cosine transform (DCT-II): a real stand-in for the DFT.
xt::xarray<double> dct_matrix(std::size_t n) {
  xt::xarray<double> d = xt::zeros<double>({n, n});
  for (std::size_t k = 0; k < n; ++k)
    for (std::size_t j = 0; j < n; ++j) d(k, j) = std::cos(std::numbers::pi / double(n) * (double(j) + 0.5) * double(k));
  return d;
}

int main() {
  constexpr std::size_t devices = 4, rows = 8, cols = 12;
  xt::random::seed(3);
  xt::xarray<double> a = xt::random::rand<double>({rows, cols});
  // Sharded by rows: device p holds rows [2p, 2p + 2), all 12 columns.
  xt::xarray<double> row_shards = xt::reshape_view(a, {devices, rows / devices, cols});
  const xt::xarray<double> p = dct_matrix(rows), q = dct_matrix(cols);

  auto transpose = [](auto x) {  // x: (rows / devices, cols), this device's rows
    // Cut the columns into 4 blocks, send block k to device k, and stack the blocks received
    // along the rows: device p now holds column block p of every row, (rows, cols / devices).
    auto columns = namedax::all_to_all(x, "i"_ax, 1, 0, {.tiled = true});
    return namedax::xeinsum<"rc->cr">(columns);  // the local transpose: (cols / devices, rows)
  };

  // y = P a Q^T, with P and Q the DCT matrices: a 2-D DCT, computed as a 2-D FFT is on a
  // cluster. Each step works along a dimension the device holds whole.
  auto transform_2d = [&](auto x) {
    auto along_cols = namedax::xeinsum<"rc,kc->rk">(x, q);  // rows are local: transform each row
    auto transposed = transpose(along_cols);                // now the row index is local
    return namedax::xeinsum<"cr,kr->ck">(transposed, p);    // y^T, sharded by its rows
  };

  bool ok = true;
  for (const char* mode : {"pmap", "vmap"}) {
    const bool devices_mode = mode[0] == 'p';
    xt::xarray<double> t = devices_mode ? namedax::pmap<"i">(transpose)(row_shards) : namedax::vmap<"i">(transpose)(row_shards);
    xt::xarray<double> yt = devices_mode ? namedax::pmap<"i">(transform_2d)(row_shards) : namedax::vmap<"i">(transform_2d)(row_shards);
    // Stacked over devices, the shards of the transpose are the whole (cols, rows) transpose.
    t.reshape({cols, rows});
    yt.reshape({cols, rows});
    const xt::xarray<double> expected = xt::transpose(a);
    const bool transpose_ok = t == expected;  // pure data movement: equal bit for bit

    // The 2-D DCT by plain loops on the whole matrix, for comparison.
    double max_diff = 0.0;
    for (std::size_t k = 0; k < rows; ++k)
      for (std::size_t l = 0; l < cols; ++l) {
        double y = 0.0;
        for (std::size_t r = 0; r < rows; ++r)
          for (std::size_t c = 0; c < cols; ++c) y += p(k, r) * a(r, c) * q(l, c);
        max_diff = std::max(max_diff, std::abs(yt(l, k) - y));
      }
    const bool transform_ok = max_diff < 1e-12;
    std::printf("%s: transpose %s xt::transpose(a); 2-D DCT max |difference| = %.3g\n", mode,
                transpose_ok ? "equals" : "DIFFERS FROM", max_diff);
    ok = ok && transpose_ok && transform_ok;
  }
  if (!ok) return 1;
  std::printf("distributed transpose matches xt::transpose, and the 2-D transform matches plain loops\n");
  return 0;
}
