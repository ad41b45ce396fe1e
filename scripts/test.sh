#!/usr/bin/env bash
# Every test: the g++ release build's ctest, the clang 14 build's ctest under
# AddressSanitizer + UndefinedBehaviorSanitizer (the tests include golden digests that
# must hold whatever the compiler; the sanitizers check every access on the way), the
# PyTorch tests (tests/python, against the package setup.sh installs in .venv) and the
# formatting. The clang release preset stays for local use: the asan build is clang too.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
ctest --preset release -j"$(nproc)"
scripts/sanitizers.sh asan
.venv/bin/python -m pytest tests/python -q
scripts/check-format.sh
