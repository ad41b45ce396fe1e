#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks (apt, as root), then configures and
# builds the release preset. Idempotent: installed packages are not fetched again.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(g++ clang cmake ninja-build pkg-config libmpfr-dev libgmp-dev libgtest-dev
          libbenchmark-dev clang-format clang-tidy)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}"
fi

preset="${KERNEL_ALIGN_PRESET:-release}"
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset"
