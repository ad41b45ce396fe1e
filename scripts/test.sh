#!/usr/bin/env bash
# Every test: builds with g++ (release) and clang 14, runs ctest on both (the tests
# include golden digests that must hold whatever the compiler), runs the PyTorch tests
# (tests/python, against the package setup.sh installs in .venv) and checks formatting.
set -euo pipefail
cd "$(dirname "$0")/.."

for preset in release clang; do
  # Python once, with the release preset.
  skip_python=1
  [[ $preset == release ]] && skip_python=0
  KERNEL_ALIGN_PRESET=$preset KERNEL_ALIGN_SKIP_PYTHON=$skip_python scripts/setup.sh
  ctest --preset "$preset" -j2
done
.venv/bin/python -m pytest tests/python -q
scripts/check-format.sh
