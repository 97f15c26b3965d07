// SPDX-License-Identifier: MIT
// An axis written as a string inside shard_map. The out spec P() fits the psum the user meant
// (over "i"), so nothing but the string is reported.
// expect-error: namedax: axis names are types, written .?.i.?._ax
// expect-one-error
#include <namedax/namedax.hpp>

using namespace namedax::literals;

int main() {
  namedax::mesh m{namedax::devices<"i">(2)};
  auto f = namedax::shard_map([](auto v) { return namedax::psum(v, "i"); }, m, namedax::P("i"_ax), namedax::P());
  auto out = f(xt::xarray<float>(xt::arange<float>(4)));
  (void)out;
}
