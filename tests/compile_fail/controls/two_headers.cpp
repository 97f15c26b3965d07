// SPDX-License-Identifier: MIT
// A unit that uses psum under vmap and pmap includes the two headers that declare them, not
// the umbrella header: each public header must compile without the others (the derivative
// rules of namedax::grad, among them, are needed only by a unit that differentiates).
#include <namedax/collectives.hpp>
#include <namedax/map.hpp>

using namespace namedax::literals;

int main() {
  xt::xarray<float> x = xt::arange<float>(16).reshape({4, 4});
  auto total = [](auto row) { return namedax::psum(row, "i"_ax); };
  xt::xarray<float> a = namedax::vmap<"i">(total)(x), b = namedax::pmap<"i">(total)(x);
  return a == b ? 0 : 1;
}
