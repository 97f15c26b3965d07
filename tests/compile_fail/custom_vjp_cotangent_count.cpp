// SPDX-License-Identifier: MIT
// custom_vjp: bwd must return one cotangent per argument of the function; one too few is
// reported by name, not as an index out of range of a std::tuple deep in the recorded program.
// expect-error: namedax::custom_vjp: bwd must return one cotangent per argument of the function
#include <namedax/namedax.hpp>

#include <tuple>
#include <utility>

int main() {
  auto product = namedax::custom_vjp([](const auto& a, const auto& b) { return a * b; },
                                     [](const auto& a, const auto& b) { return std::pair{a * b, std::pair{a, b}}; },
                                     [](const auto& kept, const auto& ct) { return std::tuple{ct * kept.second}; });
  xt::xarray<double> x = xt::ones<double>({3});
  xt::xarray<double> g = namedax::grad([&](const auto& a) { return namedax::sum(product(a, a)); })(x);
  (void)g;
}
