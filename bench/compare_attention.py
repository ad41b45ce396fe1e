#!/usr/bin/env python3
"""kernel_align.attention against torch's F.scaled_dot_product_attention (its CPU flash
kernel) at Qwen-Image's joint-attention shapes, measured in one process, interleaved, the
best of --repeats each (issue 32's performance target: >= 0.8x torch; docs/performance.md).

    .venv/bin/python bench/compare_attention.py [--quick] [--threads 1 2]
        [--dtypes fp32 bf16] [--images 1024 1328] [--text 256] [--heads 24] [--backward]
        [--repeats 3] [--json F] [--csv F]

Printed per (image, tokens, dtype, threads, direction): our time, torch's, torch/ours, and
the GFLOP/s of ours counting the two products of the forward (4 S^2 D per head) or the
four of the backward (8 S^2 D; the recomputed scores not counted). Both run the same
[B, S, H, D] tensors: ours with layout "bshd", torch on the transposed [B, H, S, D] views
(no copy). Long: at 1024x1024 (4352 tokens, 24 heads) one forward is seconds per thread.
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
HEAD_DIM = 128


def tokens_of(pixels: int, text: int) -> int:
    return (pixels // 16) ** 2 + text  # VAE /8, 2x2 patches


def once(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(seq: int, heads: int, dtype, threads: int, repeats: int, backward: bool) -> dict:
    torch.set_num_threads(threads)
    kernel_align.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, seq, heads, HEAD_DIM, generator=g).to(dtype).requires_grad_(backward)
               for _ in range(3))
    dout = torch.randn(1, seq, heads, HEAD_DIM, generator=g).to(dtype)

    def theirs_forward():
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                              v.transpose(1, 2)).transpose(1, 2)

    def ours_forward():
        return kernel_align.attention(q, k, v)

    if backward:
        ours_out, theirs_out = ours_forward(), theirs_forward()

        def ours():
            torch.autograd.grad(ours_out, (q, k, v), dout, retain_graph=True)

        def theirs():
            torch.autograd.grad(theirs_out, (q, k, v), dout, retain_graph=True)
    else:
        ours, theirs = ours_forward, theirs_forward
    ours(), theirs()  # warm-up
    ours_times, theirs_times = [], []
    for _ in range(repeats):  # interleaved: the machine's load hits both alike
        ours_times.append(once(ours))
        theirs_times.append(once(theirs))
    flops = (8 if backward else 4) * seq * seq * HEAD_DIM * heads
    return {"tokens": seq, "heads": heads,
            "dtype": [n for n, t in DTYPES.items() if t == dtype][0], "threads": threads,
            "direction": "backward" if backward else "forward", "ours_s": min(ours_times),
            "torch_s": min(theirs_times), "torch_over_ours": min(theirs_times) / min(ours_times),
            "ours_gflops": flops / min(ours_times) / 1e9}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="a 256x256 image (512 tokens with the text), 4 heads, 1 repeat")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=["fp32", "bf16"])
    parser.add_argument("--images", type=int, nargs="+", default=[1024, 1328],
                        help="square images, in pixels")
    parser.add_argument("--text", type=int, default=256, help="text tokens")
    parser.add_argument("--heads", type=int, default=24)
    parser.add_argument("--backward", action="store_true", help="also time the backward")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--csv", metavar="FILE")
    args = parser.parse_args(argv)
    if args.quick:
        args.images, args.heads, args.repeats = [256], 4, 1
    rows = []
    header = (f"{'image':>6} {'tokens':>6} {'dtype':>5} {'thr':>3} {'dir':>8} {'ours s':>8} "
              f"{'torch s':>8} {'torch/ours':>10} {'GFLOP/s':>8}")
    print(header)
    for pixels in args.images:
        seq = tokens_of(pixels, args.text)
        for dtype_name in args.dtypes:
            for threads in args.threads:
                for backward in ([False, True] if args.backward else [False]):
                    row = measure(seq, args.heads, DTYPES[dtype_name], threads, args.repeats,
                                  backward)
                    row["image"] = pixels
                    rows.append(row)
                    print(f"{pixels:>6} {seq:>6} {dtype_name:>5} {threads:>3} "
                          f"{row['direction']:>8} {row['ours_s']:>8.3f} {row['torch_s']:>8.3f} "
                          f"{row['torch_over_ours']:>10.2f} {row['ours_gflops']:>8.1f}",
                          flush=True)
    write_outputs({"rows": rows, "torch": torch.__version__}, args.json, args.csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
