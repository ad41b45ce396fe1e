#!/usr/bin/env python3
"""kernel-align's CUDA ops at the issue's shapes against the device's own copy speed and
the peers that are installed (scripts/gpu_check.sh runs it on a lent GPU).

    python3 bench/gpu_bench.py [--shapes 1024x1024,1328x1328,1664x928] [--dtypes bf16,fp32]
        [--reps 40] [--no-compile] [--json F] [--csv F] [--dry-run]

Per op, direction, dtype and shape (B=1, H=24, D=128, 256 text tokens, diffusers' layout):
  ours      torch.ops.kernel_align on CUDA tensors (backward: the *_backward ops)
  copy      a device-to-device copy of as many bytes as the op must move (each input read
            once, each output written once), timed in the same run: the ceiling
  eager     the same formulas in eager PyTorch (diffusers' RMSNorm with a weight; RoPE on
            interleaved pairs with fp32 cos/sin; the fused op as norm-then-rope per stream);
            backward by autograd
  compile   torch.compile of those formulas (Triton; dynamic=True: one compile per op and
            dtype for every shape)
  flashinfer, liger   their rmsnorm / rope where the package imports (else "absent")
Times are medians of --reps calls, each timed with CUDA events after the L2 cache is
flushed (a 256 MiB write), so every call reads its inputs from device memory. Printed:
time, effective bandwidth (minimal bytes / time), ours / copy bandwidth, and each peer's
time over ours (> 1: ours faster); then fused over unfused, forward and backward. The
targets (issue 12): every op >= 0.85 of copy; fused >= 1.7x unfused forward, >= 1.5x
backward; >= 1.2x torch.compile; faster than every peer present.

--dry-run: tiny shapes on the CPU with wall-clock timing, to check the script end to end
on a machine without a GPU (its numbers mean nothing).
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

import kernel_align as ka

HEADS, D, TEXT = 24, 128, 256
GRIDS = {"1024x1024": [(1, 64, 64)], "1328x1328": [(1, 83, 83)], "1664x928": [(1, 58, 104)]}
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
OPS = torch.ops.kernel_align
EPS = 1e-6


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default=",".join(GRIDS))
    p.add_argument("--dtypes", default="bf16,fp32")
    p.add_argument("--reps", type=int, default=40)
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--json")
    p.add_argument("--csv")
    p.add_argument("--dry-run", action="store_true")
    return p.parse_args()


class Timer:
    """Median time of fn() in microseconds, each call after an L2 flush."""

    def __init__(self, device, reps):
        self.device, self.reps = device, reps
        self.flush = torch.empty(64 << 20 if device == "cuda" else 1 << 10, dtype=torch.float32,
                                 device=device)

    def __call__(self, fn):
        for _ in range(3):
            fn()
        times = []
        for _ in range(self.reps):
            self.flush.zero_()
            if self.device == "cuda":
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                stop.record()
                stop.synchronize()
                times.append(start.elapsed_time(stop) * 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(times)


# ---- the formulas, for eager and torch.compile --------------------------------------

def norm_formula(x, w):
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
    return ((xf * rstd).to(w.dtype) * w).to(x.dtype)


def rope_formula(x, cos, sin):  # interleaved pairs; cos/sin [S, 1, D/2] fp32
    pairs = x.float().unflatten(-1, (-1, 2))
    a, b = pairs[..., 0], pairs[..., 1]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2).to(x.dtype)


def fused_formula(q, k, w, cos, sin):
    def stream(x, wt, wi):
        return rope_formula(torch.cat([norm_formula(x[:, :TEXT], wt), norm_formula(x[:, TEXT:], wi)], 1),
                            cos, sin)
    return stream(q, w[0], w[2]), stream(k, w[1], w[3])


# ---- one shape and dtype --------------------------------------------------------------

def bench_case(shape_name, dtype_name, device, timer, compile_ok, peers):
    dtype = DTYPES[dtype_name]
    positions = ka.qwen_image_rope_positions(GRIDS[shape_name], TEXT)
    cos, sin = (t.to(device) for t in ka.rope_tables(positions))
    seq = cos.shape[0]
    if device == "cpu":  # dry run: a few tokens
        seq = TEXT + 16
        cos, sin = cos[:seq], sin[:seq]
    g = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(1, seq, HEADS, D, device=device, generator=g).to(dtype)
    k = torch.randn(1, seq, HEADS, D, device=device, generator=g).to(dtype)
    dq, dk = torch.randn_like(q), torch.randn_like(k)
    w = [(1 + 0.1 * torch.randn(D, device=device, generator=g)).to(dtype) for _ in range(4)]
    cos3, sin3 = cos[:, None, :], sin[:, None, :]
    tensor_bytes = q.numel() * q.element_size()
    table_bytes = 2 * cos.numel() * 4
    args = (TEXT, EPS, "diffusers", "interleaved", "bshd")
    rows = []

    def ours_unfused_forward():
        for x, wt, wi in ((q, w[0], w[2]), (k, w[1], w[3])):
            n = torch.empty_like(x)
            n[:, :TEXT] = OPS.qk_rmsnorm(x[:, :TEXT], wt, EPS, "diffusers", None)
            n[:, TEXT:] = OPS.qk_rmsnorm(x[:, TEXT:], wi, EPS, "diffusers", None)
            OPS.multi_axis_rope_(n, cos, sin, "interleaved", "bshd")

    def ours_unfused_backward():
        for x, g_out, wt, wi in ((q, dq, w[0], w[2]), (k, dk, w[1], w[3])):
            g_in = OPS.multi_axis_rope_backward(g_out, cos, sin, "interleaved", "bshd")
            OPS.qk_rmsnorm_backward(x[:, :TEXT], g_in[:, :TEXT], wt, EPS, "diffusers", True)
            OPS.qk_rmsnorm_backward(x[:, TEXT:], g_in[:, TEXT:], wi, EPS, "diffusers", True)

    # (op, direction, ours, bytes moved, eager formula for the peers, inputs needing grad)
    cases = [
        ("qk_rmsnorm", "forward", lambda: OPS.qk_rmsnorm(q, w[2], EPS, "diffusers", None),
         2 * tensor_bytes, lambda x: norm_formula(x, w[2]), [q]),
        ("qk_rmsnorm", "backward", lambda: OPS.qk_rmsnorm_backward(q, dq, w[2], EPS, "diffusers", True),
         3 * tensor_bytes, lambda x: norm_formula(x, w[2]), [q]),
        ("multi_axis_rope", "forward", lambda: OPS.multi_axis_rope(q, cos, sin, "interleaved", "bshd"),
         2 * tensor_bytes + table_bytes, lambda x: rope_formula(x, cos3, sin3), [q]),
        ("multi_axis_rope", "backward",
         lambda: OPS.multi_axis_rope_backward(dq, cos, sin, "interleaved", "bshd"),
         2 * tensor_bytes + table_bytes, lambda x: rope_formula(x, cos3, sin3), [q]),
        ("qk_norm_rope", "forward", lambda: OPS.qk_norm_rope(q, k, *w, cos, sin, *args, None),
         4 * tensor_bytes + table_bytes, lambda x, y: fused_formula(x, y, w, cos3, sin3), [q, k]),
        ("qk_norm_rope", "backward",
         lambda: OPS.qk_norm_rope_backward(q, k, dq, dk, *w, cos, sin, *args, [True] * 4),
         6 * tensor_bytes + table_bytes, lambda x, y: fused_formula(x, y, w, cos3, sin3), [q, k]),
        ("unfused", "forward", ours_unfused_forward, 4 * tensor_bytes + table_bytes, None, None),
        ("unfused", "backward", ours_unfused_backward, 6 * tensor_bytes + table_bytes, None, None),
    ]
    copy_cache = {}
    compiled_cache = {}
    for op, direction, ours, moved, formula, grad_inputs in cases:
        row = {"op": op, "direction": direction, "dtype": dtype_name, "shape": shape_name,
               "tokens": seq, "bytes": moved}
        row["ours_us"] = timer(ours)
        if moved not in copy_cache:  # a copy reads and writes half the op's bytes each
            src = torch.empty(moved // 2, dtype=torch.uint8, device=device)
            dst = torch.empty_like(src)
            copy_cache[moved] = timer(lambda: dst.copy_(src))
        row["copy_us"] = copy_cache[moved]
        row["gbps"] = moved / row["ours_us"] / 1e3
        row["of_copy"] = row["copy_us"] / row["ours_us"]
        if formula is not None:
            def timed(fn):
                if direction == "forward":
                    return timer(lambda: fn(*grad_inputs))
                leaves = [x.detach().requires_grad_() for x in grad_inputs]
                outs = fn(*leaves)
                outs = outs if isinstance(outs, tuple) else (outs,)
                grads = [torch.randn_like(o) for o in outs]
                return timer(lambda: torch.autograd.grad(outs, leaves, grads, retain_graph=True))
            row["eager"] = timed(formula) / row["ours_us"]
            if compile_ok:
                key = (op, dtype_name)
                compiled_cache.setdefault(key, torch.compile(formula, dynamic=True))
                row["compile"] = timed(compiled_cache[key]) / row["ours_us"]
            for name, peer in peers.items():
                fn = peer(op, direction, q, k, w, cos, sin, dq)
                if fn is not None:
                    row[name] = timer(fn) / row["ours_us"]
        rows.append(row)
    return rows


# ---- peers that may be installed ------------------------------------------------------

def find_peers():
    """Name -> function(op, direction, tensors...) -> callable or None. Only what imports."""
    peers, absent = {}, []
    try:
        import flashinfer  # noqa: F401

        def flashinfer_case(op, direction, q, k, w, cos, sin, dq):
            if op == "qk_rmsnorm" and direction == "forward":
                x2 = q.reshape(-1, D)
                return lambda: flashinfer.norm.rmsnorm(x2, w[2], EPS)
            return None
        peers["flashinfer"] = flashinfer_case
    except Exception as e:  # noqa: BLE001
        absent.append(f"flashinfer ({type(e).__name__})")
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction

        def liger_case(op, direction, q, k, w, cos, sin, dq):
            if op == "qk_rmsnorm" and direction == "forward":
                return lambda: LigerRMSNormFunction.apply(q, w[2], EPS)
            return None
        peers["liger"] = liger_case
    except Exception as e:  # noqa: BLE001
        absent.append(f"liger-kernel ({type(e).__name__})")
    return peers, absent


def main():
    a = parse()
    # Compiled backwards are timed again and again on one graph (retain_graph=True), which
    # buffers donated to the backward forbid.
    import torch._functorch.config

    torch._functorch.config.donated_buffer = False
    device = "cpu" if a.dry_run else "cuda"
    if device == "cuda" and not (torch.cuda.is_available() and ka.HAS_CUDA):
        sys.exit("gpu_bench: needs a CUDA device and kernel_align built with CUDA (or --dry-run)")
    timer = Timer(device, 3 if a.dry_run else a.reps)
    peers, absent = find_peers()
    print(f"gpu_bench: {torch.cuda.get_device_name() if device == 'cuda' else 'cpu (dry run)'}, "
          f"torch {torch.__version__}; peers present: {', '.join(peers) or 'none'}; absent: "
          f"{', '.join(absent) or 'none'}", flush=True)
    rows = []
    for shape in a.shapes.split(","):
        for dtype in a.dtypes.split(","):
            t0 = time.time()
            rows += bench_case(shape, dtype, device, timer, not a.no_compile, peers)
            print(f"  {shape} {dtype}: {time.time() - t0:.0f} s", flush=True)
    peer_names = ["eager"] + ([] if a.no_compile else ["compile"]) + list(peers)
    header = (f"{'op':<16}{'dir':<9}{'dtype':<6}{'shape':<11}{'us':>9}{'GB/s':>8}{'of copy':>9}"
              + "".join(f"{n:>11}" for n in peer_names))
    print("\n" + header)
    for r in rows:
        print(f"{r['op']:<16}{r['direction']:<9}{r['dtype']:<6}{r['shape']:<11}{r['ours_us']:9.1f}"
              f"{r['gbps']:8.0f}{r['of_copy']:9.2f}"
              + "".join(f"{r[n]:11.2f}" if n in r else f"{'-':>11}" for n in peer_names))
    print("\nfused over unfused (unfused time / fused time; targets 1.7 forward, 1.5 backward)")
    for r in rows:
        if r["op"] != "qk_norm_rope":
            continue
        unfused = next(u for u in rows if u["op"] == "unfused" and u["direction"] == r["direction"]
                       and u["dtype"] == r["dtype"] and u["shape"] == r["shape"])
        r["fused_speedup"] = unfused["ours_us"] / r["ours_us"]
        print(f"  {r['direction']:<9}{r['dtype']:<6}{r['shape']:<11}{r['fused_speedup']:6.2f}")
    worst = min(r["of_copy"] for r in rows if r["op"] != "unfused")
    print(f"\nworst ours/copy bandwidth: {worst:.2f} (target 0.85)")
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            keys = sorted({key for r in rows for key in r})
            writer = csv.DictWriter(f, fieldnames=keys)
            writer.writeheader()
            writer.writerows(rows)
    return 0 if math.isfinite(worst) else 1


if __name__ == "__main__":
    sys.exit(main())
