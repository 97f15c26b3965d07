// SPDX-License-Identifier: MIT
// grad of a function that gathers with pgather, which has no derivative rule yet.
// expect-error: namedax::grad: pgather has no derivative rule yet
// clang++ prints the assertion's condition on the first line: a short one, not the traced type.
// expect-error-clang: requirement 'detail::has_derivative_rule<false>' .namedax::grad: pgather has no derivative rule yet
#include <namedax/namedax.hpp>

using namespace namedax::literals;

int main() {
  xt::xarray<double> table = xt::ones<double>({4, 3});
  auto f = [](auto t) {
    return namedax::grad([](const auto& u) {
      return namedax::psum(namedax::sum(namedax::pgather(u, namedax::axis_index("i"_ax), "i"_ax)), "i"_ax);
    })(t);
  };
  auto out = namedax::vmap<"i">(f)(table);
  (void)out;
}
