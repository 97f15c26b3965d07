// SPDX-License-Identifier: MIT
// Collective matmul, as in JAX's shard_map tutorial: C = A B with A split by rows and B split
// by rows (the contracted dimension) over 4 devices; each device computes its rows of C.
// Written three ways: all_gather B, then multiply; the ring of JAX's version: at step s each
// device multiplies the block of B it holds, which came from device i - s, by the matching
// columns of its A (a dynamic_slice at an index computed from axis_index), and passes the
// block on with ppermute; and the same ring overlapped, each block sent on with
// async::ppermute before it is multiplied. Checked against plain loops, in both modes.
#include <namedax/namedax.hpp>

#include <xtensor/xrandom.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>

using namespace namedax::literals;

namespace {
constexpr int devices = 4;
constexpr std::size_t rows = 8, inner = 12, cols = 5;  // A: rows x inner, B: inner x cols
constexpr std::size_t row_block = rows / devices, inner_block = inner / devices;
}  // namespace

int main() {
  xt::random::seed(3);
  xt::xarray<float> a = xt::random::randn<float>({rows, inner});
  xt::xarray<float> b = xt::random::randn<float>({inner, cols});
  // Device i holds rows [i * row_block, ...) of A and rows [i * inner_block, ...) of B.
  xt::xarray<float> a_blocks = xt::reshape_view(a, {std::size_t{devices}, row_block, inner});
  xt::xarray<float> b_blocks = xt::reshape_view(b, {std::size_t{devices}, inner_block, cols});

  // All-gather: every device assembles the whole of B, then multiplies.
  auto gathered = [](auto a, auto b) {
    auto whole_b = namedax::all_gather(b, "i"_ax, {.tiled = true});  // (inner, cols)
    return namedax::xeinsum<"mk,kf->mf">(a, whole_b);
  };

  // Ring: the block held at step s came from device (i - s) mod n; it meets columns
  // [(i - s) mod n * inner_block, ...) of this device's A.
  auto ring = [](auto a, auto b) {
    const auto i = namedax::axis_index("i"_ax);
    auto block_columns = [&](int step) {
      auto source = (i + (devices - step)) % devices;
      return namedax::dynamic_slice(a, std::tuple{0, source * int{inner_block}}, std::array{row_block, inner_block});
    };
    std::vector<std::pair<int, int>> to_next;
    for (int d = 0; d < devices; ++d) to_next.emplace_back(d, (d + 1) % devices);
    auto held = namedax::eval(b);
    auto c = namedax::eval(namedax::xeinsum<"mk,kf->mf">(block_columns(0), held));
    for (int step = 1; step < devices; ++step) {
      held = namedax::ppermute(held, "i"_ax, to_next);
      c += namedax::xeinsum<"mk,kf->mf">(block_columns(step), held);
    }
    return c;
  };

  // The ring again, overlapped as in JAX's version: each step sends the held block on with
  // async::ppermute before multiplying it, so the block travels while the device computes.
  // The same products, summed in the same order: the same bits as the ring above.
  auto overlapped = [](auto a, auto b) {
    const auto i = namedax::axis_index("i"_ax);
    auto block_columns = [&](int step) {
      auto source = (i + (devices - step)) % devices;
      return namedax::dynamic_slice(a, std::tuple{0, source * int{inner_block}}, std::array{row_block, inner_block});
    };
    std::vector<std::pair<int, int>> to_next;
    for (int d = 0; d < devices; ++d) to_next.emplace_back(d, (d + 1) % devices);
    auto held = namedax::eval(b);
    auto in_flight = namedax::async::ppermute(held, "i"_ax, to_next);
    auto c = namedax::eval(namedax::xeinsum<"mk,kf->mf">(block_columns(0), held));
    for (int step = 1; step < devices; ++step) {
      held = in_flight.wait();
      if (step + 1 < devices) in_flight = namedax::async::ppermute(held, "i"_ax, to_next);
      c += namedax::xeinsum<"mk,kf->mf">(block_columns(step), held);
    }
    return c;
  };

  // Plain loops, in double.
  xt::xarray<double> expected = xt::zeros<double>({rows, cols});
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t c = 0; c < cols; ++c)
      for (std::size_t k = 0; k < inner; ++k) expected(r, c) += double(a(r, k)) * double(b(k, c));

  bool ok = true;
  auto check = [&](const char* what, xt::xarray<float> on_threads, xt::xarray<float> vectorized) {
    on_threads.reshape({rows, cols}), vectorized.reshape({rows, cols});
    double diff = 0.0;
    for (std::size_t k = 0; k < expected.size(); ++k)
      diff = std::max(diff, std::abs(double(on_threads.flat(k)) - expected.flat(k)));
    const bool same_bits = on_threads == vectorized;
    std::printf("%s: max |difference| from plain loops %.3g; vmap and pmap %s\n", what, diff,
                same_bits ? "agree bit for bit" : "DIFFER");
    ok = ok && diff < 1e-4 && same_bits;  // a NaN fails the first test
  };
  check("all_gather then matmul", namedax::pmap<"i">(gathered)(a_blocks, b_blocks),
        namedax::vmap<"i">(gathered)(a_blocks, b_blocks));
  check("ppermute ring", namedax::pmap<"i">(ring)(a_blocks, b_blocks), namedax::vmap<"i">(ring)(a_blocks, b_blocks));
  const xt::xarray<float> overlapped_c = namedax::pmap<"i">(overlapped)(a_blocks, b_blocks);
  check("overlapped ring (async::ppermute)", overlapped_c, namedax::vmap<"i">(overlapped)(a_blocks, b_blocks));
  const bool same_as_ring = overlapped_c == xt::xarray<float>(namedax::pmap<"i">(ring)(a_blocks, b_blocks));
  std::printf("overlapped ring and ppermute ring %s\n", same_as_ring ? "agree bit for bit" : "DIFFER");
  if (!ok || !same_as_ring) return 1;
  std::printf("collective matmul (all_gather, ppermute ring and overlapped ring) matches the plain loops\n");
  return 0;
}
