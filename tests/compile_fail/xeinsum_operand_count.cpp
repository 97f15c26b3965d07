// SPDX-License-Identifier: MIT
// xeinsum takes one operand per input of its spec: two inputs, one operand does not compile.
// expect-error: namedax::xeinsum: the spec names a different number of operands than were given
#include <namedax/namedax.hpp>

using namespace namedax::literals;

int main() {
  xt::xarray<float> xs = xt::zeros<float>({4, 3});
  auto f = [](auto x) { return namedax::xeinsum<"j,k->jk">(x); };
  auto result = namedax::vmap<"i">(f)(xs);
  (void)result;
}
