#!/usr/bin/env bash
# Prepares, on this (CPU) machine, what scripts/gpu_check.sh needs on a lent GPU machine
# that cannot fetch anything: into .gpu/ (git-ignored; the device tool's `carry`):
#   .gpu/debs/    Debian packages of MPFR, GMP and GoogleTest (headers and libraries),
#                 unpacked there only where the machine lacks them;
#   .gpu/wheels/  pure-Python wheels for the Python 3.12 there: diffusers and what it
#                 needs beyond that machine's packages (importlib_metadata).
# Idempotent; needs apt (Debian's archive) and pip (PyPI).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpu/debs .gpu/wheels
debs=(libmpfr-dev libmpfr6 libgmp-dev libgmp10 libgmpxx4ldbl libgtest-dev)
if ! ls .gpu/debs/libgtest-dev_*.deb >/dev/null 2>&1; then
  (cd .gpu/debs && apt-get download "${debs[@]}")
fi
# Versions: diffusers as requirements.txt pins it; importlib_metadata any recent.
diffusers_pin=$(grep -E '^diffusers==' requirements.txt)
if ! ls .gpu/wheels/diffusers-*.whl >/dev/null 2>&1; then
  python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    -d .gpu/wheels "$diffusers_pin" "importlib_metadata==8.7.0" "zipp==3.23.0"
fi
du -sh .gpu | sed 's/^/gpu_check_prepare: /'
ls .gpu/debs .gpu/wheels
