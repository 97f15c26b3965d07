#!/usr/bin/env bash
# Sets up, builds and runs the flagship example (data-parallel linear regression on a threads mesh and a vectorized mesh).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --target linear_regression -j2
./build/examples/linear_regression
