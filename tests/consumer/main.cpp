// SPDX-License-Identifier: MIT
// A program built against an installed namedax: x / psum(x) and a matmul under vmap and pmap.
#include <namedax/namedax.hpp>

#include <xtensor/xio.hpp>

#include <iostream>

using namespace namedax::literals;

int main() {
  auto normalize = [](auto x) { return x / namedax::psum(x, "i"_ax); };
  xt::xarray<float> xs = {1.f, 2.f, 3.f, 4.f};
  xt::xarray<float> a = namedax::vmap<"i">(normalize)(xs);  // one tensor
  xt::xarray<float> b = namedax::pmap<"i">(normalize)(xs);  // 4 device threads
  const xt::xarray<float> expected = {0.1f, 0.2f, 0.3f, 0.4f};
  if (a.shape() != expected.shape() || b.shape() != expected.shape() || !xt::allclose(a, expected) ||
      !xt::allclose(b, expected)) {
    std::cerr << "namedax consumer: expected " << expected << ", vmap gave " << a << ", pmap gave " << b << "\n";
    return 1;
  }
  // A matmul goes through OpenBLAS, which the installed package config links.
  auto matmul = [](auto x, auto w) { return namedax::xeinsum<"ij,jk->ik">(x, w); };
  xt::xarray<float> x = {{{1.f, 2.f}, {3.f, 4.f}}}, w = {{{1.f, 0.f}, {1.f, 1.f}}};
  const xt::xarray<float> product = {{{3.f, 2.f}, {7.f, 4.f}}};
  if (namedax::vmap<"i">(matmul)(x, w) != product || namedax::pmap<"i">(matmul)(x, w) != product) {
    std::cerr << "namedax consumer: xeinsum's matmul differs from " << product << "\n";
    return 1;
  }
  std::cout << "namedax consumer: vmap and pmap psum agree, and so do their matmuls\n";
  return 0;
}
