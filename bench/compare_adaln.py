#!/usr/bin/env python3
"""kernel_align.adaln_modulation against a same-run copy of its traffic and against torch
(diffusers' formula eager and under torch.compile), measured in one process, interleaved,
the best of --repeats each (issue 32's target: >= 0.9 of the copy in fp32, ahead of
torch.compile; docs/performance.md).

    .venv/bin/python bench/compare_adaln.py [--quick] [--threads 1 2] [--dtypes fp32 bf16]
        [--tokens 4352 7145] [--dim 3072] [--backward] [--repeats 5] [--json F] [--csv F]

Printed per (tokens, dtype, threads, direction): the time of ours, of a copy of the same
bytes (forward: x read, y written; backward: x and dy read, dx written; as one
`torch.Tensor.copy_` moving as many bytes), of torch eager and torch.compile, and the ratios copy/ours (the
fraction of memory speed) and compiled/ours (> 1: ours is faster).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F

import kernel_align
from bench_output import write_outputs

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def formula(x, scale, shift):
    return F.layer_norm(x, (x.shape[-1],), eps=1e-6) * (1 + scale[:, None]) + shift[:, None]


def best(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def measure(tokens: int, dim: int, dtype, threads: int, repeats: int, backward: bool,
            compiled) -> dict:
    torch.set_num_threads(threads)
    kernel_align.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, tokens, dim, generator=g).to(dtype).requires_grad_(backward)
    scale = (0.1 * torch.randn(1, dim, generator=g)).to(dtype).requires_grad_(backward)
    shift = (0.1 * torch.randn(1, dim, generator=g)).to(dtype).requires_grad_(backward)
    dy = torch.randn(1, tokens, dim, generator=g).to(dtype)
    # The least traffic: forward x read and y written (2 N elements), backward x and dy read
    # and dx written (3 N): a copy of N, or of 1.5 N, elements moves as many bytes.
    elements = tokens * dim * 3 // 2 if backward else tokens * dim
    copy_src = torch.empty(elements, dtype=dtype)
    copy_dst = torch.empty_like(copy_src)

    def run(fn):
        if not backward:
            return lambda: fn(x, scale, shift)
        out = fn(x, scale, shift)
        return lambda: torch.autograd.grad(out, (x, scale, shift), dy, retain_graph=True)

    ours, eager, comp = (run(kernel_align.adaln_modulation), run(formula), run(compiled))

    def copy():
        copy_dst.copy_(copy_src)

    for fn in (ours, eager, comp, copy):
        fn()  # warm-up (and compile)
    t = {name: [] for name in ("ours", "copy", "eager", "compiled")}
    for _ in range(repeats):
        for name, fn in (("ours", ours), ("copy", copy), ("eager", eager), ("compiled", comp)):
            t[name].append(best(fn, 1))
    row = {name: min(v) for name, v in t.items()}
    row.update(tokens=tokens, dim=dim, dtype=[n for n, v in DTYPES.items() if v == dtype][0],
               threads=threads, direction="backward" if backward else "forward",
               copy_over_ours=row["copy"] / row["ours"],
               compiled_over_ours=row["compiled"] / row["ours"])
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="512 tokens, 1 repeat")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=["fp32", "bf16"])
    parser.add_argument("--tokens", type=int, nargs="+", default=[4352, 7145],
                        help="tokens of one sample (1024x1024 and 1328x1328 with 256 text)")
    parser.add_argument("--dim", type=int, default=3072)
    parser.add_argument("--backward", action="store_true", help="also time the backward")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--csv", metavar="FILE")
    args = parser.parse_args(argv)
    if args.quick:
        args.tokens, args.repeats = [512], 1
    compiled = torch.compile(formula)
    rows = []
    print(f"{'tokens':>6} {'dtype':>5} {'thr':>3} {'dir':>8} {'ours ms':>8} {'copy ms':>8} "
          f"{'eager ms':>8} {'compiled ms':>11} {'copy/ours':>9} {'compiled/ours':>13}")
    for tokens in args.tokens:
        for dtype_name in args.dtypes:
            for threads in args.threads:
                for backward in ([False, True] if args.backward else [False]):
                    r = measure(tokens, args.dim, DTYPES[dtype_name], threads, args.repeats,
                                backward, compiled)
                    rows.append(r)
                    print(f"{tokens:>6} {dtype_name:>5} {threads:>3} {r['direction']:>8} "
                          f"{r['ours'] * 1e3:>8.2f} {r['copy'] * 1e3:>8.2f} "
                          f"{r['eager'] * 1e3:>8.2f} {r['compiled'] * 1e3:>11.2f} "
                          f"{r['copy_over_ours']:>9.2f} {r['compiled_over_ours']:>13.2f}",
                          flush=True)
    write_outputs({"rows": rows, "torch": torch.__version__}, args.json, args.csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
