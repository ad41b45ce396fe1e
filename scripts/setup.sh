#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks (apt, as root), then configures and
# builds the release preset, and sets up Python: .venv with the pins of requirements.txt
# and the kernel_align PyTorch package (editable, built in build/py-*). Idempotent:
# installed packages are not fetched again. KERNEL_ALIGN_SKIP_PYTHON=1 skips Python.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(g++ clang cmake ninja-build pkg-config libmpfr-dev libgmp-dev libgtest-dev
          libbenchmark-dev libsimde-dev clang-format clang-tidy python3-venv ccache
          libclang-rt-14-dev)  # the sanitizers' and libFuzzer's runtimes (scripts/sanitizers.sh)
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

if [[ "${KERNEL_ALIGN_SKIP_PYTHON:-0}" != 1 ]]; then
  [[ -x .venv/bin/python ]] || python3 -m venv .venv
  .venv/bin/pip install --quiet -r requirements.txt
  # No build isolation: the extension compiles against the torch just installed.
  CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
    .venv/bin/pip install --quiet --no-build-isolation --no-deps -e .
fi
