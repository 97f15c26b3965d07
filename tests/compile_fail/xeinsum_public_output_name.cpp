// SPDX-License-Identifier: MIT
// Through the public xeinsum, an output name that no input has is the only error reported.
// expect-error: appears in the output but in no input
#include <namedax/namedax.hpp>

using namespace namedax::literals;

int main() {
  xt::xarray<float> x = xt::zeros<float>({2, 3});
  auto f = [](auto x) { return namedax::xeinsum<"ij{i}->i{k}">(x); };
  auto result = namedax::vmap<"i">(f)(x);
  (void)result;
}
