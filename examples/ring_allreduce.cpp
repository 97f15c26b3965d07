// SPDX-License-Identifier: MIT
// A ring all-reduce built from ppermute alone: a reduce-scatter around the ring, then an
// all-gather around the ring, one chunk per step. Checked against psum on the same data,
// on 4 simulated devices (pmap) and vectorized (vmap).
#include <namedax/namedax.hpp>

#include <xtensor/xrandom.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

using namespace namedax::literals;

int main() {
  constexpr int devices = 4;
  constexpr std::size_t chunk = 3;
  // Every device holds a vector of devices * chunk numbers, seen as `devices` chunks of
  // `chunk` numbers: xs is (devices, chunks, chunk), and each device gets a (chunks, chunk).
  xt::random::seed(7);
  xt::xarray<float> xs = xt::random::rand<float>({std::size_t{devices}, std::size_t{devices}, chunk});

  // The ring: device d sends to device d + 1, the last one to device 0.
  std::vector<std::pair<int, int>> ring;
  for (int d = 0; d < devices; ++d) ring.push_back({d, (d + 1) % devices});
  // Chunk numbers as a column, so that a comparison with it picks whole rows of a buffer.
  xt::xarray<int> chunk_ids = xt::arange<int>(devices).reshape({devices, 1});

  auto ring_allreduce = [&](auto x) {
    const int n = namedax::axis_size("i"_ax);
    // is_chunk(offset): true on the row of chunk (me + offset) mod n, where me is this
    // device's index. axis_index is one number per device under pmap, a vector under vmap.
    auto is_chunk = [&](int offset) {
      auto k = namedax::axis_index("i"_ax) + (offset % n + n) % n;  // in 0 .. 2n - 2
      return chunk_ids == k || chunk_ids == k - n;
    };
    // A chunk of the buffer, as a (chunk,) value: zero the other rows, sum over rows.
    auto take = [](auto mask, auto buffer) { return namedax::psum(namedax::where(mask, buffer, 0.f), namedax::axes(0)); };

    auto buffer = namedax::eval(x);
    // Reduce-scatter: at step s device d sends its partial sum of chunk d - s to d + 1,
    // which adds it to its own. After n - 1 steps device d holds chunk d + 1 summed over
    // every device. Only one chunk travels per device and step.
    for (int s = 0; s < n - 1; ++s) {
      auto incoming = namedax::ppermute(take(is_chunk(-s), buffer), "i"_ax, ring);
      buffer = namedax::eval(namedax::where(is_chunk(-s - 1), buffer + incoming, buffer));
    }
    // All-gather: at step s device d passes on the finished chunk d + 1 - s; the receiver
    // stores it in place. After n - 1 more steps every device holds every summed chunk.
    for (int s = 0; s < n - 1; ++s) {
      auto incoming = namedax::ppermute(take(is_chunk(1 - s), buffer), "i"_ax, ring);
      buffer = namedax::eval(namedax::where(is_chunk(-s), incoming, buffer));
    }
    return std::tuple{buffer, namedax::psum(x, "i"_ax)};  // the ring's result and psum's
  };

  bool ok = true;
  auto check = [&](const char* mode, const xt::xarray<float>& ring_sum, const xt::xarray<float>& psum) {
    float max_diff = ring_sum.shape() == psum.shape() ? 0.f : INFINITY;
    if (std::isfinite(max_diff))
      for (std::size_t k = 0; k < psum.size(); ++k) max_diff = std::max(max_diff, std::abs(ring_sum.flat(k) - psum.flat(k)));
    // The ring adds each chunk's terms in another order than psum does, so allow rounding.
    const bool match = max_diff <= 1e-5f;
    std::printf("%s: max |ring - psum| = %.3g over %zu numbers%s\n", mode, max_diff, psum.size(), match ? "" : "  MISMATCH");
    ok = ok && match;
  };
  auto [ring_p, psum_p] = namedax::pmap<"i">(ring_allreduce)(xs);
  check("pmap", ring_p, psum_p);
  auto [ring_v, psum_v] = namedax::vmap<"i">(ring_allreduce)(xs);
  check("vmap", ring_v, psum_v);
  std::printf("device 2, chunk 0: ring %.6f %.6f %.6f, psum %.6f %.6f %.6f\n", ring_p(2, 0, 0), ring_p(2, 0, 1),
              ring_p(2, 0, 2), psum_p(2, 0, 0), psum_p(2, 0, 1), psum_p(2, 0, 2));
  if (!ok) return 1;
  std::printf("ring all-reduce matches psum (pmap and vmap, %d devices)\n", devices);
  return 0;
}
