"""Tensor parallel on a real engine: torch.distributed with the gloo backend, 2 and 4
ranks started here; a row-parallel (K split) and a column-parallel (N split) Linear give
every rank the unsharded call's bytes, and a split the tree cannot reproduce is refused."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from kernel_align import linear
from kernel_align.tensor_parallel import (
    column_parallel_linear,
    row_parallel_linear,
    shards_reproduce,
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _inputs(k: int, dtype: torch.dtype):
    g = torch.Generator().manual_seed(k)
    x = torch.randn(6, 5, k, generator=g).to(dtype)
    w = (torch.randn(48, k, generator=g) / k**0.5).to(dtype)
    b = torch.randn(48, generator=g).to(dtype)
    return x, w, b


def _rank(rank: int, world: int, port: int, failures) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        for k in (256, 3072):
            for dtype in (torch.float32, torch.bfloat16):
                x, w, b = _inputs(k, dtype)
                part = k // world
                cols = slice(rank * part, (rank + 1) * part)
                want = linear(x, w, b)
                got = row_parallel_linear(x[..., cols].contiguous(), w[:, cols].contiguous(), b)
                if not torch.equal(got.view(torch.uint8), want.view(torch.uint8)):
                    failures.put(f"row-parallel K {k} {dtype} rank {rank}/{world}")
                rows = slice(rank * 48 // world, (rank + 1) * 48 // world)
                want = linear(x, w, b, activation="gelu_tanh")
                got = column_parallel_linear(x, w[rows], b[rows], activation="gelu_tanh")
                if not torch.equal(got.view(torch.uint8), want.view(torch.uint8)):
                    failures.put(f"column-parallel K {k} {dtype} rank {rank}/{world}")
        x, w, _ = _inputs(96, torch.float32)  # 96 / 2 = 48: shards would split a leaf
        try:
            row_parallel_linear(x[..., :96 // world], w[:, :96 // world])
            failures.put(f"K 96 over {world} ranks was not refused")
        except ValueError as e:
            if "argument 'x_shard'" not in str(e):
                failures.put(f"K 96: {e}")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 4])
def test_sharded_linear_gives_the_unsharded_bytes_on_every_rank(world):
    failures = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(_rank, args=(world, _free_port(), failures), nprocs=world,
                       start_method="spawn")
    found = []
    while not failures.empty():
        found.append(failures.get())
    assert not found, "\n".join(found)


def test_shards_reproduce_is_the_contracts_rule():
    assert shards_reproduce(3072, 2) and shards_reproduce(3072, 8) and shards_reproduce(256, 8)
    assert not shards_reproduce(96, 2)  # 48-long shards split a leaf
    assert not shards_reproduce(3072, 3)  # not a power of two
    assert not shards_reproduce(3072 * 3, 64)  # 288 leaves are 32 groups of 9: not 64 parts
