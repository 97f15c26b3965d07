// SPDX-License-Identifier: MIT
// The MLP of examples/mesh_mlp.cpp on a mesh of MPI processes x device threads: run with
// `mpirun -np 2 mpi_mesh_mlp`. Process i trains on block i of the batch ("data"), with two
// threads splitting the hidden units ("model"); the training function and its specs are
// mesh_mlp.hpp's, unchanged. Every process also runs the same program on a mesh of 2 x 2
// threads and checks that both give the same parameters and losses.
#include <namedax/mpi.hpp>

#include "mesh_mlp.hpp"

#include <cstdio>

int main(int argc, char** argv) {
  namedax::mpi::environment mpi(argc, argv);  // first: sets up MPI for the whole program
  const auto data = mesh_mlp::make_problem();

  // Process axes come first: the processes split the mesh, then each one's threads.
  namedax::mesh processes{namedax::mpi::processes<"data">(2), namedax::devices<"model">(2)};
  namedax::mesh threads{namedax::devices<"data">(2), namedax::devices<"model">(2)};
  const auto on_processes = mesh_mlp::train(processes, data);  // every process receives the whole result
  const auto on_threads = mesh_mlp::train(threads, data);
  const auto expected = mesh_mlp::reference(data);

  // The reductions over "data" add one value per process: two values add to the same bits
  // in either order, so MPI and the threads must agree exactly. (On more processes MPI may
  // sum in an order of its own, and floats would differ in the last bits.)
  int same_bits = mesh_mlp::same_bits(on_processes, on_threads);
  const double error = mesh_mlp::relative_error(on_processes, expected);
  int close = error < 1e-5;
  for (int* flag : {&same_bits, &close})  // every process checked its own copy
    MPI_Allreduce(MPI_IN_PLACE, flag, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);

  if (mpi.rank() == 0) {
    const auto& losses = std::get<1>(on_processes);
    for (int step = 0; step < mesh_mlp::steps; ++step)
      std::printf("step %d  loss processes x threads %.6f  threads %.6f\n", step, losses(step),
                  std::get<1>(on_threads)(step));
    std::printf("MPI processes x threads and the threads mesh %s bit for bit\n", same_bits ? "agree" : "DISAGREE");
    std::printf("max difference from the plain loops, relative to each array's largest entry: %.3g\n", error);
    if (same_bits && close)
      std::printf("mpi_mesh_mlp: PASS, 2 processes x 2 threads train as the threads mesh does\n");
  }
  return same_bits && close ? 0 : 1;
}
