#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Compile time and size as metrics, in two parts.
#
# Release part (CXXFLAGS): times the compilation (wall clock, best of RUNS, peak memory and CPU
# time) of a translation unit that uses xtensor alone, of the flagship example, of one that only
# includes namedax, of one that uses psum alone and of one that uses every collective, each
# under vmap and pmap; then of the last one with namedax.hpp precompiled (the cost of the
# precompiled header itself is a row of its own); then of the one-collective and
# all-collectives units with NAMEDAX_SEPARATE_COMPILATION, the one-collective unit also with the
# two headers it needs in place of the umbrella header (the one-off cost of the separately
# compiled source, src/separate_compilation.cpp, is a row of its own); then of every example,
# examples/*.cpp, header-only (example_<name>) and with NAMEDAX_SEPARATE_COMPILATION, as a unit
# that links the compiled part is compiled (example_<name>_separate). Prints each one's ratios
# to the xtensor-only one, compiled in the same run, and writes them to a CSV file:
#   unit,wall_seconds,peak_rss_mb,cpu_seconds,wall_ratio,rss_ratio,cpu_ratio
#
# Debug part (DEBUG_CXXFLAGS): compiles once the xtensor-only unit for reference, every example
# and every test unit (tests/*.cpp but main.cpp), header-only by default (the mode that
# compiles the most; DEBUG_MODE=separate for NAMEDAX_SEPARATE_COMPILATION), and checks each
# against the limits a Debug build must keep to: peak compiler memory under 2 GB, object file
# under 30 MB, no string in the object's .debug_str (type and linkage names) longer than 64 KB.
# Writes a second CSV, <output without .csv>_debug.csv:
#   unit,mode,peak_rss_mb,object_mb,longest_debug_string_bytes,wall_seconds,over_limits
# where over_limits is empty or lists what the unit breaks, joined by ';': memory, object,
# debug_string, or compile_failed (then the other columns are NA). A unit over a limit is
# marked OVER in the output.
#
#   benchmarks/compile_time.sh [--release] [--debug] [--check-limits] [--list] [output.csv]
#
#   output.csv       the Release CSV (default: compile_time.csv in the current directory)
#   --release        run the Release part      (neither --release nor --debug: both parts)
#   --debug          run the Debug part
#   --check-limits   run the Debug part (and the Release part only if --release is given too);
#                    exit with status 1 when a Debug unit breaks a limit or fails to compile
#   --list           print the units that would be compiled, compile nothing
#
# Environment:
#   CXX              the compiler (default g++)
#   CXXFLAGS         the Release part's flags (default -std=c++20 -O2)
#   DEBUG_CXXFLAGS   the Debug part's flags (default -std=c++20 -O0 -g)
#   DEBUG_MODE       header (default) or separate: how the Debug part compiles its units
#   RUNS             timed compilations of each Release unit (default 3)
#   JOBS             Debug units compiled at once (default 2)
#   UNITS            an extended regular expression: only the units whose name it matches run
#                    (default: all). The xtensor-only baseline always runs: the ratios need it.
#   MEMORY_LIMIT_MB, OBJECT_LIMIT_MB, DEBUG_STRING_LIMIT_KB   the limits (2048, 30, 64)
#
# The examples mpi_*.cpp need MPI's compiler flags: they are included when
# `mpicxx --showme:compile` (OpenMPI) prints them, and compiled with those flags.
# Release target: the all-collectives unit compiles in less than 3 times the xtensor-only one.
set -euo pipefail
# Command substitutions keep -e, so that a failed compilation inside one stops the script.
shopt -s inherit_errexit
root="$(cd "$(dirname "$0")/.." && pwd)"

# The header comment above, without its '#'.
usage() { awk 'NR > 2 && /^#/ { sub(/^# ?/, ""); print; next } NR > 2 { exit }' "$0"; }

run_release=0
run_debug=0
check_limits=0
list_only=0
out_arg=""
for arg in "$@"; do
  case "$arg" in
    --release) run_release=1 ;;
    --debug) run_debug=1 ;;
    --check-limits) check_limits=1; run_debug=1 ;;
    --list) list_only=1 ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "unknown option: $arg" >&2; usage >&2; exit 2 ;;
    *) out_arg="$arg" ;;
  esac
done
if [ "$run_release" -eq 0 ] && [ "$run_debug" -eq 0 ]; then run_release=1; run_debug=1; fi

