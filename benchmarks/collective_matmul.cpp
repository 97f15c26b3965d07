// SPDX-License-Identifier: MIT
// A collective matmul on n = 4 and 8 pmap devices (--devices): every device holds a block of b
// rows of x (b x k) and a block of c columns of w (k x c), and computes all_gather(x) @ w
// (n b x c). Three ways,
// timed in alternating rounds of the same run: all_gather then one matmul; a ring of blocking
// ppermutes (step s multiplies the block that came from s devices back, then passes it on);
// the same ring with namedax::async::ppermute, the next block started before the current one
// is multiplied. Prints each time and the ratios (above 1: the first is faster).
// Then a stack of layers whose weights are sharded by columns (as FSDP shards them): each
// layer's weight gathered with a blocking all_gather before its matmul, or with
// namedax::async::all_gather started one layer ahead, so that the gather of layer l + 1 is in
// flight while layer l multiplies.
//
//   collective_matmul --rows 128,512 --inner 512 --cols 256 --rounds 7 --layers 4 --devices 4,8
#include "bench_common.hpp"

#include <namedax/namedax.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <random>
#include <string>
#include <thread>

using namespace namedax::literals;

namespace {

volatile float sink;

/// Index d sends to d + 1 (mod n).
std::vector<std::pair<int, int>> ring_pairs(std::size_t n) {
  std::vector<std::pair<int, int>> pairs;
  for (std::size_t d = 0; d < n; ++d) pairs.emplace_back(static_cast<int>(d), static_cast<int>((d + 1) % n));
  return pairs;
}

auto matmul = [](const auto& a, const auto& b) { return namedax::xeinsum<"ij,jk->ik">(a, b); };

auto gather_then_multiply = [](auto x, auto w) {
  return namedax::eval(matmul(namedax::all_gather(x, "i"_ax, {.tiled = true}), w));
};

/// The ring's steps from the block in hand on, `parts` the products so far: step s multiplies
/// the block of device (d - s) mod N, and the parts stack in step order. `Started`: the block
/// is sent on with async::ppermute before it is multiplied; else a blocking ppermute after.
template <std::size_t N, bool Started, class B, class W, class... Parts>
auto ring_steps(const B& block, const W& w, const std::vector<std::pair<int, int>>& pairs, const Parts&... parts) {
  if constexpr (sizeof...(Parts) + 1 == N) {
    return namedax::eval(namedax::concat(std::tuple{parts..., namedax::eval(matmul(block, w))}, 0));
  } else if constexpr (Started) {
    auto next = namedax::async::ppermute(block, "i"_ax, pairs);
    auto product = namedax::eval(matmul(block, w));
    return ring_steps<N, Started>(next.wait(), w, pairs, parts..., product);
  } else {
    auto product = namedax::eval(matmul(block, w));
    return ring_steps<N, Started>(namedax::ppermute(block, "i"_ax, pairs), w, pairs, parts..., product);
  }
}

/// The ring of blocking ppermutes over N devices, or of async::ppermutes (`Started`).
template <std::size_t N, bool Started>
auto ring_matmul = [](auto x, auto w) { return ring_steps<N, Started>(namedax::eval(x), w, ring_pairs(N)); };

// The library's ring, rows in index order: namedax::all_gather_matmul.
auto library_ring = [](auto x, auto w) { return namedax::all_gather_matmul(x, w, "i"_ax); };
// The same both ways round: n / 2 steps of two blocks.
auto library_both_ways = [](auto x, auto w) { return namedax::all_gather_matmul(x, w, "i"_ax, {.bidirectional = true}); };

constexpr std::size_t max_layers = 8;

/// y @ w_0 @ w_1 ..., each w_l the column shards of every device gathered (tiled, axis 1).
template <bool Started>
auto layer_stack(std::size_t layers) {
  return [layers](auto y, auto shards) {
    auto layer = [&](std::size_t l) { return namedax::eval(namedax::take(shards, static_cast<int>(l), 0)); };
    auto gather = [](auto shard) { return namedax::all_gather(shard, "i"_ax, {.axis = 1, .tiled = true}); };
    auto out = namedax::eval(y);
    if constexpr (Started) {
      auto next = namedax::async::all_gather(layer(0), "i"_ax, {.axis = 1, .tiled = true});
      for (std::size_t l = 0; l < layers; ++l) {
        auto w = next.wait();
        if (l + 1 < layers) next = namedax::async::all_gather(layer(l + 1), "i"_ax, {.axis = 1, .tiled = true});
        out = namedax::eval(matmul(out, w));
      }
    } else {
      for (std::size_t l = 0; l < layers; ++l) out = namedax::eval(matmul(out, gather(layer(l))));
    }
    return out;
  };
}

xt::xarray<float> random_blocks(std::vector<std::size_t> shape, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  xt::xarray<float> a = xt::xarray<float>::from_shape(shape);
  for (auto& v : a) v = u(rng);
  return a;
}

double time_after_pause(const auto& f) {
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // idle BLAS and TBB threads stop spinning
  const auto start = bench::clock::now();
  f();
  return bench::since(start);
}

/// Whether device d's ring result (parts in step order) holds the gathered result's rows.
template <std::size_t devices>
bool ring_matches(const xt::xarray<float>& ring_out, const xt::xarray<float>& gathered, std::size_t b, double& worst) {
  bool same_shape = ring_out.shape() == gathered.shape();
  if (!same_shape) return false;
  const std::size_t c = gathered.shape()[2];
  for (std::size_t d = 0; d < devices; ++d)
    for (std::size_t s = 0; s < devices; ++s) {
      const std::size_t source = (d + devices - s) % devices;
      for (std::size_t r = 0; r < b; ++r)
        for (std::size_t j = 0; j < c; ++j) {
          const double diff = std::abs(double(ring_out(d, s * b + r, j)) - double(gathered(d, source * b + r, j)));
          worst = std::max(worst, diff);
        }
    }
  return worst < 1e-3;
}

/// Same shape and bits.
bool same_bits(const xt::xarray<float>& a, const xt::xarray<float>& b) {
  return a.shape() == b.shape() && std::equal(a.begin(), a.end(), b.begin(), [](float u, float v) {
           return std::memcmp(&u, &v, sizeof u) == 0;
         });
}

template <std::size_t devices>
void run_case(std::size_t b, std::size_t k, std::size_t c, int rounds) {
  const auto x = random_blocks({devices, b, k}, 1), w = random_blocks({devices, k, c}, 2);
  auto gathered = [&] { return xt::xarray<float>(namedax::pmap<"i">(gather_then_multiply)(x, w)); };
  auto blocking = [&] { return xt::xarray<float>(namedax::pmap<"i">(ring_matmul<devices, false>)(x, w)); };
  auto started = [&] { return xt::xarray<float>(namedax::pmap<"i">(ring_matmul<devices, true>)(x, w)); };
  auto library = [&] { return xt::xarray<float>(namedax::pmap<"i">(library_ring)(x, w)); };
  auto both_ways = [&] { return xt::xarray<float>(namedax::pmap<"i">(library_both_ways)(x, w)); };
  const auto g = gathered(), r = blocking(), a = started(), l = library();
  double worst = 0;
  const bool ok = ring_matches<devices>(r, g, b, worst) && same_bits(r, a) && l.shape() == g.shape() &&
                  xt::amax(xt::abs(l - g))() < 1e-3 && same_bits(l, both_ways());
  double t_gather = 1e30, t_blocking = 1e30, t_async = 1e30, t_library = 1e30, t_both = 1e30;
  for (int round = 0; round < rounds; ++round) {
    t_gather = std::min(t_gather, time_after_pause([&] { sink = gathered()(0, 0, 0); }));
    t_blocking = std::min(t_blocking, time_after_pause([&] { sink = blocking()(0, 0, 0); }));
    t_async = std::min(t_async, time_after_pause([&] { sink = started()(0, 0, 0); }));
    t_library = std::min(t_library, time_after_pause([&] { sink = library()(0, 0, 0); }));
    t_both = std::min(t_both, time_after_pause([&] { sink = both_ways()(0, 0, 0); }));
  }
  const double flops = 2.0 * double(devices) * double(devices * b) * double(k) * double(c);
  std::printf("devices=%zu b=%-5zu k=%-5zu c=%-5zu  all_gather+matmul %8.3f ms  ring %8.3f ms  async ring %8.3f ms  "
              "(%6.1f GFLOP/s)  ring/async %5.2f  all_gather/async %5.2f  all_gather_matmul %8.3f ms, "
              "all_gather/all_gather_matmul %5.2f  bidirectional %8.3f ms, one-way/bidirectional %5.2f  %s (max diff to "
              "all_gather %.2g)\n",
              devices, b, k, c, t_gather * 1e3, t_blocking * 1e3, t_async * 1e3, flops / t_async * 1e-9, t_blocking / t_async,
              t_gather / t_async, t_library * 1e3, t_gather / t_library, t_both * 1e3, t_library / t_both,
              ok ? "checked" : "MISMATCH", worst);
}

/// The layer stack: y (b x k per device) through `layers` k x k weights, column-sharded.
template <std::size_t devices>
void run_layers(std::size_t b, std::size_t k, std::size_t layers, int rounds) {
  const auto y = random_blocks({devices, b, k}, 3);
  auto shards = random_blocks({devices, layers, k, k / devices}, 4);
  shards /= std::sqrt(float(k));
  auto blocking = [&] { return xt::xarray<float>(namedax::pmap<"i">(layer_stack<false>(layers))(y, shards)); };
  auto started = [&] { return xt::xarray<float>(namedax::pmap<"i">(layer_stack<true>(layers))(y, shards)); };
  const bool ok = same_bits(blocking(), started());
  double t_blocking = 1e30, t_started = 1e30;
  for (int round = 0; round < rounds; ++round) {
    t_blocking = std::min(t_blocking, time_after_pause([&] { sink = blocking()(0, 0, 0); }));
    t_started = std::min(t_started, time_after_pause([&] { sink = started()(0, 0, 0); }));
  }
  std::printf("devices=%zu layers=%zu b=%-5zu k=%-5zu  all_gather then matmul %8.3f ms  async::all_gather a layer ahead %8.3f ms  "
              "blocking/async %5.2f  %s\n",
              devices, layers, b, k, t_blocking * 1e3, t_started * 1e3, t_blocking / t_started, ok ? "same bits" : "MISMATCH");
}

}  // namespace

