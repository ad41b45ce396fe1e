"""The cost of kernel_align.alignment's module hooks (docs/alignment.md): the fixed cost
of one hooked module call (a chain of 1000 Identity modules on a [4, 8] tensor, with
hooks and without), and digest-v1's throughput on a large bf16 tensor digested per
sample. Run with the set-up's .venv: .venv/bin/python bench/alignment_overhead.py"""

import tempfile
import time
from pathlib import Path

import torch

from kernel_align import alignment


class Chain(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Identity() for _ in range(n)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def best_of(step, repeats=20):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return min(times)


def main():
    model, x = Chain(1000), torch.randn(4, 8)
    best_of(lambda: model(x), 3)  # warm-up
    plain = best_of(lambda: model(x))
    with tempfile.TemporaryDirectory() as d:
        with alignment.digest_modules(model, Path(d) / "t.jsonl") as recorder:
            model(x)
            per_step = recorder.records
            hooked = best_of(lambda: model(x))
    print(f"fixed cost of a hooked module call ([4, 8] fp32 output): "
          f"{(hooked - plain) / per_step * 1e6:.1f} us ({per_step} calls a step)")
    big = torch.randn(4, 1024, 1024).bfloat16()
    seconds = best_of(lambda: alignment.digests(big, 0), 10)
    print(f"digest-v1 throughput (bf16 [4, 1024, 1024], per sample): "
          f"{big.numel() * big.element_size() / seconds / 1e9:.2f} GB/s")


if __name__ == "__main__":
    main()
