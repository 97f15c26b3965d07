// SPDX-License-Identifier: MIT
// checkpoint: every leaf of a pytree result must be a named value; a plain number beside one
// is reported by name, not as a failed evaluation deep in the recorded program.
// expect-error: namedax::checkpoint, custom_vjp and custom_jvp: the function must return named values \(one, or a pytree of them\)
// expect-one-error
#include <namedax/namedax.hpp>

#include <utility>

int main() {
  auto block = namedax::checkpoint([](const auto& r) { return std::pair{namedax::sin(r), 2.0}; });
  xt::xarray<double> x = xt::ones<double>({4, 3});
  auto row_grad = [&](const auto& row) {
    return namedax::grad([&](const auto& r) { return namedax::sum(block(r).first); })(row);
  };
  xt::xarray<double> g = namedax::vmap<"i">(row_grad)(x);
  (void)g;
}
