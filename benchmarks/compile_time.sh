#!/usr/bin/env bash
# Compile time as a metric: times the compilation (wall clock, best of 3, and peak memory) of a
# translation unit that uses xtensor alone, of the flagship example, of one that only includes
# namedax, of one that uses psum alone and of one that uses every collective, each under vmap
# and pmap; then of the last one with namedax.hpp precompiled (the cost of the precompiled
# header itself is a row of its own); then of the one-collective and all-collectives units with
# NAMEDAX_SEPARATE_COMPILATION, the one-collective unit also with the two headers it needs in
# place of the umbrella header (the one-off cost of the separately compiled source,
# src/separate_compilation.cpp, is a row of its own). Prints each one's ratio to the
# xtensor-only one and writes them to a CSV file.
#
#   benchmarks/compile_time.sh [output.csv]      (default: compile_time.csv in the current directory)
#
# CXX (default g++) and CXXFLAGS (default -std=c++20 -O2) choose the compiler and its flags;
# RUNS (default 3) the number of timed compilations of each unit. Target: the all-collectives
# unit compiles in less than 3 times the xtensor-only one.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="$(realpath -m "${1:-compile_time.csv}")"
cxx="${CXX:-g++}"
read -r -a flags <<<"${CXXFLAGS:--std=c++20 -O2}"
runs="${RUNS:-3}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

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

units=(xtensor_only:"$work/xtensor_only.cpp"
       namedax_include_only:"$work/namedax_include_only.cpp"
       one_collective:"$work/one_collective.cpp"
       linear_regression:"$root/examples/linear_regression.cpp"
       all_collectives:"$root/benchmarks/all_collectives.cpp"
       precompiled_header:PCH
       all_collectives_with_pch:"$root/benchmarks/all_collectives.cpp")
# Separate compilation: units that declare what one source defines once.
separate_units=(separate_compilation_source:"SEPARATE:$root/src/separate_compilation.cpp"
                one_collective_separate:"SEPARATE:$work/one_collective.cpp"
                one_collective_two_headers_separate:"SEPARATE:$work/one_collective_two_headers.cpp"
                all_collectives_separate:"SEPARATE:$root/benchmarks/all_collectives.cpp")

# Precompiled headers as g++ finds them (a .gch beside the header); other compilers skip them.
if ! "$cxx" --version | grep -qi 'gcc\|g++'; then units=("${units[@]:0:5}"); fi
units+=("${separate_units[@]}")

have_time=0
if [ -x /usr/bin/time ] && /usr/bin/time -f '%M' true >/dev/null 2>&1; then have_time=1; fi

# GNU time's %M is the "Maximum resident set size" that `time -v` prints.
# One compilation; prints "<wall seconds> <peak RSS in kB, or NA> <CPU seconds, or NA>".
# The precompiled header: g++ takes $work/pch/namedax/namedax.hpp.gch in place of the header
# when that directory comes first on the include path and the flags match.
compile_once() {
  local source="$1"
  local -a command=("$cxx" "${flags[@]}" -I"$root/include" -c "$source" -o "$work/unit.o")
  if [ "${source#SEPARATE:}" != "$source" ]; then
    source="${source#SEPARATE:}"
    command=("$cxx" "${flags[@]}" -DNAMEDAX_SEPARATE_COMPILATION -I"$root/include" -c "$source" -o "$work/unit.o")
  elif [ "$source" = PCH ]; then
    mkdir -p "$work/pch/namedax"
    # Built from a header that includes namedax.hpp (g++ warns about #pragma once in a main file).
    echo '#include <namedax/namedax.hpp>' >"$work/pch_source.hpp"
    command=("$cxx" "${flags[@]}" -I"$root/include" -x c++-header "$work/pch_source.hpp"
             -o "$work/pch/namedax/namedax.hpp.gch")
  elif [ -f "$work/pch/namedax/namedax.hpp.gch" ]; then
    command=("$cxx" "${flags[@]}" -I"$work/pch" -I"$root/include" -Winvalid-pch -c "$source" -o "$work/unit.o")
  fi
  if [ "$have_time" -eq 1 ]; then
    /usr/bin/time -f '%e %M %U %S' -o "$work/time.txt" "${command[@]}" || return 1
    awk '{ printf "%s %s %.2f\n", $1, $2, $3 + $4 }' "$work/time.txt"
  else
    local start end
    start=$(date +%s.%N)
    "${command[@]}" || return 1
    end=$(date +%s.%N)
    echo "$(awk -v s="$start" -v e="$end" 'BEGIN { printf "%.2f", e - s }') NA NA"
  fi
}

echo "compiler: $("$cxx" --version | head -n 1); flags: ${flags[*]}; best of $runs"
echo "unit,wall_seconds,peak_rss_mb,cpu_seconds,wall_ratio,rss_ratio,cpu_ratio" >"$out"
base_wall=""
base_rss=""
base_cpu=""
for entry in "${units[@]}"; do
  name="${entry%%:*}"
  source="${entry#*:}"
  best_wall=""
  best_rss=""
  best_cpu=""
  for ((r = 0; r < runs; r++)); do
    result=$(compile_once "$source")  # an assignment, so that a failed compilation stops the script
    read -r wall rss cpu <<<"$result"
    if [ -z "$best_wall" ] || awk -v a="$wall" -v b="$best_wall" 'BEGIN { exit !(a < b) }'; then best_wall="$wall"; fi
    if [ "$rss" != NA ] && { [ -z "$best_rss" ] || [ "$rss" -lt "$best_rss" ]; }; then best_rss="$rss"; fi
    if [ "$cpu" != NA ] && { [ -z "$best_cpu" ] || awk -v a="$cpu" -v b="$best_cpu" 'BEGIN { exit !(a < b) }'; }; then
      best_cpu="$cpu"
    fi
  done
  if [ -z "$base_wall" ]; then base_wall="$best_wall"; base_rss="$best_rss"; base_cpu="$best_cpu"; fi
  row=$(awk -v n="$name" -v w="$best_wall" -v bw="$base_wall" -v m="$best_rss" -v bm="$base_rss" \
                -v c="$best_cpu" -v bc="$base_cpu" 'BEGIN {
    mb = (m == "") ? "NA" : sprintf("%.0f", m / 1024)
    rr = (m == "" || bm == "") ? "NA" : sprintf("%.2f", m / bm)
    cs = (c == "") ? "NA" : sprintf("%.2f", c)
    cr = (c == "" || bc == "") ? "NA" : sprintf("%.2f", c / bc)
    printf "%s,%.2f,%s,%s,%.2f,%s,%s", n, w, mb, cs, w / bw, rr, cr }')
  echo "$row" >>"$out"
  IFS=, read -r _ w mb cs wr rr cr <<<"$row"
  printf '%-28s %7.2f s wall %6s MB %7s s CPU   ratios to xtensor_only: wall %s, memory %s, CPU %s\n' \
         "$name" "$w" "$mb" "$cs" "$wr" "$rr" "$cr"
done
echo "written: $out"
