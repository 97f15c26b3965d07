// SPDX-License-Identifier: MIT
// A transformer block (two-head self-attention and an MLP, each after a layer norm and with a
// residual connection) trained with namedax::grad on a 2 x 2 mesh: sequences split over
// "data", heads and MLP hidden units split over "model" (Megatron-style). A few SGD steps
// lower the loss and match the same training with the model unsharded (the mesh "data" only).
#include <namedax/namedax.hpp>

#include <xtensor/xadapt.hpp>
#include <xtensor/xrandom.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <tuple>
#include <utility>
#include <vector>

using namespace namedax::literals;

namespace {
constexpr std::size_t sequences = 4, length = 5, width = 8, heads = 2, head_width = 4, hidden = 16;
constexpr int steps = 5;
constexpr double learning_rate = 0.1;

/// x / its standard deviation after subtracting its mean, over the last dim (no learned
/// scale).
template <class X>
auto layer_norm(const X& x) {
  auto centered = x - namedax::mean(x, -1, {.keepdims = true});
  auto variance = namedax::mean(centered * centered, -1, {.keepdims = true});
  return centered / namedax::sqrt(variance + 1e-5);
}

/// The block's mean squared error against targets t, written for one block of the mesh: x and
/// t are this block's sequences (sequence, position, feature); the parameters are this block's
/// heads and hidden units. `model` names what the heads' and hidden units' shares are summed
/// over: "model"_ax on the 2 x 2 mesh, nothing (namedax::axes()) when the model is whole.
template <class Model>
auto loss_over(Model model) {
  return [model](const auto& params, const auto& x, const auto& t) {
    const auto& [wq, wk, wv, wo, w1, w2] = params;  // wq, wk, wv (head, feature, head_width), wo (head, head_width, feature)
    auto n = layer_norm(x);
    auto project = [&](const auto& w) { return namedax::pdot(n, w, namedax::axes(), {{2}, {1}}); };  // (seq, pos, head, hw)
    auto q = project(wq) * (1.0 / std::sqrt(static_cast<double>(head_width)));
    auto k = project(wk);
    auto v = project(wv);
    // Per sequence and head: scores (seq, head, pos, pos), softmax over the keys, the values mixed.
    auto scores = namedax::pdot(q, k, namedax::axes(), {{3}, {3}}, {{0, 2}, {0, 2}});
    auto mixed = namedax::pdot(namedax::softmax(scores, -1), v, namedax::axes(), {{3}, {1}}, {{0, 1}, {0, 2}});
    auto h = x + namedax::pdot(mixed, wo, model, {{1, 3}, {0, 1}});  // the heads summed, here and over `model`
    auto a = namedax::tanh(namedax::pdot(layer_norm(h), w1, namedax::axes(), {{2}, {0}}));
    auto y = h + namedax::pdot(a, w2, model, {{2}, {0}});
    auto r = y - t;
    return namedax::pmean(namedax::mean(r * r), "data"_ax);
  };
}

/// SGD with namedax::value_and_grad: the trained parameters and the loss before each step.
template <class Model>
auto train_over(Model model) {
  return [model](const auto& initial, const auto& x, const auto& t) {
    auto params = std::apply([](const auto&... w) { return std::tuple{namedax::eval(w)...}; }, initial);
    std::vector<double> losses;
    for (int step = 0; step < steps; ++step) {
      auto [loss, gradient] = namedax::value_and_grad(loss_over(model))(params, x, t);
      losses.push_back(loss.value());
      params = namedax::tree_map([](const auto& p, const auto& g) { return namedax::eval(p - learning_rate * g); },
                                 params, gradient);
    }
    return std::tuple{params, xt::xarray<double>(xt::adapt(losses))};
  };
}

double relative_error(const xt::xarray<double>& a, const xt::xarray<double>& b) {
  return xt::amax(xt::abs(a - b))() / xt::amax(xt::abs(b))();
}
}  // namespace

int main() {
  xt::random::seed(11);
  auto random = [](std::vector<std::size_t> shape, double scale) {
    return xt::xarray<double>(scale * xt::random::randn<double>(shape));
  };
  const auto params = std::tuple{random({heads, width, head_width}, 0.4), random({heads, width, head_width}, 0.4),
                                 random({heads, width, head_width}, 0.4), random({heads, head_width, width}, 0.4),
                                 random({width, hidden}, 0.4), random({hidden, width}, 0.3)};
  const auto x = random({sequences, length, width}, 1.0);
  const auto t = random({sequences, length, width}, 1.0);

  // On the 2 x 2 mesh: heads (dim 0 of wq, wk, wv, wo), W1's columns and W2's rows split over
  // "model"; sequences over "data".
  const auto heads_split = namedax::P("model"_ax);
  const auto parameter_specs = std::tuple{heads_split, heads_split, heads_split, heads_split,
                                          namedax::P(namedax::none, "model"_ax), namedax::P("model"_ax)};
  namedax::mesh mesh{namedax::devices<"data">(2), namedax::devices<"model">(2)};
  auto [trained, losses] = namedax::shard_map(train_over("model"_ax), mesh,
                                              std::tuple{parameter_specs, namedax::P("data"_ax), namedax::P("data"_ax)},
                                              std::tuple{parameter_specs, namedax::P()})(params, x, t);

  // The reference: the model whole on every block, the sequences still over "data".
  const auto whole = namedax::P();
  const auto whole_specs = std::tuple{whole, whole, whole, whole, whole, whole};
  namedax::mesh data_only{namedax::vectorized<"data">(2)};
  auto [trained_ref, losses_ref] = namedax::shard_map(train_over(namedax::axes()), data_only,
                                                      std::tuple{whole_specs, namedax::P("data"_ax), namedax::P("data"_ax)},
                                                      std::tuple{whole_specs, namedax::P()})(params, x, t);

  for (int step = 0; step < steps; ++step)
    std::printf("step %d  loss %.9f (model unsharded: %.9f)\n", step, losses(step), losses_ref(step));
  double error = relative_error(losses, losses_ref);
  namedax::tree_map([&](const auto& a, const auto& b) { return error = std::max(error, relative_error(a, b)); },
                    trained, trained_ref);
  std::printf("max difference from the unsharded training (losses and parameters, relative): %.3g\n", error);
  const bool falling = losses(steps - 1) < losses(0);
  const bool pass = falling && error < 1e-5;
  if (pass) std::printf("transformer_block: PASS, data x model parallel training with grad matches the unsharded model\n");
  return pass ? 0 : 1;
}
