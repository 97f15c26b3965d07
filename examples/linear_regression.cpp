// SPDX-License-Identifier: MIT
// Data-parallel linear regression on a mesh: shard_map splits the samples over the mesh axis
// "data"; each block differentiates the loss with namedax::grad, and the pmean in the loss
// makes its gradient the average over all blocks. The same program runs on a mesh of 8
// simulated devices and on a mesh of 8 vectorized indices, with identical losses.
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
  auto train = [&](auto X, auto y, auto w0) {
    auto w = namedax::eval(w0);
    std::vector<float> losses, differences;
    float scale = 0;  // the largest gradient so far, the first one: what float rounding is relative to
    for (int step = 0; step < steps; ++step) {
      // The loss does not vary along "data", so it is one value in every placement; the
      // gradient of w, which does not vary either, is the same on every block.
      auto [value, gradient] = namedax::value_and_grad(loss)(w, X, y);
      losses.push_back(value.value());
      // Check: the gradient by hand, 2 (X w - y) X averaged over the samples and the blocks.
      auto residual = namedax::pdot(X, w, namedax::axes(), {{1}, {0}}) - y;
      auto by_hand = namedax::pmean(2.f * namedax::expand_dims(residual, 1) * X, namedax::axes(0, "data"_ax));
      scale = std::max(scale, namedax::max(namedax::abs(by_hand)).value());
      differences.push_back(namedax::max(namedax::abs(gradient - by_hand)).value() / scale);
      w = namedax::eval(w - learning_rate * gradient);
    }
    return std::tuple{w, xt::xarray<float>(xt::adapt(losses)), xt::xarray<float>(xt::adapt(differences))};
  };
  // Rows of X and entries of y split over "data", the weights whole on every block. The
  // results are the same on every block (pmean), so out specs P() return them once.
  const auto in_specs = std::tuple{namedax::P("data"_ax), namedax::P("data"_ax), namedax::P()};
  const auto out_specs = std::tuple{namedax::P(), namedax::P(), namedax::P()};
  namedax::mesh threads{namedax::devices<"data">(8)};        // one host thread per block
  namedax::mesh vectorized{namedax::vectorized<"data">(8)};  // one tensor computation, "data" a dim
  auto [w_threads, losses_threads, diff_threads] = namedax::shard_map(train, threads, in_specs, out_specs)(X, y, w0);
  auto [w_vectorized, losses_vectorized, diff_vectorized] =
      namedax::shard_map(train, vectorized, in_specs, out_specs)(X, y, w0);

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
