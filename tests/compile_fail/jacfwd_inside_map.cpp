// SPDX-License-Identifier: MIT
// jacfwd inside a map: one assertion that says it needs a forward mode and that jacrev gives
// the Jacobian inside maps.
// expect-error: namedax::jacfwd inside a map needs a forward mode
// expect-one-error
#include <namedax/namedax.hpp>

int main() {
  xt::xarray<double> xs = xt::ones<double>({4, 3});
  auto rows = [](const auto& row) { return namedax::jacfwd([](const auto& v) { return namedax::sin(v); })(row); };
  auto out = namedax::vmap<"i">(rows)(xs);
  (void)out;
}
