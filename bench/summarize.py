#!/usr/bin/env python3
"""Summarise kernel_align_bench JSON output as markdown tables.

    bench/summarize.py results.json [more.json ...] [--targets]

Case names are <op>/<dtype>/<shape>/<path>/threads:<n>[/real_time]. With repetitions
the median aggregate is used; several plain runs of one case (several files, or
repetitions without aggregates) are reduced to their median here.

cpu/real is the calling thread's CPU time over wall time: at 1 thread, well under 1.0
means the case shared its core with other processes (a noisy measurement).

Tables: every case (median GB/s, ratio to the same-run memcpy and non-temporal copy);
the fused speed-up (qk_norm_rope over the unfused qk_rmsnorm + multi_axis_rope
pipeline on q and k, same path, dtype, shape, threads). With --targets, each row says
whether it meets the issue's target.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field

OP_ORDER = [
    "copy_memcpy",
    "copy_nt_copy",
    "qk_rmsnorm_fwd",
    "qk_rmsnorm_bwd",
    "multi_axis_rope_fwd",
    "multi_axis_rope_bwd",
    "qk_norm_rope_fwd",
    "unfused_norm_rope_fwd",
    "qk_norm_rope_bwd",
    "unfused_norm_rope_bwd",
]
DTYPE_ORDER = ["fp32", "bf16", "fp16"]
SHAPE_ORDER = ["t2i_1024x1024", "t2i_1328x1328", "t2i_1664x928", "edit_1024x1024+ref1024x1024"]
PATH_ORDER = ["copy", "reference", "api-default", "cpu-portable", "cpu-avx2", "cpu-avx512"]

# The issues' targets (never lowered here: a row that misses one says so). Ratio to the
# same-run memcpy: issue 3's for every dtype (1 thread 1.0, more threads 0.9) and issue
# 13's for fp32 (0.9 at every thread count). Fused over unfused by direction, issue 13's:
# forward 1.7x, backward 1.5x (90% of the 5/3 traffic ratio derived in
# docs/performance.md).
TARGET_RATIO_1_THREAD = 1.00
TARGET_RATIO_ALL_THREADS = 0.90
TARGET_RATIO_FP32 = 0.90
TARGET_FUSED_SPEEDUP = {"fwd": 1.7, "bwd": 1.5}


@dataclass
class Case:
    op: str
    dtype: str
    shape: str
    path: str
    threads: int
    gbps: list[float] = field(default_factory=list)
    ratio: list[float] = field(default_factory=list)
    ratio_nt: list[float] = field(default_factory=list)
    copy_gbps: list[float] = field(default_factory=list)
    ms: list[float] = field(default_factory=list)
    cpu_share: list[float] = field(default_factory=list)  # cpu_time / real_time
    error: str | None = None

    @property
    def key(self):
        return (self.op, self.dtype, self.shape, self.path, self.threads)

    def med(self, name):
        values = getattr(self, name)
        return statistics.median(values) if values else float("nan")


def parse_name(run_name: str):
    parts = run_name.split("/")
    if parts and parts[-1] == "real_time":
        parts = parts[:-1]
    if len(parts) != 5 or not parts[4].startswith("threads:"):
        return None
    return parts[0], parts[1], parts[2], parts[3], int(parts[4].split(":", 1)[1])


def _to_ms(value, unit):
    return value * {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[unit]


def load(paths) -> tuple[dict, dict]:
    """Cases by key, and the context of the first file."""
    cases: dict = {}
    context: dict = {}
    for path in paths:
        with open(path) as f:
            data = json.load(f)
        if not context:
            context = data.get("context", {})
        # Prefer medians; fall back to plain iterations when no aggregates are present.
        benches = data.get("benchmarks", [])
        have_median = {b.get("run_name") for b in benches if b.get("aggregate_name") == "median"}
        for b in benches:
            run_name = b.get("run_name", b["name"])
            if b.get("run_type") == "aggregate":
                if b.get("aggregate_name") != "median":
                    continue
            elif run_name in have_median:
                continue
            parsed = parse_name(run_name)
            if parsed is None:
                continue
            case = cases.setdefault(parsed, Case(*parsed))
            if b.get("error_occurred"):
                case.error = b.get("error_message", "error")
                continue
            case.gbps.append(b.get("GBps", float("nan")))
            case.ratio.append(b.get("ratio_to_copy", float("nan")))
            case.ratio_nt.append(b.get("ratio_to_nt_copy", float("nan")))
            case.copy_gbps.append(b.get("copy_GBps", float("nan")))
            case.ms.append(_to_ms(b["real_time"], b.get("time_unit", "ns")))
            if b.get("real_time"):
                case.cpu_share.append(b.get("cpu_time", 0.0) / b["real_time"])
    return cases, context


def order(case_or_key):
    op, dtype, shape, path, threads = (
        case_or_key.key if isinstance(case_or_key, Case) else case_or_key
    )

    def idx(seq, v):
        return seq.index(v) if v in seq else len(seq)

    return (idx(SHAPE_ORDER, shape), idx(DTYPE_ORDER, dtype), idx(OP_ORDER, op),
            idx(PATH_ORDER, path), threads)


def fmt(v, spec=".2f"):
    return "n/a" if v != v else format(v, spec)  # NaN check


def ratio_targets(dtype, threads):
    """(issue, ratio to memcpy) pairs a row is judged against."""
    targets = [("issue 3", TARGET_RATIO_1_THREAD if threads == 1 else TARGET_RATIO_ALL_THREADS)]
    if dtype == "fp32":
        targets.append(("issue 13", TARGET_RATIO_FP32))
    return targets


def case_table(cases, targets: bool) -> str:
    head = "| op | dtype | shape | path | threads | ms | GB/s | copy GB/s | ratio to copy | ratio to NT copy | cpu/real |"
    sep = "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|"
    if targets:
        head += " target |"
        sep += "---|"
    lines = [head, sep]
    for c in sorted(cases.values(), key=order):
        if c.error:
            lines.append(f"| {c.op} | {c.dtype} | {c.shape} | {c.path} | {c.threads} | "
                         f"error: {c.error} |" + " |" * (6 + targets))
            continue
        row = (f"| {c.op} | {c.dtype} | {c.shape} | {c.path} | {c.threads} | {fmt(c.med('ms'))} | "
               f"{fmt(c.med('gbps'))} | {fmt(c.med('copy_gbps'))} | {fmt(c.med('ratio'))} | "
               f"{fmt(c.med('ratio_nt'))} | {fmt(c.med('cpu_share'))} |")
        if targets:
            if c.op.startswith("copy_") or c.path in ("reference", "api-default"):
                row += " - |"
            else:
                ratio = c.med("ratio")
                row += " " + "; ".join(
                    f"{issue}: {'met' if ratio >= t else 'NOT met'} (>= {t:.2f})"
                    for issue, t in ratio_targets(c.dtype, c.threads)) + " |"
        lines.append(row)
    return "\n".join(lines)


def fused_table(cases, targets: bool) -> str:
    head = "| direction | dtype | shape | path | threads | fused ms | unfused ms | fused speed-up |"
    sep = "|---|---|---|---|---:|---:|---:|---:|"
    if targets:
        head += " target |"
        sep += "---|"
    lines = [head, sep]
    rows = []
    for c in cases.values():
        for direction in ("fwd", "bwd"):
            if c.op != f"qk_norm_rope_{direction}" or c.error:
                continue
            u = cases.get((f"unfused_norm_rope_{direction}", c.dtype, c.shape, c.path, c.threads))
            if u is None or u.error:
                continue
            speedup = u.med("ms") / c.med("ms")
            rows.append((order(c), direction, c, u, speedup))
    for _, direction, c, u, speedup in sorted(rows, key=lambda r: (r[1], r[0])):
        row = (f"| {direction} | {c.dtype} | {c.shape} | {c.path} | {c.threads} | "
               f"{fmt(c.med('ms'))} | {fmt(u.med('ms'))} | {fmt(speedup)}x |")
        if targets:
            if c.path in ("reference", "api-default"):
                row += " - |"
            else:
                target = TARGET_FUSED_SPEEDUP[direction]
                row += f" {'met' if speedup >= target else 'NOT met'} (>= {target}x) |"
        lines.append(row)
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="+", help="kernel_align_bench --benchmark_out JSON file(s)")
    ap.add_argument("--targets", action="store_true", help="add a column judging the issue's targets")
    args = ap.parse_args(argv)
    cases, context = load(args.json)
    if not cases:
        print("summarize: no kernel_align_bench cases in the input", file=sys.stderr)
        return 1
    info = {k: context.get(k) for k in ("date", "host_name", "num_cpus", "mhz_per_cpu",
                                         "kernel_align.best_isa", "GLIBC_TUNABLES")}
    print("Context: " + ", ".join(f"{k}={v}" for k, v in info.items() if v not in (None, "")))
    print()
    print("### Bandwidth (median)")
    print()
    print(case_table(cases, args.targets))
    fused = fused_table(cases, args.targets)
    if fused.count("\n") > 1:
        print()
        print("### Fused qk_norm_rope vs unfused qk_rmsnorm + multi_axis_rope (q and k)")
        print()
        print(fused)
    return 0


if __name__ == "__main__":
    sys.exit(main())
