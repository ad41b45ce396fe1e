#!/usr/bin/env bash
# Runs kernel_align_bench with repetitions, keeps the JSON and prints the summary tables.
#
#   bench/run_bench.sh [--quick] [--out FILE] [--reps N] [--min-time S] [-- extra benchmark flags]
#
#   --quick      t2i_1328x1328 only, no reference backend (a few minutes on 2 cores)
#   --out FILE   JSON output (default build/bench/results/bench-<date>.json)
#   --reps N     --benchmark_repetitions (default 5); medians are reported
#   --min-time S --benchmark_min_time per repetition (default 0.3)
#   --filter RE  --benchmark_filter (default: every case, or the --quick set)
#   BENCH=path   the binary (default build/bench/bench/kernel_align_bench)
set -euo pipefail
cd "$(dirname "$0")/.."

bench="${BENCH:-build/bench/bench/kernel_align_bench}"
reps=5
min_time=0.3
filter=""
out=""
extra=()
while (($#)); do
  case "$1" in
    --quick) filter='/t2i_1328x1328/(copy|cpu-[a-z0-9]+)/'; shift ;;
    --out) out="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --min-time) min_time="$2"; shift 2 ;;
    --filter) filter="$2"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "run_bench.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

if [[ ! -x "$bench" ]]; then
  echo "run_bench.sh: no binary at $bench; build it first:" >&2
  echo "  cmake -S . -B build/bench -G Ninja -DCMAKE_BUILD_TYPE=Release && cmake --build build/bench --target kernel_align_bench" >&2
  exit 2
fi
if [[ -z "$out" ]]; then
  mkdir -p build/bench/results
  out="build/bench/results/bench-$(date +%Y%m%d-%H%M%S).json"
fi

args=(--benchmark_repetitions="$reps" --benchmark_report_aggregates_only=true
      --benchmark_min_time="$min_time" --benchmark_out="$out" --benchmark_out_format=json)
[[ -n "$filter" ]] && args+=(--benchmark_filter="$filter")
echo "run_bench.sh: $bench ${args[*]} ${extra[*]}" >&2
"$bench" "${args[@]}" "${extra[@]}" >&2
echo "run_bench.sh: results in $out" >&2
python3 bench/summarize.py --targets "$out"
