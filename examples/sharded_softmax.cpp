// SPDX-License-Identifier: MIT
// Softmax and layer norm over a feature axis sharded across 4 devices, as in a
// tensor-parallel layer: each device holds 2 of the 8 features of every row. The softmax is
// numerically stable: pmax finds each row's maximum over all shards, then psum adds the
// exponentials. Checked against the unsharded computation by plain loops.
#include <namedax/namedax.hpp>

#include <xtensor/xrandom.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>

using namespace namedax::literals;

int main() {
  constexpr std::size_t rows = 3, devices = 4, features = 8;
  constexpr float eps = 1e-5f;  // layer norm's guard against a zero variance
  // Row 0 is ordinary; rows 1 and 2 sit near +1000 and -1000, where exp overflows and
  // underflows in float: only a softmax that subtracts the maximum first survives them.
  xt::random::seed(5);
  xt::xarray<float> x = 3.f * xt::random::randn<float>({rows, features});
  for (std::size_t f = 0; f < features; ++f) x(1, f) += 1000.f, x(2, f) -= 1000.f;
  xt::xarray<float> gamma = 1.f + 0.1f * xt::random::randn<float>({features}), beta = 0.1f * xt::random::randn<float>({features});

  // Sharded by features: x is seen as (rows, devices, features / devices) and mapped along
  // its dimension 1; gamma and beta as (devices, features / devices), mapped along 0.
  xt::xarray<float> x_shards = xt::reshape_view(x, {rows, devices, features / devices});
  xt::xarray<float> gamma_shards = xt::reshape_view(gamma, {devices, features / devices});
  xt::xarray<float> beta_shards = xt::reshape_view(beta, {devices, features / devices});

  // Written for one shard: x is (rows, features on this device). The feature axis is "i"
  // (across devices) and positional axis 1 (within one): reductions name both.
  const auto feature_axes = namedax::axes("i"_ax, 1);
  auto layer = [&](auto x, auto gamma, auto beta) {
    auto row_max = namedax::pmax(x, feature_axes);  // (rows,), the same on every device
    auto e = namedax::eval(namedax::exp(x - namedax::expand_dims(row_max, 1)));
    auto softmax = e / namedax::expand_dims(namedax::psum(e, feature_axes), 1);
    // The naive softmax, for contrast: exp(1000) is inf in float, and inf / inf is NaN.
    auto naive = namedax::exp(x) / namedax::expand_dims(namedax::psum(namedax::exp(x), feature_axes), 1);

    // Layer norm: pmean over both axes divides by all 8 features of the row.
    auto centered = namedax::eval(x - namedax::expand_dims(namedax::pmean(x, feature_axes), 1));
    auto variance = namedax::pmean(namedax::square(centered), feature_axes);
    auto normalized = centered / namedax::sqrt(namedax::expand_dims(variance, 1) + eps) * gamma + beta;
    return std::tuple{softmax, normalized, naive};
  };
  const auto in_axes = std::tuple{1, 0, 0};
  constexpr int out_axes = 1;  // put the device axis back between rows and features

  // The unsharded computation, in double, by plain loops.
  xt::xarray<double> softmax_ref = xt::zeros<double>({rows, features}), norm_ref = softmax_ref;
  for (std::size_t r = 0; r < rows; ++r) {
    double max = -INFINITY, sum = 0.0, mean = 0.0, variance = 0.0;
    for (std::size_t f = 0; f < features; ++f) max = std::max(max, double(x(r, f)));
    for (std::size_t f = 0; f < features; ++f) sum += softmax_ref(r, f) = std::exp(double(x(r, f)) - max);
    for (std::size_t f = 0; f < features; ++f) softmax_ref(r, f) /= sum, mean += x(r, f) / double(features);
    for (std::size_t f = 0; f < features; ++f) variance += (x(r, f) - mean) * (x(r, f) - mean) / double(features);
    for (std::size_t f = 0; f < features; ++f) norm_ref(r, f) = (x(r, f) - mean) / std::sqrt(variance + eps) * gamma(f) + beta(f);
  }

  bool ok = true;
  auto check = [&](const char* mode, auto result) {
    auto [softmax, normalized, naive] = result;
    softmax.reshape({rows, features}), normalized.reshape({rows, features}), naive.reshape({rows, features});
    double softmax_diff = 0.0, norm_diff = 0.0;
    for (std::size_t k = 0; k < softmax_ref.size(); ++k) {
      softmax_diff = std::max(softmax_diff, std::abs(softmax.flat(k) - softmax_ref.flat(k)));
      norm_diff = std::max(norm_diff, std::abs(normalized.flat(k) - norm_ref.flat(k)));
    }
    // NaN compares false, so a NaN anywhere fails the check too.
    const bool match = softmax_diff < 1e-6 && norm_diff < 1e-4;
    std::printf("%s: max |difference| softmax %.3g, layer norm %.3g; naive softmax of row 1: %g, row 2: %g\n", mode,
                softmax_diff, norm_diff, naive(1, 0), naive(2, 0));
    ok = ok && match;
  };
  check("pmap", namedax::pmap<"i">(layer, in_axes, out_axes)(x_shards, gamma_shards, beta_shards));
  check("vmap", namedax::vmap<"i">(layer, in_axes, out_axes)(x_shards, gamma_shards, beta_shards));
  if (!ok) return 1;
  std::printf("sharded softmax and layer norm match the unsharded computation\n");
  return 0;
}
