// SPDX-License-Identifier: MIT
// What collective tracing costs: a pmap of 4 devices running 2000 scalar psums, with the
// recorder off and on, and the cost of the check a collective makes when it is off,
// as a fraction of one collective. Same-run ratios only.
#include "bench_common.hpp"

#include <namedax/namedax.hpp>

using namespace namedax::literals;

namespace {
volatile float sink;
volatile bool flag_sink;
}  // namespace

int main() {
  constexpr int collectives = 2000;
  xt::xarray<float> x = xt::arange<float>(4);
  auto f = [](auto v) {
    auto acc = namedax::eval(v);
    for (int k = 0; k < collectives; ++k) acc = namedax::eval(namedax::psum(acc, "i"_ax) * 0.25f + v * 0.0f);
    return acc;
  };
  const double off = bench::best_time([&] { sink = namedax::pmap<"i">(f)(x)(0); }, 0, 5);
  const double on = bench::best_time([&] {
    namedax::start_tracing();
    sink = namedax::pmap<"i">(f)(x)(0);
    namedax::stop_tracing();
  }, 0, 5);
  constexpr long checks = 100'000'000;
  const double check = bench::best_time([&] {
    for (long k = 0; k < checks; ++k) flag_sink = namedax::detail::tracing();
  }, 0, 3);
  const double per_collective = off / collectives, per_check = check / checks;
  std::printf("pmap, 4 devices, %d scalar psums: recording off %.2f us per collective, on %.2f us (on/off ratio %.3f)\n",
              collectives, per_collective * 1e6, on / collectives * 1e6, on / off);
  std::printf("the check a collective makes when recording is off: %.2f ns = %.5f of one collective\n", per_check * 1e9,
              per_check / per_collective);
}
