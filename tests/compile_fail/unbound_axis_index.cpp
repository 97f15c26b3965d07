// SPDX-License-Identifier: MIT
// axis_index of an axis that no enclosing map binds does not compile once the value leaves the map.
// g++ spells the axis name fixed_string<2>{"j"}, clang++ 14 as its character codes, {{106, 0}}.
// expect-error: axis_not_bound<namedax::axis_index_fn, namedax::axis<(namedax::fixed_string<2>..j..|..106, 0..)>
#include <namedax/namedax.hpp>

using namespace namedax::literals;

int main() {
  xt::xarray<float> xs = xt::zeros<float>({4});
  auto f = [](auto x) { return x + namedax::axis_index("j"_ax); };  // "j" is not mapped
  auto result = namedax::pmap<"i">(f)(xs);
  (void)result;
}
