#!/usr/bin/env python3
"""kernel-align vs PyTorch (eager and torch.compile) on CPU, at the benchmark shapes.

    .venv/bin/python bench/compare_torch.py [--shapes ...] [--dtypes ...] [--threads ...]
        [--ops ...] [--no-compile] [--compile-shapes ...] [--ours-json FILE] [--json F] [--csv F]

PyTorch side (the seed's eager formulas, diffusers' weighted RMSNorm):
  qk_rmsnorm:      xf = x.float(); rstd = rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps);
                   y = (xf * rstd).to(w.dtype) * w
  multi_axis_rope: x1, x2 = x.float().chunk(2, -1);
                   y = cat(x1*cos - x2*sin, x2*cos + x1*sin).to(dtype); cos/sin [S, 1, 64] fp32
  qk_norm_rope:    per stream q, k: cat(norm(x[:, :T], w_text), norm(x[:, T:], w_image)) -> rope
  backward:        torch.autograd.grad on a graph built once (retain_graph), w.r.t. x (and
                   the weights); only the backward is timed.
Each is timed eagerly and compiled (torch.compile, inductor CPU, dynamic=False, recompiled
per thread count), under two allocator settings, each in its own child process (this script
re-executes itself): glibc defaults, and GLIBC_TUNABLES=glibc.malloc.mmap_max=0 (large
tensors come from the heap instead of fresh page-faulting mmaps).

kernel-align side: the Google Benchmark binary (bench/kernel_align_bench) is run with a
filter for the same ops, dtypes, shapes and thread counts on the best CPU path, or its JSON
is read from --ours-json. Note: our RoPE cases use diffusers' interleaved pairs (the torch
formula above is rotate-half); both move the same bytes with the same flops.

Ratios printed are torch time / our time (> 1: ours is faster).
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import summarize  # noqa: E402

HEADS, HEAD_DIM, TEXT_LEN, EPS = 24, 128, 256, 1e-6
SHAPES = {  # name -> images as (width_px, height_px)
    "t2i_1024x1024": [(1024, 1024)],
    "t2i_1328x1328": [(1328, 1328)],
    "t2i_1664x928": [(1664, 928)],
    "edit_1024x1024+ref1024x1024": [(1024, 1024), (1024, 1024)],
}
DTYPES = ["fp32", "bf16", "fp16"]
OPS = ["qk_rmsnorm_fwd", "qk_rmsnorm_bwd", "multi_axis_rope_fwd", "multi_axis_rope_bwd",
       "qk_norm_rope_fwd", "qk_norm_rope_bwd"]
ALLOCATORS = {"default": None, "tuned": "glibc.malloc.mmap_max=0"}
# The targets: ours vs eager torch with the tuned allocator, and vs torch.compile.
TARGET_EAGER = {"bf16": 5.0, "fp32": 2.5}
TARGET_COMPILE = 1.2


# ---------------------------------------------------------------------------------------
# PyTorch side (child process)

def positions(images):
    """diffusers' Qwen-Image positions [S, 3]: text (m+j on all axes), then images."""
    import torch
    grids = [(h // 16, w // 16) for (w, h) in images]
    m = max(max(h // 2, w // 2) for h, w in grids)
    rows = [torch.arange(TEXT_LEN).unsqueeze(1).repeat(1, 3) + m]
    for k, (h, w) in enumerate(grids):
        hh = torch.arange(h) - (h + 1) // 2
        ww = torch.arange(w) - (w + 1) // 2
        f = torch.full((h, w), k)
        rows.append(torch.stack([f, hh[:, None].expand(h, w), ww[None, :].expand(h, w)], -1)
                    .reshape(-1, 3))
    return torch.cat(rows).to(torch.int64)


def tables(pos):
    import torch
    cols = []
    for a, dim in enumerate((16, 56, 56)):
        inv = 1.0 / (10000.0 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        cols.append(pos[:, a:a + 1].float() * inv)
    ang = torch.cat(cols, 1)  # [S, 64]
    return ang.cos()[:, None, :].contiguous(), ang.sin()[:, None, :].contiguous()


def rms(x, w):
    import torch
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
    return (xf * rstd).to(w.dtype) * w


def rope(x, cos, sin):
    import torch
    x1, x2 = x.float().chunk(2, -1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), -1).to(x.dtype)


def norm_rope(q, k, wtq, wtk, wiq, wik, cos, sin):
    import torch

    def one(x, wt, wi):
        y = torch.cat((rms(x[:, :TEXT_LEN], wt), rms(x[:, TEXT_LEN:], wi)), 1)
        return rope(y, cos, sin)

    return one(q, wtq, wiq), one(k, wtk, wik)


def time_ms(fn, min_reps=3, max_reps=25, budget_s=1.0):
    fn()  # warm-up (and, compiled, the compile)
    samples = []
    t_start = time.perf_counter()
    while len(samples) < min_reps or (len(samples) < max_reps
                                      and time.perf_counter() - t_start < budget_s):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def make_case(op, x, k, ws, cos, sin, dy, dk, fn_norm, fn_rope, fn_nr):
    """A callable timing one op; backward cases build their graph once."""
    import torch
    if op == "qk_rmsnorm_fwd":
        return lambda: fn_norm(x, ws[2])
    if op == "multi_axis_rope_fwd":
        return lambda: fn_rope(x, cos, sin)
    if op == "qk_norm_rope_fwd":
        return lambda: fn_nr(x, k, *ws, cos, sin)
    if op == "qk_rmsnorm_bwd":
        xr, wr = x.detach().requires_grad_(), ws[2].detach().requires_grad_()
        y = fn_norm(xr, wr)
        return lambda: torch.autograd.grad(y, (xr, wr), dy, retain_graph=True)
    if op == "multi_axis_rope_bwd":
        xr = x.detach().requires_grad_()
        y = fn_rope(xr, cos, sin)
        return lambda: torch.autograd.grad(y, (xr,), dy, retain_graph=True)
    if op == "qk_norm_rope_bwd":
        qr, kr = x.detach().requires_grad_(), k.detach().requires_grad_()
        wr = [w.detach().requires_grad_() for w in ws]
        yq, yk = fn_nr(qr, kr, *wr, cos, sin)
        return lambda: torch.autograd.grad((yq, yk), (qr, kr, *wr), (dy, dk), retain_graph=True)
    raise ValueError(op)


def child(args) -> int:
    import torch
    torch.manual_seed(0)
    tdt = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    results = []
    compile_shapes = set(args.compile_shapes or args.shapes)
    for shape in args.shapes:
        pos = positions(SHAPES[shape])
        cos, sin = tables(pos)
        seq = pos.shape[0]
        for dname in args.dtypes:
            dt = tdt[dname]
            x = torch.empty(1, seq, HEADS, HEAD_DIM).uniform_(-2, 2).to(dt)
            k = torch.empty(1, seq, HEADS, HEAD_DIM).uniform_(-2, 2).to(dt)
            dy = torch.empty(1, seq, HEADS, HEAD_DIM).uniform_(-2, 2).to(dt)
            dk = torch.empty(1, seq, HEADS, HEAD_DIM).uniform_(-2, 2).to(dt)
            ws = [torch.empty(HEAD_DIM).uniform_(0.5, 1.5).to(dt) for _ in range(4)]
            for threads in args.threads:
                torch.set_num_threads(threads)
                impls = [("eager", rms, rope, norm_rope)]
                if not args.no_compile and shape in compile_shapes:
                    torch._dynamo.reset()  # inductor bakes the thread count into its code
                    impls.append(("compile", torch.compile(rms, dynamic=False),
                                  torch.compile(rope, dynamic=False),
                                  torch.compile(norm_rope, dynamic=False)))
                for impl, fn_norm, fn_rope, fn_nr in impls:
                    for op in args.ops:
                        try:
                            t0 = time.perf_counter()
                            case = make_case(op, x, k, ws, cos, sin, dy, dk, fn_norm, fn_rope,
                                             fn_nr)
                            ms = time_ms(case)
                            setup = time.perf_counter() - t0
                        except Exception as e:  # report, keep going
                            print(f"compare_torch: {impl} {op} {dname} {shape} t={threads}: {e}",
                                  file=sys.stderr)
                            continue
                        del case
                        results.append(dict(op=op, dtype=dname, shape=shape, threads=threads,
                                            impl=impl, allocator=args.allocator, ms=ms))
                        with open(args.child_out + ".partial", "a") as f:
                            f.write(json.dumps(results[-1]) + "\n")
                        print(f"  [{args.allocator}] {impl:7s} {op:20s} {dname} {shape:28s} "
                              f"t={threads}: {ms:8.2f} ms (setup+timing {setup:.1f} s)",
                              file=sys.stderr, flush=True)
            del x, k, dy, dk, ws
    with open(args.child_out, "w") as f:
        json.dump(dict(torch=torch.__version__, glibc_tunables=os.environ.get("GLIBC_TUNABLES", ""),
                       results=results), f)
    return 0


# ---------------------------------------------------------------------------------------
# Our side

def run_ours(args) -> str:
    bench = Path(args.bench)
    if not bench.exists():
        sys.exit(f"compare_torch: no benchmark binary at {bench} (build target kernel_align_bench) "
                 "or pass --ours-json")
    path_re = args.path if args.path else "cpu-[a-z0-9]+"
    filt = (f"^({'|'.join(args.ops)})/({'|'.join(args.dtypes)})/"
            f"({'|'.join(re.escape(s) for s in args.shapes)})/({path_re})/"
            f"threads:({'|'.join(str(t) for t in args.threads)})/")
    out = tempfile.NamedTemporaryFile(prefix="ka-ours-", suffix=".json", delete=False).name
    cmd = [str(bench), f"--benchmark_filter={filt}", f"--benchmark_repetitions={args.reps}",
           "--benchmark_report_aggregates_only=true", f"--benchmark_min_time={args.min_time}",
           f"--benchmark_out={out}", "--benchmark_out_format=json"]
    print("compare_torch: " + " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, stdout=sys.stderr)
    return out


def best_path(cases, context):
    """cpu-<best_isa> when present, else the highest CPU path measured."""
    best = context.get("kernel_align.best_isa")
    present = {c.path for c in cases.values()}
    if best and f"cpu-{best}" in present:
        return f"cpu-{best}"
    for p in reversed(summarize.PATH_ORDER):
        if p in present:
            return p
    return None


# ---------------------------------------------------------------------------------------

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--dtypes", nargs="+", default=DTYPES, choices=DTYPES)
    ap.add_argument("--threads", nargs="+", type=int, default=sorted({1, os.cpu_count() or 1}))
    ap.add_argument("--ops", nargs="+", default=OPS, choices=OPS)
    ap.add_argument("--allocators", nargs="+", default=list(ALLOCATORS), choices=list(ALLOCATORS))
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--compile-shapes", nargs="+", choices=list(SHAPES),
                    help="shapes to compile (default: all of --shapes); compiling is slow")
    ap.add_argument("--compile-allocators", nargs="+", default=["tuned"], choices=list(ALLOCATORS),
                    help="allocator settings under which torch.compile is timed (default: tuned)")
    ap.add_argument("--ours-json", nargs="+", help="kernel_align_bench JSON instead of running it")
    ap.add_argument("--bench", default=str(ROOT / "build/bench/bench/kernel_align_bench"))
    ap.add_argument("--path", help="our path to compare (default: cpu-<best_isa>)")
    ap.add_argument("--reps", type=int, default=3, help="our repetitions (median)")
    ap.add_argument("--min-time", default="0.3")
    ap.add_argument("--torch-json", nargs="+", help="reuse child JSON files instead of timing torch")
    ap.add_argument("--save-torch", help="keep the torch timings (JSON) here")
    ap.add_argument("--json", help="write the comparison rows as JSON")
    ap.add_argument("--csv", help="write the comparison rows as CSV")
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    ap.add_argument("--allocator", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.child_out:
        return child(args)

    # Torch timings, one child per allocator setting.
    torch_rows = []
    if args.torch_json:
        for p in args.torch_json:
            with open(p) as f:
                torch_rows += json.load(f)["results"]
    else:
        for alloc in args.allocators:
            env = dict(os.environ)
            env.pop("GLIBC_TUNABLES", None)
            if ALLOCATORS[alloc]:
                env["GLIBC_TUNABLES"] = ALLOCATORS[alloc]
            out = tempfile.NamedTemporaryFile(prefix=f"ka-torch-{alloc}-", suffix=".json",
                                              delete=False).name
            cmd = [sys.executable, str(Path(__file__).resolve()), "--child-out", out,
                   "--allocator", alloc, "--shapes", *args.shapes, "--dtypes", *args.dtypes,
                   "--threads", *map(str, args.threads), "--ops", *args.ops]
            if args.no_compile or alloc not in args.compile_allocators:
                cmd.append("--no-compile")
            elif args.compile_shapes:
                cmd += ["--compile-shapes", *args.compile_shapes]
            print(f"compare_torch: timing torch, allocator {alloc} "
                  f"(GLIBC_TUNABLES={env.get('GLIBC_TUNABLES', '')!r})", file=sys.stderr, flush=True)
            subprocess.run(cmd, check=True, env=env)
            with open(out) as f:
                torch_rows += json.load(f)["results"]
        if args.save_torch:
            with open(args.save_torch, "w") as f:
                json.dump(dict(results=torch_rows), f)

    # Our timings.
    ours_files = args.ours_json or [run_ours(args)]
    cases, context = summarize.load(ours_files)
    path = args.path or best_path(cases, context)

    def prefer(a, b):
        return a if a == a else b  # a unless NaN

    t = {}
    for r in torch_rows:
        t[(r["op"], r["dtype"], r["shape"], r["threads"], r["impl"], r["allocator"])] = r["ms"]

    rows = []
    for shape in args.shapes:
        for dtype in args.dtypes:
            for op in args.ops:
                for threads in args.threads:
                    c = cases.get((op, dtype, shape, path, threads))
                    ours = c.med("ms") if c and not c.error else float("nan")
                    get = lambda impl, alloc: t.get((op, dtype, shape, threads, impl, alloc),
                                                    float("nan"))
                    row = dict(op=op, dtype=dtype, shape=shape, threads=threads, path=path,
                               ours_ms=ours,
                               eager_default_ms=get("eager", "default"),
                               eager_tuned_ms=get("eager", "tuned"),
                               compile_ms=prefer(get("compile", "tuned"),
                                                 get("compile", "default")))
                    row["eager_default_over_ours"] = row["eager_default_ms"] / ours
                    row["eager_tuned_over_ours"] = row["eager_tuned_ms"] / ours
                    row["compile_over_ours"] = row["compile_ms"] / ours
                    rows.append(row)

    f = summarize.fmt
    print(f"kernel-align path: {path}; torch ratios are torch time / our time (> 1: ours faster).")
    print("Targets: vs eager (tuned allocator) >= 5x bf16, >= 2.5x fp32; vs torch.compile >= 1.2x.")
    print()
    print("| op | dtype | shape | threads | ours ms | eager ms (default alloc) | eager ms (tuned) "
          "| compile ms | eager/ours (default) | eager/ours (tuned) | compile/ours | targets |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        verdicts = []
        te = TARGET_EAGER.get(r["dtype"])
        if te is not None and r["eager_tuned_over_ours"] == r["eager_tuned_over_ours"]:
            verdicts.append(f"eager {'met' if r['eager_tuned_over_ours'] >= te else 'NOT met'} (>= {te}x)")
        if r["compile_over_ours"] == r["compile_over_ours"]:
            verdicts.append(f"compile {'met' if r['compile_over_ours'] >= TARGET_COMPILE else 'NOT met'}"
                            f" (>= {TARGET_COMPILE}x)")
        print(f"| {r['op']} | {r['dtype']} | {r['shape']} | {r['threads']} | {f(r['ours_ms'])} | "
              f"{f(r['eager_default_ms'])} | {f(r['eager_tuned_ms'])} | {f(r['compile_ms'])} | "
              f"{f(r['eager_default_over_ours'])} | {f(r['eager_tuned_over_ours'])} | "
              f"{f(r['compile_over_ours'])} | {'; '.join(verdicts) or '-'} |")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(path=path, context=context, rows=rows), fh, indent=1)
    if args.csv:
        with open(args.csv, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else ["op"])
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
