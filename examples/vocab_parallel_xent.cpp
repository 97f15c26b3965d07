// SPDX-License-Identifier: MIT
// Vocabulary-parallel softmax cross-entropy, as in Megatron's output layer: the logits of a
// batch are split by vocabulary entries over 4 devices, and no device ever holds a whole
// row. Each device takes the logsumexp of its own entries; the row's logsumexp combines them
// stably (pmax, then psum of exponentials); the label's logit comes from the one device whose
// range holds it (take_along_axis where the label is local, zero elsewhere, psum). Checked
// against plain loops over whole rows, in both modes.
#include <namedax/namedax.hpp>

#include <xtensor/xrandom.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>

using namespace namedax::literals;

int main() {
  constexpr std::size_t batch = 6, devices = 4, vocabulary = 32, local_entries = vocabulary / devices;
  xt::random::seed(11);
  xt::xarray<float> logits = 4.f * xt::random::randn<float>({batch, vocabulary});
  for (std::size_t v = 0; v < vocabulary; ++v) logits(2, v) += 500.f;  // exp overflows without the max
  xt::xarray<std::int32_t> labels = xt::random::randint<std::int32_t>({batch}, 0, int{vocabulary});
  // Device i holds entries [i * local_entries, ...) of every row: logits seen as
  // (batch, devices, local_entries) and mapped along dimension 1; the labels are replicated.
  xt::xarray<float> shards = xt::reshape_view(logits, {batch, devices, local_entries});

  auto cross_entropy = [](auto x, auto labels) {  // x: (batch, local_entries)
    auto local = namedax::logsumexp(x, 1);        // (batch,)
    auto top = namedax::pmax(local, "i"_ax);
    auto lse = top + namedax::log(namedax::psum(namedax::exp(local - top), "i"_ax));
    auto here = labels - namedax::axis_index("i"_ax) * int{local_entries};  // the label's index on this device
    auto mine = (here >= 0) && (here < int{local_entries});
    auto picked = namedax::take_along_axis(x, namedax::expand_dims(namedax::clip(here, 0, int{local_entries} - 1), 1), 1);
    auto label_logit = namedax::psum(namedax::where(mine, namedax::squeeze(picked, 1), 0.f), "i"_ax);
    return namedax::eval(namedax::mean(lse - label_logit));  // the same on every device
  };
  const auto in_axes = std::tuple{1, namedax::none};

  double expected = 0.0;  // plain loops over whole rows, in double
  for (std::size_t r = 0; r < batch; ++r) {
    double top = -INFINITY, sum = 0.0;
    for (std::size_t v = 0; v < vocabulary; ++v) top = std::max(top, double(logits(r, v)));
    for (std::size_t v = 0; v < vocabulary; ++v) sum += std::exp(double(logits(r, v)) - top);
    expected += (top + std::log(sum) - logits(r, static_cast<std::size_t>(labels(r)))) / double(batch);
  }

  xt::xarray<float> on_threads = namedax::pmap<"i">(cross_entropy, in_axes)(shards, labels);
  xt::xarray<float> vectorized = namedax::vmap<"i">(cross_entropy, in_axes)(shards, labels);
  const bool same_bits = on_threads == vectorized;
  double diff = 0.0;
  for (float loss : on_threads) diff = std::max(diff, std::abs(double(loss) - expected) / std::abs(expected));
  std::printf("loss %.6f on every device (plain loops: %.6f, relative difference %.3g); vmap and pmap %s\n",
              double(on_threads(0)), expected, diff, same_bits ? "agree bit for bit" : "DIFFER");
  if (!(diff < 1e-5) || !same_bits) return 1;
  std::printf("vocabulary-parallel cross-entropy matches the unsharded loss\n");
  return 0;
}
