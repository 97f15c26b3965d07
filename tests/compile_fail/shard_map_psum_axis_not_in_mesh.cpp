// SPDX-License-Identifier: MIT
// Inside shard_map, a psum over "model", which the mesh (of "data" alone) does not have. The
// diagnostic names the mesh, not an enclosing vmap or pmap, and it is the only one: the out
// spec P(), which would be right for a psum over "data", reports nothing more.
// expect-error: axis_not_in_mesh<namedax::psum_fn, namedax::axis<(namedax::fixed_string<6>..model..|..109, 111, 100, 101, 108, 0..)>, namedax::axis<(namedax::fixed_string<5>..data..|..100, 97, 116, 97, 0..)> ?>
// expect-one-error
#include <namedax/namedax.hpp>

using namespace namedax::literals;

int main() {
  namedax::mesh m{namedax::devices<"data">(2)};
  auto f = namedax::shard_map([](auto x) { return namedax::psum(x, "model"_ax); }, m, namedax::P("data"_ax),
                              namedax::P());
  auto out = f(xt::xarray<float>(xt::zeros<float>({4})));
  (void)out;
}
