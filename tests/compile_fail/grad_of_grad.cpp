// SPDX-License-Identifier: MIT
// grad of grad: higher-order derivatives are not supported yet, and the first error says so
// (not a mismatch of types deep in the recorded program), with nothing after it.
// expect-error: namedax::grad: higher-order derivatives \(grad of grad\) are not supported yet
// clang++ prints the assertion's condition on the first line: a short one, not the traced type.
// expect-error-clang: requirement 'higher_order_is_supported<!nested>' .namedax::grad: higher-order derivatives \(grad of grad\) are not supported yet
// expect-one-error
#include <namedax/namedax.hpp>

int main() {
  auto f = [](const auto& x) { return namedax::sum(namedax::sin(x) * x); };
  xt::xarray<double> x = xt::ones<double>({3});
  xt::xarray<double> curvature = namedax::grad(namedax::grad(f))(x);
  (void)curvature;
}
