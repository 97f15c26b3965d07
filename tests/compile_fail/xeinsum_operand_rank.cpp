// SPDX-License-Identifier: MIT
// A fixed-rank operand (xt::xtensor<float, 2>) whose spec names three subscripts does not compile.
// expect-error: namedax::xeinsum: an operand's type fixes its rank, and the spec gives it another number of subscripts
#include <namedax/namedax.hpp>
#include <xtensor/xtensor.hpp>

using namespace namedax::literals;

int main() {
  xt::xarray<float> xs = xt::zeros<float>({4, 3});
  xt::xtensor<float, 2> w = xt::zeros<float>({3, 5});
  auto f = [&](auto x) { return namedax::xeinsum<"j,jkl->kl">(x, w); };
  auto result = namedax::vmap<"i">(f)(xs);
  (void)result;
}
