// SPDX-License-Identifier: MIT
// A permutation known at compile time that names index 4 of an axis of static size 4 does not compile.
// expect-error: namedax::ppermute: the static permutation names an index past the axis.s static size
#include <namedax/namedax.hpp>

using namespace namedax::literals;

int main() {
  xt::xarray<float> xs = xt::arange<float>(4);
  auto f = [](auto x) { return namedax::ppermute(x, "i"_ax, namedax::static_perm<0, 1, 3, 4>); };
  auto result = namedax::vmap<"i", 4>(f)(xs);
  (void)result;
}
