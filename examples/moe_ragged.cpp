// SPDX-License-Identifier: MIT
// The mixture-of-experts layer of moe_layer.hpp (top-2 routing, ragged dispatch, no token
// dropped) on 4 indices, under vmap and under pmap: both are checked against plain loops over
// the whole batch on one process, and against each other bit for bit, for three routings (some
// chunks empty, then one index receiving nothing). examples/mpi_moe_ragged.cpp runs the same
// layer on MPI processes.
#include "moe_layer.hpp"

#include <algorithm>
#include <cstdio>
#include <tuple>

int main() {
  using namespace moe_layer;
  problem p = make_problem();
  bool ok = true;
  double max_error = 0.0;
  std::ptrdiff_t empty_chunks = 0;
  for (const auto& r : routings) {
    route(p, r);
    const auto ref = reference(p);  // named members, not bindings: the lambda below captures them
    const auto& expected = ref.first;
    const auto& chunk_sizes = ref.second;
    const auto empty = std::count(chunk_sizes.begin(), chunk_sizes.end(), 0);
    empty_chunks += empty;
    std::printf("routing %s: rows sent (sender x receiver), %td of %zu chunks empty\n", r.name, empty, D * D);
    for (std::size_t s = 0; s < D; ++s) {
      for (std::size_t t = 0; t < D; ++t) std::printf(" %3d", chunk_sizes(s, t));
      std::printf("\n");
    }
    auto check = [&](const char* mode, const auto& result) {
      const auto& [y, sizes] = result;
      const double error = relative_error(y, expected);
      const bool sizes_match = sizes == chunk_sizes;
      std::printf("  %s: max |difference| / max |y| = %.3g, send sizes %s\n", mode, error,
                  sizes_match ? "match" : "DIFFER");
      ok = ok && y.shape() == expected.shape() && error < 1e-5 && sizes_match;
      max_error = std::max(max_error, error);
    };
    const auto vectorized = namedax::vmap<"i">(layer(p))(p.x, p.w1, p.w2);
    const auto on_threads = namedax::pmap<"i">(layer(p))(p.x, p.w1, p.w2);
    check("vmap", vectorized);
    check("pmap", on_threads);
    if (std::get<0>(vectorized) != std::get<0>(on_threads)) {
      std::printf("  vmap and pmap results DIFFER\n");
      ok = false;
    }
  }
  if (!ok || empty_chunks == 0) return 1;
  std::printf("moe_ragged: vmap and pmap agree bit for bit; max error vs reference %.2g\n", max_error);
  return 0;
}
