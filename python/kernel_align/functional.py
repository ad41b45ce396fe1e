"""The operators as Python functions. Each checks devices, then calls the
``torch.ops.kernel_align`` operator, so eager calls, autograd and ``torch.compile``
all run the library's C++ code (docs/contract.md gives its bytes).

Tensors may be fp32, bf16 or fp16, contiguous or strided (views of permuted or sliced
tensors are read in place). cos/sin tables are fp32 ``[S, D/2]`` constants (see
``rope_tables``); no gradient flows into them. Every tensor of a call lives on one
device: the CPU, or a CUDA device where ``kernel_align.HAS_CUDA``.

Errors common to every function here (the message names the op, the argument, what
was expected and what was found; a refused call writes nothing):

- ``TypeError``: an argument that must be a tensor is not a dense ``torch.Tensor`` (a
  list, a numpy array, None, a sparse or nested tensor), or a tensor's dtype (or
  ``out_dtype``) is not torch.float32, torch.bfloat16 or torch.float16; a scalar argument
  of another type (``text_len=1.5``, ``eps="1e-6"``, ``mode=1``, ``out_dtype="float32"``).
- ``ValueError``: an integer argument outside int64 (``text_len=2**63``), and everything
  the C++ library refuses (``kernel_align::Error``), checked before any output is
  allocated: a tensor
  on another device (meta, CUDA without ``HAS_CUDA``) or tensors on two devices, a wrong
  rank, shape or head dim, an empty tensor, a negated view (``.resolve_neg()`` it), an
  unknown option string, ``eps`` not finite, negative or not representable in fp32, an
  output sharing memory with an input (views of one buffer that share no element, such
  as q and k of a packed QKV tensor, do not), outputs larger than the device's memory
  (RAM and swap on the CPU), a table that requires grad where autograd records the call,
  and, in strict mode, a call the first-choice backend cannot run.
- ``NotImplementedError``: double backward through the norms (a gradient of the
  gradient of ``qk_rmsnorm`` or ``qk_norm_rope``).

**out=**: ``qk_rmsnorm``, ``multi_axis_rope``, ``qk_norm_rope``, ``adaln_modulation`` and
``adaln_gate_residual`` take ``out=`` (a tensor, or the ``(q_out, k_out)`` pair), as torch's
own ops do: the result is written there and
``out`` returned, so a loop that reuses its buffers allocates nothing per call (a fresh
output above glibc's mmap threshold page-faults on first write: docs/python.md, "Speed
in practice"). The bytes are the allocating call's. An out tensor has the output's
shape exactly (it is never resized), any strides, and its own dtype is the output's
(``out_dtype`` may be omitted or must equal it); it must not share memory with an input
or another output, except as an op's in-place form allows (``adaln_modulation``'s out
may be x; ``adaln_gate_residual``'s x or y). As for torch's out= functions, no gradient
is recorded: while grad mode is on, an argument that requires grad (an input or an out
tensor) is refused (RuntimeError) before anything is written. The raw operators are
``torch.ops.kernel_align.*_out`` (the norm and RoPE backward ops too:
``qk_rmsnorm_backward_out``, ``multi_axis_rope_backward_out``,
``qk_norm_rope_backward_out``, whose optional weight
gradients are written where given).
"""

from __future__ import annotations

import torch

from ._ops import FUSED_WEIGHT_NAMES, as_dtype, as_float, as_int, as_str, check_tensors, ops


def check_out(op: str, out_dtype: torch.dtype | None, **outputs: torch.Tensor) -> None:
    """The out= tensors are tensors; out_dtype, if given, is theirs (the outputs' dtype is
    the out tensors' own). Shapes, devices and overlap are the library's to check."""
    check_tensors(op, **outputs)
    for name, tensor in outputs.items():
        if out_dtype is not None and tensor.dtype != out_dtype:
            raise ValueError(f"kernel_align.{op}: argument 'out_dtype': expected None or "
                             f"{name}'s dtype {tensor.dtype}, found {out_dtype}")

__all__ = [
    "activation",
    "adaln_gate_residual",
    "adaln_modulation",
    "attention",
    "flow_sde_step_logp",
    "latent_grid",
    "latent_normalize",
    "latent_pack",
    "latent_unpack",
    "linear",
    "qk_rmsnorm",
    "multi_axis_rope",
    "multi_axis_rope_",
    "qk_norm_rope",
    "qk_norm_rope_",
    "true_cfg",
]


