// SPDX-License-Identifier: MIT
// all_gather's options have no `scatter_dimension` field (psum_scatter's do): the error names
// the options all_gather takes.
// expect-error: namedax: all_gather takes namedax::all_gather_options
#include <namedax/namedax.hpp>

using namespace namedax::literals;

int main() {
  xt::xarray<float> xs = xt::arange<float>(8);
  xs.reshape({4, 2});
  auto f = [](auto x) { return namedax::all_gather(x, "i"_ax, {.scatter_dimension = 1}); };
  auto result = namedax::vmap<"i">(f)(xs);
  (void)result;
}
