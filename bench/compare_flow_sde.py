#!/usr/bin/env python3
"""kernel_align.flow_sde_step_logp against a same-run copy of its traffic and against
Flow-GRPO's expressions in torch (eager and under torch.compile), measured in one process,
interleaved, the best of --repeats each (issue 33's target: >= 0.9 of the copy in fp32,
ahead of torch.compile, 1 and 2 threads; docs/performance.md).

    .venv/bin/python bench/compare_flow_sde.py [--quick] [--parts step logp backward]
        [--threads 1 2] [--dtypes fp32 bf16] [--tokens 4096 6889] [--batch 1 8]
        [--repeats 5] [--json F] [--csv F]

Latents are Qwen-Image's packed ones, [B, tokens, 64] (1024x1024: 4096 tokens, 1328x1328:
6889). Printed per (part, batch, tokens, dtype, threads): the time of ours, of a copy of
the same bytes (one `torch.Tensor.copy_` moving as many: the step reads x, v and noise and
writes prev; logp reads x, v and prev; its backward reads x, v and prev and writes dv), of
torch eager and torch.compile, and the ratios copy/ours (the fraction of memory speed) and
compiled/ours (> 1: ours is faster).
"""

from __future__ import annotations

import argparse
import math
import sys

import torch

import kernel_align
from bench_output import write_outputs
from timing import interleaved_minima

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
SIGMA, SIGMA_PREV, SIGMA_MAX, LEVEL = 0.8, 0.6, 0.9, 0.7
CHANNELS = 64


def _mean_and_scale(x, v):
    """Flow-GRPO's sde_step_with_logprob: the mean and std sqrt(-dt)."""
    std = math.sqrt(SIGMA / (1 - SIGMA)) * LEVEL
    dt = SIGMA_PREV - SIGMA
    mean = x * (1 + std ** 2 / (2 * SIGMA) * dt) + v * (1 + std ** 2 * (1 - SIGMA) / (2 * SIGMA)) * dt
    return mean, std * math.sqrt(-dt)


def step_formula(x, v, noise):
    mean, scale = _mean_and_scale(x, v)
    return mean + scale * noise


def logp_formula(x, v, prev):
    mean, scale = _mean_and_scale(x, v)
    logp = (-((prev.detach() - mean) ** 2) / (2 * scale ** 2) - math.log(scale)
            - math.log(math.sqrt(2 * math.pi)))
    return logp.mean(dim=tuple(range(1, logp.ndim)))


def ours_step(x, v, noise):
    return torch.ops.kernel_align.flow_sde_step(x, v, noise, SIGMA, SIGMA_PREV, LEVEL, SIGMA_MAX)


def ours_logp(x, v, prev):
    return kernel_align.flow_sde_step_logp(x, v, SIGMA, SIGMA_PREV, sigma_max=SIGMA_MAX,
                                           prev=prev, noise_level=LEVEL)[1]


# Per part: ours, the formula, and the traffic in latent tensors (what a copy moves).
PARTS = {"step": (ours_step, step_formula, 4), "logp": (ours_logp, logp_formula, 3),
         "backward": (ours_logp, logp_formula, 4)}


def measure(part: str, batch: int, tokens: int, dtype, threads: int, repeats: int) -> dict:
    ours_fn, formula, traffic = PARTS[part]
    # A fresh compilation for each row: one compiled function called at many shapes stops
    # recompiling at dynamo's cache limit and runs eager from then on.
    torch._dynamo.reset()
    compiled = torch.compile(formula, dynamic=False)
    torch.set_num_threads(threads)
    kernel_align.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    shape = (batch, tokens, CHANNELS)
    backward = part == "backward"
    x, third = (torch.randn(shape, generator=g).to(dtype) for _ in range(2))
    v = torch.randn(shape, generator=g).to(dtype).requires_grad_(backward)
    elements = batch * tokens * CHANNELS * traffic // 2  # a copy of half moves as many bytes
    copy_src = torch.empty(elements, dtype=dtype)
    copy_dst = torch.empty_like(copy_src)

    def run(fn):
        if not backward:
            return lambda: fn(x, v, third)
        out = fn(x, v, third)
        dlogp = torch.ones_like(out)
        return lambda: torch.autograd.grad(out, v, dlogp, retain_graph=True)

    timed = [("ours", run(ours_fn)), ("copy", lambda: copy_dst.copy_(copy_src)),
             ("eager", run(formula)), ("compiled", run(compiled))]
    row = interleaved_minima(timed, repeats)
    row.update(part=part, batch=batch, tokens=tokens,
               dtype=[n for n, d in DTYPES.items() if d == dtype][0], threads=threads,
               copy_over_ours=row["copy"] / row["ours"],
               compiled_over_ours=row["compiled"] / row["ours"])
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="512 tokens, 1 repeat")
    parser.add_argument("--parts", nargs="+", choices=sorted(PARTS), default=list(PARTS))
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=["fp32", "bf16"])
    parser.add_argument("--tokens", type=int, nargs="+", default=[4096, 6889])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--csv", metavar="FILE")
    args = parser.parse_args(argv)
    if args.quick:
        args.tokens, args.repeats = [512], 1
    rows = []
    print(f"{'part':>8} {'B':>2} {'tokens':>6} {'dtype':>5} {'thr':>3} {'ours ms':>8} "
          f"{'copy ms':>8} {'eager ms':>8} {'compiled ms':>11} {'copy/ours':>9} "
          f"{'compiled/ours':>13}")
    for part, batch, tokens, dtype_name, threads in (
            (p, b, t, d, n) for p in args.parts for b in args.batch for t in args.tokens
            for d in args.dtypes for n in args.threads):
        r = measure(part, batch, tokens, DTYPES[dtype_name], threads, args.repeats)
        rows.append(r)
        print(f"{part:>8} {batch:>2} {tokens:>6} {dtype_name:>5} {threads:>3} "
              f"{r['ours'] * 1e3:>8.2f} {r['copy'] * 1e3:>8.2f} {r['eager'] * 1e3:>8.2f} "
              f"{r['compiled'] * 1e3:>11.2f} {r['copy_over_ours']:>9.2f} "
              f"{r['compiled_over_ours']:>13.2f}", flush=True)
    write_outputs({"rows": rows, "torch": torch.__version__}, args.json, args.csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
