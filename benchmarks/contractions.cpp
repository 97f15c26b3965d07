// SPDX-License-Identifier: MIT
// xeinsum<"ij,jk->ik"> on float32 matrices, against baselines measured in the same run:
// under vmap (a batch of b matmuls, each operand mapped over its leading dim) against a loop
// of cblas_sgemm calls on OpenBLAS's default thread count; on d pmap devices against d
// threads each calling a one-thread cblas_sgemm (the thread count the devices use); and both
// against a naive raw-pointer i-k-j loop. Prints GFLOP/s and the ratio to sgemm (below 1:
// namedax is slower).
//
//   contractions --sizes 512,2048 --batches 1,4 --devices 2,4 --naive-max 512
#include "bench_common.hpp"

#include <namedax/namedax.hpp>
#include <namedax/xeinsum.hpp>

#include <cblas.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

volatile float sink;

/// b random s x s matrices, row-major one after the other.
xt::xarray<float> matrices(std::size_t b, std::size_t s, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  xt::xarray<float> x = xt::xarray<float>::from_shape({b, s, s});
  for (auto& v : x) v = u(rng);
  return x;
}

void sgemm(std::size_t s, const float* a, const float* b, float* c) {
  const int n = static_cast<int>(s);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.f, a, n, b, n, 0.f, c, n);
}

void naive(std::size_t s, const float* a, const float* b, float* c) {
  for (std::size_t i = 0; i < s; ++i) {
    float* row = c + i * s;
    for (std::size_t j = 0; j < s; ++j) row[j] = 0;
    for (std::size_t k = 0; k < s; ++k) {
      const float aik = a[i * s + k];
      const float* brow = b + k * s;
      for (std::size_t j = 0; j < s; ++j) row[j] += aik * brow[j];
    }
  }
}

double time_of(const auto& f) {
  const auto start = bench::clock::now();
  f();
  return bench::since(start);
}

/// Best time of `reps` runs, after one warm-up run.
double best_of(int reps, const auto& f) {
  f();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) best = std::min(best, time_of(f));
  return best;
}

/// A run after a pause: OpenBLAS's idle threads spin for a while after a threaded call (and
/// tbb's after a parallel loop), and would take cores from the next contender.
double time_after_pause(const auto& f) {
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  return time_of(f);
}

/// The best times of namedax and of its baseline, measured in alternating rounds after a
/// warm-up of each: on a shared machine a burst of load slows both alike.
std::pair<double, double> best_alternating(int rounds, const auto& namedax, const auto& baseline) {
  namedax();
  baseline();
  double a = 1e30, b = 1e30;
  for (int r = 0; r < rounds; ++r)
    a = std::min(a, time_after_pause(namedax)), b = std::min(b, time_after_pause(baseline));
  return {a, b};
}

void print(const std::string& name, double flops, double namedax, double blas, double loop) {
  std::printf("%-34s %9.1f GFLOP/s  sgemm %9.1f GFLOP/s  ratio %5.2f", name.c_str(), flops / namedax * 1e-9,
              flops / blas * 1e-9, blas / namedax);
  if (loop > 0) std::printf("  naive %7.2f GFLOP/s (namedax %6.1fx)", flops / loop * 1e-9, loop / namedax);
  std::printf("\n");
}

auto matmul = [](auto x, auto w) { return namedax::xeinsum<"ij,jk->ik">(x, w); };

void vmap_case(std::size_t s, std::size_t b, bool with_naive) {
  const auto x = matrices(b, s, 1), w = matrices(b, s, 2);
  xt::xarray<float> c = xt::zeros<float>({b, s, s});
  const int rounds = s >= 2048 ? 3 : 15;
  const auto [t_namedax, t_blas] = best_alternating(
      rounds,
      [&] {
        auto r = namedax::vmap<"i">(matmul)(x, w);
        sink = r(0, 0, 0);
      },
      [&] {
        for (std::size_t k = 0; k < b; ++k) sgemm(s, x.data() + k * s * s, w.data() + k * s * s, c.data() + k * s * s);
        sink = c(0, 0, 0);
      });
  const double t_loop = with_naive ? best_of(1, [&] {
    for (std::size_t k = 0; k < b; ++k) naive(s, x.data() + k * s * s, w.data() + k * s * s, c.data() + k * s * s);
    sink = c(0, 0, 0);
  })
                                   : 0;
  print("vmap s=" + std::to_string(s) + " batch=" + std::to_string(b), 2.0 * double(b) * double(s * s * s), t_namedax,
        t_blas, t_loop);
}

void pmap_case(std::size_t s, std::size_t d, bool with_naive) {
  const auto x = matrices(d, s, 1), w = matrices(d, s, 2);
  xt::xarray<float> c = xt::zeros<float>({d, s, s});
  const int rounds = s >= 2048 ? 3 : 15;
  // d threads, each a one-thread sgemm on its own matrices: the devices' thread count.
  auto on_threads = [&](auto kernel) {
    std::vector<std::thread> team;
    for (std::size_t k = 0; k < d; ++k)
      team.emplace_back([&, k] { kernel(s, x.data() + k * s * s, w.data() + k * s * s, c.data() + k * s * s); });
    for (auto& t : team) t.join();
    sink = c(0, 0, 0);
  };
  const int threads = openblas_get_num_threads();
  const auto [t_namedax, t_blas] = best_alternating(
      rounds,
      [&] {
        auto r = namedax::pmap<"i">(matmul)(x, w);
        sink = r(0, 0, 0);
      },
      [&] {
        openblas_set_num_threads(1);
        on_threads(sgemm);
        openblas_set_num_threads(threads);
      });
  const double t_loop = with_naive ? best_of(1, [&] { on_threads(naive); }) : 0;
  print("pmap s=" + std::to_string(s) + " devices=" + std::to_string(d), 2.0 * double(d) * double(s * s * s),
        t_namedax, t_blas, t_loop);
}

}  // namespace

int main(int argc, char** argv) {
  bench::options opt(argc, argv, {{"sizes", "512,2048"}, {"batches", "1,4"}, {"devices", "2,4"}, {"naive-max", "512"}});
  const auto sizes = bench::parse_list(opt.values["sizes"]);
  const auto batches = bench::parse_list(opt.values["batches"]);
  const auto devices = bench::parse_list(opt.values["devices"]);
  const std::size_t naive_max = std::stoull(opt.values["naive-max"]);
  std::printf("xeinsum<\"ij,jk->ik\"> float32, %zu cores, OpenBLAS %d threads outside devices; ratio = sgemm time / "
              "namedax time\n",
              bench::hardware_threads(), openblas_get_num_threads());
  for (std::size_t s : sizes) {
    for (std::size_t b : batches) vmap_case(s, b, s <= naive_max);
    for (std::size_t d : devices) pmap_case(s, d, s <= naive_max);
  }
}
