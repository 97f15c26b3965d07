// SPDX-License-Identifier: MIT
// all_gather_v with a plain number as the count: one assertion that says the count is each
// index's own named value, and what gathers the same rows of every index.
// expect-error: namedax::all_gather_v: the count must be a named value of integers
// expect-one-error
#include <namedax/namedax.hpp>

using namespace namedax::literals;

int main() {
  xt::xarray<float> xs = xt::ones<float>({4, 3, 2});
  auto out = namedax::vmap<"i">([](const auto& v) { return namedax::all_gather_v(v, 1, "i"_ax); })(xs);
  (void)out;
}
