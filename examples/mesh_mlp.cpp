// SPDX-License-Identifier: MIT
// A two-layer MLP trained on a 2 x 2 mesh, data parallel along "data" and tensor parallel
// along "model" (examples/mesh_mlp.hpp), with a hand-written backward pass. The same
// shard-mapped SGD runs on device threads, vectorized, and threads x vectorized; the three
// agree bit for bit and match an unsharded plain-loop reference.
#include "mesh_mlp.hpp"

#include <cstdio>

int main() {
  const auto data = mesh_mlp::make_problem();
  // The placements only change where the mesh positions run: the program is the same.
  namedax::mesh threads{namedax::devices<"data">(2), namedax::devices<"model">(2)};
  namedax::mesh vectorized{namedax::vectorized<"data">(2), namedax::vectorized<"model">(2)};
  namedax::mesh mixed{namedax::devices<"data">(2), namedax::vectorized<"model">(2)};
  const auto on_threads = mesh_mlp::train(threads, data);
  const auto on_vectorized = mesh_mlp::train(vectorized, data);
  const auto on_mixed = mesh_mlp::train(mixed, data);
  const auto expected = mesh_mlp::reference(data);

  const auto& losses = std::get<1>(on_threads);
  const auto& losses_ref = std::get<1>(expected);
  for (int step = 0; step < mesh_mlp::steps; ++step)
    std::printf("step %d  loss %.6f (plain loops, in double: %.6f)\n", step, losses(step), losses_ref(step));
  const bool same_bits =
      mesh_mlp::same_bits(on_threads, on_vectorized) && mesh_mlp::same_bits(on_threads, on_mixed);
  const double error = std::max({mesh_mlp::relative_error(on_threads, expected),
                                 mesh_mlp::relative_error(on_vectorized, expected),
                                 mesh_mlp::relative_error(on_mixed, expected)});
  std::printf("threads, vectorized and threads x vectorized meshes %s bit for bit\n", same_bits ? "agree" : "DISAGREE");
  std::printf("max difference from the plain loops, relative to each array's largest entry: %.3g\n", error);
  const bool trained = losses(mesh_mlp::steps - 1) < losses(0);
  const bool pass = same_bits && error < 1e-5 && trained;
  if (pass) std::printf("mesh_mlp: PASS, data x model parallel training matches the unsharded loops\n");
  return pass ? 0 : 1;
}
