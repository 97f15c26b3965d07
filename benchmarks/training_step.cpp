// SPDX-License-Identifier: MIT
// One training step (forward, namedax::value_and_grad, an SGD update of every parameter) of a
// tensor-parallel MLP and of a transformer block (multi-head self-attention, then an MLP, each
// after a layer norm and with a residual connection), in float32, on a 2 x 2 mesh: the batch
// split over "data", the MLP's hidden units and the heads over "model" (Megatron-style), the
// loss a pmean over "data". The same shard_map runs on
// 4 device threads (a mesh of devices) and vectorized on one thread (a mesh of vectorized axes,
// OpenBLAS and oneTBB limited to one thread). benchmarks/torch_training_step.py times the same
// steps, the model whole, in PyTorch's eager mode with autograd; scripts/bench.sh prints the
// ratios. Prints one line per model and placement and writes the CSV that report.py reads:
//   impl,collective,devices,bytes,actual_bytes,seconds   (collective: the model's step)
//
//   training_step --batch 64 --width 1024 --hidden 4096 --out training_step.csv
//
// Sizes: the MLP maps (batch, width) -> (batch, hidden) -> (batch, width); the transformer
// block takes --sequences sequences of --length tokens of --block-width features, with
// --heads heads of block-width / heads each and an MLP of 4 x block-width hidden units.
#include "bench_common.hpp"

#include <namedax/namedax.hpp>

#include <oneapi/tbb/global_control.h>
#include <xtensor/xrandom.hpp>

#include <cblas.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>

using namespace namedax::literals;

