#!/usr/bin/env bash
# Installs optional Debian packages (used by the benchmarks only, never by the build or the
# tests) when some are missing: as root with apt-get; otherwise names them and exits with 1.
# Usage: bash scripts/optional-packages.sh <package>...
set -euo pipefail
missing=()
for p in "$@"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "optional Debian packages missing: ${missing[*]}; run as root or install them with apt-get" >&2
  exit 1
fi
echo "installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
