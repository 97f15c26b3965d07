// SPDX-License-Identifier: MIT
// grad of a function that lifts a scalar function with apply, which has no derivative rule
// (apply takes any callable): the first line names apply and the two ways out.
// expect-error: namedax::grad: apply has no derivative rule .* namedax::custom_vjp or namedax::custom_jvp
// clang++ prints the assertion's condition on the first line: a short one, not the traced type.
// expect-error-clang: requirement 'detail::has_derivative_rule<false>' .namedax::grad: apply has no derivative rule
#include <namedax/namedax.hpp>

using namespace namedax::literals;

int main() {
  xt::xarray<double> xs = xt::ones<double>({4, 3});
  auto f = [](auto x) {
    return namedax::grad([](const auto& u) {
      return namedax::sum(namedax::apply([](double v) { return v > 1 ? v : 2 * v; }, u));
    })(x);
  };
  auto out = namedax::vmap<"i">(f)(xs);
  (void)out;
}