namespace {

constexpr float learning_rate = 0.01f;

/// The MLP's loss on one block of the mesh: x and t are this block's rows, w1 this block's
/// columns of W1 and w2 the same rows of W2; the partial outputs are summed over "model".
auto mlp_loss = [](const auto& params, const auto& x, const auto& t) {
  const auto& [w1, w2] = params;
  auto h = namedax::tanh(namedax::pdot(x, w1, namedax::axes(), {{1}, {0}}));
  auto r = namedax::pdot(h, w2, "model"_ax, {{1}, {0}}) - t;
  return namedax::pmean(namedax::mean(r * r), "data"_ax);
};

/// x / its standard deviation after subtracting its mean, over the last dim.
template <class X>
auto layer_norm(const X& x) {
  auto centered = x - namedax::mean(x, -1, {.keepdims = true});
  auto variance = namedax::mean(centered * centered, -1, {.keepdims = true});
  return centered / namedax::sqrt(variance + 1e-5f);
}

/// The transformer block's loss on one block of the mesh: x and t are this block's sequences
/// (sequence, position, feature), the parameters this block's heads and hidden units.
auto block_loss = [](const auto& params, const auto& x, const auto& t) {
  const auto& [wq, wk, wv, wo, w1, w2] = params;  // wq, wk, wv (head, feature, head_width), wo (head, head_width, feature)
  const float scale = 1.f / std::sqrt(static_cast<float>(wq.shape()[2]));
  auto n = layer_norm(x);
  auto project = [&](const auto& w) { return namedax::pdot(n, w, namedax::axes(), {{2}, {1}}); };  // (seq, pos, head, hw)
  auto q = project(wq) * scale;
  auto k = project(wk);
  auto v = project(wv);
  auto scores = namedax::pdot(q, k, namedax::axes(), {{3}, {3}}, {{0, 2}, {0, 2}});  // (seq, head, pos, pos)
  auto mixed = namedax::pdot(namedax::softmax(scores, -1), v, namedax::axes(), {{3}, {1}}, {{0, 1}, {0, 2}});
  auto h = x + namedax::pdot(mixed, wo, "model"_ax, {{1, 3}, {0, 1}});  // the heads summed, here and over "model"
  auto a = namedax::tanh(namedax::pdot(layer_norm(h), w1, namedax::axes(), {{2}, {0}}));
  auto r = h + namedax::pdot(a, w2, "model"_ax, {{2}, {0}}) - t;
  return namedax::pmean(namedax::mean(r * r), "data"_ax);
};

/// One SGD step of `loss`: the updated parameters and the loss before the step.
template <class Loss>
auto sgd_step(Loss loss) {
  return [loss](const auto& params, const auto& x, const auto& t) {
    auto [value, gradient] = namedax::value_and_grad(loss)(params, x, t);
    auto updated = namedax::tree_map([](const auto& p, const auto& g) { return namedax::eval(p - learning_rate * g); },
                                     params, gradient);
    return std::tuple{updated, value};
  };
}

xt::xarray<float> random(const std::vector<std::size_t>& shape, float scale) {
  return xt::xarray<float>(scale * xt::random::randn<float>(shape));
}

/// Times steps of `step` (a shard_map) from `initial`, each step starting from the last one's
/// parameters, so that every timed step does the work of training. Returns seconds per step
/// and the loss of the first step.
template <class Step, class Params>
std::pair<double, float> time_steps(const Step& step, Params initial, const xt::xarray<float>& x,
                                    const xt::xarray<float>& t) {
  auto params = std::move(initial);
  float first = 0;
  bool have_first = false;
  const double seconds = bench::best_time(
      [&] {
        auto [updated, loss] = step(params, x, t);
        if (!have_first) first = static_cast<float>(loss()), have_first = true;
        params = std::move(updated);
      },
      0, 3);
  return {seconds, first};
}

struct sizes {
  std::size_t batch, width, hidden, sequences, length, block_width, heads;
};

/// The MLP's and the block's steps on `mesh`, printed and written as `impl`.
template <class Mesh>
void run(bench::csv_file& csv, const char* impl, const Mesh& mesh, const sizes& s) {
  xt::random::seed(5);
  {
    const auto x = random({s.batch, s.width}, 1.f), t = random({s.batch, s.width}, 1.f);
    std::tuple params{random({s.width, s.hidden}, 1.f / std::sqrt(static_cast<float>(s.width))),
                      random({s.hidden, s.width}, 1.f / std::sqrt(static_cast<float>(s.hidden)))};
    const auto specs = std::tuple{namedax::P(namedax::none, "model"_ax), namedax::P("model"_ax)};
    auto step = namedax::shard_map(sgd_step(mlp_loss), mesh, std::tuple{specs, namedax::P("data"_ax), namedax::P("data"_ax)},
                                   std::tuple{specs, namedax::P()});
    const auto [seconds, loss] = time_steps(step, params, x, t);
    std::printf("%-24s mlp_step          %9.2f ms  (loss %.6f; batch %zu, width %zu, hidden %zu)\n", impl, seconds * 1e3,
                static_cast<double>(loss), s.batch, s.width, s.hidden);
    csv.row(impl, "mlp_step", 4, s.batch * s.width * sizeof(float), s.batch * s.width * sizeof(float), seconds);
  }
  {
    const std::size_t head_width = s.block_width / s.heads, hidden = 4 * s.block_width;
    const auto x = random({s.sequences, s.length, s.block_width}, 1.f);
    const auto t = random({s.sequences, s.length, s.block_width}, 1.f);
    const float in_scale = 1.f / std::sqrt(static_cast<float>(s.block_width));
    std::tuple params{random({s.heads, s.block_width, head_width}, in_scale),
                      random({s.heads, s.block_width, head_width}, in_scale),
                      random({s.heads, s.block_width, head_width}, in_scale),
                      random({s.heads, head_width, s.block_width}, in_scale), random({s.block_width, hidden}, in_scale),
                      random({hidden, s.block_width}, 1.f / std::sqrt(static_cast<float>(hidden)))};
    const auto heads = namedax::P("model"_ax);
    const auto specs = std::tuple{heads, heads, heads, heads, namedax::P(namedax::none, "model"_ax), namedax::P("model"_ax)};
    auto step = namedax::shard_map(sgd_step(block_loss), mesh, std::tuple{specs, namedax::P("data"_ax), namedax::P("data"_ax)},
                                   std::tuple{specs, namedax::P()});
    const auto [seconds, loss] = time_steps(step, params, x, t);
    const std::size_t bytes = x.size() * sizeof(float);
    std::printf("%-24s transformer_step  %9.2f ms  (loss %.6f; %zu sequences of %zu, width %zu, %zu heads)\n", impl,
                seconds * 1e3, static_cast<double>(loss), s.sequences, s.length, s.block_width, s.heads);
    csv.row(impl, "transformer_step", 4, bytes, bytes, seconds);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  bench::options opt(argc, argv,
                     {{"batch", "64"}, {"width", "1024"}, {"hidden", "4096"}, {"sequences", "16"}, {"length", "32"},
                      {"block-width", "256"}, {"heads", "4"}, {"out", "training_step.csv"}});
  const sizes s{std::stoull(opt["batch"]),     std::stoull(opt["width"]),       std::stoull(opt["hidden"]),
                std::stoull(opt["sequences"]), std::stoull(opt["length"]),      std::stoull(opt["block-width"]),
                std::stoull(opt["heads"])};
  bench::csv_file csv(opt["out"]);
  // Which of OpenBLAS's kernels runs: where it does not know the processor, it falls back to
  // its SSE3 ones (Prescott), two to three times slower (scripts/bench.sh sets OPENBLAS_CORETYPE).
  std::printf("one training step (forward, grad, SGD update), float32, on a 2 x 2 mesh (data x model); OpenBLAS %s\n",
              openblas_get_corename());
  run(csv, "namedax_devices", namedax::mesh{namedax::devices<"data">(2), namedax::devices<"model">(2)}, s);
  {
    // One thread: the kernels' task loops and OpenBLAS on the calling thread alone.
    const tbb::global_control one_thread(tbb::global_control::max_allowed_parallelism, 1);
    const int blas_threads = openblas_get_num_threads();
    openblas_set_num_threads(1);
    run(csv, "namedax_vectorized_1t", namedax::mesh{namedax::vectorized<"data">(2), namedax::vectorized<"model">(2)}, s);
    openblas_set_num_threads(blas_threads);
  }
  std::printf("wrote %s\n", opt["out"].c_str());
}
