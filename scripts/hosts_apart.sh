#!/usr/bin/env bash
# The hosts-apart tier: MPI processes on simulated hosts of this machine, with faults injected.
#
#   bash scripts/hosts_apart.sh <test_mpi_watchdog program> [mpirun] [scenario ...]
#
# Each scenario gets three Linux network namespaces, the hosts ndx-<pid>-h0, -h1 and -h2 (with
# 10.231.0.1, .2 and .3 on a private /24), each joined by a veth pair to a bridge in a fourth
# namespace, ndx-<pid>-sw. mpirun runs on h0 and starts its daemons on the other hosts through
# an agent that stands in for ssh (`ip netns exec` into the host's namespace); every host has a
# hostname of its own (a UTS namespace), OpenMPI talks over TCP only (btl tcp,self, and both
# btl and oob on the private subnet), and the program runs one process per host, rank r on hr.
# The scenarios (the program's `fault` loop unless said otherwise), each faulting rank 2's host:
#   plain      the program's `slow` loop (12 process maps of a 256 KiB psum), no fault
#   slowed     the same with h2's link slowed both ways by a tbf qdisc: every sum right, no error
#   killed     rank 2 killed by SIGKILL mid-run (mpirun --enable-recovery keeps the job)
#   stopped    rank 2 frozen by SIGSTOP mid-run (a stuck host)
#   link_down  h2's end of its veth pair set down mid-run (a host cut off)
# A fault must end the survivors (ranks 0 and 1) with a namedax::collective_error naming rank 2
# within the watchdog's deadline (NAMEDAX_MPI_TIMEOUT, 2 s here): the program checks its
# messages and times and prints "watchdog passed"; this script checks that line, and the time
# from the fault to it. Every scenario is bounded by `timeout`; everything is torn down after
# each one and on any exit. Nothing outside the namespaces this script makes is touched.
# Where namespaces cannot be made (not root, no iproute2, no permission) it prints one line,
# "hosts_apart: SKIPPED: <why>", and exits 0.
set -euo pipefail

skip() {
  echo "hosts_apart: SKIPPED: $*"
  exit 0
}

