// SPDX-License-Identifier: MIT
// Local reductions and scans under vmap, against baselines measured in the same run: a
// 16 x 4096 x 1024 float32 array mapped over its first dim, each slice a 4096 x 1024 matrix.
// Cases: sum over the last positional dim and over the first, against xtensor's xt::sum on a
// fixed-rank xt::xtensor (immediate evaluation) and against a hand-written loop into a
// preallocated output; softmax and cumsum over the last dim (and cumsum over the first)
// against hand-written loops. Prints the time of namedax and each baseline's time divided by
// it (above 1: namedax is faster).
//
//   local_ops --axis 16 --rows 4096 --cols 1024
#include "bench_common.hpp"

#include <namedax/namedax.hpp>
#include <namedax/reductions.hpp>

#include <xtensor/xreducer.hpp>
#include <xtensor/xtensor.hpp>

#include <array>
#include <cmath>
#include <cstdio>
#include <string>

using namespace namedax::literals;

namespace {

volatile float sink;

void print(const std::string& name, double namedax, double hand, double xtensor) {
  std::printf("%-26s %10.2f ms %12.2f %12s\n", name.c_str(), namedax * 1e3, hand / namedax,
              xtensor > 0 ? std::to_string(xtensor / namedax).substr(0, 5).c_str() : "-");
}

/// The best times of several functions, measured in interleaved rounds: on a shared machine
/// a burst of load then slows every contender alike, and the ratios stay honest.
template <class... F>
std::array<double, sizeof...(F)> best_interleaved(std::size_t bytes, F&&... f) {
  std::array<double, sizeof...(F)> best;
  best.fill(1e30);
  for (int round = 0; round < 11; ++round) {
    std::size_t k = 0;
    ((best[k] = std::min(best[k], bench::best_time(f, bytes, 1)), ++k), ...);
  }
  return best;
}

/// Runs `op` (a namedax operation on one slice) under vmap over the leading dim of `x`: the
/// mapped function returns a token, so that only the operation is timed.
template <class Op>
auto mapped(const xt::xarray<float>& x, Op op) {
  auto f = [op](auto v, auto token) {
    auto r = op(v);
    sink = *r.payload().cbegin();
    return token;
  };
  return [&x, tokens = xt::xarray<float>(xt::zeros<float>({x.shape()[0]})), m = namedax::vmap<"i">(f)] {
    (void)m(x, tokens);
  };
}

}  // namespace

int main(int argc, char** argv) {
  bench::options opt(argc, argv, {{"axis", "16"}, {"rows", "4096"}, {"cols", "1024"}});
  const std::size_t n = std::stoull(opt["axis"]), rows = std::stoull(opt["rows"]), cols = std::stoull(opt["cols"]);
  xt::xtensor<float, 3> fixed = xt::xtensor<float, 3>::from_shape({n, rows, cols});
  for (std::size_t k = 0; k < fixed.size(); ++k) fixed.data()[k] = -2.f + static_cast<float>(k % 13) * 0.25f;
  const xt::xarray<float> x = fixed;
  const float* in = fixed.data();
  std::printf("vmap over %zu of %zu x %zu float32 (%s)\n", n, rows, cols, bench::human_bytes(x.size() * 4).c_str());
  std::printf("%-26s %13s %12s %12s\n", "case", "namedax", "hand/namedax", "xt/namedax");

  {  // sum over the last positional dim: each output element a contiguous row
    xt::xtensor<float, 2> out = xt::xtensor<float, 2>::from_shape({n, rows});
    auto nd_run = mapped(x, [](const auto& v) { return namedax::sum(v, 1); });
    auto hand_run = [&] {
      for (std::size_t r = 0; r < n * rows; ++r) {
        const float* line = in + r * cols;
        float acc = line[0];
        for (std::size_t c = 1; c < cols; ++c) acc += line[c];
        out.data()[r] = acc;
      }
      sink = out.data()[0];
    };
    auto xt_run = [&] {
      out = xt::sum(fixed, {2}, xt::evaluation_strategy::immediate);
      sink = out.data()[0];
    };
    const auto [nd, hand, xs] = best_interleaved(x.size() * 4, nd_run, hand_run, xt_run);
    print("sum(x, 1)  [last dim]", nd, hand, xs);
  }
  {  // sum over the first positional dim: each output element a column
    xt::xtensor<float, 2> out = xt::xtensor<float, 2>::from_shape({n, cols});
    auto nd_run = mapped(x, [](const auto& v) { return namedax::sum(v, 0); });
    auto hand_run = [&] {
      for (std::size_t s = 0; s < n; ++s) {
        float* o = out.data() + s * cols;
        const float* slab = in + s * rows * cols;
        for (std::size_t c = 0; c < cols; ++c) o[c] = slab[c];
        for (std::size_t r = 1; r < rows; ++r)
          for (std::size_t c = 0; c < cols; ++c) o[c] += slab[r * cols + c];
      }
      sink = out.data()[0];
    };
    auto xt_run = [&] {
      out = xt::sum(fixed, {1}, xt::evaluation_strategy::immediate);
      sink = out.data()[0];
    };
    const auto [nd, hand, xs] = best_interleaved(x.size() * 4, nd_run, hand_run, xt_run);
    print("sum(x, 0)  [first dim]", nd, hand, xs);
  }
  xt::xtensor<float, 3> out = xt::xtensor<float, 3>::from_shape({n, rows, cols});
  {
    auto nd_run = mapped(x, [](const auto& v) { return namedax::softmax(v, -1); });
    auto hand_run = [&] {
      for (std::size_t r = 0; r < n * rows; ++r) {
        const float* line = in + r * cols;
        float* o = out.data() + r * cols;
        float m = line[0];
        for (std::size_t c = 1; c < cols; ++c) m = m < line[c] ? line[c] : m;
        float s = 0;
        for (std::size_t c = 0; c < cols; ++c) s += (o[c] = std::exp(line[c] - m));
        for (std::size_t c = 0; c < cols; ++c) o[c] /= s;
      }
      sink = out.data()[0];
    };
    const auto [nd, hand] = best_interleaved(x.size() * 4, nd_run, hand_run);
    print("softmax(x, -1)", nd, hand, 0);
  }
  {
    auto nd_run = mapped(x, [](const auto& v) { return namedax::cumsum(v, -1); });
    auto hand_run = [&] {
      for (std::size_t r = 0; r < n * rows; ++r) {
        const float* line = in + r * cols;
        float* o = out.data() + r * cols;
        float acc = 0;
        for (std::size_t c = 0; c < cols; ++c) o[c] = acc = c == 0 ? line[0] : acc + line[c];
      }
      sink = out.data()[0];
    };
    const auto [nd, hand] = best_interleaved(x.size() * 4, nd_run, hand_run);
    print("cumsum(x, -1)", nd, hand, 0);
  }
  {
    auto nd_run = mapped(x, [](const auto& v) { return namedax::cumsum(v, 0); });
    auto hand_run = [&] {
      for (std::size_t s = 0; s < n; ++s) {
        const float* slab = in + s * rows * cols;
        float* o = out.data() + s * rows * cols;
        for (std::size_t c = 0; c < cols; ++c) o[c] = slab[c];
        for (std::size_t r = 1; r < rows; ++r)
          for (std::size_t c = 0; c < cols; ++c) o[r * cols + c] = o[(r - 1) * cols + c] + slab[r * cols + c];
      }
      sink = out.data()[0];
    };
    const auto [nd, hand] = best_interleaved(x.size() * 4, nd_run, hand_run);
    print("cumsum(x, 0)", nd, hand, 0);
  }
}
