#!/usr/bin/env bash
# Installs the Debian packages namedax needs, when some are missing (as root, with apt-get).
# OpenMPI is for the MPI backend's tests, example and benchmarks; the library builds without it.
# GNU time and binutils measure the Debug builds' compiler memory and debug strings (scripts/test.sh).
set -euo pipefail
packages=(cmake make g++ clang pkgconf libxtensor-dev xtl-dev libxsimd-dev libboost-dev libtbb-dev libopenblas-dev doctest-dev
          libopenmpi-dev openmpi-bin time binutils)
# iproute2 (ip, tc) makes the simulated hosts of the MPI tests (scripts/hosts_apart.sh), which
# only root can make: needed, and installed, as root only.
if [ "$(id -u)" -eq 0 ]; then packages+=(iproute2); fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "namedax needs these Debian packages: ${missing[*]}; run as root or install them with apt-get" >&2
    exit 1
  fi
  echo "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
