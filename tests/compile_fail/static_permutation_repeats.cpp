// SPDX-License-Identifier: MIT
// A permutation known at compile time that sends from one source twice does not compile.
// expect-error: namedax::ppermute: the static permutation needs .source, destination. pairs
#include <namedax/namedax.hpp>

using namespace namedax::literals;

int main() {
  xt::xarray<float> xs = xt::arange<float>(4);
  auto f = [](auto x) { return namedax::ppermute(x, "i"_ax, namedax::static_perm<0, 1, 0, 2>); };
  auto result = namedax::pmap<"i">(f)(xs);
  (void)result;
}
