#!/usr/bin/env bash
# The libFuzzer targets (tests/fuzz, docs/reliability.md), built by the asan preset
# (clang 14, ASan + UBSan, the library instrumented for coverage; scripts/test.sh has
# built them already): each replays its corpus (tests/fuzz/corpus/<target>/: seeds,
# the minimized corpus and every input a finding came from), then fuzzes for
# KA_FUZZ_SECONDS (default 60) from a copy of it. Any crash, sanitizer report or
# escaped exception fails; the input is kept in build/asan/fuzz-findings/.
# The targets run side by side, one per core (each fuzzer is one process on one core).
# KA_FUZZ_MERGE=1 merges what the run found into the corpus (for a commit).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${KA_FUZZ_SECONDS:-60}"
cmake --preset asan >/dev/null
cmake --build --preset asan --target npy_fuzz cli_args_fuzz trace_fuzz ops_fuzz
findings=build/asan/fuzz-findings
logs=build/asan/fuzz-logs
mkdir -p "$findings" "$logs"

# One target: replay, fuzz, merge if asked; output in $logs/<target>.log.
fuzz_target() {
  local target=$1
  local binary="build/asan/tests/fuzz/${target}_fuzz"
  local corpus="tests/fuzz/corpus/$target"
  local work="build/asan/fuzz-work/$target"
  # The fuzzer's own exit status decides: this function runs on the left of `||` (below),
  # where `set -e` does not stop it, so each run's status is kept and returned.
  local status=0
  mkdir -p "$(dirname "$work")"
  echo "fuzz: $target: replaying $(find "$corpus" -type f | wc -l) inputs"
  "$binary" -runs=0 -artifact_prefix="$findings/$target-" "$corpus" >"$work.replay" 2>&1 ||
    status=$?
  grep -E "ERROR|runtime error|SUMMARY" "$work.replay" || true
  tail -1 "$work.replay"
  rm -rf "$work" && mkdir -p "$work" && cp "$corpus"/* "$work"/
  echo "fuzz: $target: fuzzing for ${seconds}s"
  "$binary" -max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$findings/$target-" \
    "$work" >"$work.out" 2>&1 || status=$?
  grep -E "^stat::number_of_executed_units|^stat::new_units_added|DONE|ERROR|runtime error|SUMMARY" \
    "$work.out" || true
  if [[ "${KA_FUZZ_MERGE:-0}" == 1 ]]; then
    "$binary" -merge=1 "$corpus" "$work" 2>&1 | grep -E "MERGE-OUTER: [0-9]+ new files" || true
  fi
  return "$status"
}

# The slowest first, so that the last to start is not the one that ends last.
targets=(ops npy cli_args trace)
rm -f "$logs"/*.failed
export -f fuzz_target
export seconds findings
printf '%s\n' "${targets[@]}" | xargs -P "$(nproc)" -I{} bash -c \
  'set -euo pipefail; fuzz_target {} >"$0/{}.log" 2>&1 || touch "$0/{}.failed"' "$logs"
failed=()
for target in "${targets[@]}"; do
  cat "$logs/$target.log"
  [[ ! -e $logs/$target.failed ]] || failed+=("$target")
done
if ((${#failed[@]})); then
  echo "fuzz: failed: ${failed[*]} (inputs in $findings)" >&2
  exit 1
fi
echo "fuzz: every target replayed and fuzzed without a finding"
