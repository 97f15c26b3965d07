// SPDX-License-Identifier: MIT
// Data-parallel linear regression on a mesh, as JAX's training step: the loss is written for
// one block of samples and averaged over the blocks with pmean; shard_map splits the samples
// over the mesh axis "data", and value_and_grad differentiates the function that calls
// shard_map. The same program runs on a mesh of 8 simulated devices and on a mesh of 8
// vectorized indices, with identical losses.
#include <namedax/namedax.hpp>

#include <xtensor/xadapt.hpp>
#include <xtensor/xrandom.hpp>
#include <xtensor/xview.hpp>

#include <algorithm>
#include <cstdio>
#include <tuple>
#include <vector>

using namespace namedax::literals;

int main() {
  constexpr std::size_t samples = 512, features = 3;
  constexpr int steps = 100;
  constexpr float learning_rate = 0.1f;

  // Synthetic data y = X w_true + 0.5 + noise. X is (samples, features + 1), its last column
  // all ones so that the last weight is the bias.
  xt::random::seed(42);
  xt::xarray<float> X = xt::ones<float>({samples, features + 1});
  xt::view(X, xt::all(), xt::range(0, features)) = xt::random::randn<float>({samples, features});
  xt::xarray<float> w_true{1.5f, -2.0f, 0.7f, 0.5f};
  xt::xarray<float> y = xt::sum(X * w_true, {1}) + 0.01f * xt::random::randn<float>({samples});
  xt::xarray<float> w0 = xt::zeros<float>({features + 1});

  // The mean squared error over all samples, written for one block: X and y vary along
  // "data", w does not; pmean averages over this block's samples (dim 0) and over the blocks.
  auto loss = [](const auto& w, const auto& X, const auto& y) {
    auto residual = namedax::pdot(X, w, namedax::axes(), {{1}, {0}}) - y;  // X w - y on this block
    return namedax::pmean(residual * residual, namedax::axes(0, "data"_ax));
  };
  // The weights whole on every block, rows of X and entries of y split over "data"; the loss
  // is the same on every block (pmean), so the out spec P() returns it once.
  const auto in_specs = std::tuple{namedax::P(), namedax::P("data"_ax), namedax::P("data"_ax)};
  // JAX's training step: grad of a function that calls shard_map. The pullback is the mesh's
  // shard_map of the loss's pullback, collectives included.
  auto train = [&](const auto& mesh) {
    auto sharded_loss = [&](const auto& w) { return namedax::shard_map(loss, mesh, in_specs, namedax::P())(w, X, y); };
    xt::xarray<float> w = w0;
    std::vector<float> losses, differences;
    float scale = 0;  // the largest gradient so far, the first one: what float rounding is relative to
    for (int step = 0; step < steps; ++step) {
      auto [value, gradient] = namedax::value_and_grad(sharded_loss)(w);
      losses.push_back(value.value());
      // Check: the gradient by hand, 2 X^T (X w - y) / samples.
      xt::xarray<float> residual = xt::sum(X * w, {1}) - y;
      xt::xarray<float> by_hand = 2.f * xt::sum(xt::view(residual, xt::all(), xt::newaxis()) * X, {0}) / float(samples);
      scale = std::max(scale, xt::amax(xt::abs(by_hand))());
      differences.push_back(xt::amax(xt::abs(gradient - by_hand))() / scale);
      w = w - learning_rate * gradient;
    }
    return std::tuple{w, xt::xarray<float>(xt::adapt(losses)), xt::xarray<float>(xt::adapt(differences))};
  };
  namedax::mesh threads{namedax::devices<"data">(8)};        // one host thread per block
  namedax::mesh vectorized{namedax::vectorized<"data">(8)};  // one tensor computation, "data" a dim
  auto [w_threads, losses_threads, diff_threads] = train(threads);
  auto [w_vectorized, losses_vectorized, diff_vectorized] = train(vectorized);

  for (int step : {0, 1, 10, steps - 1})
    std::printf("step %3d  loss threads %.6f  vectorized %.6f\n", step, losses_threads(step), losses_vectorized(step));
  std::printf("weights: %.3f %.3f %.3f, bias %.3f (true 1.5 -2.0 0.7, bias 0.5)\n", w_threads(0), w_threads(1),
              w_threads(2), w_threads(3));
  const float difference = std::max(xt::amax(diff_threads)(), xt::amax(diff_vectorized)());
  const bool grad_ok = difference < 1e-5f;
  std::printf("grad vs the hand-written gradient: max difference %.3g (relative to the first gradient)%s\n", difference,
              grad_ok ? "" : "  -- GRADIENT MISMATCH");
  const bool match = losses_threads == losses_vectorized && w_threads == w_vectorized;
  const bool trained = losses_threads(steps - 1) < 1e-3f;
  std::printf("%s\n", match ? "losses match: threads and vectorized meshes agree bit for bit"
                            : "MISMATCH between the threads and vectorized meshes");
  return match && trained && grad_ok ? 0 : 1;
}
