// SPDX-License-Identifier: MIT
// namedax::local gives one value per device: under vmap a value that varies along the mapped
// axis has one value per index, so local() does not compile for it.
// expect-error: namedax::local: this value varies along a vmap axis
#include <namedax/namedax.hpp>

int main() {
  xt::xarray<float> xs = xt::arange<float>(4);
  auto f = [](auto x) {
    xt::xarray<float> mine = namedax::local(x);
    return namedax::eval(x + mine(0));
  };
  auto result = namedax::vmap<"i">(f)(xt::xarray<float>(xs.reshape({4, 1})));
  (void)result;
}
