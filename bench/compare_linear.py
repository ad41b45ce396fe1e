#!/usr/bin/env python3
"""kernel_align.linear against torch's own F.linear (MKL/oneDNN) at Qwen-Image's Linear
shapes, measured in one process, interleaved, the best of --repeats each (issue 31's
performance targets; docs/performance.md).

    .venv/bin/python bench/compare_linear.py [--quick] [--threads 1 2] [--dtypes fp32 bf16]
        [--tokens 4352 1] [--backward] [--block] [--json F] [--csv F]

Printed per (N x K, M, dtype, threads): our time, torch's, torch/ours (>= 0.85 is the
fp32 target for M >= 256), GFLOP/s of ours and, for M <= 16 (memory-bound: the weight is
read once), the same-run time of a copy of the weight's bytes over ours (target >= 0.9).
--backward also times dx and dw (ours: linear_backward; torch: autograd of F.linear, both
as one backward of a graph built once). --block times one real-size Qwen-Image block
(3072 wide, 24 heads, a 512x512 image and 64 text tokens; diffusers 0.42.1's
QwenImageTransformerBlock with random weights; --block-dtypes, bf16 and fp32), forward and
backward, inside
kernel_align.batch_invariant() (issue 31: the Linears) and fully under the contract (issue
32: also the attention processor and the block's forward as under_contract runs it) against
torch's defaults (target <= 1.25x).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch
import torch.nn.functional as F

import kernel_align
from bench_output import write_outputs

# (N, K, activation) of every Linear of a Qwen-Image block and its embeddings.
SHAPES = [
    (3072, 64, None),  # img_in
    (3072, 3584, None),  # txt_in
    (3072, 256, "silu"),  # timestep_embedder.linear_1 (SiLU fused)
    (3072, 3072, None),  # to_q/k/v, to_out, timestep linear_2
    (18432, 3072, None),  # img_mod / txt_mod
    (12288, 3072, "gelu_tanh"),  # mlp up (GELU fused)
    (3072, 12288, None),  # mlp down
    (6144, 3072, None),  # norm_out linear
    (64, 3072, None),  # proj_out
]
QUICK_SHAPES = [(3072, 3072, None), (12288, 3072, "gelu_tanh"), (64, 3072, None)]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def best(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def torch_linear(x, w, b, activation):
    y = F.linear(x, w, b)
    if activation == "gelu_tanh":
        return F.gelu(y, approximate="tanh")
    if activation == "silu":
        return F.silu(y)
    return y


def measure(n, k, activation, m, dtype, threads, repeats, backward):
    torch.set_num_threads(threads)
    kernel_align.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=g).to(dtype)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(dtype)
    b = torch.randn(n, generator=g).to(dtype)
    ours, theirs = [], []
    for _ in range(repeats):  # interleaved: the machine's load hits both alike
        ours.append(best(lambda: kernel_align.linear(x, w, b, activation=activation), 1))
        theirs.append(best(lambda: torch_linear(x, w, b, activation), 1))
    row = {"n": n, "k": k, "m": m, "activation": activation or "none",
           "dtype": [name for name, t in DTYPES.items() if t == dtype][0], "threads": threads,
           "ours_ms": min(ours) * 1e3, "torch_ms": min(theirs) * 1e3}
    row["torch_over_ours"] = row["torch_ms"] / row["ours_ms"]
    row["ours_gflops"] = 2.0 * m * n * k / min(ours) / 1e9
    if m <= 16:
        target = torch.empty_like(w)  # allocated once: the copy's time is the memory's
        copy = best(lambda: target.copy_(w), repeats)
        row["copy_over_ours"] = copy / min(ours)
    if backward:
        xs, ws, bs = (t.clone().requires_grad_() for t in (x, w, b))
        dy = torch.randn(m, n, generator=g).to(dtype)
        y_ours = kernel_align.linear(xs, ws, bs, activation=activation)
        y_torch = torch_linear(xs, ws, bs, activation)
        ours_b, torch_b = [], []
        for _ in range(repeats):
            ours_b.append(best(lambda: torch.autograd.grad(y_ours, (xs, ws), dy,
                                                           retain_graph=True), 1))
            torch_b.append(best(lambda: torch.autograd.grad(y_torch, (xs, ws), dy,
                                                            retain_graph=True), 1))
        row["ours_backward_ms"] = min(ours_b) * 1e3
        row["torch_backward_ms"] = min(torch_b) * 1e3
        row["backward_torch_over_ours"] = min(torch_b) / min(ours_b)
    return row


def block_ratio(threads: int, repeats: int, dtype: torch.dtype) -> dict:
    from diffusers.models.transformers.transformer_qwenimage import (
        QwenEmbedRope, QwenImageTransformerBlock)
    torch.set_num_threads(threads)
    kernel_align.set_num_threads(threads)
    torch.manual_seed(0)
    block = QwenImageTransformerBlock(dim=3072, num_attention_heads=24,
                                      attention_head_dim=128).to(dtype)
    image_tokens, text_tokens = 32 * 32, 64  # 512x512 pixels: 64x64 latents, 2x2 patches
    img = torch.randn(1, image_tokens, 3072).to(dtype).requires_grad_()
    txt = torch.randn(1, text_tokens, 3072).to(dtype).requires_grad_()
    temb = torch.randn(1, 3072).to(dtype)
    rope = QwenEmbedRope(theta=10000, axes_dim=[16, 56, 56], scale_rope=True)
    freqs = rope([(1, 32, 32)], max_txt_seq_len=text_tokens, device=torch.device("cpu"))

    def step():
        txt_out, img_out = block(hidden_states=img, encoder_hidden_states=txt,
                                 encoder_hidden_states_mask=None, temb=temb,
                                 image_rotary_emb=freqs)
        (img_out.float().sum() + txt_out.float().sum()).backward()

    from kernel_align.diffusers import (KernelAlignQwenImageAttnProcessor,
                                        _block_forward_under_contract)

    def under_contract_step():
        # What under_contract does to each block of a model (its processor, its forward of
        # the library's ops), on this one block.
        processor = block.attn.processor
        block.attn.set_processor(KernelAlignQwenImageAttnProcessor())
        block.forward = _block_forward_under_contract(block)
        try:
            with kernel_align.batch_invariant():
                step()
        finally:
            del block.forward
            block.attn.set_processor(processor)

    times = {"torch": [], "batch_invariant": [], "under_contract": []}
    for _ in range(repeats):
        times["torch"].append(best(step, 1))
        with kernel_align.batch_invariant():
            times["batch_invariant"].append(best(step, 1))
        times["under_contract"].append(best(under_contract_step, 1))
    result = {"threads": threads, "dtype": str(dtype).removeprefix("torch."),
              "torch_s": min(times["torch"]),
              "batch_invariant_s": min(times["batch_invariant"]),
              "under_contract_s": min(times["under_contract"])}
    result["ratio"] = result["batch_invariant_s"] / result["torch_s"]
    result["under_contract_ratio"] = result["under_contract_s"] / result["torch_s"]
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="three shapes, one thread, fp32")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), default=["fp32", "bf16"])
    parser.add_argument("--tokens", type=int, nargs="+", default=[4352, 1, 4],
                        help="M values (4352: a 1024x1024 image's 4096 tokens + 256 text)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--backward", action="store_true")
    parser.add_argument("--block", action="store_true")
    parser.add_argument("--block-dtypes", nargs="+", choices=sorted(DTYPES),
                        default=["bf16", "fp32"])
    parser.add_argument("--json")
    parser.add_argument("--csv")
    args = parser.parse_args(argv)
    shapes = QUICK_SHAPES if args.quick else SHAPES
    threads = [1] if args.quick else args.threads
    dtypes = ["fp32"] if args.quick else args.dtypes
    tokens = [256, 1] if args.quick else args.tokens
    rows = []
    total = len(shapes) * len(tokens) * len(dtypes) * len(threads)
    print(f"{'N x K':>12} {'M':>5} {'act':>9} {'dtype':>5} {'thr':>3} {'ours ms':>9} "
          f"{'torch ms':>9} {'torch/ours':>10} {'GFLOP/s':>8} {'copy/ours':>9}"
          + (f" {'bwd t/o':>8}" if args.backward else ""))
    for t in threads:
        for dtype in dtypes:
            for m in tokens:
                for n, k, activation in shapes:
                    row = measure(n, k, activation, m, DTYPES[dtype], t, args.repeats,
                                  args.backward)
                    rows.append(row)
                    copy = f"{row['copy_over_ours']:9.2f}" if "copy_over_ours" in row else " " * 9
                    line = (f"{n:>6}x{k:<5} {m:>5} {row['activation']:>9} {dtype:>5} {t:>3} "
                            f"{row['ours_ms']:9.3f} {row['torch_ms']:9.3f} "
                            f"{row['torch_over_ours']:10.2f} {row['ours_gflops']:8.1f} {copy}")
                    if args.backward:
                        line += f" {row['backward_torch_over_ours']:8.2f}"
                    print(line, f"[{len(rows)}/{total}]", file=sys.stdout, flush=True)
    document = {"rows": rows}
    if args.block:
        document["block"] = [block_ratio(t, max(2, args.repeats // 2), DTYPES[d])
                             for t in threads for d in args.block_dtypes]
        for r in document["block"]:
            print(f"Qwen-Image block (3072 wide, 512x512 + 64 text), forward+backward, "
                  f"{r['dtype']}, {r['threads']} thread(s): torch {r['torch_s']:.2f} s, "
                  f"batch-invariant {r['batch_invariant_s']:.2f} s (ratio {r['ratio']:.2f}), "
                  f"under the contract {r['under_contract_s']:.2f} s (ratio "
                  f"{r['under_contract_ratio']:.2f}; target <= 1.25)")
    write_outputs(document, args.json, args.csv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
