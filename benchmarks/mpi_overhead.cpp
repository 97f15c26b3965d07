// SPDX-License-Identifier: MIT
// The overhead of namedax over MPI: psum, all_gather, psum_scatter, all_to_all and ppermute
// inside one namedax::mpi::pmap against the raw MPI call they become (MPI_Allreduce,
// MPI_Allgather, MPI_Reduce_scatter_block, MPI_Alltoall, MPI_Sendrecv around a ring), on the
// same processes, float32, per-process sizes of 1 KiB to 16 MiB. Each time is the slowest
// process's, best of several batches after a warm-up; namedax's calls run in a loop inside
// the mapped function, each result evaluated, so the map's own set-up is not timed. Then the
// overlap of async::psum (MPI_Iallreduce) with a computation of the psum's length. Last, a
// collective matmul all_gather(x) @ w over the processes (each holds b rows of x, b x k, and
// the same k x c shape of w): all_gather then matmul, a ring of blocking ppermutes, the same
// ring with async::ppermute (MPI_Isend and MPI_Irecv in flight while a block is multiplied),
// and namedax::all_gather_matmul.
//
//   mpirun -np 4 mpi_overhead [--sizes 1024,65536,1048576,16777216] [--collectives psum,...]
//                             [--overlap 1048576,16777216] [--ring-rows 128,512]
//                             [--ring-inner 512] [--ring-cols 64,256]
//   NAMEDAX_MPI_AGREE=0 skips namedax's per-call agreement across processes.
#include <namedax/mpi.hpp>

#include "bench_common.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

using namespace namedax::literals;

