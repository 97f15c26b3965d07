// SPDX-License-Identifier: MIT
// SPMD control flow needs one value per device: under vmap a value that varies along the
// mapped axis is many values, so `if (x.value() > 0)` does not compile there.
// expect-error: namedax: this value varies along a vmap axis, so it is not one value
#include <namedax/namedax.hpp>

using namespace namedax::literals;

int main() {
  xt::xarray<float> xs = xt::arange<float>(4);
  auto f = [](auto x) {
    if (namedax::psum(x, namedax::axes(0)).value() > 0) return namedax::eval(x * 2.f);
    return namedax::eval(x * 1.f);
  };
  auto result = namedax::vmap<"i">(f)(xt::xarray<float>(xs.reshape({4, 1})));
  (void)result;
}