out="$(realpath -m "${out_arg:-compile_time.csv}")"
debug_out="${out%.csv}_debug.csv"
cxx="${CXX:-g++}"
read -r -a flags <<<"${CXXFLAGS:--std=c++20 -O2}"
read -r -a debug_flags <<<"${DEBUG_CXXFLAGS:--std=c++20 -O0 -g}"
debug_mode="${DEBUG_MODE:-header}"
case "$debug_mode" in header | separate) ;; *) echo "DEBUG_MODE is header or separate" >&2; exit 2 ;; esac
runs="${RUNS:-3}"
parallel_jobs="${JOBS:-2}"
unit_filter="${UNITS:-}"
memory_limit_kb=$(( ${MEMORY_LIMIT_MB:-2048} * 1024 ))
object_limit_bytes=$(( ${OBJECT_LIMIT_MB:-30} * 1024 * 1024 ))
debug_string_limit_bytes=$(( ${DEBUG_STRING_LIMIT_KB:-64} * 1024 ))
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# ---- The units ---------------------------------------------------------------------------

# The baseline: what a user of xtensor alone compiles for a trivial program.
cat >"$work/xtensor_only.cpp" <<'CPP'
#include <xtensor/xarray.hpp>
#include <xtensor/xbuilder.hpp>
#include <xtensor/xio.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xview.hpp>

#include <iostream>

int main() {
  xt::xarray<float> x = xt::arange<float>(16).reshape({4, 4});
  xt::xarray<float> y = x / xt::sum(x, {0});
  std::cout << xt::view(y, 0, xt::all()) << "\n";
  return 0;
}
CPP
# The cost of including namedax, with nothing instantiated.
cat >"$work/namedax_include_only.cpp" <<'CPP'
#include <namedax/namedax.hpp>

int main() { return 0; }
CPP

# One collective: psum under vmap and pmap, the smallest program that maps and communicates.
cat >"$work/one_collective.cpp" <<'CPP'
#include <namedax/namedax.hpp>

#include <iostream>

using namespace namedax::literals;

int main() {
  xt::xarray<float> x = xt::arange<float>(16).reshape({4, 4});
  auto total = [](auto row) { return namedax::psum(row, "i"_ax); };
  std::cout << namedax::vmap<"i">(total)(x) << namedax::pmap<"i">(total)(x) << "\n";
  return 0;
}
CPP

# The same with the two headers psum under vmap and pmap needs, instead of the umbrella header.
sed 's|#include <namedax/namedax.hpp>|#include <namedax/collectives.hpp>\n#include <namedax/map.hpp>|' \
  "$work/one_collective.cpp" >"$work/one_collective_two_headers.cpp"

# Built from a header that includes namedax.hpp (g++ warns about #pragma once in a main file).
echo '#include <namedax/namedax.hpp>' >"$work/pch_source.hpp"

# MPI's examples need its compiler flags (include path, defines); without them they are left out.
mpi_flags=()
have_mpi=0
if mpi_compile=$(mpicxx --showme:compile 2>/dev/null); then
  read -r -a mpi_flags <<<"$mpi_compile"
  have_mpi=1
fi

