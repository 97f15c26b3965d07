// SPDX-License-Identifier: MIT
// out_axes none asks for a result that does not vary along the map's axis; x * 2 varies.
// expect-error: (incomplete type|undefined template) .*namedax::out_axes_none_but_result_varies_along_axis<namedax::axis<(namedax::fixed_string<2>..i..|..105, 0..)> ?, 1>
#include <namedax/namedax.hpp>

using namespace namedax::literals;

int main() {
  xt::xarray<float> x = xt::arange<float>(4);
  auto f = [](auto v) { return std::tuple{namedax::psum(v, "i"_ax), v * 2.f}; };
  auto out = namedax::vmap<"i">(f, 0, namedax::none)(x);
  (void)out;
}
