"""Whole models under the contract's linear tree, the two ways users know from the peers.

``batch_invariant()`` (a context manager) and ``set_batch_invariant(True)`` register
kernel-align implementations of ``aten::mm``, ``aten::addmm``, ``aten::bmm`` and
``aten::mv`` for the CPU (and CUDA where the extension has it) through ``torch.library``,
as thinking-machines' ``set_batch_invariant_mode()`` and vLLM's batch-invariant switch
do: every matmul of any model (``F.linear``, ``@``, ``torch.matmul`` decompose to these)
then runs ``kernel_align.linear``, forward and backward (aten's own derivative formulas
call ``mm`` again), and a row's bytes no longer depend on the rows it is batched with.
On the CPU the mode also registers aten's flash attention for CPU
(``_scaled_dot_product_flash_attention_for_cpu`` and its backward, which
``F.scaled_dot_product_attention`` reaches there), and on CUDA (where the extension has it)
``scaled_dot_product_attention`` itself, before aten picks a kernel: both run
``kernel_align.attention`` (layout "bhsd"), so a sample's bytes do not depend on how far a key-padding mask pads it.
It takes what a key-padding mask is (none, or a bool or 0/-inf mask ``[B or 1, 1, 1, S]``,
q, k and v of one shape, the default scale, no dropout, not causal) and raises
NotImplementedError naming the argument for anything else, never computing it another
way. Masked queries' rows are +0, where torch attends them to the valid keys. ``F.silu``
(``aten::silu`` and its ``silu_backward``) runs ``kernel_align.activation`` too.
Leaving the last context (or ``set_batch_invariant(False)``) removes the registrations,
also when the body raised; contexts nest. Eager mode only: a ``torch.compile`` graph
lowers matmuls to its own kernels (use ``kernel_align.linear`` or ``patch_linear`` there).

``patch_linear(model)`` is the explicit, scoped change: each ``nn.Linear`` of the model
runs ``kernel_align.linear``, with the activation fused where diffusers applies one right
after a Linear (``GELU(approximate="tanh")``'s projection in a ``FeedForward``, the SiLU
between the two Linears of a ``TimestepEmbedding``); ``restore()`` (or leaving its
``with`` block) puts every forward back.

What changes in the numbers: the product's K sum follows the contract's tree (fp32,
fma leaves of 32, fixed combination), ``addmm`` with a 1-D bias and ``alpha = beta = 1``
adds the bias in fp32 before the one rounding, other ``alpha``/``beta`` are applied by
torch's elementwise ops to the rounded product, and ``patch_linear``'s fused activations
are applied in fp32 before the rounding (diffusers rounds the product first). A batched
sampler and a per-sample trainer under the same setting compute the same bits.
"""

from __future__ import annotations

import contextlib
import threading
import types
import warnings
from collections.abc import Iterator

import torch

from ._ops import HAS_CUDA, ops

__all__ = ["batch_invariant", "set_batch_invariant", "is_batch_invariant", "patch_linear",
           "LinearPatch"]

_DISPATCH_KEYS = ("CPU", "CUDA") if HAS_CUDA else ("CPU",)


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return ops.linear(a, b.t(), None, "none")


def _addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor, *, beta=1, alpha=1):
    if beta == 1 and alpha == 1 and bias.dim() == 1 and bias.shape[0] == b.shape[1]:
        return ops.linear(a, b.t(), bias, "none")
    product = _mm(a, b)
    scaled = product if alpha == 1 else product * alpha
    if beta == 0:
        return scaled
    return scaled + (bias if beta == 1 else bias * beta)


def _bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # Each batch element is its own product: the same bytes as the element alone.
    return torch.stack([_mm(a[i], b[i]) for i in range(a.shape[0])])


def _mv(matrix: torch.Tensor, vector: torch.Tensor) -> torch.Tensor:
    return ops.linear(vector.unsqueeze(0), matrix, None, "none").squeeze(0)


def _silu(x: torch.Tensor) -> torch.Tensor:
    return ops.activation(x, "silu")


