// SPDX-License-Identifier: MIT
// Data-parallel linear regression: each of 8 devices holds a shard of the data, computes
// the gradient on its shard, and the devices average their gradients with pmean. The same
// function runs vectorized (vmap) and on 8 simulated devices (pmap), with identical losses.
#include <namedax/namedax.hpp>

#include <xtensor/xadapt.hpp>
#include <xtensor/xrandom.hpp>
#include <xtensor/xview.hpp>

#include <cstdio>
#include <tuple>
#include <vector>

using namespace namedax::literals;

int main() {
  constexpr std::size_t devices = 8, per_device = 64, features = 3;
  constexpr int steps = 100;
  constexpr float learning_rate = 0.1f;

  // Synthetic data y = X w_true + 0.5 + noise, in shards: X is (devices, samples, features + 1),
  // its last column all ones so that the last weight is the bias.
  xt::random::seed(42);
  xt::xarray<float> X = xt::ones<float>({devices, per_device, features + 1});
  xt::view(X, xt::all(), xt::all(), xt::range(0, features)) = xt::random::randn<float>({devices, per_device, features});
  xt::xarray<float> w_true{1.5f, -2.0f, 0.7f, 0.5f};
  xt::xarray<float> y = xt::sum(X * w_true, {2}) + 0.01f * xt::random::randn<float>({devices, per_device});
  xt::xarray<float> w0 = xt::zeros<float>({features + 1});  // the same on every device: in_axes none

  // Written once, for one shard. "data" names the axis along which the shards are spread.
  auto train = [&](auto X, auto y, auto w0) {
    auto w = namedax::eval(w0);
    std::vector<float> losses;
    for (int step = 0; step < steps; ++step) {
      auto residual = namedax::eval(namedax::psum(X * w, namedax::axes(1)) - y);  // X w - y on this shard
      // The loss does not vary along "data" after pmean, so it is one value in both modes.
      losses.push_back(namedax::pmean(residual * residual, namedax::axes(0, "data"_ax)).value());
      // Gradient of the mean squared error on this shard, averaged over all shards.
      auto gradient = namedax::pmean(2.f * namedax::expand_dims(residual, 1) * X, namedax::axes(0, "data"_ax));
      w = namedax::eval(w - learning_rate * gradient);
    }
    return std::tuple{w, xt::xarray<float>(xt::adapt(losses))};
  };
  auto in_axes = std::tuple{0, 0, namedax::none};
  auto [w_vmap, losses_vmap] = namedax::vmap<"data">(train, in_axes)(X, y, w0);
  auto [w_pmap, losses_pmap] = namedax::pmap<"data">(train, in_axes)(X, y, w0);

  // Every index of "data" holds the same replicated result; take index 0.
  for (int step : {0, 1, 10, steps - 1})
    std::printf("step %3d  loss vmap %.6f  pmap %.6f\n", step, losses_vmap(0, step), losses_pmap(0, step));
  std::printf("weights (pmap): %.3f %.3f %.3f, bias %.3f (true 1.5 -2.0 0.7, bias 0.5)\n", w_pmap(0, 0), w_pmap(0, 1),
              w_pmap(0, 2), w_pmap(0, 3));
  const bool match = losses_vmap == losses_pmap && w_vmap == w_pmap;
  const bool trained = losses_pmap(0, steps - 1) < 1e-3f;
  std::printf("%s\n", match ? "losses match: vmap and pmap agree bit for bit" : "MISMATCH between vmap and pmap");
  return match && trained ? 0 : 1;
}