def qk_rmsnorm(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    *,
    eps: float = 1e-6,
    mode: str = "single",
    out_dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """RMSNorm over the last dim D (even, 2..4096) of a 1-4-D tensor.

    mode "single": ``y = out(x * rstd * w)``, one rounding (the seed); "diffusers":
    ``y = out(w_dtype(x * rstd) * w)``, diffusers' RMSNorm. ``out_dtype`` defaults to
    x's dtype. Differentiable in x and weight (first order). Every other dim indexes
    independent rows: a row's bytes do not depend on the others (docs/contract.md
    section 3). Not in place: x is only read.

    Args:
        x: the input, ``[..., D]`` with 1 to 4 dims, fp32, bf16 or fp16, any strides.
        weight: the learned scale, ``[D]``, any of the three dtypes, or None (a weight of
            ones, which is exact).
        eps: added to the mean square; finite, >= 0 and representable in fp32.
        mode: "single" or "diffusers" (equal with an fp32 weight or no weight).
        out_dtype: the output's dtype (fp32, bf16 or fp16); None: x's dtype.
        out: a tensor to write the result into instead of a new one (see "out=" below).

    Returns:
        A new tensor of x's shape and strides (``torch.empty_like``), dtype ``out_dtype``;
        with ``out``, ``out`` itself, written.

    Raises:
        TypeError: x or weight is not a dense tensor, or x, weight or out_dtype has a
            dtype other than fp32, bf16, fp16.
        ValueError: D odd or outside 2..4096, x of rank 0 or above 4, weight not ``[D]``,
            an empty tensor, bad eps or mode, a tensor not on the CPU (or a CUDA device
            with ``HAS_CUDA``), tensors on two devices, a strict-mode fallback.
        NotImplementedError: a double backward through this op.
    """
    check_tensors("qk_rmsnorm", ("weight",), x=x, weight=weight)
    op = "qk_rmsnorm"
    eps, mode = as_float(op, "eps", eps), as_str(op, "mode", mode)
    out_dtype = as_dtype(op, "out_dtype", out_dtype)
    if out is None:
        return ops.qk_rmsnorm(x, weight, eps, mode, out_dtype)
    check_out(op, out_dtype, out=out)
    ops.qk_rmsnorm_out(x, weight, eps, mode, out)
    return out


def multi_axis_rope(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    pairing: str = "interleaved",
    layout: str = "bshd",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rotary embedding of a 4-D ``x`` in ``layout`` ("bshd" ``[B, S, H, D]`` or "bhsd"
    ``[B, H, S, D]``); row s of the tables rotates sequence position s. ``pairing``:
    "interleaved" pairs ``(x[2i], x[2i+1])`` (diffusers), "half" pairs ``(x[i],
    x[i + D/2])`` (the seed). Differentiable in x, to any order (the gradient is the
    transpose rotation). Not in place: see ``multi_axis_rope_``.

    Args:
        x: ``[B, S, H, D]`` (bshd) or ``[B, H, S, D]`` (bhsd), D even 2..4096; fp32, bf16
            or fp16, any strides.
        cos: fp32 ``[S, D/2]``: column i is the cosine of pair i's angle (``rope_tables``).
            A constant: it must not require grad when autograd records the call.
        sin: fp32 ``[S, D/2]``, the sines, likewise.
        pairing: "interleaved" or "half".
        layout: "bshd" or "bhsd": which dim of x is the sequence.
        out: a tensor to write the result into instead of a new one (see "out=" below).

    Returns:
        A new tensor of x's shape, dtype and strides (``torch.empty_like``); with
        ``out``, ``out`` itself, written.

    Raises:
        TypeError: x, cos or sin is not a dense tensor, or x has another dtype.
        ValueError: x not 4-D or D odd or outside 2..4096; cos or sin not fp32 ``[S, D/2]``
            for the S of x in ``layout``; an unknown pairing or layout; a table that
            requires grad (under autograd); a device the extension does not run, tensors
            on two devices; a strict-mode fallback.
    """
    check_tensors("multi_axis_rope", x=x, cos=cos, sin=sin)
    op = "multi_axis_rope"
    pairing, layout = as_str(op, "pairing", pairing), as_str(op, "layout", layout)
    if out is None:
        return ops.multi_axis_rope(x, cos, sin, pairing, layout)
    check_out(op, None, out=out)
    ops.multi_axis_rope_out(x, cos, sin, pairing, layout, out)
    return out


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
    in-place ops (a leaf that requires grad cannot be rotated in place). The raw
    ``torch.ops.kernel_align.multi_axis_rope_`` behaves the same.

    In place: x is overwritten (its version counter bumps, so a backward that needs x's
    old value raises torch's "modified by an inplace operation") and returned; it must
    not overlap cos or sin, nor itself (an expanded view). A refused call leaves x as it
    was.

    Args:
        x: the tensor to rotate, ``[B, S, H, D]`` (bshd) or ``[B, H, S, D]`` (bhsd); fp32,
            bf16 or fp16, any non-overlapping strides.
        cos: fp32 ``[S, D/2]`` cosines (a constant, as in ``multi_axis_rope``).
        sin: fp32 ``[S, D/2]`` sines.
        pairing: "interleaved" or "half".
        layout: "bshd" or "bhsd".

    Returns:
        x itself, rotated.

    Raises:
        TypeError: as ``multi_axis_rope``.
        ValueError: as ``multi_axis_rope`` (a table that requires grad while grad mode is
            on, whether or not x does), and x overlapping a table or itself.
        RuntimeError: torch's, for x a leaf that requires grad (or a view of one) while
            grad mode is on, or an inference tensor outside ``torch.inference_mode()``.
    """
    check_tensors("multi_axis_rope_", x=x, cos=cos, sin=sin)
    op = "multi_axis_rope_"
    ops.multi_axis_rope_(x, cos, sin, as_str(op, "pairing", pairing), as_str(op, "layout", layout))
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
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rope(qk_rmsnorm(q))`` and the same for k in one pass: sequence positions below
    ``text_len`` are text (normalised with the text weights), the rest image. q and k
    share B, S and D (head counts may differ). Bytes equal to the unfused ops with the
    intermediate in the output dtype. Differentiable in q, k and the four weights (first
    order; a weight gradient of a stream without positions is 0). Not in place: see
    ``qk_norm_rope_``.

    Args:
        q: queries, ``[B, S, Hq, D]`` (bshd) or ``[B, Hq, S, D]`` (bhsd), D even 2..4096;
            fp32, bf16 or fp16, any strides.
        k: keys, ``[B, S, Hk, D]`` or ``[B, Hk, S, D]``: q's B, S and D, any dtype of the
            three.
        cos: fp32 ``[S, D/2]`` cosines (``rope_tables``; a constant).
        sin: fp32 ``[S, D/2]`` sines.
        text_len: how many leading sequence positions are text, 0 to S.
        text_q_weight: ``[D]`` weight of q's text positions, or None (no weight).
        text_k_weight: ``[D]`` weight of k's text positions, or None.
        image_q_weight: ``[D]`` weight of q's image positions, or None.
        image_k_weight: ``[D]`` weight of k's image positions, or None.
        eps: as in ``qk_rmsnorm``.
        mode: "diffusers" (default) or "single", as in ``qk_rmsnorm``.
        pairing: "interleaved" or "half", as in ``multi_axis_rope``.
        layout: "bshd" or "bhsd", as in ``multi_axis_rope``.
        out_dtype: the dtype of both outputs; None: q's for q_out, k's for k_out.
        out: ``(q_out, k_out)`` to write the results into instead of new tensors (see
            "out=" below).

    Returns:
        ``(q_out, k_out)``: new tensors of q's and k's shapes and strides; with ``out``,
        ``out`` itself, written.

    Raises:
        TypeError: a tensor argument is not a dense tensor, or has (or out_dtype is)
            another dtype.
        ValueError: k not matching q's B, S or D; text_len outside 0..S; a weight not
            ``[D]``; cos or sin not fp32 ``[S, D/2]``; a bad option; a table that requires
            grad (under autograd); devices; a strict-mode fallback.
        NotImplementedError: a double backward through this op.
    """
    check_tensors("qk_norm_rope", FUSED_WEIGHT_NAMES, q=q, k=k, cos=cos, sin=sin, text_q_weight=text_q_weight,
                  text_k_weight=text_k_weight, image_q_weight=image_q_weight,
                  image_k_weight=image_k_weight)
    op = "qk_norm_rope"
    options = (as_int(op, "text_len", text_len), as_float(op, "eps", eps),
               as_str(op, "mode", mode), as_str(op, "pairing", pairing),
               as_str(op, "layout", layout))
    weights = (text_q_weight, text_k_weight, image_q_weight, image_k_weight)
    out_dtype = as_dtype(op, "out_dtype", out_dtype)
    if out is None:
        return ops.qk_norm_rope(q, k, *weights, cos, sin, *options, out_dtype)
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise TypeError(f"kernel_align.{op}: argument 'out': expected a (q_out, k_out) pair of "
                        f"tensors, found {out!r:.80}")
    check_out(op, out_dtype, **{"out[0]": out[0], "out[1]": out[1]})
    ops.qk_norm_rope_out(q, k, *weights, cos, sin, *options, out[0], out[1])
    return out[0], out[1]


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
    grad while grad mode is on (use ``qk_norm_rope``), as the raw
    ``torch.ops.kernel_align.qk_norm_rope_`` does.

    In place: q and k are overwritten, each in its own dtype, and returned (their version
    counters bump, so a backward that needs their old values raises torch's "modified by
    an inplace operation"). They must not overlap each other, the tables or the weights
    (nor themselves). A refused call leaves them as they were.

    Args:
        q: queries, ``[B, S, Hq, D]`` (bshd) or ``[B, Hq, S, D]`` (bhsd); fp32, bf16 or
            fp16, any non-overlapping strides.
        k: keys, q's B, S and D.
        cos: fp32 ``[S, D/2]`` cosines.
        sin: fp32 ``[S, D/2]`` sines.
        text_len: how many leading sequence positions are text, 0 to S.
        text_q_weight: ``[D]`` weight of q's text positions, or None.
        text_k_weight: ``[D]`` weight of k's text positions, or None.
        image_q_weight: ``[D]`` weight of q's image positions, or None.
        image_k_weight: ``[D]`` weight of k's image positions, or None.
        eps: as in ``qk_rmsnorm``.
        mode: "diffusers" (default) or "single".
        pairing: "interleaved" or "half".
        layout: "bshd" or "bhsd".

    Returns:
        ``(q, k)``, the same tensor objects, normalised and rotated.

    Raises:
        TypeError: as ``qk_norm_rope``.
        ValueError: as ``qk_norm_rope``; q, k or a weight requires grad while grad mode
            is on; q and k (or a weight) overlapping.
        RuntimeError: torch's, for q or k an inference tensor outside
            ``torch.inference_mode()``.
    """
    check_tensors("qk_norm_rope_", FUSED_WEIGHT_NAMES, q=q, k=k, cos=cos, sin=sin, text_q_weight=text_q_weight,
                  text_k_weight=text_k_weight, image_q_weight=image_q_weight,
                  image_k_weight=image_k_weight)
    op = "qk_norm_rope_"
    ops.qk_norm_rope_(q, k, text_q_weight, text_k_weight, image_q_weight, image_k_weight, cos,
                      sin, as_int(op, "text_len", text_len), as_float(op, "eps", eps),
                      as_str(op, "mode", mode), as_str(op, "pairing", pairing),
                      as_str(op, "layout", layout))
    return q, k


def linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    activation: str | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """``y = act(x @ weight.T + bias)``: torch's Linear under the contract's linear tree
    (docs/contract.md section 10), so a row's bytes depend on that row of x, on weight and
    on bias alone: never on the other rows (the batch, the padding), the thread count, the
    instruction set or the device. Differentiable in x, weight and bias (first order; the
    weight and bias gradients sum over rows by the same fixed tree, deterministic but, as
    any sum over a batch, not batch-invariant).

    Args:
        x: ``[..., K]`` with 1 to 4 dims whose leading dims flatten to one row stride (a
            contiguous or row-sliced tensor), fp32, bf16 or fp16.
        weight: ``[N, K]``, any strides, any of the three dtypes.
        bias: ``[N]`` or None.
        activation: None (or "none"), "gelu_tanh" (diffusers' "gelu-approximate") or
            "silu", applied in fp32 before the one rounding to the output's dtype.
        out_dtype: the output's dtype (fp32, bf16 or fp16); None: x's dtype. fp32 keeps
            the sum unrounded (a tensor-parallel shard's partial: kernel_align.tensor_parallel).

    Returns:
        A new contiguous tensor ``[..., N]`` in ``out_dtype``.

    Raises:
        TypeError: an argument that is not a dense tensor, or a dtype other than fp32,
            bf16, fp16.
        ValueError: shapes that do not chain (K of x and weight, the bias's length), x of
            rank 0 or above 4 or whose rows do not flatten, an empty tensor, an unknown
            activation, tensors on two devices or not on a supported device.
        NotImplementedError: a double backward through this op.
    """
    op = "linear"
    check_tensors(op, ("bias",), x=x, weight=weight, bias=bias)
    act = "none" if activation is None else as_str(op, "activation", activation)
    return ops.linear(x, weight, bias, act, as_dtype(op, "out_dtype", out_dtype))


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    *,
    layout: str = "bshd",
) -> torch.Tensor:
    """Joint attention ``softmax(q k^T / sqrt(D)) v`` per sample and head over the tokens
    ``mask`` keeps, under the contract (docs/contract.md section 11): every sum runs over a
    sample's valid tokens in their order, so its bytes do not depend on the padding around
    it, its batch, the thread count, the instruction set or the device. Differentiable in
    q, k and v (first order).

    Args:
        q, k, v: one shape, ``[B, S, H, D]`` (layout "bshd", as diffusers' processors hold
            them) or ``[B, H, S, D]`` ("bhsd", as ``scaled_dot_product_attention`` takes
            them), fp32, bf16 or fp16, any strides; D from 1 to 4096.
        mask: ``[B, S]`` torch.bool (or uint8), true for a token that takes part as a key
            and as a query: diffusers' ``encoder_hidden_states_mask`` joined with the image
            tokens' ones; None: every token does.
        layout: "bshd" or "bhsd".

    Returns:
        A new tensor of q's shape and dtype. A masked token's row is +0 (torch's SDPA
        gives masked queries the attention over the valid keys instead: the rows a key
        padding mask marks are padding, which a model discards), and so is every row of a
        sample without a valid token.

    Raises:
        TypeError: an argument that is not a dense tensor, a dtype the library lacks, a
            mask that is not bool or uint8.
        ValueError: shapes that differ or are not 4-D, a mask not ``[B, S]``, an empty
            tensor, an unknown layout, tensors on two devices or not on a supported device.
        NotImplementedError: a double backward through this op.
    """
    op = "attention"
    check_tensors(op, ("mask",), q=q, k=k, v=v, mask=mask)
    return ops.attention(q, k, v, mask, as_str(op, "layout", layout))


def adaln_modulation(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    *,
    eps: float = 1e-6,
    mode: str = "diffusers",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``LayerNorm(x) * (1 + scale) + shift``: the LayerNorm without affine of a Qwen-Image
    block (``norm1``/``norm2``, eps 1e-6) fused with its AdaLN modulation (``_modulate``),
    under the contract (docs/contract.md section 12): a token's bytes depend on its row and
    its sample's scale and shift alone, never on the batch, the thread count or the
    instruction set. Differentiable in x, scale and shift (first order); the gradients of
    scale and shift sum over a sample's tokens in fixed blocks.

    Args:
        x: ``[B, S, D]``, fp32, bf16 or fp16, any strides; D from 1 to 4096.
        scale, shift: ``[B, D]`` or ``[B, 1, D]`` (a sample's modulation chunks).
        eps: added to the variance; finite, >= 0 and representable in fp32.
        mode: "diffusers" rounds the normalised value, ``1 + scale`` and the product as
            diffusers does in the model's dtype; "single" rounds once, at the output.
        out: a tensor of x's shape to write the result into (in its own dtype) instead of
            a new one; it may be x itself (in place). See "out=" above.

    Returns:
        A new tensor of x's shape and dtype; with ``out``, ``out`` itself, written.

    Raises:
        TypeError: an argument that is not a dense tensor or of a dtype the library lacks.
        ValueError: x not 3-D, scale or shift not of x's B and D, an empty tensor, bad eps
            or mode, tensors on two devices or not on a supported device.
        NotImplementedError: a double backward through this op.
    """
    op = "adaln_modulation"
    check_tensors(op, x=x, scale=scale, shift=shift)
    eps, mode = as_float(op, "eps", eps), as_str(op, "mode", mode)
    if out is None:
        return ops.adaln_modulation(x, scale, shift, eps, mode)
    check_out(op, None, out=out)
    ops.adaln_modulation_out(x, scale, shift, eps, mode, out)
    return out


def adaln_gate_residual(
    x: torch.Tensor,
    gate: torch.Tensor,
    y: torch.Tensor,
    *,
    mode: str = "diffusers",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """``x + gate * y``: a Qwen-Image block's gated residual (``hidden_states + gate *
    attn_output`` and the MLP's), under the contract (docs/contract.md section 13):
    elementwise, so a token's bytes depend on its own elements and its sample's gate alone.
    Differentiable in x, gate and y (first order): x's gradient is the upstream gradient,
    y's is ``gate * dout``, and the gate's sums ``dout * y`` over a sample's tokens in
    fixed blocks of 256 (per sample, so batch-invariant; torch's sum over the broadcast dim
    is not fixed).

    Args:
        x, y: ``[B, S, D]``, fp32, bf16 or fp16, any strides; D from 1 to 4096.
        gate: ``[B, D]`` or ``[B, 1, D]`` (a sample's gate chunk).
        mode: "diffusers" rounds ``gate * y`` to x's dtype before the add, as torch computes
            it in the model's dtype (the same bytes as diffusers' expression); "single"
            rounds once, at the output.
        out: a tensor of x's shape to write the result into (in its own dtype) instead of
            a new one; it may be x or y (in place). See "out=" above.

    Returns:
        A new tensor of x's shape and dtype; with ``out``, ``out`` itself, written.

    Raises:
        TypeError: an argument that is not a dense tensor or of a dtype the library lacks.
        ValueError: x not 3-D, y not of x's shape, gate not of x's B and D, an empty
            tensor, a bad mode, tensors on two devices or not on a supported device.
        NotImplementedError: a double backward through this op.
    """
    op = "adaln_gate_residual"
    check_tensors(op, x=x, gate=gate, y=y)
    mode = as_str(op, "mode", mode)
    if out is None:
        return ops.adaln_gate_residual(x, gate, y, mode)
    check_out(op, None, out=out)
    ops.adaln_gate_residual_out(x, gate, y, mode, out)
    return out


def activation(x: torch.Tensor, kind: str = "silu") -> torch.Tensor:
    """An elementwise activation under the contract (docs/contract.md section 14): "silu"
    (``x * sigmoid(x)``, as ``F.silu``) or "gelu_tanh" (as ``F.gelu(x, approximate="tanh")``)
    with the contract's own exp and tanh (the functions of linear's fused activations), or
    "none" (x in its dtype); one rounding to x's dtype. An element's bytes depend on that
    element alone, on every backend, CPU or GPU (torch's own kernels differ between the
    two). Differentiable in x (first order). Under ``kernel_align.batch_invariant()``
    ``F.silu`` runs it too.

    Args:
        x: any shape of rank 1 to 4, fp32, bf16 or fp16, any strides.
        kind: "silu", "gelu_tanh" or "none".

    Returns:
        A new tensor of x's shape and dtype.

    Raises:
        TypeError: x is not a dense tensor or of a dtype the library lacks.
        ValueError: x of rank 0 or above 4, an empty tensor, an unknown kind, a tensor not
            on a supported device.
        NotImplementedError: a double backward through this op.
    """
    op = "activation"
    check_tensors(op, x=x)
    return ops.activation(x, as_str(op, "kind", kind))


def flow_sde_step_logp(
    x: torch.Tensor,
    v: torch.Tensor,
    sigma: float,
    sigma_prev: float,
    *,
    sigma_max: float,
    noise: torch.Tensor | None = None,
    prev: torch.Tensor | None = None,
    noise_level: float = 0.7,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of Flow-GRPO's SDE sampler (``sde_step_with_logprob`` of the flow-matching
    Euler scheduler) and its log-probability, under the contract (docs/contract.md section
    15): fp32 arithmetic whatever the dtypes, the step's constants each its exact
    expression rounded once to fp32 (``flow_sde_coefficients``), each sample's sum of
    squared distances by linear's fixed tree, so a sample's bytes depend on that sample
    alone: a batched sampler and a per-sample trainer compute the same log-probability, bit
    for bit, and the policy ratio is exactly 1.

    Two modes. Sampling (``noise`` given): ``prev = x * x_scale + v * v_scale +
    noise_scale * noise`` in x's dtype, and its log-probability. Replay (``prev`` given, as
    the trainer recomputes a recorded step): ``prev`` itself and its log-probability,
    differentiable in v (and x); prev is a constant, as Flow-GRPO detaches it.

    Args:
        x: the latents x_t, ``[B, ...]`` of rank 2 to 4 (dim 0 the samples), fp32, bf16 or
            fp16, any strides.
        v: the model's velocity (after guidance), x's shape.
        sigma: this step's sigma, in (0, 1].
        sigma_prev: the next step's, in [0, sigma).
        sigma_max: the scheduler's ``sigmas[1]``, which stands in for sigma where sigma = 1.
        noise: the step's standard normal noise, x's shape (sampling), or None.
        prev: the recorded x_{t-1}, x's shape (replay), or None. Exactly one of the two.
        noise_level: Flow-GRPO's noise level, finite and > 0.

    Returns:
        ``(prev, logp)``: prev (a new tensor in x's dtype when sampling, the given one when
        replaying) and ``logp``, fp32 ``[B]``, the mean over each sample's elements of the
        Gaussian log-density.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: both or neither of noise and prev, shapes that differ, a rank outside 2
            to 4, a sigma outside its range, a noise level that is not finite and positive,
            a step whose constants overflow fp32, tensors on two devices.
        NotImplementedError: a double backward through this op.
    """
    op = "flow_sde_step_logp"
    check_tensors(op, ("noise", "prev"), x=x, v=v, noise=noise, prev=prev)
    if (noise is None) == (prev is None):
        raise ValueError(f"kernel_align.{op}: arguments 'noise' and 'prev': expected exactly "
                         "one (noise to sample a step, prev to replay one), found "
                         + ("both" if noise is not None else "neither"))
    step = (as_float(op, "sigma", sigma), as_float(op, "sigma_prev", sigma_prev),
            as_float(op, "noise_level", noise_level), as_float(op, "sigma_max", sigma_max))
    if prev is None:
        prev = ops.flow_sde_step(x, v, noise, *step)
    return prev, ops.flow_sde_logp(x, v, prev.detach(), *step)


def latent_normalize(
    z: torch.Tensor,
    mean: torch.Tensor,
    std: torch.Tensor,
    *,
    transform: str = "normalize",
) -> torch.Tensor:
    """The VAE latents' per-channel normalization as Qwen-Image's pipelines write it, under
    the contract (docs/contract.md section 16): fp32 arithmetic whatever the dtypes, one
    rounding to z's dtype, so an element's bytes depend on that element and its channel's
    constants alone, on every backend. ``transform`` "normalize" is the Edit pipelines'
    ``(image_latents - latents_mean) / latents_std``; "denormalize" is what every pipeline
    hands the VAE's decoder, ``latents / latents_std + latents_mean`` with its
    ``latents_std = 1.0 / std`` (the reciprocal taken in fp32, then the division by it). In
    fp32 these are the pipelines' bytes; in bf16 or fp16 the value is rounded once where
    torch rounds after each operation. Differentiable in z, to any order: ``dz = dy / std`` or
    ``dy / (1 / std)``, rounded once to dy's dtype. mean and std are constants (the VAE
    config's ``latents_mean`` and ``latents_std``): they get no gradient, even when they
    require grad.

    Args:
        z: the latents, ``[B, C, L]`` or ``[B, C, H, W]`` (dim 1 the channels: the
            pipelines' ``[B, C, 1, H, W]`` with its frame dim squeezed), fp32, bf16 or
            fp16, any strides.
        mean: ``[C]``, the per-channel mean, any of the three dtypes (widened to fp32).
        std: ``[C]``, the per-channel standard deviation (not its reciprocal), likewise.
        transform: "normalize" or "denormalize".

    Returns:
        A new tensor of z's shape, dtype and strides (``torch.empty_like``).

    Raises:
        TypeError: an argument that is not a dense tensor or of a dtype the library lacks,
            or a transform that is not a str.
        ValueError: z not 3-D or 4-D, mean or std not ``[C]`` for z's C, an empty tensor,
            an unknown transform, tensors on two devices or not on a supported device.
    """
    op = "latent_normalize"
    check_tensors(op, z=z, mean=mean, std=std)
    return ops.latent_normalize(z, mean, std, as_str(op, "transform", transform))


def latent_pack(latents: torch.Tensor) -> torch.Tensor:
    """Qwen-Image's 2x2 patchify, the pipelines' ``_pack_latents``: latents
    ``[B, C, H, W]`` to the transformer's tokens ``[B, H/2 * W/2, 4C]``,
    ``tokens[b, i * W/2 + j, 4c + 2di + dj] = latents[b, c, 2i + di, 2j + dj]``
    (docs/contract.md section 16). An exact permutation: every element's bytes are copied,
    in any dtype, from any strides. Differentiable to any order: its gradient is
    ``latent_unpack``.

    Args:
        latents: ``[B, C, H, W]`` with H and W even (the pipelines' latents, their frame
            dim squeezed: see ``latent_grid``), fp32, bf16 or fp16, any strides.

    Returns:
        A new contiguous tensor ``[B, H/2 * W/2, 4C]`` of the latents' dtype.

    Raises:
        TypeError: latents is not a dense tensor or of a dtype the library lacks.
        ValueError: latents not 4-D, H or W odd, an empty tensor, a tensor not on a
            supported device.
    """
    check_tensors("latent_pack", latents=latents)
    return ops.latent_pack(latents)


def latent_unpack(tokens: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """The inverse of ``latent_pack``, the pipelines' ``_unpack_latents``: tokens
    ``[B, H/2 * W/2, 4C]`` back to latents ``[B, C, H, W]``, byte for byte. ``height`` and
    ``width`` are the latent grid's H and W (``_unpack_latents`` takes the image's and
    derives them: ``latent_grid``). Differentiable to any order: its gradient is
    ``latent_pack``.

    Args:
        tokens: ``[B, S, 4C]``, fp32, bf16 or fp16, any strides.
        height: the latents' H, even, with ``height/2 * width/2 = S``.
        width: the latents' W, even.

    Returns:
        A new contiguous tensor ``[B, C, height, width]`` of the tokens' dtype.

    Raises:
        TypeError: tokens is not a dense tensor or of a dtype the library lacks, height or
            width not an int.
        ValueError: height or width odd or not positive (the error names "height, width"),
            tokens not ``[B, height/2 * width/2, 4C]``, a tensor not on a supported device.
    """
    op = "latent_unpack"
    check_tensors(op, tokens=tokens)
    return ops.latent_pack_backward(tokens, as_int(op, "height", height),
                                    as_int(op, "width", width))


def latent_grid(height: int, width: int, vae_scale_factor: int = 8) -> tuple[int, int]:
    """The latent grid (H, W) the Qwen-Image pipelines make for an image of ``height`` x
    ``width`` pixels: ``2 * (height // (vae_scale_factor * 2))`` and the same of width, as
    their ``prepare_latents`` and ``_unpack_latents`` compute it: the VAE divides by
    ``vae_scale_factor``, and the packing needs even sizes, so an image size that is not a
    multiple of ``2 * vae_scale_factor`` is truncated (1000 pixels: a grid of 124, 992
    pixels' worth).

    Args:
        height: the image's height in pixels.
        width: the image's width in pixels.
        vae_scale_factor: the VAE's spatial compression, the pipelines'
            ``vae_scale_factor`` (8 for Qwen-Image's VAE).

    Returns:
        ``(H, W)``, the latents' height and width for ``latent_unpack``.

    Raises:
        TypeError: an argument that is not an int.
        ValueError: vae_scale_factor below 1, or height or width below
            ``2 * vae_scale_factor`` (an empty grid).
    """
    op = "latent_grid"
    factor = as_int(op, "vae_scale_factor", vae_scale_factor)
    if factor < 1:
        raise ValueError(f"kernel_align.{op}: argument 'vae_scale_factor': expected an integer "
                         f">= 1, found {factor}")
    grid = []
    for name, pixels in (("height", height), ("width", width)):
        pixels = as_int(op, name, pixels)
        if pixels < 2 * factor:
            raise ValueError(f"kernel_align.{op}: argument '{name}': expected at least "
                             f"{2 * factor} pixels (2 * vae_scale_factor: one 2x2 patch), "
                             f"found {pixels}")
        grid.append(2 * (pixels // (factor * 2)))
    return grid[0], grid[1]


def true_cfg(cond: torch.Tensor, uncond: torch.Tensor, scale: float = 4.0) -> torch.Tensor:
    """True classifier-free guidance with Qwen-Image's norm rescale, under the contract
    (docs/contract.md section 17). The pipelines combine the transformer's two predictions
    as

        comb_pred = neg_noise_pred + true_cfg_scale * (noise_pred - neg_noise_pred)
        cond_norm = torch.norm(noise_pred, dim=-1, keepdim=True)
        noise_norm = torch.norm(comb_pred, dim=-1, keepdim=True)
        noise_pred = comb_pred * (cond_norm / noise_norm)

    with ``noise_pred`` the prompt's prediction (``cond``) and ``neg_noise_pred`` the
    negative prompt's (``uncond``), the norms over the last dim (a token's channels). Here
    that is fp32 arithmetic whatever the dtypes, each operation rounded once to fp32, the
    two sums of squares by the contract's fixed row tree, and one rounding to cond's dtype,
    so a token's bytes depend on its two rows alone: a sampler that runs both predictions
    as one batch of 2B and a trainer that runs them apart compute the same bits (torch's
    ``torch.norm`` picks its reduction order by shape and kernel). A row whose combined
    prediction is zero gives NaN, as the pipeline's expression does. Differentiable in cond
    and uncond (first order: the exact gradient of the real function, in fp32 operations,
    rounded once to each input's dtype); works under ``torch.compile``.

    Args:
        cond: the conditional prediction (the pipelines' ``noise_pred``), rank 1 to 4 with
            the channels last (``[B, S, C]`` for the packed latents' tokens), fp32, bf16 or
            fp16, any strides.
        uncond: the unconditional prediction (``neg_noise_pred``), cond's shape, any of the
            three dtypes and any strides.
        scale: the guidance scale, the pipelines' ``true_cfg_scale`` (4.0 by default, as
            theirs), finite and representable in fp32.

    Returns:
        A new tensor of cond's shape, dtype and strides (``torch.empty_like``).

    Raises:
        TypeError: cond or uncond not a dense tensor or of a dtype the library lacks, a
            scale that is not a real number.
        ValueError: uncond not of cond's shape, a rank outside 1 to 4, an empty tensor, a
            scale that is not finite or not representable in fp32, tensors on two devices
            or not on a supported device.
        NotImplementedError: a double backward through this op.
    """
    op = "true_cfg"
    check_tensors(op, cond=cond, uncond=uncond)
    return ops.true_cfg(cond, uncond, as_float(op, "scale", scale))
