// SPDX-License-Identifier: MIT
// A variable that is the same along "i" cannot take a value that varies along "i": its type
// promises the same value on every index.
// expect-error: namedax: the value assigned varies along a name the variable does not vary along; make the variable vary along it
#include <namedax/namedax.hpp>

using namespace namedax::literals;

int main() {
  xt::xarray<float> xs = xt::arange<float>(4);
  auto f = [](auto x) {
    auto total = namedax::eval(namedax::psum(x, "i"_ax));
    total = x;
    return total;
  };
  auto result = namedax::vmap<"i">(f)(xs);
  (void)result;
}
