// SPDX-License-Identifier: MIT
// The shortest namedax program: x / psum(x) under vmap (one tensor) and pmap (4 devices).
// The two headers it uses, not the umbrella <namedax/namedax.hpp>: a fifth less compiler memory.
#include <namedax/collectives.hpp>  // psum, and the elementwise operators
#include <namedax/map.hpp>          // vmap, pmap

#include <xtensor/xio.hpp>

#include <iostream>

using namespace namedax::literals;  // "i"_ax  ==  namedax::axis<"i">{}

int main() {
  auto normalize = [](auto x) { return x / namedax::psum(x, "i"_ax); };
  xt::xarray<float> xs = xt::arange<float>(4);
  auto a = namedax::vmap<"i">(normalize)(xs);  // one tensor, "i" is dimension 0
  auto b = namedax::pmap<"i">(normalize)(xs);  // 4 simulated devices, one host thread each
  std::cout << "vmap: " << a << "\npmap: " << b << "\n";  // {0, 1/6, 2/6, 3/6} twice
  return a == b ? 0 : 1;
}
