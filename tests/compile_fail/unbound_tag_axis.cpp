// SPDX-License-Identifier: MIT
// A tag-type axis prints by its own name: pmax over `batch` inside a map of `model` names batch_t.
// expect-error: axis_not_bound<namedax::pmax_fn, batch_t>
#include <namedax/namedax.hpp>

NAMEDAX_AXIS(batch);

int main() {
  xt::xarray<float> xs = xt::zeros<float>({4, 2});
  auto f = [](auto x) { return namedax::pmax(x, batch); };
  auto result = namedax::vmap<"model">(f)(xs);
  (void)result;
}