namespace {

/// Seconds per call of `call` on the slowest process: a warm-up, one call that sets the batch
/// length (the same on every process, or the collectives would not pair up), then the best
/// of several batches.
template <class F>
double slowest_process_time(F&& call, std::size_t bytes) {
  auto slowest = [](double mine) {
    double worst = 0;
    MPI_Allreduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return worst;
  };
  call();
  MPI_Barrier(MPI_COMM_WORLD);
  double start = MPI_Wtime();
  call();
  const int k = bench::iterations_for(slowest(MPI_Wtime() - start));
  double best = 1e30;
  for (int r = 0; r < bench::repetitions(bytes); ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    start = MPI_Wtime();
    for (int i = 0; i < k; ++i) call();
    best = std::min(best, slowest((MPI_Wtime() - start) / k));
  }
  return best;
}

/// Each case, a best time and the call it times, timed in turn for three rounds (the machine's
/// drift hits all alike), keeping the best of each.
template <class... Calls>
void alternating_rounds(std::size_t bytes, std::pair<double*, Calls>... cases) {
  for (int round = 0; round < 3; ++round)
    ((*cases.first = std::min(*cases.first, slowest_process_time(cases.second, bytes))), ...);
}

/// One case: `floats` per process (a multiple of the process count where the call splits).
struct measured {
  double raw, namedax;
};

measured measure(const std::string& collective, std::size_t floats, std::size_t bytes) {
  int rank = 0, np = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &np);
  const std::size_t n = static_cast<std::size_t>(np);
  const int count = static_cast<int>(floats), chunk = static_cast<int>(floats / n);
  const int next = (rank + 1) % np, previous = (rank + np - 1) % np;
  std::vector<float> in(floats, static_cast<float>(rank));
  std::vector<float> out(collective == "all_gather" ? n * floats : floats);
  auto raw = [&] {
    if (collective == "psum")
      MPI_Allreduce(in.data(), out.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    else if (collective == "all_gather")
      MPI_Allgather(in.data(), count, MPI_FLOAT, out.data(), count, MPI_FLOAT, MPI_COMM_WORLD);
    else if (collective == "psum_scatter")
      MPI_Reduce_scatter_block(in.data(), out.data(), chunk, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    else if (collective == "all_to_all")
      MPI_Alltoall(in.data(), chunk, MPI_FLOAT, out.data(), chunk, MPI_FLOAT, MPI_COMM_WORLD);
    else
      MPI_Sendrecv(in.data(), count, MPI_FLOAT, next, 0, out.data(), count, MPI_FLOAT, previous, 0, MPI_COMM_WORLD,
                   MPI_STATUS_IGNORE);
  };
  measured m{1e30, 1e30};

  std::vector<std::pair<int, int>> ring;
  for (int k = 0; k < np; ++k) ring.emplace_back(k, (k + 1) % np);
  xt::xarray<float> mine = xt::xarray<float>::from_shape({1, floats});  // this process's own slice
  mine.fill(static_cast<float>(rank));
  namedax::mpi::pmap<"i">([&](auto shard) {
    const auto x = namedax::eval(shard);
    auto call = [&] {
      if (collective == "psum") namedax::eval(namedax::psum(x, "i"_ax));
      else if (collective == "all_gather") namedax::eval(namedax::all_gather(x, "i"_ax));
      else if (collective == "psum_scatter") namedax::eval(namedax::psum_scatter(x, "i"_ax, {.tiled = true}));
      else if (collective == "all_to_all") namedax::eval(namedax::all_to_all(x, "i"_ax, 0, 0, {.tiled = true}));
      else namedax::eval(namedax::ppermute(x, "i"_ax, ring));
    };
    alternating_rounds(bytes, std::pair{&m.raw, raw}, std::pair{&m.namedax, call});
    return x;
  })(mine);
  return m;
}

/// Overlap: a psum of `floats` per process and a computation of about its length (passes of
/// an elementwise evaluation over the same array), blocking (psum, then compute) against
/// async::psum started before the computation and waited after it. The array operations
/// give MPI its turns while the nonblocking MPI_Iallreduce is in flight.
struct overlapped {
  double psum, compute, blocking, started;
};

overlapped overlap(std::size_t floats, std::size_t bytes) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  xt::xarray<float> mine = xt::xarray<float>::from_shape({1, floats});
  mine.fill(static_cast<float>(rank));
  overlapped o{1e30, 1e30, 1e30, 1e30};
  namedax::mpi::pmap<"i">([&](auto shard) {
    const auto x = namedax::eval(shard);
    int passes = 1;
    auto compute = [&] {
      auto y = namedax::eval(x * 0.5f + 1.0f);
      for (int k = 1; k < passes; ++k) y = namedax::eval(y * 0.5f + 1.0f);
      return y;
    };
    auto alone = [&] { namedax::eval(namedax::psum(x, "i"_ax)); };
    auto blocking = [&] {
      auto s = namedax::eval(namedax::psum(x, "i"_ax));
      compute();
    };
    auto started = [&] {
      auto h = namedax::async::psum(x, "i"_ax);
      compute();
      (void)h.wait();
    };
    // As many passes as take the psum's time, the same on every process.
    const double one_pass = slowest_process_time(compute, bytes), sum = slowest_process_time(alone, bytes);
    passes = std::max(1, static_cast<int>(sum / one_pass + 0.5));
    MPI_Allreduce(MPI_IN_PLACE, &passes, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    alternating_rounds(bytes, std::pair{&o.psum, alone}, std::pair{&o.compute, compute},
                       std::pair{&o.blocking, blocking}, std::pair{&o.started, started});
    return x;
  })(mine);
  return o;
}

/// The ring matmul's times, each the slowest process's, best of three alternating rounds.
struct ring_times {
  double gathered, blocking, started, library;
};

ring_times ring_matmul(std::size_t b, std::size_t k, std::size_t c) {
  int rank = 0, np = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &np);
  xt::xarray<float> x = xt::xarray<float>::from_shape({1, b, k}), w = xt::xarray<float>::from_shape({1, k, c});
  for (std::size_t e = 0; e < x.size(); ++e) x.data()[e] = static_cast<float>((e * 7 + static_cast<std::size_t>(rank)) % 11) * 0.1f;
  for (std::size_t e = 0; e < w.size(); ++e) w.data()[e] = static_cast<float>((e * 5) % 13) * 0.1f;
  std::vector<std::pair<int, int>> pairs;
  for (int d = 0; d < np; ++d) pairs.emplace_back(d, (d + 1) % np);
  ring_times t{1e30, 1e30, 1e30, 1e30};
  const std::size_t bytes = b * k * sizeof(float);
  namedax::mpi::pmap<"i">([&](auto x_shard, auto w_shard) {
    const auto x = namedax::eval(x_shard);
    const auto w = namedax::eval(w_shard);
    auto product = [&](const auto& block) { return namedax::eval(namedax::xeinsum<"ij,jk->ik">(block, w)); };
    auto gathered = [&] { (void)product(namedax::all_gather(x, "i"_ax, {.tiled = true})); };
    // Step s multiplies the block of process (rank - s) mod np; the blocking ring passes it on
    // after the product, the started one before, so that it travels during the product.
    auto blocking = [&] {
      auto block = x;
      for (int s = 0; s < np; ++s) {
        (void)product(block);
        if (s + 1 < np) block = namedax::eval(namedax::ppermute(block, "i"_ax, pairs));
      }
    };
    auto started = [&] {
      auto block = x;
      auto next = namedax::async::ppermute(block, "i"_ax, pairs);
      for (int s = 0; s < np; ++s) {
        (void)product(block);
        if (s + 1 < np) {
          block = next.wait();
          if (s + 2 < np) next = namedax::async::ppermute(block, "i"_ax, pairs);
        }
      }
    };
    auto library = [&] { (void)namedax::eval(namedax::all_gather_matmul(x, w, "i"_ax)); };
    alternating_rounds(bytes, std::pair{&t.gathered, gathered}, std::pair{&t.blocking, blocking},
                       std::pair{&t.started, started}, std::pair{&t.library, library});
    return x;
  })(x, w);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  namedax::mpi::environment mpi(argc, argv);
  bench::options opts(argc, argv, {{"sizes", "1024,65536,1048576,16777216"},
                                   {"collectives", "psum,all_gather,psum_scatter,all_to_all,ppermute"},
                                   {"overlap", "1048576,16777216"},
                                   {"ring-rows", "128,512"},
                                   {"ring-inner", "512"},
                                   {"ring-cols", "64,256"}});
  const std::size_t n = static_cast<std::size_t>(mpi.size());
  const char* agree = std::getenv("NAMEDAX_MPI_AGREE");
  const bool agreeing = !(agree && std::string(agree) == "0");
  if (mpi.rank() == 0)
    std::printf("namedax over MPI against raw MPI, %zu processes, float32, per-process sizes; agreement per call %s\n", n,
                agreeing ? "on" : "off (NAMEDAX_MPI_AGREE=0)");
  bool met = true, any_large = false;
  for (const auto& collective : bench::parse_names(opts["collectives"]))
    for (std::size_t bytes : bench::parse_list(opts["sizes"])) {
      std::size_t floats = bench::floats_for(bytes);
      if (collective == "psum_scatter" || collective == "all_to_all") floats = (floats + n - 1) / n * n;
      const measured m = measure(collective, floats, bytes);
      const double ratio = m.namedax / m.raw;
      if (bytes >= (std::size_t{1} << 20)) any_large = true, met = met && ratio < 1.05;
      if (mpi.rank() == 0)
        std::printf("  %-13s %8s  raw %11.2f us  namedax %11.2f us  ratio %.3f\n", collective.c_str(),
                    bench::human_bytes(bytes).c_str(), m.raw * 1e6, m.namedax * 1e6, ratio);
    }
  if (mpi.rank() == 0 && any_large)
    std::printf("overhead < 5%% at >= 1 MiB: %s\n", met ? "met" : "missed");
  for (std::size_t bytes : bench::parse_list(opts["overlap"])) {
    const overlapped o = overlap(bench::floats_for(bytes), bytes);
    if (mpi.rank() == 0)
      std::printf("  overlap psum %8s: psum %9.2f us, compute %9.2f us; psum then compute %9.2f us, async::psum "
                  "around the compute %9.2f us, blocking/async %.2f\n",
                  bench::human_bytes(bytes).c_str(), o.psum * 1e6, o.compute * 1e6, o.blocking * 1e6, o.started * 1e6,
                  o.blocking / o.started);
  }
  if (mpi.size() < 2) return 0;  // a ring needs two processes
  const std::size_t k = std::stoull(opts["ring-inner"]);
  for (std::size_t b : bench::parse_list(opts["ring-rows"]))
    for (std::size_t c : bench::parse_list(opts["ring-cols"])) {
      const ring_times t = ring_matmul(b, k, c);
      if (mpi.rank() == 0)
        std::printf("  ring matmul b=%-4zu k=%zu c=%-4zu all_gather+matmul %9.2f us, blocking ring %9.2f us, async ring "
                    "%9.2f us, all_gather_matmul %9.2f us; blocking/async %.2f\n",
                    b, k, c, t.gathered * 1e6, t.blocking * 1e6, t.started * 1e6, t.library * 1e6, t.blocking / t.started);
    }
}
