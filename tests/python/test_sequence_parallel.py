"""kernel_align.sequence_parallel: Ulysses' attention over 2 and 3 ranks (torch.distributed,
gloo, processes started here) gives each rank the one-process attention's bytes of its
tokens, with padded prompts (a mask) and a sequence the ranks do not divide (joint_attention
pads it); a head count the ranks do not divide is refused."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import kernel_align as ka
from kernel_align import sequence_parallel as sp


def _inputs(heads):
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 13, heads, 16, generator=g).to(torch.bfloat16) for _ in range(3))
    mask = torch.ones(2, 13, dtype=torch.bool)
    mask[0, 9:] = False  # sample 0's padding
    return q, k, v, mask


def _rank(rank, world, init, heads, out):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        q, k, v, mask = _inputs(heads)
        with sp.sequence_parallel():
            joint = sp.joint_attention(q, k, v, mask)
        # ulysses_attention itself, on a sequence the ranks divide (the first 12 tokens).
        local = 12 // world
        share = slice(rank * local, (rank + 1) * local)
        mine = sp.ulysses_attention(q[:, :12][:, share], k[:, :12][:, share],
                                    v[:, :12][:, share], mask[:, :12])
        try:
            sp.ulysses_attention(q[:, share, :1], k[:, share, :1], v[:, share, :1])
            refused = ""
        except ValueError as e:
            refused = str(e)
        torch.save({"joint": joint, "mine": mine, "refused": refused}, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_each_rank_gets_the_one_process_bytes(world):
    heads = 6
    q, k, v, mask = _inputs(heads)
    whole = ka.attention(q, k, v, mask)
    whole12 = ka.attention(q[:, :12], k[:, :12], v[:, :12], mask[:, :12])
    with tempfile.TemporaryDirectory() as directory:
        out = os.path.join(directory, "out")
        mp.spawn(_rank, args=(world, "file://" + os.path.join(directory, "rendezvous"), heads,
                              out), nprocs=world, join=True)
        results = [torch.load(f"{out}.{r}") for r in range(world)]
    local = 12 // world
    for rank, r in enumerate(results):
        assert torch.equal(r["joint"], whole)
        assert torch.equal(r["mine"], whole12[:, rank * local:(rank + 1) * local])
        assert "argument 'q'" in r["refused"] and "multiple" in r["refused"]
