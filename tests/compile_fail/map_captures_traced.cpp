// SPDX-License-Identifier: MIT
// grad of a function whose vmap captures the traced parameter (JAX's closure, which C++ cannot
// convert): the first line says to pass it to the map as an argument.
// expect-error: namedax::vmap, pmap and shard_map: the mapped function returned a value computed from a value that grad traces
// expect-one-error
#include <namedax/namedax.hpp>

int main() {
  xt::xarray<double> x = {{1.0, 2.0}, {3.0, 4.0}};
  xt::xarray<double> w = {0.5, -1.0};
  auto loss = [&](const auto& weights) {
    return namedax::sum(namedax::vmap<"i">([&](const auto& row) { return namedax::sum(row * weights); })(x));
  };
  auto gradient = namedax::grad(loss)(w);
  (void)gradient;
}