int main(int argc, char** argv) {
  bench::options opt(argc, argv, {{"rows", "128,512"}, {"inner", "512"}, {"cols", "256"}, {"rounds", "7"}, {"layers", "4"},
                                 {"devices", "4,8"}});
  const auto rows = bench::parse_list(opt["rows"]);
  const std::size_t k = std::stoull(opt["inner"]), c = std::stoull(opt["cols"]);
  const int rounds = std::stoi(opt["rounds"]);
  std::printf("collective matmul all_gather(x) @ w on pmap devices, float32, %zu cores; best of %d alternating "
              "rounds; ratios above 1: async ring faster\n",
              bench::hardware_threads(), rounds);
  const std::size_t layers = std::min<std::size_t>(std::stoull(opt["layers"]), max_layers);
  for (std::size_t n : bench::parse_list(opt["devices"])) {
    auto run = [&]<std::size_t devices>(std::integral_constant<std::size_t, devices>) {
      for (std::size_t b : rows) run_case<devices>(b, k, c, rounds);
      for (std::size_t b : rows) run_layers<devices>(b, k, layers, rounds);
    };
    if (n == 4) run(std::integral_constant<std::size_t, 4>{});
    else if (n == 8) run(std::integral_constant<std::size_t, 8>{});
    else std::printf("--devices takes 4 and 8\n");
  }
}
