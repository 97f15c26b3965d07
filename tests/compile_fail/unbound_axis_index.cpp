// SPDX-License-Identifier: MIT
// axis_index of an axis that no enclosing map binds does not compile once the value leaves the map.
// expect-error: axis_not_bound<namedax::axis_index_fn, namedax::axis<namedax::fixed_string<2>..j..>
#include <namedax/namedax.hpp>

using namespace namedax::literals;

int main() {
  xt::xarray<float> xs = xt::zeros<float>({4});
  auto f = [](auto x) { return x + namedax::axis_index("j"_ax); };  // "j" is not mapped
  auto result = namedax::pmap<"i">(f)(xs);
  (void)result;
}
