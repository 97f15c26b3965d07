#!/usr/bin/env bash
# The collective benchmark suite: builds the benchmark programs in build-bench/ (Release), runs
# OpenMPI's collectives with mpirun (plain, then with glibc's huge-page malloc), PyTorch's gloo
# collectives for N = 2 and 4 (benchmarks/torch_collectives.py), namedax's device-mode and
# vectorized-mode collectives with their in-process baselines, and prints every
# case with its same-run ratios and the target lines of the performance issue. Results go to
# build-bench/results/ (raw CSVs, bench.csv, targets.csv, summary.json, output.txt).
#
#   bash scripts/bench.sh            the whole suite (15 to 25 minutes on 2 cores)
#   bash scripts/bench.sh --quick    N = 2, 4 and sizes up to 1 MiB, vmap at 16 MiB (a few minutes)
#   bash scripts/bench.sh --docs     the whole suite, then the plots and the CSV in docs/performance/
#
# OpenMPI (libopenmpi-dev, openmpi-bin) is installed by scripts/setup.sh; where CMake finds no
# MPI the MPI baselines are left out and their target lines say "no data". PyTorch (Debian's
# python3-torch) is installed here when missing and the script runs as root; without it the gloo
# baselines are left out the same way. Last, the overhead
# of namedax over MPI against the raw MPI calls (benchmarks/mpi_overhead.cpp), with namedax's
# per-call agreement on and off. Also the local reductions (benchmarks/local_ops.cpp) and the
# contractions through OpenBLAS (benchmarks/contractions.cpp), each against same-run baselines, and a
# collective matmul on 4 devices with an async::ppermute ring and a layer stack whose weights
# async::all_gather fetches a layer ahead (benchmarks/collective_matmul.cpp).
set -euo pipefail
cd "$(dirname "$0")/.."

quick=0
docs=0
for arg in "$@"; do
  case "$arg" in
    --quick) quick=1 ;;
    --docs) docs=1 ;;
    *) echo "usage: bash scripts/bench.sh [--quick] [--docs]" >&2; exit 2 ;;
  esac
done

devices="2,4,8,16"
sizes="4,1024,65536,1048576,16777216,67108864"
vmap_mib=64
if [ "$quick" -eq 1 ]; then
  devices="2,4"
  sizes="4,1024,65536,1048576"
  vmap_mib=16
fi
collectives="psum all_gather psum_scatter all_to_all ppermute"
gather_cap_mib=2048  # all_gather outputs of all devices together (N * N * size) above this are skipped

build=build-bench
results="$build/results"
jobs="${BENCH_JOBS:-1}"

bash scripts/setup.sh
have_mpi=1

# OpenBLAS (0.3.21) chooses its kernels by the processor's model; on one it does not know (a
# virtual machine's "Intel Xeon Processor") it falls back to its SSE3 kernels (Prescott), two
# to three times slower than its AVX-512 or AVX2 ones. Unless the caller chose, name the kernels
# the processor's features allow: every BLAS product of the suite, namedax's and its baselines',
# then runs on the kernels PyTorch's own would compare with.
if [ -z "${OPENBLAS_CORETYPE+set}" ] && [ -r /proc/cpuinfo ]; then
  if grep -qw avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX
  elif grep -qw avx2 /proc/cpuinfo; then export OPENBLAS_CORETYPE=Haswell
  fi
fi

cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DNAMEDAX_BUILD_TESTS=OFF -DNAMEDAX_BUILD_EXAMPLES=OFF \
  -DNAMEDAX_BUILD_BENCHMARKS=ON >/dev/null
targets=(device_collectives vectorized_collectives local_ops contractions collective_matmul_ring grad_step
         training_step)
build_targets=$(cmake --build "$build" --target help)  # mpi_baseline exists only where CMake found MPI
if [ "$have_mpi" -eq 1 ] && [[ "$build_targets" == *mpi_baseline* ]]; then
  targets+=(mpi_baseline mpi_overhead)
else
  have_mpi=0
