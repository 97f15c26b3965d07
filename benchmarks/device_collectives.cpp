// SPDX-License-Identifier: MIT
// Device-mode (pmap) psum, all_gather, psum_scatter, all_to_all and ppermute for N devices and
// per-device message sizes, against baselines measured in the same run: a hand-written
// exchange among N persistent std::threads meeting at a std::barrier, one std::barrier round,
// and the memory-traffic bound (the bytes the collective must read and write, at the speed of
// an in-process copy). Prints one line per case and writes the raw CSV that
// benchmarks/report.py joins with the OpenMPI figures.
//
//   device_collectives --devices 2,4,8,16 --sizes 4,1024,65536 --collectives psum,ppermute
//                      --out device.csv --gather-cap-mib 2048 --slow-limit 3
//
// `async_psum` (not in the default list) times namedax::async::psum started and waited at
// once, against the same baselines as psum.
#include "bench_common.hpp"

#include <namedax/namedax.hpp>

#include <atomic>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

using namespace namedax::literals;

namespace {

/// Floats per device: at least one, and a multiple of N where the collective splits it.
std::size_t elements(const std::string& collective, std::size_t bytes, std::size_t n) {
  std::size_t e = bench::floats_for(bytes);
  if (collective == "psum_scatter" || collective == "all_to_all") e = (e + n - 1) / n * n;
  return e;
}

/// Bytes the collective must read and write over all devices (each input read once, each
/// output written once), for `e` floats per device.
double traffic(const std::string& collective, std::size_t n, std::size_t e) {
  const double s = static_cast<double>(e * sizeof(float)), nn = static_cast<double>(n);
  if (collective == "all_gather") return nn * s + nn * nn * s;
  if (collective == "psum_scatter") return nn * s + s;
  return 2 * nn * s;  // psum, all_to_all, ppermute
}

/// Bus bandwidth (NCCL-tests convention) in bytes per second, for `e` floats per device.
double bus_bandwidth(const std::string& collective, std::size_t n, std::size_t e, double seconds) {
  const double s = static_cast<double>(e * sizeof(float)), nn = static_cast<double>(n);
  if (collective == "psum" || collective == "async_psum") return 2 * (nn - 1) / nn * s / seconds;
  if (collective == "all_gather") return (nn - 1) / nn * nn * s / seconds;
  if (collective == "psum_scatter" || collective == "all_to_all") return (nn - 1) / nn * s / seconds;
  return s / seconds;  // ppermute: each device sends and receives s bytes
}

xt::xarray<float> input(std::size_t n, std::size_t e) {
  xt::xarray<float> x = xt::xarray<float>::from_shape({n, e});
  for (std::size_t k = 0; k < x.size(); ++k) x.data()[k] = static_cast<float>(k % 13) * 0.25f;
  return x;
}

/// namedax: one pmap whose devices run the collective in a loop and time it themselves. Each
/// device first copies its slice into a value it owns (as an MPI rank owns its buffer); the
/// result of every call is materialised with eval. Per repetition, the slowest device's time;
/// the best repetition.
template <class Op>
double time_namedax(std::size_t n, std::size_t e, std::size_t bytes, Op op) {
  xt::xarray<float> x = input(n, e);
  const int reps = bench::repetitions(bytes);
  std::vector<std::vector<double>> times(n, std::vector<double>(static_cast<std::size_t>(reps)));
  std::atomic<int> iterations{1}, repeats{reps};
  xt::xarray<float> tokens = xt::ones<float>({n});
  auto device = [&](auto slice, auto token) {
    auto mine = namedax::eval(slice);
    std::size_t d = 0;  // this device's index, from SPMD conditions
    for (std::size_t k = 1; k < n; ++k)
      if (namedax::axis_index("i"_ax) == static_cast<int>(k)) d = k;
    // A 4-byte psum: every device has arrived when it returns.
    auto sync = [&token] { (void)namedax::eval(namedax::psum(token, "i"_ax)); };
    { auto y = namedax::eval(op(mine)); }  // warm-up: buffers, page faults
    sync();
    auto start = bench::clock::now();
    { auto y = namedax::eval(op(mine)); }
    if (d == 0) {
      const double one = bench::since(start);
      iterations = bench::iterations_for(one);
      if (one > 2.0) repeats = 1;  // a call that takes seconds is timed once
    }
    sync();
    const int k = iterations.load();
    for (int r = 0; r < repeats.load(); ++r) {
      sync();
      start = bench::clock::now();
      for (int i = 0; i < k; ++i) {
        auto y = namedax::eval(op(mine));
      }
      times[d][static_cast<std::size_t>(r)] = bench::since(start) / k;
    }
    return token;
  };
  (void)namedax::pmap<"i">(device)(x, tokens);
  double best = 1e30;
  for (int r = 0; r < repeats.load(); ++r) {
    double slowest = 0;
    for (std::size_t d = 0; d < n; ++d) slowest = std::max(slowest, times[d][static_cast<std::size_t>(r)]);
    best = std::min(best, slowest);
  }
  return best;
}

double time_namedax_collective(const std::string& collective, std::size_t n, std::size_t e, std::size_t bytes) {
  if (collective == "psum")
    return time_namedax(n, e, bytes, [](const auto& v) { return namedax::psum(v, "i"_ax); });
  if (collective == "async_psum")  // started and waited at once: what the exchange itself costs
    return time_namedax(n, e, bytes, [](const auto& v) { return namedax::async::psum(v, "i"_ax).wait(); });
  if (collective == "all_gather")
    return time_namedax(n, e, bytes, [](const auto& v) { return namedax::all_gather(v, "i"_ax, {.tiled = true}); });
  if (collective == "psum_scatter")
    return time_namedax(n, e, bytes, [](const auto& v) {
      return namedax::psum_scatter(v, "i"_ax, {.scatter_dimension = 0, .tiled = true});
    });
  if (collective == "all_to_all")
    return time_namedax(n, e, bytes, [](const auto& v) { return namedax::all_to_all(v, "i"_ax, 0, 0, {.tiled = true}); });
  std::vector<std::pair<int, int>> ring;
  for (std::size_t d = 0; d < n; ++d) ring.emplace_back(static_cast<int>(d), static_cast<int>((d + 1) % n));
  return time_namedax(n, e, bytes, [ring](const auto& v) { return namedax::ppermute(v, "i"_ax, ring); });
}

/// dst[0, count) = sum over c of src[c][offset, offset + count), in device order.
void sum_into(float* dst, const std::vector<std::vector<float>>& src, std::size_t offset, std::size_t count) {
  const float* first = src[0].data() + offset;
  for (std::size_t j = 0; j < count; ++j) dst[j] = first[j];
  for (std::size_t c = 1; c < src.size(); ++c) {
    const float* s = src[c].data() + offset;
    for (std::size_t j = 0; j < count; ++j) dst[j] += s[j];
  }
}

/// The hand-written reference: N persistent threads, each owning its input and output, meeting
/// at a std::barrier before and after the exchange. psum reduces small messages in one shot (each
/// thread sums all inputs) and large ones by reduce-scatter into a shared buffer (thread t sums
/// chunk t) then all-gather (each thread copies the buffer).
double time_hand(bench::thread_team& team, const std::string& name, std::size_t e) {
  const std::string collective = name == "async_psum" ? "psum" : name;  // the same exchange
  const std::size_t n = team.size(), chunk = (e + n - 1) / n, split = e / n;
  std::vector<std::vector<float>> in(n), out(n);
  std::vector<float> shared(e);
  const std::size_t out_size = collective == "all_gather" ? n * e : collective == "psum_scatter" ? split : e;
  team.run([&](std::size_t t) {  // first touch by the owning thread
    in[t].assign(e, static_cast<float>(t));
    out[t].assign(out_size, 0.f);
    for (std::size_t j = std::min(e, t * chunk); j < std::min(e, (t + 1) * chunk); ++j) shared[j] = 0;
  });
  std::function<void(std::size_t)> call;
  if (collective == "psum" && e * sizeof(float) < (std::size_t{64} << 10)) {
    call = [&](std::size_t t) {
      team.barrier();
      sum_into(out[t].data(), in, 0, e);
      team.barrier();
    };
  } else if (collective == "psum") {
    call = [&](std::size_t t) {
      team.barrier();
      const std::size_t begin = std::min(e, t * chunk), end = std::min(e, begin + chunk);
      sum_into(shared.data() + begin, in, begin, end - begin);
      team.barrier();
      std::memcpy(out[t].data(), shared.data(), e * sizeof(float));
    };
  } else if (collective == "all_gather") {
    call = [&](std::size_t t) {
      team.barrier();
      for (std::size_t c = 0; c < n; ++c) std::memcpy(out[t].data() + c * e, in[c].data(), e * sizeof(float));
      team.barrier();
    };
  } else if (collective == "psum_scatter") {
    call = [&](std::size_t t) {
      team.barrier();
      sum_into(out[t].data(), in, t * split, split);
      team.barrier();
    };
  } else if (collective == "all_to_all") {
    call = [&](std::size_t t) {
      team.barrier();
      for (std::size_t c = 0; c < n; ++c)
        std::memcpy(out[t].data() + c * split, in[c].data() + t * split, split * sizeof(float));
      team.barrier();
    };
  } else {  // ppermute over the ring d -> d + 1
    call = [&](std::size_t t) {
      team.barrier();
      std::memcpy(out[t].data(), in[(t + n - 1) % n].data(), e * sizeof(float));
      team.barrier();
    };
  }
  auto batch = [&](int k) {
    auto start = bench::clock::now();
    team.run([&](std::size_t t) {
      for (int i = 0; i < k; ++i) call(t);
    });
    return bench::since(start) / k;
  };
  batch(1);
  const int k = bench::iterations_for(batch(1));
  double best = 1e30;
  for (int r = 0; r < bench::repetitions(e * sizeof(float)); ++r) best = std::min(best, batch(k));
  return best;
}

/// One round of std::barrier among the team's threads.
double time_barrier(bench::thread_team& team) {
  const int k = 2000;
  double best = 1e30;
  for (int r = 0; r < 7; ++r) {
    auto start = bench::clock::now();
    team.run([&](std::size_t) {
      for (int i = 0; i < k; ++i) team.barrier();
    });
    best = std::min(best, bench::since(start) / k);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress shows through a pipe (bench.sh tees the output)
  bench::options opt(argc, argv,
                     {{"devices", "2,4,8,16"},
                      {"sizes", "4,1024,65536,1048576,16777216,67108864"},
                      {"collectives", "psum,all_gather,psum_scatter,all_to_all,ppermute"},
                      {"out", "device_collectives.csv"},
                      {"gather-cap-mib", "2048"},
                      {"slow-limit", "3"}});
  const auto devices = bench::parse_list(opt["devices"]);
  const auto sizes = bench::parse_list(opt["sizes"]);
  const auto collectives = bench::parse_names(opt["collectives"]);
  const double gather_cap = std::stod(opt["gather-cap-mib"]) * (1 << 20);
  // Sizes above one that took longer than this per call are skipped, so the suite ends.
  const double slow_limit = std::stod(opt["slow-limit"]);
  bench::csv_file csv(opt["out"]);
  const std::size_t hw = bench::hardware_threads();
  const std::size_t copy_cap = std::size_t{256} << 20;  // beyond the caches a copy's speed no longer changes

  std::printf("device collectives (pmap): time per call, bus bandwidth, and time ratios baseline / namedax "
              "(above 1: namedax is faster)\n");
  for (std::size_t n : devices) {
    bench::thread_team team(n);
    const double barrier = time_barrier(team);
    csv.row("barrier", "barrier", n, 0, 0, barrier);
    std::printf("\nN=%zu: one std::barrier round among %zu threads: %.2f us\n", n, n, barrier * 1e6);
    std::printf("%-13s %8s %12s %10s %14s %14s\n", "collective", "size", "namedax", "bus GB/s", "hand threads",
                "memory bound");
    for (const auto& collective : collectives) {
      double previous = 0;  // seconds per call at the previous size
      for (std::size_t bytes : sizes) {
        const std::size_t e = elements(collective, bytes, n);
        if (previous > slow_limit) {
          std::printf("%-13s %8s   skipped: the previous size took %.1f s per call (limit %.0f s)\n", collective.c_str(),
                      bench::human_bytes(bytes).c_str(), previous, slow_limit);
          csv.row("too_slow", collective, n, bytes, e * sizeof(float), previous);
          continue;
        }
        if (collective == "all_gather" && static_cast<double>(n * n * e * sizeof(float)) > gather_cap) {
          std::printf("%-13s %8s   skipped: the gathered outputs of all devices would take %.0f MiB (cap %.0f MiB)\n",
                      collective.c_str(), bench::human_bytes(bytes).c_str(),
                      static_cast<double>(n * n * e * sizeof(float)) / (1 << 20), gather_cap / (1 << 20));
          csv.row("skipped", collective, n, bytes, e * sizeof(float), 0);
          continue;
        }
        const double t = time_namedax_collective(collective, n, e, bytes);
        previous = t;
        const double hand = time_hand(team, collective, e);
        const std::size_t copy_bytes = std::min(copy_cap, n * e * sizeof(float));
        const double bw = std::max(bench::copy_bandwidth(copy_bytes, 1), bench::copy_bandwidth(copy_bytes, std::min(n, hw)));
        const double bound = traffic(collective, n, e) / bw;
        csv.row("namedax", collective, n, bytes, e * sizeof(float), t);
        csv.row("hand_threads", collective, n, bytes, e * sizeof(float), hand);
        csv.row("memory_bound", collective, n, bytes, e * sizeof(float), bound);
        std::printf("%-13s %8s %9.2f us %10.3f %14.2f %14.2f\n", collective.c_str(), bench::human_bytes(bytes).c_str(),
                    t * 1e6, bus_bandwidth(collective, n, e, t) / 1e9, hand / t, bound / t);
      }
    }
  }
  std::printf("\nwrote %s\n", opt["out"].c_str());
}