if [[ $# -lt 1 ]]; then
  echo "usage: $0 <test_mpi_watchdog program> [mpirun] [scenario ...]" >&2
  exit 2
fi
program=$(readlink -f "$1")
mpirun=$(command -v "${2:-mpirun}" || true)
shift $(($# >= 2 ? 2 : 1))
scenarios=("$@")
[[ ${#scenarios[@]} -gt 0 ]] || scenarios=(plain slowed killed stopped link_down)
[[ -x $program ]] || { echo "hosts_apart: no test program at $program" >&2; exit 2; }
[[ -n $mpirun ]] || { echo "hosts_apart: no mpirun" >&2; exit 2; }

[[ $(id -u) -eq 0 ]] || skip "network namespaces need root (running as uid $(id -u))"
for tool in ip tc unshare timeout hostname; do
  command -v "$tool" >/dev/null || skip "no '$tool' on PATH"
done
"$mpirun" --version 2>/dev/null | grep -qE "Open MPI|OpenRTE" || skip "$mpirun is not Open MPI's (the tier uses its rsh launcher and TCP options)"

timeout_s=2          # NAMEDAX_MPI_TIMEOUT
run_limit=45         # seconds for one mpirun, at most
# From the fault to the survivors' verdict, at most: the deadline, the census, a loaded machine's slack.
detect_limit=$((timeout_s + 10))
# The slow link: 16 Mbit/s each way (a 256 KiB psum then takes about 0.3 s instead of 0.02 s,
# well within the deadline), with a queue deep enough (rate x latency) that TCP seldom loses a
# packet to it.
tbf=(rate 16mbit burst 32kb latency 400ms)
subnet=10.231.0
prefix="ndx-$$"
hosts=("$prefix-h0" "$prefix-h1" "$prefix-h2")
switch="$prefix-sw"
work=$(mktemp -d "${TMPDIR:-/tmp}/ndx-hosts-apart.XXXXXX")

namespaces_made=()
teardown() {
  local ns pid left
  # Every process in them (mpirun, its daemons, the program), until none is left: one may
  # still start another while the first round ends them.
  for _ in $(seq 50); do
    left=""
    for ns in "${namespaces_made[@]}"; do left+=" $(ip netns pids "$ns" 2>/dev/null || true)"; done
    [[ -n ${left// /} ]] || break
    for pid in $left; do kill -KILL "$pid" 2>/dev/null || true; done
    sleep 0.1
  done
  for ns in "${namespaces_made[@]}"; do ip netns delete "$ns" 2>/dev/null || true; done
  namespaces_made=()
}
cleanup() {
  teardown
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

# The hosts: a bridge in its own namespace, and a veth pair from it to each host's namespace.
setup() {
  ip netns add "$switch" && namespaces_made+=("$switch")
  ip -n "$switch" link add ndx-br type bridge
  ip -n "$switch" link set ndx-br up
  local k
  for k in 0 1 2; do
    ip netns add "${hosts[k]}" && namespaces_made+=("${hosts[k]}")
    ip link add ndx-e$k netns "${hosts[k]}" type veth peer name ndx-p$k netns "$switch"
    ip -n "$switch" link set ndx-p$k master ndx-br
    ip -n "$switch" link set ndx-p$k up
    ip -n "${hosts[k]}" addr add "$subnet.$((k + 1))/24" dev ndx-e$k
    ip -n "${hosts[k]}" link set ndx-e$k up
    ip -n "${hosts[k]}" link set lo up
  done
}

# Can namespaces be made here? (A container may forbid it even to root.)
if ! why=$(ip netns add "$prefix-probe" 2>&1); then
  skip "cannot make a network namespace: ${why//$'\n'/ }"
fi
namespaces_made+=("$prefix-probe")
if ! why=$(ip -n "$prefix-probe" link add ndx-probe type bridge 2>&1); then
  skip "cannot make a bridge in a network namespace: ${why//$'\n'/ }"
fi
if ! why=$(ip -n "$prefix-probe" link add ndx-v0 type veth peer name ndx-v1 2>&1); then
  skip "cannot make a veth pair in a network namespace: ${why//$'\n'/ }"
fi
if ! why=$(ip netns exec "$prefix-probe" tc qdisc add dev ndx-v0 root tbf "${tbf[@]}" 2>&1); then
  skip "cannot shape a link with tbf: ${why//$'\n'/ }"
fi
if ! why=$(ip netns exec "$prefix-probe" unshare --uts hostname ndx-probe 2>&1); then
  skip "cannot run in a network namespace with a hostname of its own: ${why//$'\n'/ }"
fi
teardown

# The agent mpirun calls instead of ssh: `agent [options] <host> <command>` runs the command on
# that host: in its namespace, with its hostname.
cat >"$work/agent" <<EOF
#!/usr/bin/env bash
while [[ \$# -gt 0 && \$1 == -* ]]; do shift; done
case \$1 in
  $subnet.1) ns=${hosts[0]} ;;
  $subnet.2) ns=${hosts[1]} ;;
  $subnet.3) ns=${hosts[2]} ;;
  *) echo "hosts_apart agent: unknown host \$1" >&2; exit 1 ;;
esac
shift
exec ip netns exec "\$ns" unshare --uts /bin/sh -c 'hostname "\$0" && exec /bin/sh -c "\$1"' "\$ns" "\$*"
EOF
chmod +x "$work/agent"
printf '%s slots=1\n' "$subnet.1" "$subnet.2" "$subnet.3" >"$work/hostfile"

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

# Runs one scenario; adds it to `failed` when it fails (and prints its log). A step of the
# set-up that fails ends the script (set -e), which tears everything down.
run() {
  local scenario=$1 mode=fault recovery=() log="$work/$scenario.log"
  case $scenario in
    plain | slowed) mode=slow ;;
    killed) recovery=(--enable-recovery) ;;
    stopped | link_down) ;;
    *) echo "hosts_apart: unknown scenario $scenario" >&2; exit 2 ;;
  esac
  setup
  if [[ $scenario == slowed ]]; then
    # Both ways: h2's egress, and the bridge port's egress towards h2.
    ip netns exec "${hosts[2]}" tc qdisc add dev ndx-e2 root tbf "${tbf[@]}"
    ip netns exec "$switch" tc qdisc add dev ndx-p2 root tbf "${tbf[@]}"
  fi
  rm -f "$work"/pid.*
  local start fault_at="" verdict_at="" job
  start=$(now)
  # In a subshell that outlives it, whose stderr is not the log: the teardown's SIGKILL ends
  # mpirun (and timeout with it) without a word from the shell.
  : >"$log"
  (timeout -k 3 "$run_limit" ip netns exec "${hosts[0]}" unshare --uts /bin/sh -c 'hostname "$0" && exec "$@"' "${hosts[0]}" \
    "$mpirun" --allow-run-as-root --hostfile "$work/hostfile" -np 3 --bind-to none "${recovery[@]}" \
    --mca plm_rsh_agent "$work/agent" --mca btl tcp,self \
    --mca btl_tcp_if_include "$subnet.0/24" --mca oob_tcp_if_include "$subnet.0/24" \
    -x NAMEDAX_MPI_TIMEOUT=$timeout_s -x NAMEDAX_WATCHDOG_PID_FILE="$work/pid" \
    "$program" "$mode" >"$log" 2>&1 || true) 2>/dev/null &
  job=$!

  if [[ $mode == fault ]]; then
    # Mid-run: a second after every process has finished its first map.
    while [[ ! -s $work/pid.0 || ! -s $work/pid.1 || ! -s $work/pid.2 ]] && kill -0 "$job" 2>/dev/null; do sleep 0.1; done
    if [[ -s $work/pid.2 ]]; then
      sleep 1
      case $scenario in
        killed) kill -KILL "$(cat "$work/pid.2")" ;;
        stopped) kill -STOP "$(cat "$work/pid.2")" ;;
        link_down) ip -n "${hosts[2]}" link set ndx-e2 down ;;
      esac
      fault_at=$(now)
    fi
  fi
  # Until the verdict is printed or mpirun ends (timeout bounds it).
  while ! grep -q "watchdog \(passed\|FAILED\)" "$log" && kill -0 "$job" 2>/dev/null; do sleep 0.1; done
  grep -q "watchdog \(passed\|FAILED\)" "$log" && verdict_at=$(now)
  # mpirun ends the job (MPI_Abort after a fault); it may wait for a daemon it cannot reach.
  local ending="mpirun ended the job"
  for _ in $(seq 50); do kill -0 "$job" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$job" 2>/dev/null && ending="mpirun still ran 5 s after the verdict (ended by the teardown)"
  local stats=""
  if [[ $scenario == slowed ]]; then
    stats=$(ip netns exec "${hosts[2]}" tc -s qdisc show dev ndx-e2; ip netns exec "$switch" tc -s qdisc show dev ndx-p2)
  fi
  teardown
  wait "$job" || true

  local why="" line
  line=$(grep -m1 "watchdog \(passed\|FAILED\)" "$log" || true)
  if [[ -z $line ]]; then
    why="no verdict within $run_limit s (the survivors hung, or mpirun ended first)"
  elif [[ $line != "watchdog passed ($mode)"* ]]; then
    why="the program said: $line"
  elif [[ $mode == fault && -z $fault_at ]]; then
    why="the processes never all reached the loop: no fault injected"
  elif [[ $mode == fault ]] && awk -v f="$fault_at" -v v="$verdict_at" -v l="$detect_limit" 'BEGIN { exit !(v - f > l) }'; then
    why="the verdict came $(elapsed "$fault_at" "$verdict_at") s after the fault (at most $detect_limit s)"
  elif [[ $scenario == slowed ]] && ! grep -qE "overlimits [1-9]" <<<"$stats"; then
    why="the tbf qdiscs never throttled (no overlimits): the link was not slowed: $stats"
  fi
  if [[ -n $why ]]; then
    echo "hosts_apart: $scenario: FAILED: $why; the log:"
    sed 's/^/  | /' "$log"
    failed+=("$scenario")
    return 0
  fi
  if [[ $mode == fault ]]; then
    echo "hosts_apart: $scenario: passed in $(elapsed "$start" "$verdict_at") s, $(elapsed "$fault_at" "$verdict_at") s from the fault to the survivors' error; $ending: ${line#watchdog passed (fault): }"
  else
    echo "hosts_apart: $scenario: passed in $(elapsed "$start" "$verdict_at") s: ${line#watchdog passed (slow): }"
  fi
}

failed=()
for scenario in "${scenarios[@]}"; do
  run "$scenario"  # not in a condition: set -e stays on inside
done
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "hosts_apart: FAILED: ${failed[*]} (of ${scenarios[*]})"
  exit 1
fi
echo "hosts_apart: all passed: ${scenarios[*]}"
