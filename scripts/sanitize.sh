#!/usr/bin/env bash
# Runs the tests under the sanitizers: the whole runtime suite and the examples under
# AddressSanitizer + UndefinedBehaviorSanitizer, and the runtime suite again under
# ThreadSanitizer. Any report fails the run. Called by scripts/test.sh; runs alone too.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# -O0 compiles these template-heavy tests fastest; the tests are small, so they run fast
# enough unoptimized. No debug info, which costs compile time and memory.
# Without the MPI backend: its tests run under mpirun, not under these runtimes.
common=(-DCMAKE_BUILD_TYPE=None -DNAMEDAX_BUILD_BENCHMARKS=OFF -DNAMEDAX_INSTALL=OFF -DNAMEDAX_MPI=OFF)

# Each sanitizer build uses clang++ where it can link a program with that sanitizer, else g++:
# clang++ 14 compiles these units at -O0 in about 0.55 of g++ 12's time and half its memory
# (tests/test_grad.cpp with ThreadSanitizer: 105 s and 2.7 GB against 185 s and 5.5 GB), and
# the suite is then built and run by a second compiler too (scripts/test.sh's main build uses
# the default one).
mkdir -p build
sanitizer_compiler() {
  local compiler=g++
  if command -v clang++ >/dev/null &&
     echo 'int main() { return 0; }' | clang++ -x c++ "-fsanitize=$1" - -o build/sanitizer_probe 2>/dev/null; then
    compiler=clang++
  fi
  rm -f build/sanitizer_probe
  echo "$compiler"
}

# AddressSanitizer (with leak detection) and UndefinedBehaviorSanitizer: every runtime test and
# example.
asan_compiler=$(sanitizer_compiler address,undefined)
echo "AddressSanitizer + UndefinedBehaviorSanitizer build with $asan_compiler"
asan_flags="-O0 -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
# clang++: without UBSan's null and alignment checks in third-party headers (see the file); the path
# quoted, since the build tool passes the flags through a shell and a checkout path may hold spaces.
[ "$asan_compiler" = clang++ ] && asan_flags+=" -fsanitize-ignorelist=\"$PWD/scripts/ubsan_ignorelist.txt\""
cmake -S . -B build/asan "${common[@]}" -DNAMEDAX_SANITIZED_TESTS=ON -DCMAKE_CXX_COMPILER="$asan_compiler" \
  -DCMAKE_CXX_FLAGS="$asan_flags" >/dev/null
cmake --build build/asan -j2
(cd build/asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest -L "runtime|examples" --output-on-failure -j2 --timeout 900)

# ThreadSanitizer: the runtime tests of namedax_tests (devices, tracing, random programs in every
# placement); the array vocabulary's program, positional code on each device, runs under ASan above.
tsan_compiler=$(sanitizer_compiler thread)
echo "ThreadSanitizer build with $tsan_compiler"
cmake -S . -B build/tsan "${common[@]}" -DNAMEDAX_SANITIZED_TESTS=ON -DNAMEDAX_BUILD_EXAMPLES=OFF \
  -DCMAKE_CXX_COMPILER="$tsan_compiler" -DCMAKE_CXX_FLAGS="-O0 -fsanitize=thread" >/dev/null
cmake --build build/tsan -j2 --target namedax_tests
(cd build/tsan && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
  ctest -L runtime --output-on-failure -j2 --timeout 900)
