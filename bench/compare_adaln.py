#!/usr/bin/env python3
"""kernel_align.adaln_modulation and kernel_align.adaln_gate_residual against a same-run
copy of their traffic and against torch (diffusers' formulas eager and under
torch.compile), measured in one process, interleaved, the best of --repeats each (issue
32's target: >= 0.9 of the copy in fp32, ahead of torch.compile; docs/performance.md).

    .venv/bin/python bench/compare_adaln.py [--quick] [--ops adaln gate] [--threads 1 2]
        [--dtypes fp32 bf16] [--tokens 4352 7145] [--dim 3072] [--backward] [--repeats 5]
        [--json F] [--csv F]

Printed per (op, tokens, dtype, threads, direction): the time of ours, of a copy of the
same bytes (as one `torch.Tensor.copy_` moving as many bytes: adaln forward x read, y
written; backward x and dy read, dx written; gate forward x and y read, out written;
backward y and dout read, dy written), of torch eager and torch.compile, and the ratios
copy/ours (the fraction of memory speed) and compiled/ours (> 1: ours is faster). The
forward also times ours with out= (into one buffer reused across calls, as the copy reuses
its own): copy/ours(out=).
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

import kernel_align
from bench_output import write_outputs
from timing import interleaved_minima

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def adaln_formula(x, scale, shift):
    return F.layer_norm(x, (x.shape[-1],), eps=1e-6) * (1 + scale[:, None]) + shift[:, None]


def gate_formula(x, gate, y):
    return x + gate[:, None] * y


# Per op: ours, diffusers' formula, whether the second and third inputs are [B, D]
# modulations (else [B, S, D] tokens), and the traffic in elements of a token tensor
# (forward, backward): what a copy of as many bytes moves.
OPS = {
    "adaln": (kernel_align.adaln_modulation, adaln_formula, (True, True), (2, 3)),
    "gate": (kernel_align.adaln_gate_residual, gate_formula, (True, False), (3, 3)),
}


def measure(op: str, tokens: int, dim: int, dtype, threads: int, repeats: int,
            backward: bool) -> dict:
    ours_fn, formula, modulations, traffic = OPS[op]
    # A fresh compilation for each row: one compiled function called at many shapes stops
    # recompiling at dynamo's cache limit and runs eager from then on.
    torch._dynamo.reset()
    compiled = torch.compile(formula, dynamic=False)
    torch.set_num_threads(threads)
    kernel_align.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, tokens, dim, generator=g).to(dtype).requires_grad_(backward)
    others = [(0.1 * torch.randn(1, dim, generator=g) if modulation
               else torch.randn(1, tokens, dim, generator=g)).to(dtype).requires_grad_(backward)
              for modulation in modulations]
    inputs = (x, *others)
    dy = torch.randn(1, tokens, dim, generator=g).to(dtype)
    # The least traffic, as elements of a token tensor read or written: a copy of half as
    # many elements moves as many bytes.
    elements = tokens * dim * traffic[1 if backward else 0] // 2
    copy_src = torch.empty(elements, dtype=dtype)
    copy_dst = torch.empty_like(copy_src)

    def run(fn):
        if not backward:
            return lambda: fn(*inputs)
        out = fn(*inputs)
        return lambda: torch.autograd.grad(out, inputs, dy, retain_graph=True)

    ours, eager, comp = (run(ours_fn), run(formula), run(compiled))
    out_buffer = torch.empty_like(x)

    def copy():
        copy_dst.copy_(copy_src)

    timed = [("ours", ours), ("copy", copy), ("eager", eager), ("compiled", comp)]
    if not backward:
        timed.append(("ours_out", lambda: ours_fn(*inputs, out=out_buffer)))
    row = interleaved_minima(timed, repeats)
    row.update(op=op, tokens=tokens, dim=dim, dtype=[n for n, v in DTYPES.items() if v == dtype][0],
               threads=threads, direction="backward" if backward else "forward",
               copy_over_ours=row["copy"] / row["ours"],
               copy_over_ours_out=row["copy"] / row["ours_out"] if "ours_out" in row else None,
               compiled_over_ours=row["compiled"] / row["ours"])
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="512 tokens, 1 repeat")
    parser.add_argument("--ops", nargs="+", choices=sorted(OPS), default=sorted(OPS))
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
    rows = []
    print(f"{'op':>5} {'tokens':>6} {'dtype':>5} {'thr':>3} {'dir':>8} {'ours ms':>8} "
          f"{'copy ms':>8} {'eager ms':>8} {'compiled ms':>11} {'copy/ours':>9} "
          f"{'compiled/ours':>13} {'copy/ours(out=)':>15}")
    directions = [False, True] if args.backward else [False]
    for op, tokens, dtype_name, threads, backward in (
            (o, t, d, n, b) for o in args.ops for t in args.tokens for d in args.dtypes
            for n in args.threads for b in directions):
        r = measure(op, tokens, args.dim, DTYPES[dtype_name], threads, args.repeats, backward)
        rows.append(r)
        print(f"{op:>5} {tokens:>6} {dtype_name:>5} {threads:>3} {r['direction']:>8} "
              f"{r['ours'] * 1e3:>8.2f} {r['copy'] * 1e3:>8.2f} "
              f"{r['eager'] * 1e3:>8.2f} {r['compiled'] * 1e3:>11.2f} "
              f"{r['copy_over_ours']:>9.2f} {r['compiled_over_ours']:>13.2f} "
              + (f"{r['copy_over_ours_out']:>15.2f}" if r["copy_over_ours_out"] else f"{'-':>15}"),
              flush=True)
    write_outputs({"rows": rows, "torch": torch.__version__}, args.json, args.csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
