// SPDX-License-Identifier: MIT
// all_gather_invariant takes no axis_index_groups: within groups the results differ.
// expect-error: all_gather_invariant takes namedax::all_gather_invariant_options
#include <namedax/namedax.hpp>

using namespace namedax::literals;

int main() {
  xt::xarray<float> x = xt::arange<float>(4);
  auto f = [](auto v) { return namedax::all_gather_invariant(v, "i"_ax, {.axis_index_groups = {{0, 1}, {2, 3}}}); };
  auto out = namedax::vmap<"i">(f)(x);
  (void)out;
}