# The examples, in name order; mpi_* only with MPI.
examples=()
for source in "$root"/examples/*.cpp; do
  case "$(basename "$source")" in mpi_*) [ "$have_mpi" -eq 1 ] || continue ;; esac
  examples+=("$source")
done

# Each unit is "name|mode|source". Modes: header (header-only), separate
# (NAMEDAX_SEPARATE_COMPILATION), pch_build (builds the precompiled header; the source is
# ignored), with_pch (header-only, with that precompiled header).
release_units=("xtensor_only|header|$work/xtensor_only.cpp"
               "namedax_include_only|header|$work/namedax_include_only.cpp"
               "one_collective|header|$work/one_collective.cpp"
               "linear_regression|header|$root/examples/linear_regression.cpp"
               "all_collectives|header|$root/benchmarks/all_collectives.cpp"
               "precompiled_header|pch_build|$work/pch_source.hpp"
               "all_collectives_with_pch|with_pch|$root/benchmarks/all_collectives.cpp"
               # Separate compilation: units that declare what one source defines once.
               "separate_compilation_source|separate|$root/src/separate_compilation.cpp"
               "one_collective_separate|separate|$work/one_collective.cpp"
               "one_collective_two_headers_separate|separate|$work/one_collective_two_headers.cpp"
               "all_collectives_separate|separate|$root/benchmarks/all_collectives.cpp")
# linear_regression is measured again as example_linear_regression, so that every example
# has its two rows under one naming scheme.
for source in "${examples[@]}"; do
  name="example_$(basename "$source" .cpp)"
  release_units+=("$name|header|$source" "${name}_separate|separate|$source")
done

debug_units=("xtensor_only|$debug_mode|$work/xtensor_only.cpp")
for source in "${examples[@]}"; do
  debug_units+=("example_$(basename "$source" .cpp)|$debug_mode|$source")
done
for source in "$root"/tests/*.cpp; do
  stem="$(basename "$source" .cpp)"
  [ "$stem" = main ] && continue  # doctest's runner, no tests of its own
  debug_units+=("test_${stem#test_}|$debug_mode|$source")
done

# Whether the unit <name> <mode> is selected by UNITS. The baseline always is; the precompiled
# header is whenever the unit that uses it is, since that unit measures nothing without it.
selected() {
  local name="$1" mode="$2"
  [ "$name" = xtensor_only ] && return 0
  [ "$mode" = pch_build ] && selected all_collectives_with_pch with_pch && return 0
  [[ "$name" =~ $unit_filter ]]
}

# Prints the units of the array named $1 that UNITS selects, one a line. Precompiled headers
# are as g++ finds them (a .gch beside the header): other compilers skip the two rows.
select_units() {
  local -n units_ref="$1"
  local entry name mode
  local is_gcc=0
  if "$cxx" --version | grep -qi 'gcc\|g++'; then is_gcc=1; fi
  for entry in "${units_ref[@]}"; do
    IFS='|' read -r name mode _ <<<"$entry"
    case "$mode" in pch_build | with_pch) [ "$is_gcc" -eq 1 ] || continue ;; esac
    if selected "$name" "$mode"; then echo "$entry"; fi
  done
}

# ---- Compiling and measuring -------------------------------------------------------------

# Sets the array `command` to the compiler's command line for <mode> <source> <object>, with
# the flags that follow. examples/ is on the include path for the examples' local headers.
# The precompiled header: g++ takes $work/pch/namedax/namedax.hpp.gch in place of the header
# when that directory comes first on the include path and the flags match.
unit_command() {
  local mode="$1" source="$2" object="$3"
  shift 3
  command=("$cxx" "$@")
  case "$(basename "$source")" in mpi_*) command+=("${mpi_flags[@]}") ;; esac
  case "$mode" in
    header) command+=(-I"$root/include" -I"$root/examples" -c "$source" -o "$object") ;;
    separate) command+=(-DNAMEDAX_SEPARATE_COMPILATION -I"$root/include" -I"$root/examples"
                        -c "$source" -o "$object") ;;
    pch_build) mkdir -p "$work/pch/namedax"
               command+=(-I"$root/include" -x c++-header "$source" -o "$work/pch/namedax/namedax.hpp.gch") ;;
    with_pch) command+=(-I"$work/pch" -I"$root/include" -I"$root/examples" -Winvalid-pch
                        -c "$source" -o "$object") ;;
  esac
}

have_time=0
if [ -x /usr/bin/time ] && /usr/bin/time -f '%M' true >/dev/null 2>&1; then have_time=1; fi

# Runs the command that follows once; prints "<wall seconds> <peak RSS in kB, or NA> <CPU
# seconds, or NA>". GNU time's %M is the "Maximum resident set size" that `time -v` prints;
# <time file> receives its report.
timed() {
  local time_file="$1"
  shift
  if [ "$have_time" -eq 1 ]; then
    /usr/bin/time -f '%e %M %U %S' -o "$time_file" "$@" || return 1
    awk '{ printf "%s %s %.2f\n", $1, $2, $3 + $4 }' "$time_file"
  else
    local start end
    start=$(date +%s.%N)
    "$@" || return 1
    end=$(date +%s.%N)
    echo "$(awk -v s="$start" -v e="$end" 'BEGIN { printf "%.2f", e - s }') NA NA"
  fi
}

# awk: whether a < b, for decimal numbers.
less_than() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a < b) }'; }

# Compiles a Release unit RUNS times; prints "<best wall> <best RSS kB, or NA> <best CPU, or NA>".
best_of_runs() {
  local mode="$1" source="$2"
  local best_wall="" best_rss="" best_cpu="" result wall rss cpu r
  unit_command "$mode" "$source" "$work/unit.o" "${flags[@]}"
  for ((r = 0; r < runs; r++)); do
    result=$(timed "$work/time.txt" "${command[@]}")  # an assignment, so that a failed compilation stops the script
    read -r wall rss cpu <<<"$result"
    if [ -z "$best_wall" ] || less_than "$wall" "$best_wall"; then best_wall="$wall"; fi
    if [ "$rss" != NA ] && { [ -z "$best_rss" ] || [ "$rss" -lt "$best_rss" ]; }; then best_rss="$rss"; fi
    if [ "$cpu" != NA ] && { [ -z "$best_cpu" ] || less_than "$cpu" "$best_cpu"; }; then best_cpu="$cpu"; fi
  done
  echo "$best_wall ${best_rss:-NA} ${best_cpu:-NA}"
}

# The Release part: each selected unit's row, its ratios to the first (the baseline).
release_part() {
  local -a units
  mapfile -t units < <(select_units release_units)
  if [ "${#units[@]}" -le 1 ]; then echo "release: UNITS selects no unit but the baseline; skipped"; return; fi
  echo "release: $("$cxx" --version | head -n 1); flags: ${flags[*]}; best of $runs"
  echo "unit,wall_seconds,peak_rss_mb,cpu_seconds,wall_ratio,rss_ratio,cpu_ratio" >"$out"
  local base_wall="" base_rss="" base_cpu="" entry name mode source result wall rss cpu row
  for entry in "${units[@]}"; do
    IFS='|' read -r name mode source <<<"$entry"
    result=$(best_of_runs "$mode" "$source")
    read -r wall rss cpu <<<"$result"
    if [ -z "$base_wall" ]; then base_wall="$wall"; base_rss="$rss"; base_cpu="$cpu"; fi
    row=$(awk -v n="$name" -v w="$wall" -v bw="$base_wall" -v m="$rss" -v bm="$base_rss" \
                  -v c="$cpu" -v bc="$base_cpu" 'BEGIN {
      mb = (m == "NA") ? "NA" : sprintf("%.0f", m / 1024)
      rr = (m == "NA" || bm == "NA") ? "NA" : sprintf("%.2f", m / bm)
      cs = (c == "NA") ? "NA" : sprintf("%.2f", c)
      cr = (c == "NA" || bc == "NA" || bc == 0) ? "NA" : sprintf("%.2f", c / bc)
      printf "%s,%.2f,%s,%s,%.2f,%s,%s", n, w, mb, cs, w / bw, rr, cr }')
    echo "$row" >>"$out"
    IFS=, read -r _ w mb cs wr rr cr <<<"$row"
    printf '%-36s %7.2f s wall %6s MB %7s s CPU   ratios to xtensor_only: wall %s, memory %s, CPU %s\n' \
           "$name" "$w" "$mb" "$cs" "$wr" "$rr" "$cr"
  done
  echo "written: $out"
}

# Prints "<length in bytes> <its first 100 bytes>" of the longest NUL-terminated string in the
# object's .debug_str, where the compiler puts type and linkage names ("0 " when there is none).
longest_debug_string() {
  local object="$1" strings="$1.debug_str"
  objcopy --dump-section .debug_str="$strings" "$object" /dev/null 2>/dev/null || true
  if [ ! -s "$strings" ]; then echo "0 "; return; fi
  # Bytes, not characters: the C locale. mawk and gawk both take lines of any length.
  tr '\0' '\n' <"$strings" | LC_ALL=C awk '
    length($0) > max { max = length($0); head = substr($0, 1, 100) }
    END { printf "%d %s\n", max, head }'
  rm -f "$strings"
}

# Compiles one Debug unit and writes its CSV row to $work/debug/<name>.row, and the head of its
# longest debug string to <name>.longest. The object is removed at once: at -O0 -g, several
# of them would take hundreds of MB.
debug_unit() {
  local name="$1" mode="$2" source="$3"
  local object="$work/debug/$name.o" result wall rss bytes longest head over=""
  unit_command "$mode" "$source" "$object" "${debug_flags[@]}"
  if ! result=$(timed "$work/debug/$name.time" "${command[@]}" 2>"$work/debug/$name.log"); then
    echo "$name,$mode,NA,NA,NA,NA,compile_failed" >"$work/debug/$name.row"
    return 0
  fi
  read -r wall rss _ <<<"$result"
  bytes=$(stat -c %s "$object")
  read -r longest head <<<"$(longest_debug_string "$object")"
  rm -f "$object"
  [ "$rss" -lt "$memory_limit_kb" ] || over+="${over:+;}memory"
  [ "$bytes" -lt "$object_limit_bytes" ] || over+="${over:+;}object"
  [ "$longest" -le "$debug_string_limit_bytes" ] || over+="${over:+;}debug_string"
  echo "$head" >"$work/debug/$name.longest"
  awk -v n="$name" -v d="$mode" -v m="$rss" -v b="$bytes" -v l="$longest" -v w="$wall" -v o="$over" \
    'BEGIN { printf "%s,%s,%.0f,%.1f,%d,%.2f,%s\n", n, d, m / 1024, b / 1048576, l, w, o }' >"$work/debug/$name.row"
}

# The Debug part: one compilation per unit, so JOBS of them at once (peak memory is per
# process; wall times then include the competition for the cores, and are for information
# only). Rows in the order of the units; the names of those over a limit go to over_limit_units.
debug_part() {
  if [ "$have_time" -eq 0 ]; then
    echo "the Debug part needs GNU time (/usr/bin/time) for the compiler's peak memory" >&2
    exit 1
  fi
  local -a units
  mapfile -t units < <(select_units debug_units)
  mkdir -p "$work/debug"
  echo "debug: $("$cxx" --version | head -n 1); flags: ${debug_flags[*]}; $debug_mode; $parallel_jobs at once;" \
       "limits: memory < $((memory_limit_kb / 1024)) MB, object < $((object_limit_bytes / 1048576)) MB," \
       "debug strings <= $((debug_string_limit_bytes / 1024)) KB"
  local entry name mode source
  for entry in "${units[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$parallel_jobs" ]; do wait -n || true; done
    IFS='|' read -r name mode source <<<"$entry"
    debug_unit "$name" "$mode" "$source" &
  done
  wait

  echo "unit,mode,peak_rss_mb,object_mb,longest_debug_string_bytes,wall_seconds,over_limits" >"$debug_out"
  local row rss_mb object_mb longest wall over
  for entry in "${units[@]}"; do
    name="${entry%%|*}"
    # A unit whose job died without a row counts as failed, not as within the limits.
    row=$(cat "$work/debug/$name.row" 2>/dev/null || echo "$name,$debug_mode,NA,NA,NA,NA,compile_failed")
    echo "$row" >>"$debug_out"
    IFS=, read -r _ _ rss_mb object_mb longest wall over <<<"$row"
    printf '%-36s %6s MB memory %7s MB object %8s B longest debug string %8s s wall%s\n' \
           "$name" "$rss_mb" "$object_mb" "$longest" "$wall" "${over:+   OVER: $over}"
    if [ "$over" = compile_failed ] && [ -s "$work/debug/$name.log" ]; then
      head -n 20 "$work/debug/$name.log" | sed 's/^/    /'
    elif [ -n "$over" ]; then
      echo "    longest debug string begins: $(cat "$work/debug/$name.longest")"
    fi
    if [ -n "$over" ]; then over_limit_units+=("$name"); fi
  done
  echo "written: $debug_out"
  if [ "${#over_limit_units[@]}" -gt 0 ]; then
    echo "over a Debug limit: ${over_limit_units[*]}"
  else
    echo "every Debug unit is within the limits"
  fi
}

# ---- Main --------------------------------------------------------------------------------

if [ "$list_only" -eq 1 ]; then
  if [ "$run_release" -eq 1 ]; then select_units release_units | sed 's/^/release |/'; fi
  if [ "$run_debug" -eq 1 ]; then select_units debug_units | sed 's/^/debug   |/'; fi
  exit 0
fi
over_limit_units=()
if [ "$run_release" -eq 1 ]; then release_part; fi
if [ "$run_debug" -eq 1 ]; then debug_part; fi
# Breaking a limit is reported in every run, but only fails the run under --check-limits.
if [ "$check_limits" -eq 1 ] && [ "${#over_limit_units[@]}" -gt 0 ]; then exit 1; fi
