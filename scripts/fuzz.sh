#!/usr/bin/env bash
# The libFuzzer targets (tests/fuzz, docs/reliability.md), built by the fuzz preset
# (clang 14, ASan + UBSan): each replays its corpus (tests/fuzz/corpus/<target>/: seeds,
# the minimized corpus and every input a finding came from), then fuzzes for
# KA_FUZZ_SECONDS (default 60) from a copy of it. Any crash, sanitizer report or
# escaped exception fails; the input is kept in build/fuzz/findings/.
# KA_FUZZ_MERGE=1 merges what the run found into the corpus (for a commit).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${KA_FUZZ_SECONDS:-60}"
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz
findings=build/fuzz/findings
mkdir -p "$findings"
for target in npy cli_args trace ops; do
  binary="build/fuzz/tests/fuzz/${target}_fuzz"
  corpus="tests/fuzz/corpus/$target"
  inputs=$(find "$corpus" -type f | wc -l)
  echo "fuzz: $target: replaying $inputs inputs"
  "$binary" -runs=0 "$corpus" 2>&1 | tail -1
  work="build/fuzz/work/$target"
  rm -rf "$work" && mkdir -p "$work" && cp "$corpus"/* "$work"/
  echo "fuzz: $target: fuzzing for ${seconds}s"
  "$binary" -max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$findings/$target-" \
    "$work" 2>&1 | grep -E "^stat::number_of_executed_units|^stat::new_units_added|DONE|ERROR|runtime error|SUMMARY"
  if [[ "${KA_FUZZ_MERGE:-0}" == 1 ]]; then
    "$binary" -merge=1 "$corpus" "$work" 2>&1 | grep -E "MERGE-OUTER: [0-9]+ new files" || true
  fi
done
echo "fuzz: every target replayed and fuzzed without a finding"
