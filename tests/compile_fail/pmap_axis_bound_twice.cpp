// SPDX-License-Identifier: MIT
// A pmap may not bind a name that an enclosing pmap already binds, when its arguments carry it.
// g++ spells the axis name fixed_string<2>{"i"}, clang++ 14 as its character codes, {{105, 0}}.
// expect-error: axis_bound_twice<namedax::axis<(namedax::fixed_string<2>..i..|..105, 0..)> ?>
#include <namedax/namedax.hpp>

using namespace namedax::literals;

int main() {
  xt::xarray<float> xs = xt::zeros<float>({2, 3});
  auto inner = [](auto x) { return namedax::psum(x, "i"_ax); };
  auto outer = [&](auto x) { return namedax::pmap<"i">(inner)(namedax::eval(x * 2)); };
  auto result = namedax::pmap<"i">(outer)(xs);
  (void)result;
}
