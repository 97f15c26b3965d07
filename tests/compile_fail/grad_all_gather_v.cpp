// SPDX-License-Identifier: MIT
// grad of a function that gathers with all_gather_v, which has no derivative rule yet: the
// first error says so and what to write instead (not "no matching function").
// expect-error: namedax::grad: all_gather_v has no derivative rule yet
// clang++ prints the assertion's condition on the first line: a short one, not the traced type.
// expect-error-clang: requirement 'detail::has_derivative_rule<false>' .namedax::grad: all_gather_v has no derivative rule yet
// expect-one-error
#include <namedax/namedax.hpp>

using namespace namedax::literals;

int main() {
  xt::xarray<double> x = xt::ones<double>({2, 3});
  xt::xarray<int> counts = {1, 2};
  auto f = [](const auto& rows, const auto& count) {
    return namedax::grad([&](const auto& r) { return namedax::sum(namedax::all_gather_v(r, count, "i"_ax)); })(rows);
  };
  auto g = namedax::vmap<"i">(f)(x, counts);
  (void)g;
}
