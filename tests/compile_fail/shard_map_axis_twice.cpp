// SPDX-License-Identifier: MIT
// A partition spec names the mesh axis "data" for two dims; a mesh axis splits one dim, once.
// expect-error: (incomplete type|undefined template) .*namedax::partition_spec_names_mesh_axis_twice<namedax::axis<(namedax::fixed_string<5>..data..|..100, 97, 116, 97, 0..)> ?>
#include <namedax/namedax.hpp>

using namespace namedax::literals;

int main() {
  namedax::mesh m{namedax::devices<"data">(2)};
  auto f = namedax::shard_map([](auto x) { return x; }, m, namedax::P("data"_ax, "data"_ax), namedax::P("data"_ax));
  auto out = f(xt::xarray<float>(xt::zeros<float>({4, 4})));
  (void)out;
}
