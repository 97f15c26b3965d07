#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Runs a watchdog test job (mpirun and its arguments), which prints "watchdog passed" or
# "watchdog FAILED ..." once its survivors hold their errors, and ends the job 5 s after that
# line if it has not ended: the teardown of a job whose survivors called MPI_Abort while
# another process waited in MPI_Finalize can crash or hang inside mpirun (OpenMPI 4.1), and is
# no part of what is tested. Prints the job's output; passes on "watchdog passed" alone.
#   until_verdict.sh <seconds to wait for the verdict> mpirun ...
set -uo pipefail
limit=$1
shift
log=$(mktemp)
trap 'rm -f "$log"' EXIT
setsid "$@" >"$log" 2>&1 &  # a session of its own: the job is one process group
job=$!
verdict() { grep -q "watchdog \(passed\|FAILED\)" "$log"; }
end=$((SECONDS + limit))
until verdict || ! kill -0 "$job" 2>/dev/null || ((SECONDS >= end)); do sleep 0.1; done
for _ in $(seq 50); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
# mpirun puts the processes it starts in process groups of their own: end them by parentage.
kill -KILL $(pgrep -P "$job") -- "-$job" 2>/dev/null
wait "$job" 2>/dev/null
cat "$log"
verdict || echo "until_verdict: no verdict within $limit s"
grep -q "watchdog passed" "$log"
