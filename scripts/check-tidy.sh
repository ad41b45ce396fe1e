#!/usr/bin/env bash
# clang-tidy (.clang-tidy at the root) over the library and CLI sources, using the
# release build's compile_commands.json.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -f build/release/compile_commands.json ]] || scripts/setup.sh
mapfile -t files < <(git ls-files 'src/*.cpp' 'tools/*.cpp')
clang-tidy -p build/release --quiet "${files[@]}"
echo "tidy: ${#files[@]} files clean"
