// SPDX-License-Identifier: MIT
// Every collective once, under vmap and under pmap: the translation unit whose compile time
// benchmarks/compile_time.sh compares with one that uses xtensor alone.
#include <namedax/namedax.hpp>

#include <iostream>
#include <tuple>

using namespace namedax::literals;

int main() {
  // Each index of "i" holds a vector of 4: the rows of a 4 x 4 matrix.
  auto every_collective = [](auto x) {
    return std::tuple{
        namedax::psum(x, "i"_ax),
        namedax::pmean(x, "i"_ax),
        namedax::pmax(x, "i"_ax),
        namedax::pmin(x, "i"_ax),
        namedax::pargmax(x, "i"_ax),
        namedax::pargmin(x, "i"_ax),
        namedax::ppermute(x, "i"_ax, {{0, 1}, {1, 2}, {2, 3}, {3, 0}}),
        namedax::pshuffle(x, "i"_ax, {3, 2, 1, 0}),
        namedax::pswapaxes(x, "i"_ax, 0),
        namedax::all_to_all(x, "i"_ax, 0, 0),
        namedax::all_gather(x, "i"_ax),
        namedax::psum_scatter(x, "i"_ax),
        x + namedax::axis_index("i"_ax),
        namedax::pdot(x, x, "i"_ax, {{0}, {0}}),
        namedax::xeinsum<"j{i},j{i}->">(x, x),
        namedax::pgather(x, xt::xarray<int>{5, 0, 15}, namedax::axes("i"_ax, 0)),
    };
  };
  xt::xarray<float> xs = xt::arange<float>(16).reshape({4, 4});
  auto vectorized = namedax::vmap<"i">(every_collective)(xs);
  auto devices = namedax::pmap<"i">(every_collective)(xs);
  const bool same = vectorized == devices;
  std::cout << (same ? "vmap and pmap agree\n" : "vmap and pmap differ\n");
  return same ? 0 : 1;
}
