// SPDX-License-Identifier: MIT
// psum and x / psum(x) under vmap and pmap, as ratios to baselines measured in the same run:
// a hand-written loop, xtensor written the way a user would, and an in-process copy
// (the memory-traffic bound). Prints one line per case and writes psum_ratios.csv.
#include <namedax/namedax.hpp>

#include <xtensor/xrandom.hpp>
#include <xtensor/xreducer.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

using namespace namedax::literals;

namespace {
// Best of `repeats` runs after a warm-up: the least disturbed run on a noisy machine.
template <class F>
double seconds(F&& f, int repeats = 7) {
  f();
  double best = 1e30;
  for (int r = 0; r < repeats; ++r) {
    auto start = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

volatile float sink;
}  // namespace

int main() {
  std::ofstream csv("psum_ratios.csv");
  csv << "case,devices,bytes_per_device,seconds,baseline,baseline_seconds,ratio\n";
  auto report = [&](const std::string& name, std::size_t n, std::size_t bytes, double t, const std::string& base, double tb) {
    std::printf("%-34s n=%2zu %9zu B/device  %9.3f ms  %-22s ratio %6.2f\n", name.c_str(), n, bytes, t * 1e3, base.c_str(), t / tb);
    csv << name << ',' << n << ',' << bytes << ',' << t << ',' << base << ',' << tb << ',' << t / tb << '\n';
  };

  for (std::size_t n : {2u, 8u}) {
    for (std::size_t per_device : {std::size_t{1} << 10, std::size_t{1} << 18}) {  // floats per index
      xt::xarray<float> x = xt::random::rand<float>({n, per_device});
      const std::size_t bytes = per_device * sizeof(float);

      // Baselines: a copy of the whole input (memory bound), a hand loop, xtensor's sum.
      xt::xarray<float> copy = xt::zeros_like(x);
      double t_copy = seconds([&] { std::copy(x.data(), x.data() + x.size(), copy.data()); });
      xt::xarray<float> hand = xt::zeros<float>({per_device});
      double t_hand = seconds([&] {
        std::copy(x.data(), x.data() + per_device, hand.data());
        for (std::size_t i = 1; i < n; ++i)
          for (std::size_t k = 0; k < per_device; ++k) hand.data()[k] += x.data()[i * per_device + k];
        sink = hand(0);
      });
      double t_xtensor = seconds([&] {
        xt::xarray<float> s = xt::sum(x, {0});
        sink = s(0);
      });

      auto psum = [](auto x) { return namedax::psum(x, "i"_ax); };
      auto normalize = [](auto x) { return x / namedax::psum(x, "i"_ax); };
      double t_vmap = seconds([&] { sink = namedax::vmap<"i">(psum)(x)(0, 0); });
      double t_vmap_norm = seconds([&] { sink = namedax::vmap<"i">(normalize)(x)(0, 0); });
      double t_pmap = seconds([&] { sink = namedax::pmap<"i">(psum)(x)(0, 0); }, 3);

      report("vmap psum vs hand loop", n, bytes, t_vmap, "hand loop", t_hand);
      report("vmap psum vs xt::sum", n, bytes, t_vmap, "xt::sum(x, {0})", t_xtensor);
      report("vmap psum vs copy bound", n, bytes, t_vmap, "copy of the input", t_copy);
      report("vmap x / psum(x) vs vmap psum", n, bytes, t_vmap_norm, "vmap psum", t_vmap);
      report("pmap psum vs vmap psum", n, bytes, t_pmap, "vmap psum", t_vmap);
    }
  }
  std::printf("wrote psum_ratios.csv\n");
}
