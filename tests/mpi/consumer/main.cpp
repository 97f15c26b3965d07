// SPDX-License-Identifier: MIT
// The MPI consumer: psum over one MPI process per index, checked on every process.
#include <namedax/mpi.hpp>

using namespace namedax::literals;

int main(int argc, char** argv) {
  namedax::mpi::environment mpi(argc, argv);
  const int n = mpi.size();
  xt::xarray<int> x = xt::arange<int>(n);
  xt::xarray<int> sums = namedax::mpi::pmap<"i">([](auto x) { return namedax::psum(x, "i"_ax); })(x);
  return sums == xt::xarray<int>(xt::full_like(x, n * (n - 1) / 2)) ? 0 : 1;
}
