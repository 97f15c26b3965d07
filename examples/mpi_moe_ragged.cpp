// SPDX-License-Identifier: MIT
// The mixture-of-experts layer of moe_layer.hpp on 4 MPI processes: run with `mpirun -np 4
// mpi_moe_ragged`. Process i holds index i's tokens and experts; the ragged exchanges travel
// by MPI_Ialltoallv. Every process also runs the layer on 4 device threads and checks that
// both give the same bits (the exchanges only move rows; every sum is local), and that both
// match the plain loops, for the three routings of moe_ragged.cpp.
#include <namedax/mpi.hpp>

#include "moe_layer.hpp"

#include <cstdio>
#include <tuple>

int main(int argc, char** argv) {
  namedax::mpi::environment mpi(argc, argv);  // first: sets up MPI for the whole program
  using namespace moe_layer;
  problem p = make_problem();
  int same_bits = 1, close = 1;
  double max_error = 0.0;
  for (const auto& r : routings) {
    route(p, r);
    const auto expected = reference(p).first;
    const auto on_processes = namedax::mpi::pmap<"i">(layer(p))(p.x, p.w1, p.w2);  // every process gets all of it
    const auto on_threads = namedax::pmap<"i">(layer(p))(p.x, p.w1, p.w2);
    same_bits = same_bits && std::get<0>(on_processes) == std::get<0>(on_threads) &&
                std::get<1>(on_processes) == std::get<1>(on_threads);
    const double error = relative_error(std::get<0>(on_processes), expected);
    close = close && error < 1e-5;
    max_error = std::max(max_error, error);
    if (mpi.rank() == 0) std::printf("routing %s: max |difference| / max |y| = %.3g\n", r.name, error);
  }
  for (int* flag : {&same_bits, &close})  // every process checked its own copy
    MPI_Allreduce(MPI_IN_PLACE, flag, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);
  if (mpi.rank() == 0) {
    std::printf("MPI processes and device threads %s bit for bit\n", same_bits ? "agree" : "DISAGREE");
    if (same_bits && close)
      std::printf("mpi_moe_ragged: PASS, 4 processes route, dispatch and combine as 4 threads do (max error %.2g)\n",
                  max_error);
  }
  return same_bits && close ? 0 : 1;
}
