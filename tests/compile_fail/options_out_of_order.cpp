// SPDX-License-Identifier: MIT
// C++20 designated initializers keep the declaration order: all_gather's options are
// `.axis_index_groups`, `.axis`, then `.tiled`. g++ rejects `.tiled` before `.axis`, naming
// the options struct the braces bind to; clang++ accepts them with the warning matched here.
// expect-error-gcc: designator order for field .*namedax::without_groups::all_gather_options::axis.* does not match declaration order
// expect-error-clang: ISO C\+\+ requires field designators to be specified in declaration order
#include <namedax/namedax.hpp>

using namespace namedax::literals;

int main() {
  xt::xarray<float> xs = xt::arange<float>(8);
  xs.reshape({4, 2});
  auto f = [](auto x) { return namedax::all_gather(x, "i"_ax, {.tiled = true, .axis = 0}); };
  auto result = namedax::vmap<"i">(f)(xs);
  (void)result;
}
