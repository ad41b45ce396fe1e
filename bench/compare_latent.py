#!/usr/bin/env python3
"""kernel_align's latent ops (latent_normalize both ways, latent_pack and latent_unpack)
against a same-run copy of their traffic and against the pipelines' own torch expressions
(eager and under torch.compile), measured in one process, interleaved, the best of
--repeats each (issue 33's target: >= 0.9 of the copy in fp32, ahead of torch.compile, 1
and 2 threads; docs/performance.md).

    .venv/bin/python bench/compare_latent.py [--quick] [--parts normalize pack ...]
        [--threads 1 2] [--dtypes fp32 bf16] [--sizes 128 166] [--batch 1 8]
        [--repeats 5] [--json F] [--csv F]

Latents are Qwen-Image's, [B, 16, H, W] with H = W = --sizes (1024x1024 images: 128,
1328x1328: 166); tokens [B, H/2 * W/2, 64]. Every part reads one tensor and writes one of
the same size, so the copy is one `torch.Tensor.copy_` of it. Printed per (part, batch,
size, dtype, threads): the time of ours, of the copy, of torch eager and torch.compile,
and the ratios copy/ours (the fraction of memory speed) and compiled/ours (> 1: ours is
faster).
"""

from __future__ import annotations

import argparse
import sys

import torch

import kernel_align
from bench_output import write_outputs
from timing import interleaved_minima

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
CHANNELS = 16
# The Qwen-Image VAE's constants (AutoencoderKLQwenImage's config).
MEAN = [-0.7571, -0.7089, -0.9113, 0.1075, -0.1745, 0.9653, -0.1517, 1.5508, 0.4134, -0.0715,
        0.5517, -0.3632, -0.1922, -0.9497, 0.2503, -0.2921]
STD = [2.8184, 1.4541, 2.3275, 2.6558, 1.2196, 1.7708, 2.6052, 2.0743, 3.2687, 2.1526, 2.8652,
       1.5579, 1.6382, 1.1253, 2.8251, 1.9160]


def _constants():
    return torch.tensor(MEAN), torch.tensor(STD)


def normalize_formula(z, mean, std):
    """The edit pipeline's `(image_latents - latents_mean) / latents_std`."""
    return (z - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1)


def denormalize_formula(z, mean, std):
    """The pipelines' `latents / latents_std + latents_mean`, latents_std = 1 / std."""
    return z / (1.0 / std.view(1, -1, 1, 1)) + mean.view(1, -1, 1, 1)


def pack_formula(latents):
    """QwenImagePipeline._pack_latents."""
    b, c, h, w = latents.shape
    x = latents.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (h // 2) * (w // 2), c * 4)


def unpack_formula(tokens, h, w):
    """QwenImagePipeline._unpack_latents (for the latent grid's h and w)."""
    b, _, features = tokens.shape
    x = tokens.view(b, h // 2, w // 2, features // 4, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(b, features // 4, h, w)


def measure(part: str, batch: int, size: int, dtype, threads: int, repeats: int) -> dict:
    torch._dynamo.reset()  # a fresh compilation per row (dynamo's cache limit)
    torch.set_num_threads(threads)
    kernel_align.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    latents = torch.randn(batch, CHANNELS, size, size, generator=g).to(dtype)
    mean, std = _constants()
    if part in ("normalize", "denormalize"):
        formula = normalize_formula if part == "normalize" else denormalize_formula
        compiled = torch.compile(formula, dynamic=False)
        args = (latents, mean, std)
        ours = lambda: kernel_align.latent_normalize(latents, mean, std, transform=part)
    elif part == "pack":
        formula, compiled = pack_formula, torch.compile(pack_formula, dynamic=False)
        args = (latents,)
        ours = lambda: kernel_align.latent_pack(latents)
    else:
        tokens = pack_formula(latents)
        formula, compiled = unpack_formula, torch.compile(unpack_formula, dynamic=False)
        args = (tokens, size, size)
        ours = lambda: kernel_align.latent_unpack(tokens, size, size)
    copy_src = torch.empty_like(latents)
    copy_dst = torch.empty_like(latents)
    timed = [("ours", ours), ("copy", lambda: copy_dst.copy_(copy_src)),
             ("eager", lambda: formula(*args)), ("compiled", lambda: compiled(*args))]
    row = interleaved_minima(timed, repeats)
    row.update(part=part, batch=batch, size=size,
               dtype=[n for n, d in DTYPES.items() if d == dtype][0], threads=threads,
               copy_over_ours=row["copy"] / row["ours"],
               compiled_over_ours=row["compiled"] / row["ours"])
    return row


PARTS = ("normalize", "denormalize", "pack", "unpack")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="32x32 latents, 1 repeat")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=["fp32", "bf16"])
    parser.add_argument("--sizes", type=int, nargs="+", default=[128, 166])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--csv", metavar="FILE")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.repeats = [32], 1
    rows = []
    print(f"{'part':>11} {'B':>2} {'H=W':>4} {'dtype':>5} {'thr':>3} {'ours ms':>8} "
          f"{'copy ms':>8} {'eager ms':>8} {'compiled ms':>11} {'copy/ours':>9} "
          f"{'compiled/ours':>13}")
    for part, batch, size, dtype_name, threads in (
            (p, b, s, d, n) for p in args.parts for b in args.batch for s in args.sizes
            for d in args.dtypes for n in args.threads):
        r = measure(part, batch, size, DTYPES[dtype_name], threads, args.repeats)
        rows.append(r)
        print(f"{part:>11} {batch:>2} {size:>4} {dtype_name:>5} {threads:>3} "
              f"{r['ours'] * 1e3:>8.3f} {r['copy'] * 1e3:>8.3f} {r['eager'] * 1e3:>8.3f} "
              f"{r['compiled'] * 1e3:>11.3f} {r['copy_over_ours']:>9.2f} "
              f"{r['compiled_over_ours']:>13.2f}", flush=True)
    write_outputs({"rows": rows, "torch": torch.__version__}, args.json, args.csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
