// SPDX-License-Identifier: MIT
// The in_specs entry of argument 1, a pair of arrays, is a tuple of one spec; the diagnostic
// names the argument.
// expect-error-gcc: check_in_spec_fits_argument\(\) .with long unsigned int Argument = 1.*the in_specs entry of an argument .* is a node that does not match the argument's structure
// expect-error-clang: requirement .in_spec_fits_argument<1UL, false>. .namedax::shard_map: the in_specs entry of an argument
// expect-error: in_spec_fits_argument<1(UL)?, false>
// expect-one-error
#include <namedax/namedax.hpp>

using namespace namedax::literals;

int main() {
  namedax::mesh m{namedax::devices<"data">(2)};
  auto f = namedax::shard_map([](auto x, auto yz) { return x + yz.first; }, m,
                              std::tuple{namedax::P("data"_ax), std::tuple{namedax::P("data"_ax)}}, namedax::P("data"_ax));
  xt::xarray<float> a = xt::zeros<float>({4});
  xt::xarray<float> out = f(a, std::pair{a, a});
  (void)out;
}
