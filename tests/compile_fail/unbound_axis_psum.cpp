// SPDX-License-Identifier: MIT
// A psum over an axis that no enclosing map binds does not compile; the diagnostic names it.
// g++ spells the axis name fixed_string<2>{"k"}, clang++ 14 as its character codes, {{107, 0}}.
// expect-error: axis_not_bound<namedax::psum_fn, namedax::axis<(namedax::fixed_string<2>..k..|..107, 0..)>
#include <namedax/namedax.hpp>

using namespace namedax::literals;

int main() {
  xt::xarray<float> xs = xt::arange<float>(4);
  auto f = [](auto x) { return namedax::psum(x, "k"_ax); };  // only "i" is bound
  auto result = namedax::vmap<"i">(f)(xs);
  (void)result;
}
