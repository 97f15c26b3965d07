// SPDX-License-Identifier: MIT
// in_specs gives two specs for a function of three arguments; the diagnostic gives both counts.
// expect-error-gcc: in_specs has a different number of entries than the function takes arguments.*namedax::detail::in_specs_count_matches<2, 3>.* evaluates to false
// expect-error-clang: requirement .in_specs_count_matches<2UL, 3UL>. .namedax::shard_map: in_specs has a different number of entries than the function takes arguments
// expect-error: in_specs_count_matches<2(UL)?, 3(UL)?>
// expect-one-error
#include <namedax/namedax.hpp>

using namespace namedax::literals;

int main() {
  namedax::mesh m{namedax::devices<"data">(2)};
  auto f = namedax::shard_map([](auto x, auto y, auto z) { return x + y + z; }, m,
                              std::tuple{namedax::P("data"_ax), namedax::P("data"_ax)}, namedax::P("data"_ax));
  xt::xarray<float> a = xt::zeros<float>({4});
  xt::xarray<float> out = f(a, a, a);
  (void)out;
}
