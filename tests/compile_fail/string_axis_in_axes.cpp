// SPDX-License-Identifier: MIT
// An axis written as a string inside namedax::axes(...).
// expect-error: namedax::axes: axis names are types, written .?.i.?._ax
#include <namedax/namedax.hpp>

int main() {
  xt::xarray<float> x = xt::arange<float>(8).reshape({4, 2});
  auto f = [](auto v) { return namedax::psum(v, namedax::axes("i", 0)); };
  auto out = namedax::vmap<"i">(f)(x);
  (void)out;
}
