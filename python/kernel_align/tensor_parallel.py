"""Tensor-parallel Linear layers whose every rank gets the unsharded call's bytes.

A row-parallel Linear (K split over the ranks, as Megatron and FSDP-TP shard the second
Linear of an MLP) sums partial products across ranks, and a plain all-reduce sums them in
an order the backend chooses: a TP=2 sampler and a TP=1 trainer then part bits. Here each
rank computes its shard's sum by the contract's tree in fp32 (``linear`` with
``out_dtype=torch.float32``), the partials are gathered in rank order and combined by the
top levels of the same tree (``kernel_align::contract::linear_combine_shards``), then the
bias, the activation and the one rounding: the bytes of ``linear`` on the whole K, on
every rank, whenever ``shards_reproduce(K, world_size)``; any other split is refused.
A column-parallel Linear (N split) needs nothing: each rank's columns are the unsharded
call's columns, and gathering them in rank order gives its output.

Forward only (a sampler's, or a trainer's recomputation): the gathers are not
differentiable. The combination runs on the CPU (partials of CUDA tensors are refused).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ._ops import as_str, check_tensors, ops
from .functional import linear

__all__ = ["shards_reproduce", "row_parallel_linear", "column_parallel_linear"]


def shards_reproduce(k: int, parts: int) -> bool:
    """Whether ``parts`` equal shards of a reduction of length ``k``, each summed by the
    contract's tree and combined in its order, give the unsharded sum bit for bit: ``parts``
    a power of two dividing the tree's group count, and k/parts a multiple of its 32-long
    leaf (docs/contract.md section 10)."""
    return bool(ops.linear_shards_reproduce(int(k), int(parts)))


def row_parallel_linear(x_shard: torch.Tensor, weight_shard: torch.Tensor,
                        bias: torch.Tensor | None = None, *, activation: str | None = None,
                        group=None) -> torch.Tensor:
    """The unsharded ``linear(x, weight, bias)`` on every rank of ``group``, from this
    rank's K columns: ``x_shard`` ``[..., K/P]`` and ``weight_shard`` ``[N, K/P]`` hold
    shard ``rank`` of P = the group's size, in rank order; ``bias`` (``[N]``, the whole
    bias, on every rank) and the activation are applied once, after the combination.
    ValueError when the contract's tree cannot reproduce a P-way split of K."""
    op = "row_parallel_linear"
    check_tensors(op, ("bias",), x_shard=x_shard, weight_shard=weight_shard, bias=bias)
    act = "none" if activation is None else as_str(op, "activation", activation)
    parts = dist.get_world_size(group)
    k = x_shard.shape[-1] * parts
    if not shards_reproduce(k, parts):
        raise ValueError(
            f"kernel_align.{op}: argument 'x_shard': expected a split of K that the "
            f"contract's tree reproduces (P a power of two dividing the tree's group count, "
            f"K/P a multiple of 32), found K = {k} over P = {parts} ranks")
    partial = linear(x_shard, weight_shard, out_dtype=torch.float32).contiguous()
    gathered = [torch.empty_like(partial) for _ in range(parts)]
    dist.all_gather(gathered, partial, group=group)
    return ops.linear_combine_shards(gathered, bias, act, x_shard.dtype)


def column_parallel_linear(x: torch.Tensor, weight_shard: torch.Tensor,
                           bias_shard: torch.Tensor | None = None, *,
                           activation: str | None = None, group=None,
                           gather: bool = True) -> torch.Tensor:
    """This rank's N columns of ``linear(x, weight, bias, activation=...)`` (``weight_shard``
    ``[N/P, K]``, ``bias_shard`` ``[N/P]``, shard ``rank`` of ``group``, a torch.distributed
    process group, None: the default one), or with ``gather`` every rank's, concatenated in
    rank order: the unsharded output's bytes."""
    y = linear(x, weight_shard, bias_shard, activation=activation)
    if not gather:
        return y
    parts = [torch.empty_like(y) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, y.contiguous(), group=group)
    return torch.cat(parts, dim=-1)
