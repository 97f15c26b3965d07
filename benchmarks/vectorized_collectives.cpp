// SPDX-License-Identifier: MIT
// Vectorized-mode (vmap) collectives on a 64 MiB float32 array, against baselines measured in
// the same run: a hand-written loop into a preallocated output (and the same loop into a fresh
// allocation, which is what a function returning a new array pays), xtensor's own operation
// written the way a user would, and the memory-traffic bound (bytes read and written, at the
// speed of a one-thread in-process copy). Cases: psum and pmax with the named axis first and
// last, x / psum(x, "i"_ax) with the axis first and last, and all_to_all (these three also
// written into a preallocated output with map.into(out), as the hand loop is). Prints one line
// per case and writes the raw CSV that benchmarks/report.py reads.
//
//   vectorized_collectives --mib 64 --axis 16 --out vectorized.csv
#include "bench_common.hpp"

#include <namedax/namedax.hpp>

#include <xtensor/xmanipulation.hpp>
#include <xtensor/xreducer.hpp>

#include <cstdio>
#include <memory>
#include <string>

using namespace namedax::literals;

namespace {

volatile float sink;

struct result {
  double namedax, hand, hand_fresh, xtensor, bound;
  double into = 0;  // the map writing into a preallocated output (map.into(out)), where measured
};

void print(bench::csv_file& csv, const std::string& name, std::size_t n, std::size_t bytes, const result& r) {
  std::printf("%-22s %10.2f ms %14.2f %14.2f %14.2f %14.2f\n", name.c_str(), r.namedax * 1e3, r.hand / r.namedax,
              r.hand_fresh / r.namedax, r.xtensor / r.namedax, r.bound / r.namedax);
  if (r.into > 0) {
    std::printf("%-22s %10.2f ms %14.2f %14.2f %14.2f %14.2f\n", (name + " into").c_str(), r.into * 1e3,
                r.hand / r.into, r.hand_fresh / r.into, r.xtensor / r.into, r.bound / r.into);
    csv.row("namedax_into", name, n, bytes, bytes, r.into);
  }
  csv.row("namedax", name, n, bytes, bytes, r.namedax);
  csv.row("hand_loop", name, n, bytes, bytes, r.hand);
  csv.row("hand_loop_fresh", name, n, bytes, bytes, r.hand_fresh);
  csv.row("xtensor", name, n, bytes, bytes, r.xtensor);
  csv.row("memory_bound", name, n, bytes, bytes, r.bound);
}

xt::xarray<float> input(std::size_t rows, std::size_t cols) {
  xt::xarray<float> x = xt::xarray<float>::from_shape({rows, cols});
  for (std::size_t k = 0; k < x.size(); ++k) x.data()[k] = 1.f + static_cast<float>(k % 13) * 0.25f;
  return x;
}

/// A reduction of the n x m (axis first) or m x n (axis last) array `x` over its named axis of
/// size n, by hand, into `out` of m elements.
template <bool Max>
void reduce_by_hand(const float* x, float* out, std::size_t n, std::size_t m, bool axis_first) {
  auto combine = [](float a, float b) { return Max ? (a < b ? b : a) : a + b; };
  if (axis_first) {
    for (std::size_t k = 0; k < m; ++k) out[k] = x[k];
    for (std::size_t i = 1; i < n; ++i)
      for (std::size_t k = 0; k < m; ++k) out[k] = combine(out[k], x[i * m + k]);
  } else {
    for (std::size_t k = 0; k < m; ++k) {
      float acc = x[k * n];
      for (std::size_t i = 1; i < n; ++i) acc = combine(acc, x[k * n + i]);
      out[k] = acc;
    }
  }
}

template <bool Max>
result reduction_case(std::size_t n, std::size_t m, bool axis_first, double copy_bw) {
  const std::size_t bytes = n * m * sizeof(float);
  xt::xarray<float> x = axis_first ? input(n, m) : input(m, n);
  xt::xarray<float> tokens = xt::zeros<float>({n});
  auto f = [](auto v, auto token) {
    if constexpr (Max) {
      auto r = namedax::eval(namedax::pmax(v, "i"_ax));
      sink = *r.payload().cbegin();
    } else {
      auto r = namedax::eval(namedax::psum(v, "i"_ax));
      sink = *r.payload().cbegin();
    }
    return token;
  };
  result r{};
  r.namedax = bench::best_time([&] { (void)namedax::vmap<"i">(f, std::tuple{axis_first ? 0 : 1, 0})(x, tokens); }, bytes);
  std::vector<float> out(m);
  r.hand = bench::best_time([&] {
    reduce_by_hand<Max>(x.data(), out.data(), n, m, axis_first);
    sink = out[0];
  }, bytes);
  r.hand_fresh = bench::best_time([&] {
    std::unique_ptr<float[]> fresh(new float[m]);
    reduce_by_hand<Max>(x.data(), fresh.get(), n, m, axis_first);
    sink = fresh[0];
  }, bytes);
  const std::size_t axis = axis_first ? 0 : 1;
  r.xtensor = bench::best_time([&] {
    if constexpr (Max) {
      xt::xarray<float> s = xt::amax(x, {axis});
      sink = s(0);
    } else {
      xt::xarray<float> s = xt::sum(x, {axis});
      sink = s(0);
    }
  }, bytes);
  r.bound = static_cast<double>(bytes + m * sizeof(float)) / copy_bw;
  return r;
}

/// x / psum(x) over the named axis: the hand version sums in a first pass, divides in a second.
result normalize_case(std::size_t n, std::size_t m, bool axis_first, double copy_bw) {
  const std::size_t bytes = n * m * sizeof(float);
  xt::xarray<float> x = axis_first ? input(n, m) : input(m, n);
  auto f = [](auto v) { return v / namedax::psum(v, "i"_ax); };
  result r{};
  const int in_axis = axis_first ? 0 : 1;
  r.namedax = bench::best_time([&] {
    auto y = namedax::vmap<"i">(f, in_axis, in_axis)(x);
    sink = y.data()[0];
  }, bytes);
  const auto map = namedax::vmap<"i">(f, in_axis, in_axis);
  xt::xarray<float> y;
  r.into = bench::best_time([&] {
    map.into(y)(x);
    sink = y.data()[0];
  }, bytes);
  std::vector<float> sums(m), out(n * m);
  auto two_pass = [&](float* dst) {
    reduce_by_hand<false>(x.data(), sums.data(), n, m, axis_first);
    const float* s = sums.data();
    if (axis_first) {
      for (std::size_t i = 0; i < n; ++i)
        for (std::size_t k = 0; k < m; ++k) dst[i * m + k] = x.data()[i * m + k] / s[k];
    } else {
      for (std::size_t k = 0; k < m; ++k)
        for (std::size_t i = 0; i < n; ++i) dst[k * n + i] = x.data()[k * n + i] / s[k];
    }
    sink = dst[0];
  };
  r.hand = bench::best_time([&] { two_pass(out.data()); }, bytes);
  r.hand_fresh = bench::best_time([&] {
    std::unique_ptr<float[]> fresh(new float[n * m]);
    two_pass(fresh.get());
  }, bytes);
  // xtensor written lazily, as the issue describes: the sum is a lazy reducer inside the
  // division, so it is recomputed for every element. Only two runs: it is slow.
  const std::size_t axis = axis_first ? 0 : 1;
  r.xtensor = bench::best_time([&] {
    xt::xarray<float> y = axis_first ? xt::xarray<float>(x / xt::sum(x, {axis}))
                                     : xt::xarray<float>(x / xt::expand_dims(xt::sum(x, {axis}), 1));
    sink = y.data()[0];
  }, bytes, 2);
  r.bound = 2.0 * static_cast<double>(bytes) / copy_bw;
  return r;
}

/// Untiled all_to_all(v, "i", 0, 0) on x of shape (n, n, b): out[i][j] = x[j][i], a transpose
/// of n x n blocks of b floats.
result all_to_all_case(std::size_t n, std::size_t m, double copy_bw) {
  const std::size_t b = m / n, bytes = n * n * b * sizeof(float);
  xt::xarray<float> x = input(n * n, b);
  x.reshape({n, n, b});
  auto f = [](auto v) { return namedax::all_to_all(v, "i"_ax, 0, 0); };
  result r{};
  r.namedax = bench::best_time([&] {
    auto y = namedax::vmap<"i">(f)(x);
    sink = y.data()[0];
  }, bytes);
  const auto map = namedax::vmap<"i">(f);
  xt::xarray<float> y;
  r.into = bench::best_time([&] {
    map.into(y)(x);
    sink = y.data()[0];
  }, bytes);
  std::vector<float> out(n * n * b);
  auto blocks = [&](float* dst) {
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < n; ++j) std::memcpy(dst + (i * n + j) * b, x.data() + (j * n + i) * b, b * sizeof(float));
    sink = dst[0];
  };
  r.hand = bench::best_time([&] { blocks(out.data()); }, bytes);
  r.hand_fresh = bench::best_time([&] {
    std::unique_ptr<float[]> fresh(new float[n * n * b]);
    blocks(fresh.get());
  }, bytes);
  r.xtensor = bench::best_time([&] {
    xt::xarray<float> y = xt::transpose(x, {1, 0, 2});
    sink = y.data()[0];
  }, bytes);
  r.bound = 2.0 * static_cast<double>(bytes) / copy_bw;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress shows through a pipe (bench.sh tees the output)
  bench::options opt(argc, argv, {{"mib", "64"}, {"axis", "16"}, {"out", "vectorized_collectives.csv"}});
  const std::size_t n = std::stoull(opt["axis"]);
  const std::size_t bytes = static_cast<std::size_t>(std::stod(opt["mib"]) * (1 << 20));
  const std::size_t m = bytes / sizeof(float) / n;
  bench::csv_file csv(opt["out"]);
  // vmap runs on the calling thread: its bound is a one-thread copy.
  const double copy_bw = bench::copy_bandwidth(std::min(n * m * sizeof(float), std::size_t{256} << 20), 1);
  std::printf("vectorized collectives (vmap), %s float32, named axis of size %zu; time ratios baseline / namedax "
              "(above 1: namedax is faster); one-thread copy %.1f GB/s\n",
              bench::human_bytes(n * m * sizeof(float)).c_str(), n, copy_bw / 1e9);
  std::printf("%-22s %13s %14s %14s %14s %14s\n", "case", "namedax", "hand loop", "hand, fresh", "xtensor", "memory bound");
  const std::size_t total = n * m * sizeof(float);
  print(csv, "vmap_psum_first", n, total, reduction_case<false>(n, m, true, copy_bw));
  print(csv, "vmap_psum_last", n, total, reduction_case<false>(n, m, false, copy_bw));
  print(csv, "vmap_pmax_first", n, total, reduction_case<true>(n, m, true, copy_bw));
  print(csv, "vmap_pmax_last", n, total, reduction_case<true>(n, m, false, copy_bw));
  print(csv, "vmap_normalize_first", n, total, normalize_case(n, m, true, copy_bw));
  print(csv, "vmap_normalize_last", n, total, normalize_case(n, m, false, copy_bw));
  print(csv, "vmap_all_to_all", n, total, all_to_all_case(n, m, copy_bw));
  std::printf("wrote %s\n", opt["out"].c_str());
}
