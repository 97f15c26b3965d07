// SPDX-License-Identifier: MIT
// OpenMPI's collectives, the baseline of the device-mode benchmarks: MPI_Allreduce (psum),
// MPI_Allgather (all_gather), MPI_Reduce_scatter_block (psum_scatter), MPI_Alltoall
// (all_to_all) and MPI_Sendrecv around a ring (ppermute), on float32, for each per-rank size
// given, in one launch. Rank 0 prints one CSV row per size (same columns as the other
// benchmarks), with the slowest rank's time per call, best of several batches after a warm-up.
//
//   mpirun -np 4 mpi_baseline <collective> <impl label> <bytes> [<bytes> ...]
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

int repetitions(std::size_t bytes) {  // the same policy as bench_common.hpp
  if (bytes >= (std::size_t{64} << 20)) return 2;
  if (bytes >= (std::size_t{16} << 20)) return 3;
  if (bytes >= (std::size_t{1} << 20)) return 5;
  return 7;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, np = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &np);
  if (argc < 4) {
    if (rank == 0) std::fprintf(stderr, "usage: mpi_baseline <collective> <label> <bytes>...\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const std::string collective = argv[1], label = argv[2];
  const std::size_t n = static_cast<std::size_t>(np);
  for (int a = 3; a < argc; ++a) {
    const std::size_t bytes = std::stoull(argv[a]);
    std::size_t e = std::max<std::size_t>(1, bytes / sizeof(float));  // floats per rank, as in device_collectives
    if (collective == "psum_scatter" || collective == "all_to_all") e = (e + n - 1) / n * n;
    const std::size_t out_size = collective == "all_gather" ? n * e : collective == "psum_scatter" ? e / n : e;
    std::vector<float> in(e, static_cast<float>(rank)), out(out_size, 0.f);
    const int next = (rank + 1) % np, previous = (rank + np - 1) % np;
    auto call = [&] {
      if (collective == "psum")
        MPI_Allreduce(in.data(), out.data(), static_cast<int>(e), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      else if (collective == "all_gather")
        MPI_Allgather(in.data(), static_cast<int>(e), MPI_FLOAT, out.data(), static_cast<int>(e), MPI_FLOAT,
                      MPI_COMM_WORLD);
      else if (collective == "psum_scatter")
        MPI_Reduce_scatter_block(in.data(), out.data(), static_cast<int>(e / n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      else if (collective == "all_to_all")
        MPI_Alltoall(in.data(), static_cast<int>(e / n), MPI_FLOAT, out.data(), static_cast<int>(e / n), MPI_FLOAT,
                     MPI_COMM_WORLD);
      else if (collective == "ppermute")
        MPI_Sendrecv(in.data(), static_cast<int>(e), MPI_FLOAT, next, 0, out.data(), static_cast<int>(e), MPI_FLOAT,
                     previous, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      else
        MPI_Abort(MPI_COMM_WORLD, 2);
    };
    // Warm-up, then one timed call on every rank to choose the batch length (about 20 ms).
    call();
    MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime();
    call();
    double one = MPI_Wtime() - start, slowest = 0;
    MPI_Allreduce(&one, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    const int k = std::clamp(static_cast<int>(0.02 / std::max(slowest, 1e-9)), 1, 2000);
    int reps = repetitions(bytes);
    if (slowest > 2.0) reps = 1;  // a call that takes seconds is timed once
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
      MPI_Barrier(MPI_COMM_WORLD);
      start = MPI_Wtime();
      for (int i = 0; i < k; ++i) call();
      double mine = (MPI_Wtime() - start) / k, worst = 0;
      MPI_Allreduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
      best = std::min(best, worst);
    }
    if (rank == 0) {
      std::printf("%s,%s,%d,%zu,%zu,%.9g\n", label.c_str(), collective.c_str(), np, bytes, e * sizeof(float), best);
      std::fflush(stdout);
    }
  }
  MPI_Finalize();
}
