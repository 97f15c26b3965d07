// SPDX-License-Identifier: MIT
// Each collective takes its own options struct: psum given all_gather's options does not compile,
// and the first error line says which options psum takes.
// expect-error: namedax: psum, pmean, pmax and pmin take namedax::reduce_options
#include <namedax/namedax.hpp>

using namespace namedax::literals;

int main() {
  xt::xarray<float> xs = xt::arange<float>(4);
  auto f = [](auto x) { return namedax::psum(x, "i"_ax, namedax::all_gather_options{.tiled = true}); };
  auto result = namedax::vmap<"i">(f)(xs);
  (void)result;
}
