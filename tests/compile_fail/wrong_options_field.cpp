// SPDX-License-Identifier: MIT
// psum's options have no `tiled` field (all_gather's do): the error names the options psum takes.
// expect-error: namedax: psum, pmean, pmax and pmin take namedax::reduce_options
#include <namedax/namedax.hpp>

using namespace namedax::literals;

int main() {
  xt::xarray<float> xs = xt::arange<float>(4);
  auto f = [](auto x) { return namedax::psum(x, "i"_ax, {.tiled = true}); };
  auto result = namedax::vmap<"i">(f)(xs);
  (void)result;
}
