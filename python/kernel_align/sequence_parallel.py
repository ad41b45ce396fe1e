"""Ulysses-style sequence parallelism for the contract's joint attention.

Under sequence parallelism each rank holds a contiguous share of a sample's tokens; every
per-token layer (the Linears, the norms, the modulation, the RoPE) runs on that share alone,
and only the attention needs every token: Ulysses' all-to-all hands each rank every token
of a subset of the heads, the rank runs the attention of its heads, and a second all-to-all
returns each rank its tokens with every head. Under the contract a head's attention depends
on that sample's valid tokens alone (docs/contract.md section 11), and the all-to-alls move
bytes, so the result is the one-process attention's, bit for bit, whatever the rank count.

``ulysses_attention`` is that exchange around ``kernel_align.attention`` (forward, for a
sampler: the collectives of torch.distributed record no gradient). ``sequence_parallel``
makes the diffusers processor (``kernel_align.diffusers``) run its joint attention so, for
the demonstration and tests of ``python -m kernel_align.alignment grpo``: there the
per-token layers run replicated, each rank keeping its share of the joint tokens around the
attention, which is where sequence parallelism changes what is computed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from . import functional

__all__ = ["joint_attention", "sequence_parallel", "ulysses_attention"]

_GROUP: list = []  # the group of the active sequence_parallel() (torch.distributed's default: None)


def _exchange(chunks: list[torch.Tensor], group) -> list[torch.Tensor]:
    """all_to_all of `chunks` (chunk j to rank j) as raw bytes: every dtype, bit for bit."""
    import torch.distributed as dist

    send = [c.contiguous().view(torch.uint8) for c in chunks]
    received = [torch.empty_like(s) for s in send]
    dist.all_to_all(received, send, group=group)
    return [r.view(c.dtype) for r, c in zip(received, chunks)]


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      mask: torch.Tensor | None = None, *, group=None) -> torch.Tensor:
    """``kernel_align.attention`` over a sequence split across the ranks of ``group``.

    Args:
        q, k, v: this rank's tokens, ``[B, S / P, H, D]`` (layout bshd): rank r holds tokens
            ``[r S / P, (r + 1) S / P)`` of every sample. H must be a multiple of the rank
            count P.
        mask: ``[B, S]`` bool for the whole sequence (true: the token takes part), or None.
        group: a torch.distributed process group (None: the default group).

    Returns:
        This rank's tokens of the attention's output, ``[B, S / P, H, D]``: the bytes of the
        one-process attention of the whole sequence.

    Raises:
        ValueError: H not a multiple of the rank count, or a mask of the wrong shape.
    """
    import torch.distributed as dist

    world = dist.get_world_size(group)
    batch, local, heads, _ = q.shape
    if heads % world != 0:
        raise ValueError(f"kernel_align.ulysses_attention: argument 'q': expected a head count "
                         f"that is a multiple of the {world} ranks, found {heads}")
    if mask is not None and tuple(mask.shape) != (batch, local * world):
        raise ValueError(f"kernel_align.ulysses_attention: argument 'mask': expected shape "
                         f"({batch}, {local * world}), found {tuple(mask.shape)}")
    h = heads // world

    def every_token_of_my_heads(t: torch.Tensor) -> torch.Tensor:
        return torch.cat(_exchange([t[:, :, j * h:(j + 1) * h] for j in range(world)], group),
                         dim=1)

    out = functional.attention(every_token_of_my_heads(q), every_token_of_my_heads(k),
                               every_token_of_my_heads(v), mask, layout="bshd")
    return torch.cat(_exchange([out[:, j * local:(j + 1) * local] for j in range(world)], group),
                     dim=2)


def joint_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    mask: torch.Tensor | None) -> torch.Tensor:
    """The diffusers processor's joint attention: ``kernel_align.attention``, or inside
    ``sequence_parallel()`` the same bytes through ``ulysses_attention``: the replicated joint
    sequence padded (with masked tokens) to a multiple of the ranks, this rank's share taken,
    the attention exchanged, the shares all-gathered and the padding dropped.

    Args:
        q, k, v: the joint ``[text, image]`` tokens of every sample, ``[B, S, H, D]`` (bshd),
            the same on every rank.
        mask: ``[B, S]`` bool (true: the token takes part), or None.

    Returns:
        The attention's output ``[B, S, H, D]``, the bytes of ``kernel_align.attention``.
    """
    if not _GROUP:
        return functional.attention(q, k, v, mask, layout="bshd")
    import torch.distributed as dist

    group = _GROUP[-1]
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    batch, seq = q.shape[:2]
    local = -(-seq // world)
    pad = local * world - seq
    full_mask = mask if mask is not None else torch.ones(batch, seq, dtype=torch.bool)
    if pad:
        def padded(t):
            return torch.cat([t, t.new_zeros((batch, pad, *t.shape[2:]))], dim=1)

        q, k, v = padded(q), padded(k), padded(v)
        full_mask = torch.cat([full_mask.to(torch.bool),
                               torch.zeros(batch, pad, dtype=torch.bool)], dim=1)
    share = slice(rank * local, (rank + 1) * local)
    mine = ulysses_attention(q[:, share], k[:, share], v[:, share],
                             full_mask if (pad or mask is not None) else None, group=group)
    shares = [torch.empty_like(mine).view(torch.uint8) for _ in range(world)]
    dist.all_gather(shares, mine.contiguous().view(torch.uint8), group=group)
    return torch.cat([s.view(mine.dtype) for s in shares], dim=1)[:, :seq]


@contextlib.contextmanager
def sequence_parallel(group=None) -> Iterator[None]:
    """Inside: the ``kernel_align.diffusers`` processor runs its joint attention through
    ``ulysses_attention`` over the ranks of ``group`` (torch.distributed's default: None)."""
    _GROUP.append(group)
    try:
        yield
    finally:
        _GROUP.pop()
