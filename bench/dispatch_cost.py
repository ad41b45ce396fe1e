#!/usr/bin/env python3
"""What one call costs besides its kernel, warm and cold: Python, torch's dispatcher,
our binding and the output allocation, on a tensor too small for the kernel to matter.

    .venv/bin/python bench/dispatch_cost.py [--calls N] [--flush-mib M] [--json FILE]

"cold" calls each follow a write over a --flush-mib buffer (default 64 MiB, twice this
machine's L3), which evicts the caches and TLBs as one of our kernels does at the
benchmark shapes (25-90 MB streamed per call): the per-call cost that
compare_torch.py's "paired" binding overhead sees. Each row's call is timed from Python
with time.perf_counter; "warm" calls follow calls of themselves, cold ones are interleaved
case by case so that a slow spell of the machine hits them alike. Medians in
microseconds. Rows:

  python call            a Python lambda returning None (the timing's floor)
  torch x.add_(0)        one of torch's own in-place ops, for scale
  torch empty_like(x)    one of torch's own allocating ops
  rope_ (in place)       torch.ops.kernel_align.multi_axis_rope_: dispatcher, binding, C++
                         API, no allocation, no autograd kernel (in-place ops have none)
  rope                   torch.ops.kernel_align.multi_axis_rope: + output allocation and
                         the Autograd key's kernel (csrc/autograd.cpp)
  rope below autograd    the same under torch._C._AutoDispatchBelowAutograd: without the
                         Autograd kernel (the guard's own cost included)
  qk_rmsnorm             torch.ops.kernel_align.qk_rmsnorm with a weight
  ka.multi_axis_rope     the Python API, which adds its device check
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import kernel_align as ka


def cases():
    ops = torch.ops.kernel_align
    x = torch.randn(1, 1, 24, 128).to(torch.bfloat16)
    w = torch.randn(128).to(torch.bfloat16)
    cos, sin = ka.rope_tables(ka.qwen_image_rope_positions([(1, 1, 1)], 0))

    def rope_below_autograd():
        with torch._C._AutoDispatchBelowAutograd():
            return ops.multi_axis_rope(x, cos, sin, "interleaved", "bshd")

    return {
        "python call": lambda: None,
        "torch x.add_(0)": lambda: x.add_(0),
        "torch empty_like(x)": lambda: torch.empty_like(x),
        "rope_ (in place)": lambda: ops.multi_axis_rope_(x, cos, sin, "interleaved", "bshd"),
        "rope": lambda: ops.multi_axis_rope(x, cos, sin, "interleaved", "bshd"),
        "rope below autograd": rope_below_autograd,
        "qk_rmsnorm": lambda: ops.qk_rmsnorm(x, w, 1e-6, "single", None),
        "ka.multi_axis_rope": lambda: ka.multi_axis_rope(x, cos, sin),
    }


def measure(calls, flush_mib):
    torch.set_num_threads(1)
    ka.set_num_threads(1)
    flush = torch.zeros(flush_mib << 20, dtype=torch.uint8)
    table = cases()
    result = {name: {} for name in table}
    for name, fn in table.items():  # warm: each call right after calls of itself
        for _ in range(5):
            fn()
        result[name]["warm"] = statistics.median(timed(fn) for _ in range(calls))
    cold = {name: [] for name in table}
    for i in range(calls):  # cold: interleaved, each call after an eviction
        for name, fn in table.items():
            flush.add_(1)
            cold[name].append(timed(fn))
        if (i + 1) % max(1, calls // 4) == 0:
            print(f"dispatch_cost: {i + 1}/{calls} cold rounds", flush=True)
    for name, times in cold.items():
        result[name]["cold"] = statistics.median(times)
    return result


def timed(fn):
    """fn's wall time in microseconds."""
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--calls", type=int, default=100, help="timed calls per row and state")
    parser.add_argument("--flush-mib", type=int, default=64, help="eviction buffer (MiB)")
    parser.add_argument("--json", help="write the medians here")
    args = parser.parse_args()
    result = measure(args.calls, args.flush_mib)
    print(f"\nMedian call time from Python, us ({args.calls} calls per cell; cold: after a "
          f"{args.flush_mib} MiB write)\n")
    print("| call | warm | cold |")
    print("|---|---:|---:|")
    for name, row in result.items():
        print(f"| {name} | {row['warm']:.1f} | {row['cold']:.1f} |")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"calls": args.calls, "flush_mib": args.flush_mib, "median_us": result}, f,
                      indent=1)


if __name__ == "__main__":
    main()
