// SPDX-License-Identifier: MIT
// A mapped argument's type records the view it reads, so `x = psum(x, ...)` cannot rebind it;
// the first error line says to hold the variable in an owning value. clang++ prints the
// assertion's condition on that line too: a short one, not the whole expression type.
// expect-error: namedax: this value's type records the expression that computes it, so it cannot be rebound; hold a variable that changes in a value that owns its data
// expect-error-clang: requirement 'detail::variable_owns_its_data<false>' .namedax: this value's type records the expression that computes it, so it cannot be rebound
#include <namedax/namedax.hpp>

using namespace namedax::literals;

int main() {
  xt::xarray<float> xs = xt::arange<float>(4);
  auto f = [](auto x) {
    x = namedax::psum(x, "i"_ax);
    return x;
  };
  auto result = namedax::vmap<"i">(f)(xs);
  (void)result;
}
