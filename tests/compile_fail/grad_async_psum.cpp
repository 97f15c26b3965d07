// SPDX-License-Identifier: MIT
// grad of a function that starts an asynchronous psum, which has no derivative rule: the
// blocking psum has (its transpose).
// expect-error: namedax::grad: asynchronous collectives have no derivative rule
// clang++ prints the assertion's condition on the first line: a short one, not the traced type.
// expect-error-clang: requirement 'has_derivative_rule<!traced>' .namedax::grad: asynchronous collectives have no derivative rule
#include <namedax/namedax.hpp>

using namespace namedax::literals;

int main() {
  xt::xarray<double> xs = xt::ones<double>({4, 3});
  auto f = [](auto x) {
    return namedax::grad([](const auto& u) { return namedax::sum(namedax::async::psum(u * u, "i"_ax).wait()); })(x);
  };
  auto out = namedax::vmap<"i">(f)(xs);
  (void)out;
}
