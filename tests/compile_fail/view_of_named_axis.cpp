// SPDX-License-Identifier: MIT
// A named axis is not a dim of the value a mapped function sees: each index of the map holds
// its own value, so view does not slice along a name.
// expect-error: namedax::view: slices select positional dims; a named axis is not sliced
#include <namedax/namedax.hpp>
#include <namedax/structure.hpp>

using namespace namedax::literals;

int main() {
  xt::xarray<float> xs = xt::zeros<float>({4, 3});
  auto f = [](auto x) { return namedax::eval(namedax::view(x, "i"_ax, xt::range(0, 2))); };
  auto result = namedax::vmap<"i">(f)(xs);
  (void)result;
}
