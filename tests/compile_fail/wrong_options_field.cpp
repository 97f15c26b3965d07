// SPDX-License-Identifier: MIT
// psum's options have no `tiled` field: the designated initializer matches no overload of psum.
// expect-error: no match(ing function)? for call to [^a-z]*(object of type [^a-z]*)?const namedax::psum_fn.*initializer list
#include <namedax/namedax.hpp>

using namespace namedax::literals;

int main() {
  xt::xarray<float> xs = xt::arange<float>(4);
  auto f = [](auto x) { return namedax::psum(x, "i"_ax, {.tiled = true}); };
  auto result = namedax::vmap<"i">(f)(xs);
  (void)result;
}
