"""nn.Module forms of the operators: ``QkRmsNorm`` (a per-head RMSNorm with a learned
weight) and ``MultiAxisRope`` (RoPE with fixed axes, theta, pairing and layout). Both check
their options when built, by the rules the ops apply when called (a ``ValueError`` naming
the argument), and call the functions of ``kernel_align.functional`` in ``forward``."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from ._ops import as_float, as_int, as_str, ops
from .functional import multi_axis_rope, qk_rmsnorm
from .positions import POSITION_AXES, rope_tables

__all__ = ["QkRmsNorm", "MultiAxisRope"]


class QkRmsNorm(nn.Module):
    """Per-head RMSNorm over the last dim ``dim``, with a learned weight (ones at
    start) unless ``elementwise_affine=False``. ``mode``: "single" or "diffusers"
    (see ``kernel_align.qk_rmsnorm``).

    Attributes:
        dim: the normalised (head) dim D.
        eps: the epsilon added to the mean square.
        mode: "single" or "diffusers".
        weight: ``nn.Parameter`` of shape ``[dim]``, or None without elementwise_affine.
    """

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
        """Builds the norm; nothing is computed.

        Args:
            dim: the head dim D, even, 2 to 4096.
            eps: added to the mean square; finite, >= 0 and representable in fp32.
            elementwise_affine: whether there is a learned weight (ones at start).
            mode: "single" or "diffusers" (see ``kernel_align.qk_rmsnorm``).
            device: where the weight is allocated (torch's default device when None).
            dtype: the weight's dtype, fp32, bf16 or fp16 (torch's default dtype when
                None); another is refused at the first call (TypeError).

        Raises:
            TypeError: dim not an int, eps not a real number, mode not a str.
            ValueError: a dim, eps or mode the op would refuse.
        """
        super().__init__()
        # Refused here rather than at the first call, by the library's own rules.
        op = "QkRmsNorm"
        ops.check_options(as_int(op, "dim", dim), as_float(op, "eps", eps),
                          as_str(op, "mode", mode), None, None)
        self.dim, self.eps, self.mode = dim, eps, mode
        self.weight = (
            nn.Parameter(torch.ones(dim, device=device, dtype=dtype))
            if elementwise_affine
            else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``kernel_align.qk_rmsnorm(x, self.weight, eps=self.eps, mode=self.mode)``.

        Args:
            x: ``[..., dim]``, 1 to 4 dims, fp32, bf16 or fp16 (not modified).

        Returns:
            A new tensor of x's shape and dtype.

        Raises:
            TypeError, ValueError: as ``kernel_align.qk_rmsnorm`` (e.g. x's last dim is
                not ``dim``: the weight's length does not match).
        """
        return qk_rmsnorm(x, self.weight, eps=self.eps, mode=self.mode)

    def extra_repr(self) -> str:
        """The options shown by ``repr(module)``: dim, eps, mode and whether it has a weight."""
        return f"{self.dim}, eps={self.eps}, mode={self.mode!r}, weight={self.weight is not None}"


class MultiAxisRope(nn.Module):
    """Multi-axis RoPE with fixed axes, theta, pairing and layout. ``tables(positions)``
    builds the cos/sin tables that ``forward(x, cos, sin)`` applies. No parameters.

    Attributes:
        axes_dim: the tuple of three axis dims (frame, height, width).
        theta: the RoPE base.
        pairing: "interleaved" or "half".
        layout: "bshd" or "bhsd".
    """

    def __init__(
        self,
        axes_dim: Sequence[int] = (16, 56, 56),
        *,
        theta: float = 10000.0,
        pairing: str = "interleaved",
        layout: str = "bshd",
    ) -> None:
        """Builds the module; checks the options (by building the tables of one token).

        Args:
            axes_dim: three even dims, one per position axis (frame, height, width), each
                2 to 4096, summing to the head dim D (at most 4096).
            theta: the base of the frequencies; finite, > 0, representable in fp32.
            pairing: "interleaved" (diffusers) or "half" (the seed).
            layout: "bshd" or "bhsd".

        Raises:
            TypeError: an axis dim not an int, theta not a real number, pairing or layout
                not a str.
            ValueError: not three axes, a bad axis dim or theta, an unknown pairing or
                layout.
        """
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
        ops.check_options(None, None, None, as_str("MultiAxisRope", "pairing", pairing),
                          as_str("MultiAxisRope", "layout", layout))
        self.axes_dim, self.theta = axes_dim, theta
        self.pairing, self.layout = pairing, layout

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``kernel_align.rope_tables(positions, self.axes_dim, self.theta)``.

        Args:
            positions: integer ``[S, 3]`` CPU tensor, e.g. from
                ``kernel_align.qwen_image_rope_positions``.

        Returns:
            ``(cos, sin)``, fp32 CPU tensors ``[S, sum(axes_dim)/2]``.

        Raises:
            TypeError, ValueError: as ``kernel_align.rope_tables``.
        """
        return rope_tables(positions, self.axes_dim, self.theta)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """``kernel_align.multi_axis_rope(x, cos, sin)`` with the module's pairing and layout.

        Args:
            x: 4-D in the module's layout, D = sum(axes_dim); fp32, bf16 or fp16 (not
                modified).
            cos: fp32 ``[S, D/2]`` from ``tables`` (on x's device).
            sin: fp32 ``[S, D/2]`` likewise.

        Returns:
            A new tensor of x's shape and dtype.

        Raises:
            TypeError, ValueError: as ``kernel_align.multi_axis_rope``.
        """
        return multi_axis_rope(x, cos, sin, pairing=self.pairing, layout=self.layout)

    def extra_repr(self) -> str:
        """The options shown by ``repr(module)``: axes_dim, theta, pairing and layout."""
        return (f"axes_dim={self.axes_dim}, theta={self.theta}, pairing={self.pairing!r}, "
                f"layout={self.layout!r}")
