// SPDX-License-Identifier: MIT
// The argument is an xt::xtensor of rank 1, but its spec has two entries.
// expect-error: (incomplete type|undefined template) .*namedax::partition_spec_has_more_entries_than_the_argument_has_dims<0, 2, 1>
#include <namedax/namedax.hpp>

using namespace namedax::literals;

int main() {
  namedax::mesh m{namedax::devices<"data">(2)};
  auto f = namedax::shard_map([](auto x) { return x; }, m, namedax::P("data"_ax, namedax::none), namedax::P("data"_ax));
  xt::xtensor<float, 1> x = xt::zeros<float>({4});
  auto out = f(x);
  (void)out;
}
