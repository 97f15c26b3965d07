// SPDX-License-Identifier: MIT
// A training step's backward pass by namedax::grad against the hand-written one (the linear
// maps' transposes and the derivative of tanh written out), for a data-parallel two-layer MLP
// under pmap and vmap: `cmake --build build --target grad_step && ./build/benchmarks/grad_step`.
// Prints the time ratio grad / hand-written (target: at most 1.5).
#include "bench_common.hpp"

#include <namedax/namedax.hpp>

#include <xtensor/xrandom.hpp>

#include <algorithm>
#include <cstdio>
#include <tuple>

using namespace namedax::literals;

namespace {

// loss = mean over the batch (every index of "batch") of |tanh(x w1) w2 - t|^2 / 2.
auto loss = [](const auto& params, const auto& x, const auto& t) {
  const auto& [w1, w2] = params;
  auto h = namedax::tanh(namedax::pdot(x, w1, namedax::axes(), {{1}, {0}}));
  auto r = namedax::pdot(h, w2, namedax::axes(), {{1}, {0}}) - t;
  return namedax::pmean(namedax::mean(r * r), "batch"_ax) / 2.0;
};

// The same gradient by hand: the transposes of the products and of pmean, tanh' = 1 - h^2.
auto by_hand = [](const auto& params, const auto& x, const auto& t) {
  const auto& [w1, w2] = params;
  auto h = namedax::eval(namedax::tanh(namedax::pdot(x, w1, namedax::axes(), {{1}, {0}})));
  auto r = namedax::eval(namedax::pdot(h, w2, namedax::axes(), {{1}, {0}}) - t);
  const double n = static_cast<double>(r.shape()[0] * r.shape()[1]) * namedax::axis_size("batch"_ax);
  auto dr = namedax::eval(r / n);
  auto dw2 = namedax::psum(namedax::pdot(h, dr, namedax::axes(), {{0}, {0}}), "batch"_ax);
  auto dh = namedax::eval(namedax::pdot(dr, w2, namedax::axes(), {{1}, {1}}) * (1.0 - h * h));
  auto dw1 = namedax::psum(namedax::pdot(x, dh, namedax::axes(), {{0}, {0}}), "batch"_ax);
  return std::tuple{namedax::eval(dw1), namedax::eval(dw2)};
};

template <class Map>
void compare(const char* placement, Map map, std::size_t devices, std::size_t rows, std::size_t width) {
  xt::xarray<double> x = xt::random::randn<double>({devices, rows, width});
  xt::xarray<double> t = xt::random::randn<double>({devices, rows, width});
  std::tuple params{xt::xarray<double>(xt::random::randn<double>({width, width}) * 0.1),
                    xt::xarray<double>(xt::random::randn<double>({width, width}) * 0.1)};
  const auto in_axes = std::tuple{namedax::none, 0, 0};
  auto hand = map([](const auto& p, const auto& xs, const auto& ts) { return by_hand(p, xs, ts); }, in_axes);
  auto auto_ = map([](const auto& p, const auto& xs, const auto& ts) { return namedax::grad(loss)(p, xs, ts); }, in_axes);
  const auto [h1, h2] = hand(params, x, t);
  const auto [g1, g2] = auto_(params, x, t);
  const double difference = std::max(xt::amax(xt::abs(h1 - g1))(), xt::amax(xt::abs(h2 - g2))());
  const std::size_t bytes = x.size() * sizeof(double);
  const double t_hand = bench::best_time([&] { hand(params, x, t); }, bytes, 5);
  const double t_grad = bench::best_time([&] { auto_(params, x, t); }, bytes, 5);
  std::printf("grad step %-4s %zu devices, %zux%zu per device: hand %.3f ms, grad %.3f ms, ratio %.2f (max difference %.1e)\n",
              placement, devices, rows, width, t_hand * 1e3, t_grad * 1e3, t_grad / t_hand, difference);
}

}  // namespace

int main() {
  for (std::size_t width : {64, 256}) {
    compare("pmap", [](auto f, auto in) { return namedax::pmap<"batch">(f, in, namedax::none); }, 4, 256, width);
    compare("vmap", [](auto f, auto in) { return namedax::vmap<"batch">(f, in, namedax::none); }, 4, 256, width);
  }
}
