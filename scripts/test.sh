#!/usr/bin/env bash
# Every test: builds with g++ (release) and clang 14, runs ctest on both (the tests
# include golden digests that must hold whatever the compiler), and checks formatting.
set -euo pipefail
cd "$(dirname "$0")/.."

for preset in release clang; do
  KERNEL_ALIGN_PRESET=$preset scripts/setup.sh
  ctest --preset "$preset" -j2
done
scripts/check-format.sh
