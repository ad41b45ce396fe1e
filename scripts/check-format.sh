#!/usr/bin/env bash
# clang-format must leave every C++ source unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.hpp' '*.cpp' '*.cu' '*.cuh')
clang-format --dry-run --Werror "${files[@]}"
echo "format: ${#files[@]} files clean"
