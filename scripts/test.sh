#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite with CTest; then builds a separate project
# against an installed namedax (with CMake, its MPI component too, and with pkg-config),
# checks the compile-fail diagnostics under clang++ as well, and runs the tests under the
# sanitizers.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j2
(cd build && ctest --output-on-failure -j2 --timeout 600)

# deploy: install into a fresh prefix inside the build tree, then build and run a consumer
# project that finds namedax there with find_package(namedax 0.1 REQUIRED).
prefix="$PWD/build/deploy/prefix"
rm -rf "$prefix"
cmake --install build --prefix "$prefix" >/dev/null
cmake -S tests/consumer -B build/deploy/consumer -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build build/deploy/consumer
build/deploy/consumer/namedax_consumer
# The same consumer with the separately compiled part: find_package(namedax COMPONENTS separate).
cmake -S tests/consumer -B build/deploy/consumer_separate -DCMAKE_PREFIX_PATH="$prefix" -DNAMEDAX_CONSUMER_SEPARATE=ON >/dev/null
cmake --build build/deploy/consumer_separate
build/deploy/consumer_separate/namedax_consumer
# The MPI component, where namedax was built with it: find_package(namedax COMPONENTS mpi).
if [ -f "$prefix/share/cmake/namedax/namedaxMpiTargets.cmake" ]; then
  cmake -S tests/mpi/consumer -B build/deploy/mpi_consumer -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
  cmake --build build/deploy/mpi_consumer
  mpirun_flags=(--oversubscribe --bind-to none --mca btl self,vader)
  [ "$(id -u)" -eq 0 ] && mpirun_flags+=(--allow-run-as-root)
  timeout 300 mpirun "${mpirun_flags[@]}" -np 2 build/deploy/mpi_consumer/namedax_mpi_consumer  # a hang fails the run
fi
# The same program, built with the flags of the installed namedax.pc.
if command -v pkg-config >/dev/null; then
  export PKG_CONFIG_PATH="$prefix/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  cflags=$(pkg-config --cflags namedax)
  libs=$(pkg-config --libs namedax)
  read -r -a cflags <<<"$cflags"
  read -r -a libs <<<"$libs"
  "${CXX:-c++}" "${cflags[@]}" tests/consumer/main.cpp -o build/deploy/consumer_pkg_config "${libs[@]}"
  build/deploy/consumer_pkg_config
fi

# compile-fail under clang++: a second configuration that registers only those tests.
cmake -S . -B build/clang -DCMAKE_CXX_COMPILER=clang++ -DNAMEDAX_COMPILE_FAIL_ONLY=ON >/dev/null
(cd build/clang && ctest -L compile-fail --output-on-failure -j2 --timeout 600)

# The runtime tests and examples under AddressSanitizer + UndefinedBehaviorSanitizer, the
# device-mode tests under ThreadSanitizer.
bash scripts/sanitize.sh
