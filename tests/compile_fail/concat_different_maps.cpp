// SPDX-License-Identifier: MIT
// Values of two maps that are not nested in one another have no common environment, so they
// do not join: concat says so in its first diagnostic.
// expect-error: namedax::concat: the values come from different maps
#include <namedax/namedax.hpp>
#include <namedax/structure.hpp>

using namespace namedax::literals;

int main() {
  using in_i = namedax::env<namedax::binding<namedax::axis<"i">, namedax::placement::vectorized>>;
  using in_j = namedax::env<namedax::binding<namedax::axis<"j">, namedax::placement::vectorized>>;
  using payload = xt::xarray<float>;
  namedax::named<payload, in_i, 1> a(payload::from_shape({2, 4}));
  namedax::named<payload, in_j, 1> b(payload::from_shape({2, 3}));
  auto joined = namedax::concat(std::tuple{a, b}, 0);
  (void)joined;
}
