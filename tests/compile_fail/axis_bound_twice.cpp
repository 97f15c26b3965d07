// SPDX-License-Identifier: MIT
// A map may not bind a name that an enclosing map already binds.
// expect-error: axis_bound_twice<namedax::axis<namedax::fixed_string<2>..i..> >
#include <namedax/namedax.hpp>

using namespace namedax::literals;

int main() {
  xt::xarray<float> xs = xt::zeros<float>({4, 3});
  auto inner = [](auto x) { return namedax::psum(x, "i"_ax); };
  auto result = namedax::vmap<"i">(namedax::vmap<"i">(inner))(xs);
  (void)result;
}
