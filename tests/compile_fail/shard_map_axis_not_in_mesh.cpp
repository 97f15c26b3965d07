// SPDX-License-Identifier: MIT
// A partition spec names "modle", which the mesh does not have.
// expect-error: (incomplete type|undefined template) .*namedax::partition_spec_names_axis_not_in_mesh<namedax::axis<(namedax::fixed_string<6>..modle..|..109, 111, 100, 108, 101, 0..)> ?>
#include <namedax/namedax.hpp>

using namespace namedax::literals;

int main() {
  namedax::mesh m{namedax::devices<"data">(2), namedax::devices<"model">(2)};
  auto f = namedax::shard_map([](auto x) { return x; }, m, namedax::P("data"_ax, "modle"_ax),
                              namedax::P("data"_ax, "model"_ax));
  auto out = f(xt::xarray<float>(xt::zeros<float>({4, 4})));
  (void)out;
}
