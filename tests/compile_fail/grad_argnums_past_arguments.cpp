// SPDX-License-Identifier: MIT
// grad with argnums naming a position past the arguments: the first error says so.
// expect-error: namedax::grad: argnums names an argument position past the arguments given
// expect-one-error
#include <namedax/namedax.hpp>

int main() {
  auto f = [](const auto& x, const auto& y) { return namedax::sum(x * y); };
  xt::xarray<double> x = xt::ones<double>({3});
  auto g = namedax::grad(f, namedax::argnums<2>)(x, x);
  (void)g;
}
