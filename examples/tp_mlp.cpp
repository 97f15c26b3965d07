// SPDX-License-Identifier: MIT
// A two-layer tensor-parallel MLP on 4 simulated devices: W1 split by columns, tanh, W2 split
// by rows, a psum of the partial outputs. Its gradient is computed by namedax::grad, checked
// against the backward pass written by hand with the transposes of the collectives, against
// finite differences and against the gradient of the same network computed on one device.
#include <namedax/namedax.hpp>

#include <xtensor/xrandom.hpp>
#include <xtensor/xview.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <tuple>

using namespace namedax::literals;
namespace linear = namedax::linear;

namespace {
constexpr std::size_t devices = 4, batch = 8, inputs = 6, hidden = 16, outputs = 3;

/// The unsharded network: loss = sum((tanh(X W1) W2 - T)^2) / 2, in the precision of `T`.
template <class R>
R loss_of(const xt::xarray<float>& X, const xt::xarray<float>& W1, const xt::xarray<float>& W2,
          const xt::xarray<float>& T) {
  xt::xarray<R> x = xt::cast<R>(X), w1 = xt::cast<R>(W1), w2 = xt::cast<R>(W2), t = xt::cast<R>(T);
  R loss = 0;
  for (std::size_t b = 0; b < batch; ++b) {
    std::vector<R> a(hidden);
    for (std::size_t h = 0; h < hidden; ++h) {
      R s = 0;
      for (std::size_t i = 0; i < inputs; ++i) s += x(b, i) * w1(i, h);
      a[h] = std::tanh(s);
    }
    for (std::size_t o = 0; o < outputs; ++o) {
      R s = 0;
      for (std::size_t h = 0; h < hidden; ++h) s += a[h] * w2(h, o);
      loss += (s - t(b, o)) * (s - t(b, o)) / 2;
    }
  }
  return loss;
}

/// The gradient of the unsharded network, by hand, in float: dX, dW1, dW2.
std::tuple<xt::xarray<float>, xt::xarray<float>, xt::xarray<float>> unsharded_gradient(
    const xt::xarray<float>& X, const xt::xarray<float>& W1, const xt::xarray<float>& W2, const xt::xarray<float>& T) {
  xt::xarray<float> dX = xt::zeros<float>(X.shape()), dW1 = xt::zeros<float>(W1.shape()), dW2 = xt::zeros<float>(W2.shape());
  for (std::size_t b = 0; b < batch; ++b) {
    std::vector<float> a(hidden), da(hidden, 0.f);
    for (std::size_t h = 0; h < hidden; ++h) {
      float s = 0;
      for (std::size_t i = 0; i < inputs; ++i) s += X(b, i) * W1(i, h);
      a[h] = std::tanh(s);
    }
    for (std::size_t o = 0; o < outputs; ++o) {
      float s = 0;
      for (std::size_t h = 0; h < hidden; ++h) s += a[h] * W2(h, o);
      const float dout = s - T(b, o);
      for (std::size_t h = 0; h < hidden; ++h) dW2(h, o) += a[h] * dout, da[h] += W2(h, o) * dout;
    }
    for (std::size_t h = 0; h < hidden; ++h) {
      const float dh = da[h] * (1 - a[h] * a[h]);
      for (std::size_t i = 0; i < inputs; ++i) dW1(i, h) += X(b, i) * dh, dX(b, i) += W1(i, h) * dh;
    }
  }
  return {dX, dW1, dW2};
}

/// Central differences of the loss (computed in double) along every element of `param`.
template <class Loss>
xt::xarray<float> finite_differences(xt::xarray<float> param, Loss loss) {
  xt::xarray<float> grad = xt::zeros<float>(param.shape());
  const float step = 1e-3f;
  for (std::size_t k = 0; k < param.size(); ++k) {
    const float saved = param.flat(k);
    param.flat(k) = saved + step;
    const double up = loss(param);
    param.flat(k) = saved - step;
    const double down = loss(param);
    param.flat(k) = saved;
    grad.flat(k) = static_cast<float>((up - down) / (2.0 * (static_cast<double>(saved + step) - saved)));
  }
  return grad;
}

double max_error(const xt::xarray<float>& a, const xt::xarray<float>& b) {
  return static_cast<double>(xt::amax(xt::abs(a - b))());
}

double max_abs(const xt::xarray<float>& a) { return static_cast<double>(xt::amax(xt::abs(a))()); }
}  // namespace

