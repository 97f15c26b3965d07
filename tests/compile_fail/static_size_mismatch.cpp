// SPDX-License-Identifier: MIT
// Values whose types give the same axis two different static sizes do not combine.
// expect-error: namedax: the same axis has two different static sizes
#include <namedax/namedax.hpp>

using i4 = namedax::env<namedax::binding<namedax::axis<"i">, namedax::placement::vectorized, 4>>;
using i5 = namedax::env<namedax::binding<namedax::axis<"i">, namedax::placement::vectorized, 5>>;

int main() {
  namedax::named<xt::xarray<float>, i4, 1> a(xt::zeros<float>({4}));
  namedax::named<xt::xarray<float>, i5, 1> b(xt::zeros<float>({5}));
  auto c = a + b;
  (void)c;
}
