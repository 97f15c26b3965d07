// SPDX-License-Identifier: MIT
// all_to_all given psum_scatter's options: the first error line says which options it takes.
// expect-error: namedax: all_to_all takes namedax::all_to_all_options
#include <namedax/namedax.hpp>

using namespace namedax::literals;

int main() {
  xt::xarray<float> xs = xt::arange<float>(16).reshape({4, 4});
  auto f = [](auto x) { return namedax::all_to_all(x, "i"_ax, 0, 0, namedax::psum_scatter_options{.tiled = true}); };
  auto result = namedax::vmap<"i">(f)(xs);
  (void)result;
}
