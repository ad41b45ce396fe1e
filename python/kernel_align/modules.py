"""nn.Module forms of the operators."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ._ops import ops
from .functional import multi_axis_rope, qk_rmsnorm
from .positions import POSITION_AXES, rope_tables

__all__ = ["QkRmsNorm", "MultiAxisRope"]


class QkRmsNorm(nn.Module):
    """Per-head RMSNorm over the last dim ``dim``, with a learned weight (ones at
    start) unless ``elementwise_affine=False``. ``mode``: "single" or "diffusers"
    (see ``kernel_align.qk_rmsnorm``)."""

    def __init__(
        self,
        dim: int,
        *,
        eps: float = 1e-6,
        elementwise_affine: bool = True,
        mode: str = "single",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        # Refused here rather than at the first call, by the library's own rules.
        ops.check_options(dim, eps, mode, None, None)
        self.dim, self.eps, self.mode = dim, eps, mode
        self.weight = (
            nn.Parameter(torch.ones(dim, device=device, dtype=dtype))
            if elementwise_affine
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return qk_rmsnorm(x, self.weight, eps=self.eps, mode=self.mode)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}, mode={self.mode!r}, weight={self.weight is not None}"


class MultiAxisRope(nn.Module):
    """Multi-axis RoPE with fixed axes, theta, pairing and layout. ``tables(positions)``
    builds the cos/sin tables that ``forward(x, cos, sin)`` applies."""

    def __init__(
        self,
        axes_dim: Sequence[int] = (16, 56, 56),
        *,
        theta: float = 10000.0,
        pairing: str = "interleaved",
        layout: str = "bshd",
    ) -> None:
        super().__init__()
        # Refused here rather than at the first call: one axis per column of the positions
        # kernel_align builds, then the library's own rules (the axes and theta by building
        # the tables of one token, which traces nothing).
        axes_dim = tuple(axes_dim)
        if len(axes_dim) != POSITION_AXES:
            raise ValueError(
                "kernel_align.MultiAxisRope: argument 'axes_dim': expected 3 dims, one per "
                f"position axis (frame, height, width), found {axes_dim!r}")
        rope_tables(torch.zeros(1, POSITION_AXES, dtype=torch.int32), axes_dim, theta)
        ops.check_options(None, None, None, pairing, layout)
        self.axes_dim, self.theta = axes_dim, theta
        self.pairing, self.layout = pairing, layout

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_tables(positions, self.axes_dim, self.theta)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return multi_axis_rope(x, cos, sin, pairing=self.pairing, layout=self.layout)

    def extra_repr(self) -> str:
        return (f"axes_dim={self.axes_dim}, theta={self.theta}, pairing={self.pairing!r}, "
                f"layout={self.layout!r}")
