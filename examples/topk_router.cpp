// SPDX-License-Identifier: MIT
// The router of a mixture-of-experts layer, data parallel over 4 devices: each device scores
// its own tokens against every expert, keeps each token's top 2 experts with their softmax
// weights renormalized, and the expert loads (how many tokens chose each expert) are summed
// over all devices, as a load-balancing loss needs. Checked against plain loops, in both modes.
#include <namedax/namedax.hpp>

#include <xtensor/xrandom.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <vector>

using namespace namedax::literals;

int main() {
  constexpr std::size_t devices = 4, tokens = 6, features = 5, experts = 8, k = 2;  // tokens per device
  xt::random::seed(7);
  xt::xarray<float> x = xt::random::randn<float>({devices, tokens, features});
  xt::xarray<float> router = xt::random::randn<float>({features, experts});

  auto route = [](auto x, auto w) {  // x: (tokens, features) of this device; w: replicated
    auto probabilities = namedax::softmax(namedax::xeinsum<"tf,fe->te">(x, w), 1);
    auto [weights, chosen] = namedax::top_k(probabilities, int{k});  // (tokens, k) each, best first
    auto gates = weights / namedax::sum(weights, 1, {.keepdims = true});
    auto one_hot = namedax::cast<std::int32_t>(namedax::expand_dims(chosen, 2) == xt::arange<std::int32_t>(int{experts}));
    auto load = namedax::psum(namedax::sum(one_hot, {0, 1}), "i"_ax);  // (experts,), over all devices' tokens
    return std::tuple{namedax::eval(gates), chosen, load};
  };
  const auto in_axes = std::tuple{0, namedax::none};

  // Plain loops: each token's scores, softmax, the two best experts (ties: lower index).
  xt::xarray<float> gates_ref = xt::zeros<float>({devices, tokens, k});
  xt::xarray<std::int32_t> chosen_ref = xt::zeros<std::int32_t>({devices, tokens, k});
  xt::xarray<std::int32_t> load_ref = xt::zeros<std::int32_t>({experts});
  for (std::size_t d = 0; d < devices; ++d)
    for (std::size_t t = 0; t < tokens; ++t) {
      std::vector<double> p(experts);
      for (std::size_t e = 0; e < experts; ++e)
        for (std::size_t f = 0; f < features; ++f) p[e] += double(x(d, t, f)) * double(router(f, e));
      const double top = *std::max_element(p.begin(), p.end());
      double sum = 0.0;
      for (double& v : p) sum += v = std::exp(v - top);
      std::vector<std::size_t> order(experts);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return p[a] > p[b]; });
      for (std::size_t j = 0; j < k; ++j) {
        gates_ref(d, t, j) = float(p[order[j]] / (p[order[0]] + p[order[1]]));
        chosen_ref(d, t, j) = static_cast<std::int32_t>(order[j]);
        ++load_ref(order[j]);
      }
    }

  bool ok = true;
  auto check = [&](const char* mode, auto result) {
    auto [gates, chosen, load] = result;
    double diff = 0.0;
    for (std::size_t n = 0; n < gates.size(); ++n) diff = std::max(diff, std::abs(double(gates.flat(n)) - gates_ref.flat(n)));
    bool loads = true;  // every device holds the total
    for (std::size_t d = 0; d < devices; ++d) loads = loads && xt::view(load, d) == load_ref;
    const bool match = diff < 1e-5 && chosen == chosen_ref && loads;
    std::printf("%s: gates max |difference| %.3g, experts %s, loads %s\n", mode, diff,
                chosen == chosen_ref ? "match" : "DIFFER", loads ? "match" : "DIFFER");
    ok = ok && match;
    return result;
  };
  auto on_threads = check("pmap", namedax::pmap<"i">(route, in_axes)(x, router));
  auto vectorized = check("vmap", namedax::vmap<"i">(route, in_axes)(x, router));
  if (!ok || std::get<0>(on_threads) != std::get<0>(vectorized)) return 1;
  std::printf("top-k routing matches the plain loops; vmap and pmap agree bit for bit\n");
  return 0;
}
