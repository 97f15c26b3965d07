// SPDX-License-Identifier: MIT
// A map may not bind a name that an enclosing map already binds.
// g++ spells the axis name fixed_string<2>{"i"}, clang++ 14 as its character codes, {{105, 0}}.
// expect-error: axis_bound_twice<namedax::axis<(namedax::fixed_string<2>..i..|..105, 0..)> ?>
#include <namedax/namedax.hpp>

using namespace namedax::literals;

int main() {
  xt::xarray<float> xs = xt::zeros<float>({4, 3});
  auto inner = [](auto x) { return namedax::psum(x, "i"_ax); };
  auto result = namedax::vmap<"i">(namedax::vmap<"i">(inner))(xs);
  (void)result;
}
