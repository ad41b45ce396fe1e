#!/usr/bin/env bash
# clang-tidy (.clang-tidy at the root) over the library and CLI sources, using the
# release build's compile_commands.json; one process per core.
set -euo pipefail
cd "$(dirname "$0")/.."
[[ -f build/release/compile_commands.json ]] || scripts/setup.sh
mapfile -t files < <(git ls-files 'src/*.cpp' 'tools/*.cpp')
printf '%s\n' "${files[@]}" |
  xargs -P "$(nproc)" -n 4 clang-tidy -p build/release --quiet 2> >(grep -v 'warnings generated' >&2)
echo "tidy: ${#files[@]} files clean"