def _silu_backward(grad_output: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return ops.activation_backward(x, grad_output, "silu")


# aten's matmuls, and F.silu with its derivative (silu_backward, which aten's formula
# calls): a SiLU applied alone (the timestep embedding's before each modulation Linear)
# takes the contract's exp, the same bits on the CPU and a GPU.
_OVERRIDES = {"mm": _mm, "addmm": _addmm, "bmm": _bmm, "mv": _mv, "silu": _silu,
              "silu_backward": _silu_backward}


def _key_padding(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout_p: float,
                 is_causal: bool, attn_mask: torch.Tensor | None,
                 scale: float | None) -> torch.Tensor | None:
    """The [B, S] bool mask of an SDPA call that kernel_align.attention computes, or
    NotImplementedError naming the argument it cannot take."""
    def refuse(argument: str, expected: str, found) -> None:
        raise NotImplementedError(
            f"kernel_align.batch_invariant: scaled_dot_product_attention: argument "
            f"'{argument}': expected {expected} (kernel_align.attention's joint attention), "
            f"found {found}")

    if dropout_p != 0.0:
        refuse("dropout_p", "0.0", dropout_p)
    if is_causal:
        refuse("is_causal", "False", is_causal)
    if key.shape != query.shape or value.shape != query.shape:
        refuse("key", f"key and value of query's shape {list(query.shape)}",
               f"{list(key.shape)} and {list(value.shape)}")
    head_dim = query.shape[-1]
    if scale is not None and scale != 1.0 / head_dim ** 0.5:
        refuse("scale", f"None or 1/sqrt({head_dim})", scale)
    if attn_mask is None:
        return None
    batch, seq = query.shape[0], query.shape[2]
    if (attn_mask.dim() != 4 or attn_mask.shape[0] not in (1, batch) or attn_mask.shape[1] != 1
            or attn_mask.shape[2] != 1 or attn_mask.shape[3] != seq):
        refuse("attn_mask", f"a key-padding mask [{batch} or 1, 1, 1, {seq}]",
               list(attn_mask.shape))
    keys = attn_mask[:, 0, 0, :]
    if keys.dtype != torch.bool:
        valid = keys == 0
        if not torch.all(valid | (keys == float("-inf"))):
            refuse("attn_mask", "values 0 and -inf", "other values")
        keys = valid
    return keys.expand(batch, seq).contiguous()


def _flash_attention_cpu(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None,
                         scale=None):
    mask = _key_padding(query, key, value, dropout_p, is_causal, attn_mask, scale)
    out = ops.attention(query, key, value, mask, "bhsd")
    # torch's backward takes the row log-sum-exp; kernel_align's needs only out.
    return out, query.new_zeros(query.shape[:3], dtype=torch.float32)


def _flash_attention_cpu_backward(grad_out, query, key, value, out, logsumexp, dropout_p,
                                  is_causal, *, attn_mask=None, scale=None):
    mask = _key_padding(query, key, value, dropout_p, is_causal, attn_mask, scale)
    return ops.attention_backward(query, key, value, mask, out, grad_out, "bhsd")


def _scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0,
                                  is_causal=False, *, scale=None, enable_gqa=False):
    if enable_gqa:
        raise NotImplementedError(
            "kernel_align.batch_invariant: scaled_dot_product_attention: argument "
            "'enable_gqa': expected False (kernel_align.attention's joint attention), found True")
    mask = _key_padding(query, key, value, dropout_p, is_causal, attn_mask, scale)
    return ops.attention(query, key, value, mask, "bhsd")


# On CUDA, F.scaled_dot_product_attention itself: a composite op, so its kernel is
# registered for the autograd key too, where aten would otherwise decompose it into the
# flash, memory-efficient, cuDNN or math kernel it picks per device and dtype.
# kernel_align.attention records its own gradient. (A test runs this registration on the
# CPU's keys.)
_SDPA_KEYS = ("AutogradCUDA", "CUDA") if HAS_CUDA else ()

# aten's CPU flash attention and its backward: the kernels F.scaled_dot_product_attention
# reaches on the CPU.
_CPU_OVERRIDES = {
    "_scaled_dot_product_flash_attention_for_cpu": _flash_attention_cpu,
    "_scaled_dot_product_flash_attention_for_cpu_backward": _flash_attention_cpu_backward,
}

_lock = threading.Lock()
_library: torch.library.Library | None = None
_depth = 0  # open batch_invariant() contexts
_switched_on = False  # set_batch_invariant(True)


def _update_locked() -> None:
    global _library
    wanted = _switched_on or _depth > 0
    if wanted and _library is None:
        library = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():
            # torch warns that each registration overrides aten's own kernel: that is the
            # point here, and _destroy() below puts aten's back.
            warnings.simplefilter("ignore", UserWarning)
            for name, kernel in _OVERRIDES.items():
                for key in _DISPATCH_KEYS:
                    library.impl(name, kernel, key)
            for name, kernel in _CPU_OVERRIDES.items():
                library.impl(name, kernel, "CPU")
            for key in _SDPA_KEYS:
                library.impl("scaled_dot_product_attention", _scaled_dot_product_attention, key)
        _library = library
    elif not wanted and _library is not None:
        _library._destroy()
        _library = None


