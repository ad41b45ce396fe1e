"""The operators as Python functions. Each checks devices, then calls the
``torch.ops.kernel_align`` operator, so eager calls, autograd and ``torch.compile``
all run the library's C++ code (docs/contract.md gives its bytes).

Tensors may be fp32, bf16 or fp16, contiguous or strided (views of permuted or sliced
tensors are read in place). cos/sin tables are fp32 ``[S, D/2]`` constants (see
``rope_tables``); no gradient flows into them.
"""

from __future__ import annotations

import torch

from ._ops import FUSED_WEIGHT_NAMES, check_constant_tables, check_tensors, ops

__all__ = [
    "qk_rmsnorm",
    "multi_axis_rope",
    "multi_axis_rope_",
    "qk_norm_rope",
    "qk_norm_rope_",
]


def qk_rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    *,
    eps: float = 1e-6,
    mode: str = "single",
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """RMSNorm over the last dim D (even, 2..4096) of a 1-4-D tensor.

    mode "single": ``y = out(x * rstd * w)``, one rounding (the seed); "diffusers":
    ``y = out(w_dtype(x * rstd) * w)``, diffusers' RMSNorm. ``out_dtype`` defaults to
    x's dtype. Differentiable in x and weight.
    """
    check_tensors("qk_rmsnorm", ("weight",), x=x, weight=weight)
    return ops.qk_rmsnorm(x, weight, eps, mode, out_dtype)


def multi_axis_rope(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    pairing: str = "interleaved",
    layout: str = "bshd",
) -> torch.Tensor:
    """Rotary embedding of a 4-D ``x`` in ``layout`` ("bshd" ``[B, S, H, D]`` or "bhsd"
    ``[B, H, S, D]``); row s of the tables rotates sequence position s. ``pairing``:
    "interleaved" pairs ``(x[2i], x[2i+1])`` (diffusers), "half" pairs ``(x[i],
    x[i + D/2])`` (the seed). Differentiable in x."""
    check_tensors("multi_axis_rope", x=x, cos=cos, sin=sin)
    return ops.multi_axis_rope(x, cos, sin, pairing, layout)


class _RopeInPlace(torch.autograd.Function):
    """In-place RoPE whose backward is the transpose rotation of the gradient."""

    @staticmethod
    def forward(ctx, x, cos, sin, pairing, layout):
        ops.multi_axis_rope_(x, cos, sin, pairing, layout)
        ctx.mark_dirty(x)
        ctx.save_for_backward(cos, sin)
        ctx.pairing, ctx.layout = pairing, layout
        return x

    @staticmethod
    def backward(ctx, dy):
        cos, sin = ctx.saved_tensors
        dx = ops.multi_axis_rope_backward(dy, cos, sin, ctx.pairing, ctx.layout)
        return dx, None, None, None, None


def multi_axis_rope_(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    pairing: str = "interleaved",
    layout: str = "bshd",
) -> torch.Tensor:
    """``multi_axis_rope`` written into ``x`` itself (no new tensor); returns x. Under
    autograd the rotation is recorded as an in-place op of x, like torch's own
    in-place ops (a leaf that requires grad cannot be rotated in place)."""
    check_tensors("multi_axis_rope_", x=x, cos=cos, sin=sin)
    if torch.is_grad_enabled() and x.requires_grad:
        check_constant_tables("multi_axis_rope_", cos, sin)
        return _RopeInPlace.apply(x, cos, sin, pairing, layout)
    ops.multi_axis_rope_(x, cos, sin, pairing, layout)
    return x


def qk_norm_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    text_len: int = 0,
    text_q_weight: torch.Tensor | None = None,
    text_k_weight: torch.Tensor | None = None,
    image_q_weight: torch.Tensor | None = None,
    image_k_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    mode: str = "diffusers",
    pairing: str = "interleaved",
    layout: str = "bshd",
    out_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rope(qk_rmsnorm(q))`` and the same for k in one pass: sequence positions below
    ``text_len`` are text (normalised with the text weights), the rest image. q and k
    share B, S and D (head counts may differ). Bytes equal to the unfused ops with the
    intermediate in the output dtype. Differentiable in q, k and the four weights."""
    check_tensors("qk_norm_rope", FUSED_WEIGHT_NAMES, q=q, k=k, cos=cos, sin=sin, text_q_weight=text_q_weight,
                  text_k_weight=text_k_weight, image_q_weight=image_q_weight,
                  image_k_weight=image_k_weight)
    return ops.qk_norm_rope(q, k, text_q_weight, text_k_weight, image_q_weight, image_k_weight,
                            cos, sin, text_len, eps, mode, pairing, layout, out_dtype)


def qk_norm_rope_(
    q: torch.Tensor,
    k: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    text_len: int = 0,
    text_q_weight: torch.Tensor | None = None,
    text_k_weight: torch.Tensor | None = None,
    image_q_weight: torch.Tensor | None = None,
    image_k_weight: torch.Tensor | None = None,
    eps: float = 1e-6,
    mode: str = "diffusers",
    pairing: str = "interleaved",
    layout: str = "bshd",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``qk_norm_rope`` written into q and k themselves; returns (q, k). For inference:
    the backward needs the inputs this overwrites, so it refuses tensors that require
    grad (use ``qk_norm_rope``)."""
    check_tensors("qk_norm_rope_", FUSED_WEIGHT_NAMES, q=q, k=k, cos=cos, sin=sin, text_q_weight=text_q_weight,
                  text_k_weight=text_k_weight, image_q_weight=image_q_weight,
                  image_k_weight=image_k_weight)
    weights = (text_q_weight, text_k_weight, image_q_weight, image_k_weight)
    if torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, k, *weights)
    ):
        raise ValueError(
            "kernel_align.qk_norm_rope_: expected tensors without autograd (the in-place op "
            "overwrites q and k, which its backward needs), found one that requires grad: "
            "use qk_norm_rope, or torch.no_grad()"
        )
    ops.qk_norm_rope_(q, k, *weights, cos, sin, text_len, eps, mode, pairing, layout)
    return q, k
