// SPDX-License-Identifier: MIT
// An axis list names each axis once.
// expect-error: namedax::axes: an axis name is given twice
#include <namedax/namedax.hpp>

using namespace namedax::literals;

int main() {
  xt::xarray<float> xs = xt::zeros<float>({4});
  auto f = [](auto x) { return namedax::psum(x, namedax::axes("i"_ax, "i"_ax)); };
  auto result = namedax::vmap<"i">(f)(xs);
  (void)result;
}