def is_batch_invariant() -> bool:
    """Whether aten's matmuls run kernel-align's linear now."""
    with _lock:
        return _library is not None


def set_batch_invariant(enabled: bool) -> None:
    """Turns the batch-invariant mode on or off for the whole process: ``enabled`` True
    registers the overrides, False removes them (open ``batch_invariant()`` contexts keep
    them until they end)."""
    global _switched_on
    if not isinstance(enabled, bool):
        raise TypeError("kernel_align.set_batch_invariant: argument 'enabled': expected a "
                        f"bool, found {type(enabled).__qualname__}")
    with _lock:
        _switched_on = enabled
        _update_locked()


@contextlib.contextmanager
def batch_invariant() -> Iterator[None]:
    """Runs its body with aten's ``mm``, ``addmm``, ``bmm``, ``mv`` and (CPU) flash
    attention under the contract;
    torch's own kernels are back when it ends (normally or by an exception). Nests."""
    global _depth
    with _lock:
        _depth += 1
        _update_locked()
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            _update_locked()


# ---------------------------------------------------------------------------------------
# patch_linear


def _linear_forward(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return ops.linear(x, module.weight, module.bias, "none")


def _gelu_forward(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return ops.linear(x, module.proj.weight, module.proj.bias, "gelu_tanh")


def _timestep_embedding_forward(module: torch.nn.Module, sample: torch.Tensor,
                                condition: torch.Tensor | None = None) -> torch.Tensor:
    if condition is not None:
        # The conditioned form adds a projection first: run diffusers' own forward, whose
        # Linears are patched too.
        return type(module).forward(module, sample, condition)
    hidden = ops.linear(sample, module.linear_1.weight, module.linear_1.bias, "silu")
    return ops.linear(hidden, module.linear_2.weight, module.linear_2.bias, "none")


def _fused_forward(module: torch.nn.Module):
    """The fused forward for a diffusers module that applies an activation right after a
    Linear, or None."""
    name = type(module).__name__
    if (name == "GELU" and getattr(module, "approximate", None) == "tanh"
            and isinstance(getattr(module, "proj", None), torch.nn.Linear)):
        return _gelu_forward
    if (name == "TimestepEmbedding" and isinstance(getattr(module, "act", None), torch.nn.SiLU)
            and getattr(module, "post_act", None) is None
            and isinstance(getattr(module, "linear_1", None), torch.nn.Linear)
            and isinstance(getattr(module, "linear_2", None), torch.nn.Linear)):
        return _timestep_embedding_forward
    return None


class LinearPatch:
    """The forwards ``patch_linear`` replaced; ``restore()`` puts them back (also when
    used as a context manager). Restoring twice is harmless."""

    def __init__(self, model: torch.nn.Module):
        """Patches every module of ``model`` that runs a Linear (see patch_linear)."""
        self._saved: list[tuple[torch.nn.Module, bool, object]] = []
        for module in model.modules():
            fused = _fused_forward(module)
            if fused is None and isinstance(module, torch.nn.Linear):
                fused = _linear_forward
            if fused is None:
                continue
            had_own = "forward" in module.__dict__
            self._saved.append((module, had_own, module.__dict__.get("forward")))
            module.forward = types.MethodType(fused, module)

    @property
    def modules(self) -> list[torch.nn.Module]:
        """The modules whose forward runs under the contract."""
        return [module for module, _, _ in self._saved]

    def restore(self) -> None:
        """Puts back every forward this patch replaced; a second call does nothing."""
        for module, had_own, forward in reversed(self._saved):
            if had_own:
                module.forward = forward
            else:
                module.__dict__.pop("forward", None)
        self._saved.clear()

    def __enter__(self) -> LinearPatch:
        return self

    def __exit__(self, *exc) -> None:
        self.restore()


def patch_linear(model: torch.nn.Module) -> LinearPatch:
    """Runs every ``nn.Linear`` of ``model`` through ``kernel_align.linear`` (activations
    fused where diffusers applies one right after a Linear); returns the ``LinearPatch``
    whose ``restore()`` undoes it, also usable as ``with patch_linear(model): ...``."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError("kernel_align.patch_linear: argument 'model': expected a "
                        f"torch.nn.Module, found {type(model).__qualname__}")
    return LinearPatch(model)
