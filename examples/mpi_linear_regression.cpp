// SPDX-License-Identifier: MIT
// The flagship's data-parallel linear regression on MPI processes: run with
// `mpirun -np 4 mpi_linear_regression`. Process i trains on shard i of the data, and the
// processes average their gradients with pmean, over MPI. The training function fits the
// flagship's model (examples/linear_regression.cpp) with a gradient written by hand; every
// process also runs it on one host thread per shard (namedax::pmap) and checks that both give
// the same losses.
#include <namedax/mpi.hpp>

#include <xtensor/xadapt.hpp>
#include <xtensor/xrandom.hpp>
#include <xtensor/xview.hpp>

#include <cmath>
#include <cstdio>
#include <tuple>
#include <vector>

using namespace namedax::literals;

int main(int argc, char** argv) {
  namedax::mpi::environment mpi(argc, argv);  // first: sets up MPI for the whole program
  const std::size_t shards = static_cast<std::size_t>(mpi.size());  // one per process
  const std::size_t per_shard = 512 / shards, features = 3;
  constexpr int steps = 100;
  constexpr float learning_rate = 0.1f;

  // The same synthetic data on every process (one seed): y = X w_true + 0.5 + noise, in shards.
  // Every process passes the whole arrays; process i takes shard i.
  xt::random::seed(42);
  xt::xarray<float> X = xt::ones<float>({shards, per_shard, features + 1});
  xt::view(X, xt::all(), xt::all(), xt::range(0, features)) = xt::random::randn<float>({shards, per_shard, features});
  xt::xarray<float> w_true{1.5f, -2.0f, 0.7f, 0.5f};
  xt::xarray<float> y = xt::sum(X * w_true, {2}) + 0.01f * xt::random::randn<float>({shards, per_shard});
  xt::xarray<float> w0 = xt::zeros<float>({features + 1});

  // Written once, for one shard: the flagship's model, its gradient by hand.
  auto train = [&](auto X, auto y, auto w0) {
    auto w = namedax::eval(w0);
    std::vector<float> losses;
    for (int step = 0; step < steps; ++step) {
      auto residual = namedax::eval(namedax::psum(X * w, namedax::axes(1)) - y);  // X w - y on this shard
      losses.push_back(namedax::pmean(residual * residual, namedax::axes(0, "data"_ax)).value());
      auto gradient = namedax::pmean(2.f * namedax::expand_dims(residual, 1) * X, namedax::axes(0, "data"_ax));
      w = namedax::eval(w - learning_rate * gradient);
    }
    return std::tuple{w, xt::xarray<float>(xt::adapt(losses))};
  };
  auto in_axes = std::tuple{0, 0, namedax::none};
  // Every process receives the whole result, as pmap returns it.
  auto [w_mpi, losses_mpi] = namedax::mpi::pmap<"data">(train, in_axes)(X, y, w0);
  auto [w_threads, losses_threads] = namedax::pmap<"data">(train, in_axes)(X, y, w0);

  // MPI sums the processes' gradients in an order of its own, and the threads in index order,
  // so float results may differ in the last bits; the same bits are reported as such.
  constexpr float tolerance = 1e-5f;
  auto within = [&](const xt::xarray<float>& a, const xt::xarray<float>& b) {
    return a.shape() == b.shape() && xt::all(xt::abs(a - b) <= tolerance * (1.f + xt::abs(b)));
  };
  int same_bits = losses_mpi == losses_threads && w_mpi == w_threads;
  int close = within(losses_mpi, losses_threads) && within(w_mpi, w_threads);
  int trained = losses_mpi(0, steps - 1) < 1e-3f;
  for (int* flag : {&same_bits, &close, &trained})  // every process checked its own copy
    MPI_Allreduce(MPI_IN_PLACE, flag, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD);

  if (mpi.rank() == 0) {
    for (int step : {0, 1, 10, steps - 1})
      std::printf("step %3d  loss mpi %.6f  threads %.6f\n", step, losses_mpi(0, step), losses_threads(0, step));
    std::printf("weights (mpi, %zu processes): %.3f %.3f %.3f, bias %.3f (true 1.5 -2.0 0.7, bias 0.5)\n", shards,
                w_mpi(0, 0), w_mpi(0, 1), w_mpi(0, 2), w_mpi(0, 3));
    if (same_bits) std::printf("losses match: MPI processes and pmap threads agree bit for bit\n");
    else if (close) std::printf("losses match: MPI processes and pmap threads agree within %g (relative)\n", tolerance);
    else std::printf("MISMATCH between MPI processes and pmap threads\n");
  }
  return close && trained ? 0 : 1;
}