fi
cmake --build "$build" --target "${targets[@]}" -j "$jobs"

mkdir -p "$results"
rm -f "$results"/*.csv
start=$(date +%s)
{
  echo "namedax collective benchmarks, $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, $(uname -r)"
  echo "devices $devices; sizes per device (bytes) $sizes; vmap $vmap_mib MiB; OpenBLAS kernels ${OPENBLAS_CORETYPE:-as OpenBLAS detects them}"

  if [ "$have_mpi" -eq 1 ]; then
    mpirun_flags=(--oversubscribe --bind-to none --mca pml ob1 --mca btl self,vader)
    [ "$(id -u)" -eq 0 ] && mpirun_flags+=(--allow-run-as-root)
    echo "impl,collective,devices,bytes,actual_bytes,seconds" >"$results/mpi.csv"
    echo
    echo "OpenMPI $(mpirun --version 2>/dev/null | head -1 | awk '{print $NF}'): one mpirun per (collective, N, malloc), all sizes in one launch"
    for c in $collectives; do
      for n in ${devices//,/ }; do
        run_sizes=()
        for s in ${sizes//,/ }; do
          if [ "$c" = all_gather ] && [ $((n * n * s)) -gt $((gather_cap_mib << 20)) ]; then
            echo "  $c np=$n $s B: skipped, the gathered outputs of all ranks would exceed $gather_cap_mib MiB"
            continue
          fi
          run_sizes+=("$s")
        done
        for label in openmpi openmpi_hugetlb; do
          env_flags=()
          [ "$label" = openmpi_hugetlb ] && env_flags=(-x GLIBC_TUNABLES=glibc.malloc.hugetlb=1)
          if ! timeout 600 mpirun "${mpirun_flags[@]}" "${env_flags[@]}" -np "$n" \
            "$build/benchmarks/mpi_baseline" "$c" "$label" "${run_sizes[@]}" >"$results/mpi_run.csv"; then
            echo "  $c np=$n ($label): mpirun failed or timed out; the sizes it printed are kept"
          fi
          cat "$results/mpi_run.csv" >>"$results/mpi.csv"
          awk -F, -v c="$c" -v n="$n" -v l="$label" \
            '{printf "  %-13s np=%-2s %-16s %10s B  %12.2f us\n", c, n, l, $4, $6 * 1e6}' "$results/mpi_run.csv"
        done
      done
    done
    rm -f "$results/mpi_run.csv"
  else
    echo "OpenMPI not available: the MPI baselines are left out"
  fi

  # PyTorch's gloo collectives (benchmarks/torch_collectives.py), N = 2 and 4 of the device
  # list, one launch per N with all collectives and sizes. Debian's python3-torch goes into the
  # system Python, which may not be the first python3 on the PATH.
  echo
  torch_python=""
  find_torch() {
    for p in python3 /usr/bin/python3; do
      if command -v "$p" >/dev/null && "$p" -c 'import torch' 2>/dev/null; then torch_python="$p"; return 0; fi
    done
    return 1
  }
  if ! find_torch && [ "$(id -u)" -eq 0 ]; then
    echo "installing python3-torch (PyTorch for the gloo baselines)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3-torch; } \
      >/dev/null || true
    find_torch || true
  fi
  if [ -n "$torch_python" ]; then
    torch_version=$("$torch_python" -c 'import torch; print(torch.__version__)')
    echo "PyTorch $torch_version gloo (a process per rank, TCP over loopback): one launch per N, all collectives and sizes"
    echo "impl,collective,devices,bytes,actual_bytes,seconds" >"$results/gloo.csv"
    for n in ${devices//,/ }; do
      [ "$n" -eq 2 ] || [ "$n" -eq 4 ] || continue
      if ! timeout 1800 "$torch_python" benchmarks/torch_collectives.py --np "$n" --sizes "$sizes" \
        --collectives "${collectives// /,}" --gather-cap-mib "$gather_cap_mib" >"$results/gloo_run.csv"; then
        echo "  gloo np=$n: failed or timed out; the sizes it printed are kept"
      fi
      cat "$results/gloo_run.csv" >>"$results/gloo.csv"
      awk -F, '
        BEGIN { call["psum"] = "all_reduce"; call["all_gather"] = "all_gather";
                call["psum_scatter"] = "all_reduce + slice"; call["all_to_all"] = "all_to_all_single";
                call["ppermute"] = "irecv/isend ring" }
        { printf "  %-13s np=%-2s gloo %-22s %10s B  %12.2f us\n", $2, $3, call[$2], $4, $6 * 1e6 }' \
        "$results/gloo_run.csv"
    done
    rm -f "$results/gloo_run.csv"
  else
    echo "PyTorch not available: the gloo baselines are left out"
  fi

  echo
  "$build/benchmarks/device_collectives" --devices "$devices" --sizes "$sizes" \
    --collectives "${collectives// /,}" --gather-cap-mib "$gather_cap_mib" --out "$results/device.csv"
  echo
  "$build/benchmarks/vectorized_collectives" --mib "$vmap_mib" --axis 16 --out "$results/vectorized.csv"
  echo
  # Local reductions and scans under vmap against xt::sum and hand loops (smaller with --quick).
  if [ "$quick" -eq 1 ]; then "$build/benchmarks/local_ops" --axis 16 --rows 1024 --cols 1024
  else "$build/benchmarks/local_ops" --axis 16 --rows 4096 --cols 1024; fi
  echo
  # xeinsum matmuls through OpenBLAS under vmap and pmap against cblas_sgemm (2048 left out with --quick).
  if [ "$quick" -eq 1 ]; then "$build/benchmarks/contractions" --sizes 512 --batches 1,4 --devices 2,4
  else "$build/benchmarks/contractions" --sizes 512,2048 --batches 1,4 --devices 2,4; fi
  echo
  # A collective matmul on 4 devices: all_gather then matmul, a blocking ring, an async::ppermute ring.
  if [ "$quick" -eq 1 ]; then "$build/benchmarks/collective_matmul_ring" --rows 128 --rounds 5
  else "$build/benchmarks/collective_matmul_ring" --rows 128,512 --rounds 7; fi
  echo
  # A training step's backward pass by namedax::grad against the hand-written one (target: <= 1.5).
  "$build/benchmarks/grad_step"
  echo
  # One training step (forward, grad, SGD update) of a tensor-parallel MLP and a transformer
  # block on a 2 x 2 mesh, on device threads and vectorized on one thread, against the same
  # steps in PyTorch's eager mode with autograd at 4 threads and at 1 (where PyTorch is).
  "$build/benchmarks/training_step" --out "$results/training.csv"
  if [ -n "$torch_python" ]; then
    "$torch_python" benchmarks/torch_training_step.py --threads 4,1 >"$results/torch_training.csv" ||
      echo "torch_training_step.py failed: the PyTorch training-step baselines are left out"
  else
    echo "PyTorch not available: the PyTorch training-step baselines are left out"
  fi
  python3 benchmarks/report.py "$results"
  if [ "$have_mpi" -eq 1 ]; then
    overhead_sizes="1024,65536,1048576,16777216"
    [ "$quick" -eq 1 ] && overhead_sizes="1024,65536,1048576"
    for agree in 1 0; do
      echo
      timeout 1200 mpirun "${mpirun_flags[@]}" -x NAMEDAX_MPI_AGREE=$agree -np 4 "$build/benchmarks/mpi_overhead" \
        --sizes "$overhead_sizes" || echo "mpi_overhead (NAMEDAX_MPI_AGREE=$agree): mpirun failed or timed out"
    done
  fi
  echo "suite run time: $(( $(date +%s) - start )) s"
} 2>&1 | tee "$results/output.txt"

if [ "$docs" -eq 1 ]; then
  mkdir -p docs/performance
  cp "$results/bench.csv" "$results/targets.csv" docs/performance/
  python3 benchmarks/plot.py docs/performance/bench.csv docs/performance
fi
