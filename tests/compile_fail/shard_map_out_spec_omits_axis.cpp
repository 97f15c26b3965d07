// SPDX-License-Identifier: MIT
// The blocks of x * 2 differ along "model", but the out spec does not name "model": shard_map
// would keep one block and drop the others (JAX checks this at trace time).
// expect-error: (incomplete type|undefined template) .*namedax::out_spec_omits_axis_the_result_varies_along<namedax::axis<(namedax::fixed_string<6>..model..|..109, 111, 100, 101, 108, 0..)> ?, 0>
#include <namedax/namedax.hpp>

using namespace namedax::literals;

int main() {
  namedax::mesh m{namedax::devices<"data">(2), namedax::devices<"model">(2)};
  auto f = namedax::shard_map([](auto x) { return x * 2.f; }, m, namedax::P("data"_ax, "model"_ax),
                              namedax::P("data"_ax));
  auto out = f(xt::xarray<float>(xt::zeros<float>({4, 4})));
  (void)out;
}