int main() {
  xt::random::seed(7);
  const xt::xarray<float> X = xt::random::randn<float>({batch, inputs});
  const xt::xarray<float> W1 = 0.5f * xt::random::randn<float>({inputs, hidden});
  const xt::xarray<float> W2 = 0.5f * xt::random::randn<float>({hidden, outputs});
  const xt::xarray<float> T = xt::random::randn<float>({batch, outputs});

  // Shards: device d holds columns [4d, 4d + 4) of W1 and the same rows of W2.
  constexpr std::size_t shard = hidden / devices;
  xt::xarray<float> W1_shards = W1;
  W1_shards.reshape({inputs, devices, shard});  // mapped along dim 1
  xt::xarray<float> W2_shards = W2;
  W2_shards.reshape({devices, shard, outputs});  // mapped along dim 0

  // The loss, written once for one device: X and T are the same on every device; w1 and w2
  // are shards. h varies along "model" (its own columns); out does not (a psum).
  auto loss_fn = [](const auto& params, const auto& T) {
    const auto& [X, w1, w2] = params;
    auto a = namedax::tanh(namedax::pdot(X, w1, namedax::axes(), {{1}, {0}}));
    auto out = namedax::pdot(a, w2, "model"_ax, {{1}, {0}});  // psum over "model" of a w2
    auto residual = out - T;
    return namedax::psum(residual * residual, namedax::axes(0, 1)) / 2.f;
  };
  auto step = [&](auto X, auto w1, auto w2, auto T) {
    // The gradient in X, w1 and w2, each with its argument's type: dX is summed over "model"
    // (X does not vary along it, h does), dw1 and dw2 are shards.
    auto [value, gradient] = namedax::value_and_grad(loss_fn)(std::tuple{X, w1, w2}, T);

    // The same gradient by hand, with the transposes, as a check. residual is the cotangent
    // of out: the same on every device, so psum's transpose is pvary, a change of type that
    // moves no data.
    auto column_parallel = linear::pdot_rhs(X, namedax::axes(), {{1}, {0}});  // w1 -> X w1
    auto a = namedax::eval(namedax::tanh(column_parallel(w1)));
    auto residual = namedax::eval(namedax::pdot(a, w2, "model"_ax, {{1}, {0}}) - T);
    auto da = namedax::transpose(linear::pdot_lhs(w2, "model"_ax, {{1}, {0}}), residual);
    auto dw2 = namedax::transpose(linear::pdot_rhs(a, "model"_ax, {{1}, {0}}), residual);
    auto dh = namedax::eval(da * (1.f - a * a));
    auto dw1 = namedax::transpose(column_parallel, dh);
    // X does not vary along "model" but h does: the pullback sums over "model" (the
    // all-reduce of a column-parallel layer's input gradient), read from the types.
    auto [h_again, pullback_x] = namedax::vjp(linear::pdot_lhs(w1, namedax::axes(), {{1}, {0}}), X);
    auto dX = pullback_x(dh);
    static_assert(decltype(dX)::varying == decltype(X)::varying, "dX is the same on every device, as X is");
    static_assert(decltype(dw1)::varying == decltype(w1)::varying && decltype(dw2)::varying == decltype(w2)::varying);
    return std::tuple{value, gradient, std::tuple{namedax::eval(dX), dw1, dw2}};
  };
  auto in_axes = std::tuple{namedax::none, 1, 0, namedax::none};
  auto [loss_p, grad_p, hand_p] = namedax::pmap<"model">(step, in_axes)(X, W1_shards, W2_shards, T);
  auto [loss_v, grad_v, hand_v] = namedax::vmap<"model">(step, in_axes)(X, W1_shards, W2_shards, T);
  const bool modes_agree = loss_p == loss_v && grad_p == grad_v && hand_p == hand_v;
  const auto& [dX_p, dW1_p, dW2_p] = grad_p;

  // grad against the hand-written backward pass, relative to the largest gradient element.
  const auto& [dX_hand, dW1_hand, dW2_hand] = hand_p;
  const double largest = std::max({max_abs(dX_hand), max_abs(dW1_hand), max_abs(dW2_hand)});
  const double hand_error =
      std::max({max_error(dX_p, dX_hand), max_error(dW1_p, dW1_hand), max_error(dW2_p, dW2_hand)}) / largest;

  // Back to the unsharded layouts: outputs are stacked along the device axis at dim 0.
  xt::xarray<float> dX = xt::view(dX_p, 0);
  xt::xarray<float> dW1 = xt::transpose(dW1_p, {1, 0, 2});  // (inputs, devices, shard)
  dW1.reshape({inputs, hidden});
  xt::xarray<float> dW2 = dW2_p;
  dW2.reshape({hidden, outputs});
  const float loss = loss_p(0);

  auto [dX_ref, dW1_ref, dW2_ref] = unsharded_gradient(X, W1, W2, T);
  const double unsharded_error = std::max({max_error(dX, dX_ref), max_error(dW1, dW1_ref), max_error(dW2, dW2_ref)});
  const double loss_error = std::abs(static_cast<double>(loss) - loss_of<double>(X, W1, W2, T));

  const auto fd_X = finite_differences(X, [&](const auto& p) { return loss_of<double>(p, W1, W2, T); });
  const auto fd_W1 = finite_differences(W1, [&](const auto& p) { return loss_of<double>(X, p, W2, T); });
  const auto fd_W2 = finite_differences(W2, [&](const auto& p) { return loss_of<double>(X, W1, p, T); });
  const double fd_error = std::max({max_error(dX, fd_X), max_error(dW1, fd_W1), max_error(dW2, fd_W2)});

  std::printf("loss %.6f on %zu devices (unsharded, in double: %.6f)\n", static_cast<double>(loss), devices,
              loss_of<double>(X, W1, W2, T));
  std::printf("max gradient error against finite differences: dX %.3g, dW1 %.3g, dW2 %.3g (max %.3g)\n",
              max_error(dX, fd_X), max_error(dW1, fd_W1), max_error(dW2, fd_W2), fd_error);
  std::printf("max gradient error against the unsharded float32 gradient: %.3g\n", unsharded_error);
  std::printf("max difference between grad and the hand-written backward pass: %.3g (relative)%s\n", hand_error,
              hand_error < 1e-5 ? "" : "  -- GRADIENT MISMATCH");
  std::printf("vmap and pmap %s bit for bit\n", modes_agree ? "agree" : "DISAGREE");
  const bool pass = fd_error < 1e-3 && unsharded_error < 1e-5 && loss_error < 1e-4 && hand_error < 1e-5 && modes_agree;
  if (pass) std::printf("tp_mlp: PASS, grad and the hand-written backward pass through the collectives' transposes are correct\n");
  return pass ? 0 : 1;
}
