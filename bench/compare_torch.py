#!/usr/bin/env python3
"""kernel-align vs PyTorch on CPU, at the benchmark shapes: the C++ benchmark, our ops
through torch, the seed's formulas (eager and torch.compile) and diffusers' own code.

    .venv/bin/python bench/compare_torch.py [--quick] [--shapes ...] [--dtypes ...]
        [--threads ...] [--ops ...] [--impls ...] [--no-compile] [--compile-shapes ...]
        [--ours-json FILE] [--torch-json FILE ...] [--save-torch F] [--json F] [--csv F]

Implementations timed in torch, per op, dtype, shape and thread count (torch's and
kernel-align's thread counts both set to it):
  ka         kernel_align.qk_rmsnorm / multi_axis_rope / qk_norm_rope, as a user calls
             them (norm mode "diffusers", interleaved pairs, bshd, tables from
             kernel_align.rope_tables); backward through their registered autograd formulas.
  ka_op      the raw torch.ops.kernel_align operators; backward calls the *_backward ops
             directly (no autograd): the torch call closest to the C++ benchmark's.
  ka_out     the same operators' out= variants (torch.ops.kernel_align.*_out) writing
             outputs allocated once: no allocation per call, as a training loop that
             reuses its buffers runs them.
  eager      the seed's formulas (diffusers' weighted RMSNorm, rotate-half RoPE):
               qk_rmsnorm:      xf = x.float(); rstd = rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps);
                                y = (xf * rstd).to(w.dtype) * w
               multi_axis_rope: x1, x2 = x.float().chunk(2, -1);
                                y = cat(x1*cos - x2*sin, x2*cos + x1*sin).to(dtype); cos/sin [S, 1, 64] fp32
               qk_norm_rope:    per stream q, k: cat(norm(x[:, :T], w_text), norm(x[:, T:], w_image)) -> rope
  compile    torch.compile of those formulas (inductor CPU, dynamic=False, recompiled per
             thread count).
  diffusers  what diffusers' QwenDoubleStreamAttnProcessor2_0 runs: its RMSNorm modules
             (weights in the tensors' dtype) and apply_rotary_emb_qwen(use_real=False) with
             QwenEmbedRope's complex frequencies. qk_rmsnorm / multi_axis_rope: one module,
             one RoPE over the joint sequence; qk_norm_rope: norm_added_q/k on the text
             stream and norm_q/k on the image stream, each a tensor of its own as the
             projections make them, then RoPE of each with txt_freqs / img_freqs. The
             [text, image] concatenation after it is left out: our processor concatenates
             once too (before the fused op), so it costs both the same.
Every backward (all but ka_op) is torch.autograd.grad on a graph built once (retain_graph)
w.r.t. the inputs and the weights; only the backward is timed. qk_rmsnorm uses the image-q
weight, as the C++ benchmark does.

Each allocator setting runs in its own child process (this script re-executes itself):
glibc defaults, and "tuned" (TUNED_GLIBC below): large tensors come from the heap instead
of fresh page-faulting mmaps each call, and the heap is not trimmed back to the OS when the
freed tensor is its top chunk (which would page-fault the next call's output again).
--allocators also takes default_no_thp (the defaults without our torch ops' huge-page
advice for their outputs) and torch_thp (torch's THP_MEM_ALLOC_ENABLE=1 instead of it).
torch.compile is timed under --compile-allocators only.

C++ side: the Google Benchmark binary (bench/kernel_align_bench) is run with a filter for
the same ops, dtypes, shapes and thread counts on the CPU path our torch ops ran on
(--path; every CPU path when no op of ours was timed), or its JSON is read from
--ours-json. Its loop allocates nothing, so the allocator does not matter to it.

Printed (all in --json / --csv, one row per op, dtype, shape, thread count):
  1. torch / C++ benchmark time, with the issue's targets (eager tuned, compile);
  2. same process and thread count: eager, compile, diffusers over ka (per allocator);
  3. out= and glibc's defaults: ka_out under the default allocator against the tuned
     heap (target >= 0.95x), ka against torch.compile under the defaults;
  4. binding overhead, flagged at >= 3%: ka and ka_op time / C++ benchmark time - 1, and
     the same paired call by call against the library's C++ call inside each torch call
     (kernel_align.last_call().call_seconds), which machine noise hits on both sides; for
     ka_op also against the backend alone inside it (backend_seconds), which charges
     the C++ call's own validation and choice (~10-20 us) to the binding too.
Ratios are the other time over ours (> 1: ours is faster). Our RoPE pairs are
interleaved (diffusers'), the seed formula's rotate-half: same bytes, same flops.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import summarize  # noqa: E402

EPS = 1e-6
# The shapes are the issue's, as `kernel-align shapes` prints them (src/cases/shapes.hpp,
# the list kernel_align_bench runs): the CLI of this checkout's release build by default.
DEFAULT_CLI = ROOT / "build/release/kernel-align"
DTYPES = ["fp32", "bf16", "fp16"]
OPS = ["qk_rmsnorm_fwd", "qk_rmsnorm_bwd", "multi_axis_rope_fwd", "multi_axis_rope_bwd",
       "qk_norm_rope_fwd", "qk_norm_rope_bwd"]
IMPLS = ["ka", "ka_op", "ka_out", "eager", "diffusers", "compile"]  # timed in this order
# Inductor's options per compiled implementation. By default inductor leaves out a cast
# to bf16/fp16 between two fused ops (the norm's (x * rstd).to(w.dtype)): it computes
# one rounding fewer than the formula. emulate_precision_casts keeps every cast, so
# "compile_casts" computes the formula's roundings, as eager, diffusers and we do.
COMPILE_OPTIONS = {"compile": {}, "compile_casts": {"emulate_precision_casts": True}}
TUNED_GLIBC = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967296"
# Each allocator setting is the environment of a child process (glibc and torch read these
# at start-up; the extension reads KERNEL_ALIGN_HUGE_PAGES once). "default" is what a user
# gets: glibc's defaults, our torch ops advising huge pages for their large CPU outputs
# (docs/python.md, "Speed in practice"); "default_no_thp" the same without that advice;
# "torch_thp" torch's own THP_MEM_ALLOC_ENABLE=1 (every large tensor advised) instead of
# ours; "tuned" the tuned heap. Timed by default: default and tuned.
ALLOCATORS = {
    "default": {},
    "tuned": {"GLIBC_TUNABLES": TUNED_GLIBC},
    "default_no_thp": {"KERNEL_ALIGN_HUGE_PAGES": "0"},
    "torch_thp": {"KERNEL_ALIGN_HUGE_PAGES": "0", "THP_MEM_ALLOC_ENABLE": "1"},
}
DEFAULT_ALLOCATORS = ["default", "tuned"]
# The issue's targets: ours vs eager torch with the tuned allocator, and vs torch.compile.
TARGET_EAGER = {"bf16": 5.0, "fp32": 2.5}
TARGET_COMPILE = 1.2
# Issue 36's: out= under glibc's defaults keeps >= 0.95x of its tuned-heap speed.
TARGET_OUT_DEFAULT_OVER_TUNED = 0.95
# Binding overhead (torch op time over the C++ call) from which a row is flagged.
OVERHEAD_FLAG_PCT = 3.0

# Timed calls per case after one warm-up: (min, max, seconds after which to stop once
# min is reached). Our ops are 10-50x faster than eager torch, so they get more samples
# for little time: their medians feed the few-percent binding-overhead estimate.
TIMING = {"torch": (3, 25, 1.0), "ka": (7, 60, 1.0)}
QUICK_TIMING = {"torch": (2, 2, 0.0), "ka": (3, 5, 0.2)}
# --quick: one small shape, one dtype, one thread, few repetitions (a smoke run).
QUICK_DEFAULTS = dict(shapes=["t2i_1024x1024"], dtypes=["bf16"], threads=[1], reps=1,
                      min_time="0.05")
FULL_DEFAULTS = dict(dtypes=DTYPES, threads=sorted({1, os.cpu_count() or 1}), reps=3,
                     min_time="0.3")  # shapes: all


@dataclass(frozen=True)
class Shape:
    """One of the issue's shapes: batch 1, `heads` heads of head_dim, text_len text tokens,
    then the images, each (height, width) in tokens."""
    name: str
    heads: int
    head_dim: int
    text_len: int
    grids: tuple


def issue_shapes(cli) -> dict:
    """name -> Shape, from `cli shapes` (the kernel-align executable)."""
    if not Path(cli).exists():
        sys.exit(f"compare_torch: no kernel-align executable at {cli} (build the release "
                 "preset, or pass --cli): it lists the shapes")
    listed = json.loads(subprocess.run([str(cli), "shapes"], check=True, capture_output=True,
                                       text=True).stdout)["issue"]
    return {s["name"]: Shape(s["name"], s["heads"], s["head_dim"], s["text_len"],
                             tuple((i["height"], i["width"]) for i in s["images"]))
            for s in listed}


def resolve_shapes(ap, args, names_args=("shapes",)):
    """Checks the shape names of `names_args` against the issue's shapes (all of them where
    one is unset) and sets args.shape_of (name -> Shape)."""
    args.shape_of = issue_shapes(args.cli)
    for name in names_args:
        asked = getattr(args, name)
        unknown = [s for s in asked or [] if s not in args.shape_of]
        if unknown:
            ap.error(f"--{name.replace('_', '-')}: {', '.join(unknown)} not among "
                     f"{', '.join(args.shape_of)}")
    if args.shapes is None:
        args.shapes = list(args.shape_of)


# ---------------------------------------------------------------------------------------
# PyTorch side (child process). torch, kernel_align and diffusers are imported here only:
# the parent process needs none of them.

def positions(shape):
    """diffusers' Qwen-Image positions [S, 3]: text (m+j on all axes), then images."""
    import torch
    grids = shape.grids
    m = max(max(h // 2, w // 2) for h, w in grids)
    rows = [torch.arange(shape.text_len).unsqueeze(1).repeat(1, 3) + m]
    for k, (h, w) in enumerate(grids):
        hh = torch.arange(h) - (h + 1) // 2
        ww = torch.arange(w) - (w + 1) // 2
        f = torch.full((h, w), k)
        rows.append(torch.stack([f, hh[:, None].expand(h, w), ww[None, :].expand(h, w)], -1)
                    .reshape(-1, 3))
    return torch.cat(rows).to(torch.int64)


def tables(pos):
    """The seed formula's fp32 cos/sin [S, 1, 64], broadcast over heads."""
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


def norm_rope(q, k, wtq, wtk, wiq, wik, cos, sin, text_len):
    import torch

    def one(x, wt, wi):
        y = torch.cat((rms(x[:, :text_len], wt), rms(x[:, text_len:], wi)), 1)
        return rope(y, cos, sin)

    return one(q, wtq, wiq), one(k, wtk, wik)


@dataclass
class Tensors:
    """The inputs of one (shape, dtype), shared by every implementation."""
    q: object  # [1, S, H, D]
    k: object
    dq: object  # output gradients of the backward cases
    dk: object
    weights: list  # text q, text k, image q, image k: [D], the tensors' dtype
    seed_cos: object  # the seed formula's tables, fp32 [S, 1, D/2]
    seed_sin: object
    cos: object = None  # kernel_align.rope_tables, fp32 [S, D/2] (ka, ka_op)
    sin: object = None
    txt_freqs: object = None  # QwenEmbedRope's complex64 [T, D/2] and [S - T, D/2] (diffusers)
    img_freqs: object = None
    text_len: int = None  # T, the text tokens at the start of the sequence


def make_tensors(shape, dtype, impls) -> Tensors:
    """Random inputs and the tables of `shape` (a Shape)."""
    import torch
    pos = positions(shape)
    seq = pos.shape[0]

    def uniform(*size, lo=-2.0, hi=2.0):
        return torch.empty(*size).uniform_(lo, hi).to(dtype)

    q, k, dq, dk = (uniform(1, seq, shape.heads, shape.head_dim) for _ in range(4))
    weights = [uniform(shape.head_dim, lo=0.5, hi=1.5) for _ in range(4)]
    t = Tensors(q, k, dq, dk, weights, *tables(pos), text_len=shape.text_len)
    img_shapes = [[(1, h, w) for h, w in shape.grids]]  # a batch of one sample
    if {"ka", "ka_op", "ka_out"} & set(impls):
        import kernel_align as ka
        t.cos, t.sin = ka.rope_tables(ka.qwen_image_rope_positions(img_shapes, shape.text_len))
    if "diffusers" in impls:
        from diffusers.models.transformers.transformer_qwenimage import QwenEmbedRope
        # As QwenImageTransformer2DModel builds it (axes_dims_rope (16, 56, 56)).
        embed = QwenEmbedRope(theta=10000, axes_dim=[16, 56, 56], scale_rope=True)
        t.img_freqs, t.txt_freqs = embed(img_shapes, torch.device("cpu"),
                                         max_txt_seq_len=shape.text_len)
    return t


def leaves(tensors, requires_grad):
    """Leaf tensors of a graph (sharing the inputs' storage)."""
    return [x.detach().requires_grad_(requires_grad) for x in tensors]


# A graph builder takes (op without _fwd/_bwd, Tensors, requires_grad) and returns
# (forward: () -> tuple of outputs, leaves to differentiate, output gradients).

def formula_graph(norm, rope_fn, norm_rope_fn):
    """The seed's formulas, eager or compiled."""
    def graph(base, t, requires_grad):
        if base == "qk_rmsnorm":
            x, w = leaves((t.q, t.weights[2]), requires_grad)
            return (lambda: (norm(x, w),)), [x, w], (t.dq,)
        if base == "multi_axis_rope":
            (x,) = leaves((t.q,), requires_grad)
            return (lambda: (rope_fn(x, t.seed_cos, t.seed_sin),)), [x], (t.dq,)
        q, k, *ws = leaves((t.q, t.k, *t.weights), requires_grad)
        return ((lambda: norm_rope_fn(q, k, *ws, t.seed_cos, t.seed_sin, t.text_len)), [q, k, *ws],
                (t.dq, t.dk))
    return graph


def ka_graph(base, t, requires_grad):
    """kernel_align's Python functions (the custom ops with their autograd formulas)."""
    import kernel_align as ka
    if base == "qk_rmsnorm":
        x, w = leaves((t.q, t.weights[2]), requires_grad)
        return (lambda: (ka.qk_rmsnorm(x, w, eps=EPS, mode="diffusers"),)), [x, w], (t.dq,)
    if base == "multi_axis_rope":
        (x,) = leaves((t.q,), requires_grad)
        return (lambda: (ka.multi_axis_rope(x, t.cos, t.sin),)), [x], (t.dq,)
    q, k, *ws = leaves((t.q, t.k, *t.weights), requires_grad)

    def forward():
        return ka.qk_norm_rope(q, k, t.cos, t.sin, text_len=t.text_len, text_q_weight=ws[0],
                               text_k_weight=ws[1], image_q_weight=ws[2], image_k_weight=ws[3],
                               eps=EPS, mode="diffusers")
    return forward, [q, k, *ws], (t.dq, t.dk)


def diffusers_graph(base, t, requires_grad):
    """diffusers' RMSNorm modules and apply_rotary_emb_qwen, as its processor calls them."""
    import torch
    from diffusers.models.normalization import RMSNorm
    from diffusers.models.transformers.transformer_qwenimage import apply_rotary_emb_qwen

    def module(weight):
        norm = RMSNorm(t.q.shape[-1], eps=EPS)
        norm.weight = torch.nn.Parameter(weight.detach(), requires_grad=requires_grad)
        return norm

    if base == "qk_rmsnorm":
        (x,) = leaves((t.q,), requires_grad)
        norm = module(t.weights[2])
        return (lambda: (norm(x),)), [x, norm.weight], (t.dq,)
    if base == "multi_axis_rope":
        (x,) = leaves((t.q,), requires_grad)
        freqs = torch.cat([t.txt_freqs, t.img_freqs])  # the joint [text, image] order
        return (lambda: (apply_rotary_emb_qwen(x, freqs, use_real=False),)), [x], (t.dq,)
    # qk_norm_rope: text q, image q, text k, image k, each its own tensor (as the
    # projections make them, so no slicing shows up in the backward).
    text, image = slice(None, t.text_len), slice(t.text_len, None)
    streams = leaves((t.q[:, text], t.q[:, image], t.k[:, text], t.k[:, image]), requires_grad)
    norms = [module(t.weights[i]) for i in (0, 2, 1, 3)]  # norm_added_q, norm_q, norm_added_k, norm_k
    freqs = (t.txt_freqs, t.img_freqs, t.txt_freqs, t.img_freqs)

    def forward():
        return tuple(apply_rotary_emb_qwen(norm(x), f, use_real=False)
                     for norm, x, f in zip(norms, streams, freqs))
    grads = (t.dq[:, text], t.dq[:, image], t.dk[:, text], t.dk[:, image])
    return forward, streams + [n.weight for n in norms], grads


def graph_case(graph):
    """Callable to time: the forward, or for a _bwd op the backward of a graph built once."""
    def case(op, t):
        import torch
        base, direction = op.rsplit("_", 1)
        forward, inputs, grad_outputs = graph(base, t, requires_grad=direction == "bwd")
        if direction == "fwd":
            return forward
        outputs = forward()
        return lambda: torch.autograd.grad(outputs, inputs, grad_outputs, retain_graph=True)
    return case


def ka_op_case(op, t):
    """The raw operators, forward and backward, with the C++ benchmark's arguments."""
    import torch
    ops = torch.ops.kernel_align
    opts = (EPS, "diffusers")
    rope_opts = ("interleaved", "bshd")
    fused = (*t.weights, t.cos, t.sin, t.text_len, *opts, *rope_opts)
    calls = {
        "qk_rmsnorm_fwd": lambda: ops.qk_rmsnorm(t.q, t.weights[2], *opts, None),
        "qk_rmsnorm_bwd": lambda: ops.qk_rmsnorm_backward(t.q, t.dq, t.weights[2], *opts, True),
        "multi_axis_rope_fwd": lambda: ops.multi_axis_rope(t.q, t.cos, t.sin, *rope_opts),
        "multi_axis_rope_bwd": lambda: ops.multi_axis_rope_backward(t.dq, t.cos, t.sin, *rope_opts),
        "qk_norm_rope_fwd": lambda: ops.qk_norm_rope(t.q, t.k, *fused, None),
        "qk_norm_rope_bwd": lambda: ops.qk_norm_rope_backward(t.q, t.k, t.dq, t.dk, *fused,
                                                              [True] * 4),
    }
    return calls[op]


def ka_out_case(op, t):
    """The out= operators with the C++ benchmark's arguments, into outputs allocated here,
    once: nothing is allocated per call."""
    import torch
    ops = torch.ops.kernel_align
    opts = (EPS, "diffusers")
    rope_opts = ("interleaved", "bshd")
    fused = (*t.weights, t.cos, t.sin, t.text_len, *opts, *rope_opts)
    y, y2 = torch.empty_like(t.q), torch.empty_like(t.k)
    dws = [torch.empty_like(w) for w in t.weights]
    calls = {
        "qk_rmsnorm_fwd": lambda: ops.qk_rmsnorm_out(t.q, t.weights[2], *opts, y),
        "qk_rmsnorm_bwd": lambda: ops.qk_rmsnorm_backward_out(t.q, t.dq, t.weights[2], *opts, y,
                                                              dws[2]),
        "multi_axis_rope_fwd": lambda: ops.multi_axis_rope_out(t.q, t.cos, t.sin, *rope_opts, y),
        "multi_axis_rope_bwd": lambda: ops.multi_axis_rope_backward_out(t.dq, t.cos, t.sin,
                                                                        *rope_opts, y),
        "qk_norm_rope_fwd": lambda: ops.qk_norm_rope_out(t.q, t.k, *fused, y, y2),
        "qk_norm_rope_bwd": lambda: ops.qk_norm_rope_backward_out(t.q, t.k, t.dq, t.dk, *fused,
                                                                  y, y2, *dws),
    }
    return calls[op]


def case_builders(impls, compile_now):
    """impl name -> (op, Tensors) -> callable, for the current thread count."""
    import torch
    builders = {}
    for impl in impls:
        if impl == "ka":
            builders[impl] = graph_case(ka_graph)
        elif impl == "ka_op":
            builders[impl] = ka_op_case
        elif impl == "ka_out":
            builders[impl] = ka_out_case
        elif impl == "eager":
            builders[impl] = graph_case(formula_graph(rms, rope, norm_rope))
        elif impl == "diffusers":
            builders[impl] = graph_case(diffusers_graph)
        elif impl in COMPILE_OPTIONS and compile_now:
            torch._dynamo.reset()  # inductor bakes the thread count into its code
            builders[impl] = graph_case(formula_graph(
                *(torch.compile(f, dynamic=False, options=COMPILE_OPTIONS[impl])
                  for f in (rms, rope, norm_rope))))
    return builders


def time_ms(fn, min_reps, max_reps, budget_s, last_call=None, before=None):
    """Median wall time of fn in ms, after one untimed call (for compile: the compile).
    before, if given, runs ahead of every call of fn, outside the timed region.

    With last_call (kernel_align.last_call), also the medians over calls of (fn's time /
    the C++ call's time inside it) - 1 and of (fn's time / the backend's time inside
    it) - 1, in %: the binding overhead paired call by call, so that a slow-down of the
    machine that hits both halves of a call cancels out."""
    if before is not None:
        before()
    fn()
    samples = []
    paired = {"call": [], "backend": []}
    t_start = time.perf_counter()
    while len(samples) < min_reps or (len(samples) < max_reps
                                      and time.perf_counter() - t_start < budget_s):
        if before is not None:
            before()
        t0 = time.perf_counter()
        fn()
        elapsed = time.perf_counter() - t0
        samples.append(elapsed * 1e3)
        if last_call is not None:
            report = last_call()
            paired["call"].append(100.0 * (elapsed / report.call_seconds - 1.0))
            paired["backend"].append(100.0 * (elapsed / report.backend_seconds - 1.0))
    return statistics.median(samples), (
        {k: statistics.median(v) for k, v in paired.items()} if last_call else None)


def child(args) -> int:
    import torch
    torch.manual_seed(0)
    tdt = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    timing = QUICK_TIMING if args.quick else TIMING
    uses_ka = bool({"ka", "ka_op", "ka_out"} & set(args.impls))
    if uses_ka:
        import kernel_align as ka
    results = []
    compile_shapes = set(args.compile_shapes or args.shapes)
    for shape in args.shapes:
        for dname in args.dtypes:
            tensors = make_tensors(args.shape_of[shape], tdt[dname], args.impls)
            for threads in args.threads:
                torch.set_num_threads(threads)
                if uses_ka:
                    ka.set_num_threads(threads)  # our pool is separate from torch's
                builders = case_builders(args.impls, compile_now=shape in compile_shapes)
                for impl, build in builders.items():
                    reps = timing["ka" if impl.startswith("ka") else "torch"]
                    for op in args.ops:
                        try:
                            t0 = time.perf_counter()
                            case = build(op, tensors)
                            ms, paired_pct = time_ms(
                                case, *reps,
                                last_call=ka.last_call if impl.startswith("ka") else None)
                            setup = time.perf_counter() - t0
                        except Exception as e:  # report, keep going
                            print(f"compare_torch: {impl} {op} {dname} {shape} t={threads}: {e}",
                                  file=sys.stderr)
                            continue
                        del case
                        result = dict(op=op, dtype=dname, shape=shape, threads=threads,
                                      impl=impl, allocator=args.allocator, ms=ms)
                        if impl.startswith("ka"):
                            result["isa"] = ka.last_call().isa  # to match the C++ path
                            result["paired_overhead_pct"] = paired_pct["call"]
                            result["paired_backend_overhead_pct"] = paired_pct["backend"]
                        results.append(result)
                        with open(args.child_out + ".partial", "a") as f:
                            f.write(json.dumps(result) + "\n")
                        print(f"  [{args.allocator}] {impl:9s} {op:20s} {dname} {shape:28s} "
                              f"t={threads}: {ms:8.2f} ms (setup+timing {setup:.1f} s)",
                              file=sys.stderr, flush=True)
            del tensors
    with open(args.child_out, "w") as f:
        json.dump(dict(torch=torch.__version__, glibc_tunables=os.environ.get("GLIBC_TUNABLES", ""),
                       results=results), f)
    return 0


# ---------------------------------------------------------------------------------------
# C++ side

def run_ours(args, path) -> str:
    """The C++ benchmark's JSON for our cases on `path` (a regex of paths: None, every
    CPU path)."""
    bench = Path(args.bench)
    if not bench.exists():
        sys.exit(f"compare_torch: no benchmark binary at {bench} (build target kernel_align_bench) "
                 "or pass --ours-json")
    path_re = path or "cpu-[a-z0-9]+"
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
# Timing in children, combining, printing

def allocator_env(alloc) -> dict:
    """This process's environment with the allocators set up as ALLOCATORS[alloc] (for a
    child process: glibc reads GLIBC_TUNABLES at start-up only)."""
    env = dict(os.environ)
    for name in ("GLIBC_TUNABLES", "KERNEL_ALIGN_HUGE_PAGES", "THP_MEM_ALLOC_ENABLE"):
        env.pop(name, None)
    env.update(ALLOCATORS[alloc])
    return env


def time_torch(args) -> list:
    """Every torch-side timing, one child process per allocator setting, --process-rounds
    times in turn (default, tuned, default, tuned, ...); a timing is the median of its
    rounds (ms_rounds keeps them): a process's timings move together with the machine's
    load, so a ratio between two settings needs several of each, interleaved."""
    results = []
    for _ in range(args.process_rounds):
        results += time_torch_round(args)
    rows = {}
    for r in results:
        key = (r["op"], r["dtype"], r["shape"], r["threads"], r["impl"], r["allocator"])
        rows.setdefault(key, dict(r, ms_rounds=[]))["ms_rounds"].append(r["ms"])
    for row in rows.values():
        row["ms"] = statistics.median(row["ms_rounds"])
    return list(rows.values())


def time_torch_round(args) -> list:
    """One child process per allocator setting, each timing every case once."""
    rows = []
    for alloc in args.allocators:
        env = allocator_env(alloc)
        out = tempfile.NamedTemporaryFile(prefix=f"ka-torch-{alloc}-", suffix=".json",
                                          delete=False).name
        impls = [i for i in args.impls
                 if i != "compile" or (not args.no_compile and alloc in args.compile_allocators)]
        cmd = [sys.executable, str(Path(__file__).resolve()), "--child-out", out,
               "--allocator", alloc, "--cli", str(args.cli), "--shapes", *args.shapes, "--dtypes", *args.dtypes,
               "--threads", *map(str, args.threads), "--ops", *args.ops, "--impls", *impls]
        if args.compile_shapes:
            cmd += ["--compile-shapes", *args.compile_shapes]
        if args.quick:
            cmd.append("--quick")
        print(f"compare_torch: timing torch, allocator {alloc} ({ALLOCATORS[alloc] or 'as is'})",
              file=sys.stderr, flush=True)
        subprocess.run(cmd, check=True, env=env)
        with open(out) as f:
            rows += json.load(f)["results"]
    return rows


def ratio(num, den):
    return num / den if den else float("nan")  # a NaN operand gives NaN


def comparison_rows(args, torch_rows, cases, path) -> list:
    """One row per (op, dtype, shape, threads) with every time and ratio."""
    t = {(r["op"], r["dtype"], r["shape"], r["threads"], r["impl"], r["allocator"]): r["ms"]
         for r in torch_rows}
    paired = {(r["op"], r["dtype"], r["shape"], r["threads"], r["impl"], r["allocator"]): r
              for r in torch_rows if r.get("paired_overhead_pct") is not None}
    nan = float("nan")
    rows = []
    for shape in args.shapes:
        for dtype in args.dtypes:
            for op in args.ops:
                for threads in args.threads:
                    def get(impl, alloc):
                        return t.get((op, dtype, shape, threads, impl, alloc), nan)

                    c = cases.get((op, dtype, shape, path, threads))
                    cpp = c.med("ms") if c and not c.error else nan
                    row = dict(op=op, dtype=dtype, shape=shape, threads=threads, path=path,
                               cpp_ms=cpp)
                    for alloc in ALLOCATORS:
                        for impl in ("ka", "ka_op", "ka_out", "eager", "diffusers"):
                            row[f"{impl}_{alloc}_ms"] = get(impl, alloc)
                    # out= under the default allocator over out= under the tuned one, and
                    # our allocating op vs compile, both under the default allocator
                    row["ka_out_default_over_tuned"] = ratio(row["ka_out_tuned_ms"],
                                                             row["ka_out_default_ms"])
                    row["compile_default_over_ka_default"] = ratio(
                        get("compile", "default"), row["ka_default_ms"])
                    # compile under the tuned allocator, else under the default one
                    compile_alloc = "default" if math.isnan(get("compile", "tuned")) else "tuned"
                    row["compile_allocator"] = compile_alloc
                    row["compile_ms"] = get("compile", compile_alloc)
                    # 1. torch over the C++ benchmark
                    for alloc in ALLOCATORS:
                        row[f"eager_{alloc}_over_cpp"] = ratio(row[f"eager_{alloc}_ms"], cpp)
                    row["compile_over_cpp"] = ratio(row["compile_ms"], cpp)
                    # 2. same process and allocator: torch over our torch op
                    for alloc in ALLOCATORS:
                        ka_ms = row[f"ka_{alloc}_ms"]
                        for impl in ("eager", "diffusers"):
                            row[f"{impl}_{alloc}_over_ka"] = ratio(row[f"{impl}_{alloc}_ms"], ka_ms)
                    row["compile_over_ka"] = ratio(row["compile_ms"], row[f"ka_{compile_alloc}_ms"])
                    # 3. binding overhead of our torch ops over the C++ call
                    for alloc in ALLOCATORS:
                        for impl in ("ka", "ka_op"):
                            row[f"{impl}_{alloc}_overhead_pct"] = \
                                100.0 * (ratio(row[f"{impl}_{alloc}_ms"], cpp) - 1.0)
                            timed = paired.get((op, dtype, shape, threads, impl, alloc), {})
                            row[f"{impl}_{alloc}_paired_overhead_pct"] = timed.get(
                                "paired_overhead_pct", nan)
                            # absent from --torch-json files saved before it existed
                            row[f"{impl}_{alloc}_paired_backend_overhead_pct"] = timed.get(
                                "paired_backend_overhead_pct", nan)
                    rows.append(row)
    return rows


def print_vs_cpp(rows):
    f = summarize.fmt
    print("### torch vs the C++ benchmark")
    print()
    print("Targets: vs eager (tuned allocator) >= 5x bf16, >= 2.5x fp32; vs torch.compile >= 1.2x.")
    print()
    print("| op | dtype | shape | threads | C++ ms | eager ms (default alloc) | eager ms (tuned) "
          "| compile ms | eager/C++ (default) | eager/C++ (tuned) | compile/C++ | targets |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        verdicts = []
        te = TARGET_EAGER.get(r["dtype"])
        if te is not None and not math.isnan(r["eager_tuned_over_cpp"]):
            verdicts.append(f"eager {'met' if r['eager_tuned_over_cpp'] >= te else 'NOT met'} (>= {te}x)")
        if not math.isnan(r["compile_over_cpp"]):
            verdicts.append(f"compile {'met' if r['compile_over_cpp'] >= TARGET_COMPILE else 'NOT met'}"
                            f" (>= {TARGET_COMPILE}x)")
        print(f"| {r['op']} | {r['dtype']} | {r['shape']} | {r['threads']} | {f(r['cpp_ms'])} | "
              f"{f(r['eager_default_ms'])} | {f(r['eager_tuned_ms'])} | {f(r['compile_ms'])} | "
              f"{f(r['eager_default_over_cpp'])} | {f(r['eager_tuned_over_cpp'])} | "
              f"{f(r['compile_over_cpp'])} | {'; '.join(verdicts) or '-'} |")


def print_same_process(rows, allocators):
    f = summarize.fmt
    print("### Same process and thread count: torch time / our torch-op time (ka)")
    print()
    print("| op | dtype | shape | threads | allocator | ka ms | eager ms | compile ms "
          "| diffusers ms | eager/ka | compile/ka | diffusers/ka |")
    print("|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        for alloc in allocators:
            compiled = alloc == r["compile_allocator"]
            print(f"| {r['op']} | {r['dtype']} | {r['shape']} | {r['threads']} | {alloc} | "
                  f"{f(r[f'ka_{alloc}_ms'])} | {f(r[f'eager_{alloc}_ms'])} | "
                  f"{f(r['compile_ms']) if compiled else 'n/a'} | {f(r[f'diffusers_{alloc}_ms'])} | "
                  f"{f(r[f'eager_{alloc}_over_ka'])} | "
                  f"{f(r['compile_over_ka']) if compiled else 'n/a'} | "
                  f"{f(r[f'diffusers_{alloc}_over_ka'])} |")


def print_out(rows):
    f = summarize.fmt
    print("### out= and glibc's default allocator")
    print()
    print(f"ka_out: the out= operators into outputs allocated once. Target: ka_out's speed "
          f"under glibc's defaults >= {TARGET_OUT_DEFAULT_OVER_TUNED}x its speed under the "
          f"tuned heap (tuned ms / default ms); and ka (allocating) ahead of torch.compile "
          f"under the defaults (compile ms / ka ms > 1; n/a where compile was not timed "
          f"under the defaults: --compile-allocators default).")
    print()
    print("| op | dtype | shape | threads | ka ms (default) | ka ms (tuned) | ka_out ms (default) "
          "| ka_out ms (tuned) | ka_out default speed / tuned | compile/ka (default) | target |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        verdict = "-"
        if not math.isnan(r["ka_out_default_over_tuned"]):
            met = r["ka_out_default_over_tuned"] >= TARGET_OUT_DEFAULT_OVER_TUNED
            verdict = f"{'met' if met else 'NOT met'} (>= {TARGET_OUT_DEFAULT_OVER_TUNED}x)"
        print(f"| {r['op']} | {r['dtype']} | {r['shape']} | {r['threads']} | "
              f"{f(r['ka_default_ms'])} | {f(r['ka_tuned_ms'])} | {f(r['ka_out_default_ms'])} | "
              f"{f(r['ka_out_tuned_ms'])} | {f(r['ka_out_default_over_tuned'])} | "
              f"{f(r['compile_default_over_ka_default'])} | {verdict} |")


def print_overhead(rows, allocators):
    f = summarize.fmt

    def pct(v):
        if math.isnan(v):
            return "n/a"
        return f"{v:+.1f}%" + (" **>= 3%**" if v >= OVERHEAD_FLAG_PCT else "")

    print("### Binding overhead: torch-op time over the C++ call - 1")
    print()
    print("ka: kernel_align.* (backward through autograd); ka_op: torch.ops.kernel_align.* "
          "(backward ops called directly). Both allocate their outputs each call; the C++ "
          "loop writes into preallocated buffers. 'vs bench': median torch-op time / median "
          "C++ benchmark time (separate processes, so machine noise shows in full); "
          "'paired': median over calls of the call's time / the time of the library's C++ "
          "call inside it (kernel_align.last_call().call_seconds) - 1; 'vs backend': the "
          "same against the backend alone inside it (backend_seconds).")
    print()
    print("| op | dtype | shape | threads | allocator | C++ ms | ka ms | ka vs bench "
          "| ka paired | ka_op ms | ka_op vs bench | ka_op paired | ka_op vs backend |")
    print("|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        for alloc in allocators:
            print(f"| {r['op']} | {r['dtype']} | {r['shape']} | {r['threads']} | {alloc} | "
                  f"{f(r['cpp_ms'])} | {f(r[f'ka_{alloc}_ms'])} | "
                  f"{pct(r[f'ka_{alloc}_overhead_pct'])} | "
                  f"{pct(r[f'ka_{alloc}_paired_overhead_pct'])} | {f(r[f'ka_op_{alloc}_ms'])} | "
                  f"{pct(r[f'ka_op_{alloc}_overhead_pct'])} | "
                  f"{pct(r[f'ka_op_{alloc}_paired_overhead_pct'])} | "
                  f"{pct(r[f'ka_op_{alloc}_paired_backend_overhead_pct'])} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: t2i_1024x1024, bf16, 1 thread, few repetitions "
                         "(explicit --shapes/--dtypes/--threads/--reps/--min-time still apply)")
    ap.add_argument("--shapes", nargs="+", help="default: all (kernel-align shapes)")
    ap.add_argument("--dtypes", nargs="+", choices=DTYPES, help="default: all")
    ap.add_argument("--threads", nargs="+", type=int, help="default: 1 and all cores")
    ap.add_argument("--ops", nargs="+", default=OPS, choices=OPS)
    ap.add_argument("--impls", nargs="+", default=IMPLS, choices=IMPLS,
                    help="torch-side implementations to time (default: all)")
    ap.add_argument("--allocators", nargs="+", default=DEFAULT_ALLOCATORS, choices=list(ALLOCATORS),
                    help="allocator settings, a child process each (ALLOCATORS; default: "
                         "default tuned)")
    ap.add_argument("--process-rounds", type=int, default=1,
                    help="child processes per allocator setting, run in turn; each timing "
                         "the median of its rounds (default 1)")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--compile-shapes", nargs="+",
                    help="shapes to compile (default: all of --shapes); compiling is slow")
    ap.add_argument("--compile-allocators", nargs="+", default=["tuned"], choices=list(ALLOCATORS),
                    help="allocator settings under which torch.compile is timed (default: tuned)")
    ap.add_argument("--ours-json", nargs="+", help="kernel_align_bench JSON instead of running it")
    ap.add_argument("--bench", default=str(ROOT / "build/bench/bench/kernel_align_bench"))
    ap.add_argument("--cli", default=str(DEFAULT_CLI),
                    help="the kernel-align executable, whose `shapes` lists the shapes")
    ap.add_argument("--path", help="our path to compare (default: cpu-<best_isa>)")
    ap.add_argument("--reps", type=int, help="C++ benchmark repetitions, median (default 3)")
    ap.add_argument("--min-time", help="C++ benchmark min time per repetition (default 0.3)")
    ap.add_argument("--torch-json", nargs="+", help="reuse torch timings (--save-torch files)")
    ap.add_argument("--save-torch", help="keep the torch-side timings (JSON) here")
    ap.add_argument("--json", help="write every timing, the C++ cases and the rows as JSON")
    ap.add_argument("--csv", help="write the comparison rows as CSV")
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    ap.add_argument("--allocator", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    for name, value in (QUICK_DEFAULTS if args.quick else FULL_DEFAULTS).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    resolve_shapes(ap, args, ("shapes", "compile_shapes"))
    if args.process_rounds < 1:
        ap.error(f"argument --process-rounds: expected 1 or more, found {args.process_rounds}")

    if args.child_out:
        return child(args)

    if args.torch_json:
        torch_rows = []
        for p in args.torch_json:
            with open(p) as f:
                torch_rows += json.load(f)["results"]
    else:
        torch_rows = time_torch(args)
        if args.save_torch:
            with open(args.save_torch, "w") as f:
                json.dump(dict(results=torch_rows), f)

    # The C++ path our torch ops ran on (one ISA for all): only it is benchmarked.
    isas = sorted({r["isa"] for r in torch_rows if "isa" in r})
    ran_on = f"cpu-{isas[0]}" if len(isas) == 1 else None
    ours_files = args.ours_json or [run_ours(args, args.path or ran_on)]
    cases, context = summarize.load(ours_files)
    path = args.path or best_path(cases, context)
    rows = comparison_rows(args, torch_rows, cases, path)
    allocators = [a for a in ALLOCATORS if a in args.allocators]

    print(f"kernel-align C++ path: {path}; ratios are the other time / ours (> 1: ours faster).")
    if isas and [f"cpu-{i}" for i in isas] != [path]:
        print(f"Note: our torch ops ran on {', '.join(isas)}, the C++ cases on {path}.")
    print()
    print_vs_cpp(rows)
    print()
    print_same_process(rows, allocators)
    print()
    print_out(rows)
    print()
    print_overhead(rows, allocators)
    if args.json:
        cpp = [dict(op=c.op, dtype=c.dtype, shape=c.shape, path=c.path, threads=c.threads,
                    ms=c.med("ms"), error=c.error) for c in cases.values()]
        with open(args.json, "w") as fh:
            json.dump(dict(path=path, context=context, timings=torch_rows, cpp=cpp, rows=rows),
                      fh, indent=1)
    if args.csv:
        with open(args.csv, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else ["op"])
            w.writeheader()
            w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
