// SPDX-License-Identifier: MIT
// Mixture-of-experts dispatch and combine with all_to_all. Each of 4 devices holds 8 tokens
// and one expert. A router sends every token to one expert; all_to_all carries the tokens to
// their experts' devices, each expert transforms what it received, and a second all_to_all
// brings the results home. Checked against plain loops on one process.
//
// Capacity: each device has `capacity` slots on each expert. A device fills them in token
// order; a token whose expert has no free slot left on that device is dropped, and its
// output is zero (in a transformer, the residual connection carries it on unchanged).
#include <namedax/namedax.hpp>

#include <xtensor/xrandom.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>

using namespace namedax::literals;

int main() {
  constexpr std::size_t devices = 4, tokens = 8, features = 3, capacity = 2;
  xt::random::seed(11);
  xt::xarray<float> x = xt::random::randn<float>({devices, tokens, features});         // tokens, by device
  xt::xarray<float> router = xt::random::randn<float>({features, devices});             // the same everywhere
  xt::xarray<float> weights = xt::random::randn<float>({devices, features, features});  // expert e on device e
  // lower(s, t) = 1 for t <= s: a product with it is a running count over the tokens.
  xt::xarray<float> lower = xt::zeros<float>({tokens, tokens});
  for (std::size_t s = 0; s < tokens; ++s)
    for (std::size_t t = 0; t <= s; ++t) lower(s, t) = 1.f;
  xt::xarray<float> slots = xt::arange<float>(1.f, float(capacity) + 1.f);  // slot numbers 1 .. capacity

  auto moe = [&](auto x, auto w) {  // x: (tokens, features) of this device; w: its expert's weights
    // Route: each token goes to the expert of highest score (random scores: no ties).
    auto scores = namedax::xeinsum<"td,de->te">(x, router);  // (tokens, experts)
    auto best = namedax::pmax(scores, namedax::axes(1));      // a positional max: (tokens,)
    auto chosen = namedax::eval(namedax::cast<float>(scores == namedax::expand_dims(best, 1)));
    // Slot of token t on its expert: 1 + the number of earlier tokens of this device that
    // chose the same expert. dispatch(t, e, c) = 1 when token t takes slot c of expert e;
    // a token whose rank exceeds the capacity matches no slot: it is dropped.
    auto rank = namedax::xeinsum<"st,te->se">(lower, chosen);
    auto dispatch = namedax::eval(namedax::cast<float>(namedax::expand_dims(chosen * rank, 2) == slots));

    auto outbox = namedax::xeinsum<"tec,td->ecd">(dispatch, x);  // (experts, capacity, features)
    // Untiled all_to_all: slice e of the outbox goes to device e, which stacks the slices it
    // receives along a new axis 0, one per source device: (sources, capacity, features).
    auto inbox = namedax::all_to_all(outbox, "i"_ax, 0, 0);
    auto processed = namedax::eval(namedax::tanh(namedax::xeinsum<"scd,dk->sck">(inbox, w)));  // the expert
    auto returned = namedax::all_to_all(processed, "i"_ax, 0, 0);  // (experts, capacity, features), home again
    auto y = namedax::xeinsum<"tec,ecd->td">(dispatch, returned);   // each token's result, 0 if dropped
    auto kept = namedax::psum(dispatch, namedax::axes("i"_ax, 0, 1, 2));  // tokens served, all devices
    return std::tuple{y, kept};
  };

  // The same computation by plain loops, token by token, on one process.
  xt::xarray<float> expected = xt::zeros<float>({devices, tokens, features});
  std::size_t kept_expected = 0;
  for (std::size_t d = 0; d < devices; ++d) {
    std::size_t used[devices] = {};
    for (std::size_t t = 0; t < tokens; ++t) {
      std::size_t e = 0;
      float best = -INFINITY;
      for (std::size_t k = 0; k < devices; ++k) {
        float score = 0.f;
        for (std::size_t f = 0; f < features; ++f) score += x(d, t, f) * router(f, k);
        if (score > best) best = score, e = k;
      }
      if (used[e]++ >= capacity) continue;  // no free slot left: dropped, output zero
      ++kept_expected;
      for (std::size_t k = 0; k < features; ++k) {
        float acc = 0.f;
        for (std::size_t f = 0; f < features; ++f) acc += x(d, t, f) * weights(e, f, k);
        expected(d, t, k) = std::tanh(acc);
      }
    }
  }

  bool ok = true;
  auto check = [&](const char* mode, const auto& result) {
    const auto& [y, kept] = result;
    float max_diff = 0.f;
    for (std::size_t k = 0; k < expected.size(); ++k) max_diff = std::max(max_diff, std::abs(y.flat(k) - expected.flat(k)));
    const bool match = y.shape() == expected.shape() && max_diff < 1e-5f && std::size_t(kept(0)) == kept_expected;
    std::printf("%s: %zu of %zu tokens served, %zu dropped (loops: %zu served); max |difference| = %.3g\n", mode,
                std::size_t(kept(0)), devices * tokens, devices * tokens - std::size_t(kept(0)), kept_expected, max_diff);
    ok = ok && match;
  };
  check("pmap", namedax::pmap<"i">(moe)(x, weights));
  check("vmap", namedax::vmap<"i">(moe)(x, weights));
  if (!ok) return 1;
  std::printf("mixture-of-experts dispatch and combine match the single-process loops\n");
  return 0;
}
