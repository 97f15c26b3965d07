// SPDX-License-Identifier: MIT
// An axis written as a string, as in JAX: names are types in namedax.
// expect-error: namedax: axis names are types, written .?.i.?._ax
// expect-one-error
#include <namedax/namedax.hpp>

int main() {
  xt::xarray<float> x = xt::arange<float>(4);
  auto f = [](auto v) { return namedax::psum(v, "i"); };
  auto out = namedax::vmap<"i">(f)(x);
  (void)out;
}
