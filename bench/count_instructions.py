#!/usr/bin/env python3
"""Instructions per call and per byte of each op, counted by valgrind's callgrind.

Wall-clock timings on a shared machine move 20-40% from run to run; instruction counts
of the same binary and inputs do not. This runs the kernel_align_bench cases of each
dtype under callgrind, counting only inside the ops' public functions (--toggle-collect;
KERNEL_ALIGN_BENCH_NO_COPY_BASELINE=1 skips the copy timings), and divides each
function's instructions by its number of calls and by the bytes the benchmark counts
for the op (docs/performance.md). Use it to compare two builds of the kernels:

    bench/count_instructions.py                       # this build, best ISA path
    bench/count_instructions.py --bench OTHER/kernel_align_bench --json before.json

Needs valgrind (Debian package `valgrind`); standard library only.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

# Bench op name -> the public function it calls (one call per iteration).
OPS = {
    "qk_rmsnorm_fwd": "kernel_align::qk_rmsnorm_forward(",
    "qk_rmsnorm_bwd": "kernel_align::qk_rmsnorm_backward(",
    "multi_axis_rope_fwd": "kernel_align::multi_axis_rope_forward(",
    "multi_axis_rope_bwd": "kernel_align::multi_axis_rope_backward(",
    "qk_norm_rope_fwd": "kernel_align::qk_norm_rope_forward(",
    "qk_norm_rope_bwd": "kernel_align::qk_norm_rope_backward(",
}
DTYPES = ("fp32", "bf16", "fp16")
DEFAULT_BENCH = "build/bench/bench/kernel_align_bench"


def per_function(callgrind_file, functions):
    """{function: (calls, inclusive instructions)} for the named functions (prefixes of
    callgrind's function names), from a callgrind output file: a function's inclusive
    cost is its own cost lines plus the cost line after each of its `calls=` lines, and
    its call count sums the `calls=` lines that name it as the callee."""
    names = {}
    result = {f: [0, 0] for f in functions}

    def match(name):
        return next((f for f in functions if name.startswith(f)), None)

    current = None      # the function whose cost lines follow
    callee = None       # the callee of the next calls= line
    with open(callgrind_file, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            m = re.match(r"^(c?)fn=\((\d+)\)(?: (.*))?$", line)
            if m:
                if m.group(3):
                    names[m.group(2)] = m.group(3)
                name = match(names.get(m.group(2), ""))
                if m.group(1):
                    callee = name
                else:
                    current, callee = name, None
                continue
            if line.startswith("calls="):
                if callee is not None:
                    result[callee][0] += int(line.split()[0].split("=")[1])
                callee = None
                continue
            if not line or not (line[0].isdigit() or line[0] in "+-*"):
                continue
            if current is not None:
                result[current][1] += int(line.split()[-1])
    return {f: tuple(v) for f, v in result.items()}


def count_dtype(bench, ops, dtype, shape, path):
    """Every op of one dtype in one valgrind run (the inputs are built once)."""
    cases = f"^({'|'.join(ops)})/{dtype}/{shape}/{path}/threads:1/"
    functions = [OPS[op] for op in ops]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}",
               *(f"--toggle-collect={f}*" for f in functions), bench,
               f"--benchmark_filter={cases}", "--benchmark_min_time=0.01",
               "--benchmark_format=json"]
        env = dict(os.environ, KERNEL_ALIGN_BENCH_NO_COPY_BASELINE="1")
        run = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
        if run.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{run.stderr[-2000:]}")
        benchmarks = {b["name"].split("/")[0]: b for b in json.loads(run.stdout)["benchmarks"]}
        counts = per_function(out, functions)
    rows = []
    for op in ops:
        if op not in benchmarks:
            raise RuntimeError(f"no benchmark matches {op}/{dtype}/{shape}/{path}")
        calls, instructions = counts[OPS[op]]
        if calls == 0:
            raise RuntimeError(f"callgrind recorded no call of {OPS[op]}")
        per_call = instructions / calls
        rows.append({"op": op, "dtype": dtype, "shape": shape, "path": path, "calls": calls,
                     "instructions_per_call": per_call, "bytes": benchmarks[op]["bytes"],
                     "instructions_per_byte": per_call / benchmarks[op]["bytes"]})
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--bench", default=DEFAULT_BENCH, help=f"binary (default {DEFAULT_BENCH})")
    parser.add_argument("--shape", default="t2i_1024x1024", help="bench shape name")
    parser.add_argument("--path", default="cpu-avx2",
                        help="bench path: cpu-portable, cpu-avx2, cpu-avx512 (default cpu-avx2)")
    parser.add_argument("--ops", nargs="+", default=list(OPS), choices=list(OPS))
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    parser.add_argument("--json", help="write every count here")
    args = parser.parse_args()
    if not os.access(args.bench, os.X_OK):
        sys.exit(f"count_instructions.py: no bench binary at {args.bench} "
                 "(cmake --build build/bench --target kernel_align_bench)")

    rows = []
    for i, dtype in enumerate(args.dtypes):
        print(f"[{i + 1}/{len(args.dtypes)}] {dtype}: {len(args.ops)} ops under callgrind ...",
              file=sys.stderr, flush=True)
        rows += count_dtype(args.bench, args.ops, dtype, args.shape, args.path)

    print(f"\nInstructions per byte of counted traffic ({args.path}, {args.shape}, 1 thread; "
          "millions per call in brackets)\n")
    print("| op | " + " | ".join(args.dtypes) + " |")
    print("|---|" + "---:|" * len(args.dtypes))
    for op in args.ops:
        cells = [f"{r['instructions_per_byte']:.3f} ({r['instructions_per_call'] / 1e6:.0f})"
                 for d in args.dtypes for r in rows if r["op"] == op and r["dtype"] == d]
        print(f"| {op} | " + " | ".join(cells) + " |")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
