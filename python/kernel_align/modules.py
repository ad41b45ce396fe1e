"""nn.Module forms of the operators."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .functional import multi_axis_rope, qk_rmsnorm
from .positions import rope_tables

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
        self.axes_dim, self.theta = tuple(axes_dim), theta
        self.pairing, self.layout = pairing, layout

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_tables(positions, self.axes_dim, self.theta)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return multi_axis_rope(x, cos, sin, pairing=self.pairing, layout=self.layout)

    def extra_repr(self) -> str:
        return (f"axes_dim={self.axes_dim}, theta={self.theta}, pairing={self.pairing!r}, "
                f"layout={self.layout!r}")
