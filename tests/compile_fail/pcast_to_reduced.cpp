// SPDX-License-Identifier: MIT
// JAX's pcast(to='reduced') is a type of its explicit-sharding mode; namedax's values are
// varying or invariant only.
// expect-error: namedax::pcast: namedax types a value as varying or invariant along a name and has no reduced or unreduced type
#include <namedax/namedax.hpp>

using namespace namedax::literals;

int main() {
  xt::xarray<float> x = xt::arange<float>(4);
  auto f = [](auto v) { return namedax::pcast(namedax::psum(v, "i"_ax), "i"_ax, namedax::pcast_to::reduced); };
  auto out = namedax::vmap<"i">(f)(x);
  (void)out;
}
