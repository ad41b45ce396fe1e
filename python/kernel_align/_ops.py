"""Loads the extension (the ``torch.ops.kernel_align`` operators, defined and given
their CPU and autograd kernels in C++) and registers, through ``torch.library``, each
operator's fake kernel (shapes, dtypes and strides, for FakeTensor and
``torch.compile``).

The fake kernels allocate exactly as the C++ kernels do (``empty_like``, which keeps a
dense input's strides), so compiled graphs see the strides eager mode produces.
"""

from __future__ import annotations

import math
import numbers
import operator
import sys
from pathlib import Path

import torch

_LIBRARY_FILE = "libkernel_align_torch.so"


def _load_library() -> None:
    # __path__ lists every location of the package: an editable install keeps the
    # Python files in the source tree and the built library in site-packages.
    package = sys.modules[__package__]
    for directory in package.__path__:
        candidate = Path(directory) / _LIBRARY_FILE
        if candidate.is_file():
            torch.ops.load_library(str(candidate))
            return
    raise ImportError(
        f"kernel_align: {_LIBRARY_FILE} is not in {list(package.__path__)}; build the "
        "package (`pip install --no-build-isolation -e .`, see docs/python.md)"
    )


_load_library()
ops = torch.ops.kernel_align
# Whether the extension runs CUDA tensors (built with the library's CUDA backend, for a
# CUDA build of torch).
HAS_CUDA = bool(ops.has_cuda())
_DEVICES = "the CPU or a CUDA device" if HAS_CUDA else "the CPU"


def check_tensors(op: str, optional: tuple[str, ...] = (), **tensors) -> None:
    """TypeError naming the first argument that is not a dense ``torch.Tensor`` (a list, a
    numpy array, None where a tensor is required, a sparse or nested tensor: the
    dispatcher would raise AttributeError, RuntimeError or NotImplementedError for
    those); ValueError naming the first that is on another device than the CPU or (with
    HAS_CUDA) a CUDA device, and the backends. Names in ``optional`` may be None. The Python
    functions and the fake kernels (torch.compile, meta tensors) both check."""
    for name, tensor in tensors.items():
        if tensor is None and name in optional:
            continue
        if not isinstance(tensor, torch.Tensor):
            kind = type(tensor)
            raise TypeError(f"kernel_align.{op}: argument '{name}': expected a torch.Tensor, "
                            f"found {kind.__module__}.{kind.__qualname__}")
        if tensor.is_nested or tensor.layout is not torch.strided:
            found = "a nested tensor" if tensor.is_nested else f"layout {tensor.layout}"
            raise TypeError(f"kernel_align.{op}: argument '{name}': expected a strided (dense) "
                            f"tensor, found {found}")
        # is_cpu rather than device.type: no torch.device object per tensor, which after
        # a cache-flushing kernel halves this check's cost (about 80 -> 40 us a call).
        if not tensor.is_cpu and not (HAS_CUDA and tensor.is_cuda):
            raise ValueError(
                f"kernel_align.{op}: argument '{name}': expected a tensor on {_DEVICES}, "
                f"found one on {tensor.device} (kernel-align's backends: "
                f"{', '.join(ops.backends())})"
            )


def _type_name(value) -> str:
    kind = type(value)
    return f"{kind.__module__}.{kind.__qualname__}"


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


# The scalar arguments of the Python functions, checked before the operators' schemas see
# them: a wrong type there is torch's RuntimeError naming the schema's argument, here a
# TypeError naming the function's. A traced SymInt or SymFloat (torch.compile) passes as
# it is.


def as_int(op: str, name: str, value) -> int:
    """``value`` as an int: anything with ``__index__`` (int, bool, numpy integers, a
    one-element integer tensor); TypeError for anything else (a float, a str), ValueError
    for an integer outside int64, which the operators take."""
    if isinstance(value, torch.SymInt):
        return value
    try:
        index = operator.index(value)
    except TypeError:
        raise TypeError(f"kernel_align.{op}: argument '{name}': expected an int, found "
                        f"{_type_name(value)}") from None
    if not _INT64_MIN <= index <= _INT64_MAX:
        raise ValueError(f"kernel_align.{op}: argument '{name}': expected an integer from "
                         f"-2^63 to 2^63 - 1, found {index}")
    return index


def as_float(op: str, name: str, value) -> float:
    """``value`` as a float: any real number (float, int, numpy floats); TypeError for
    anything else (a str). An int too large for a float becomes an infinity, which the
    library's option rule then refuses by name."""
    if isinstance(value, torch.SymFloat):
        return value
    if not isinstance(value, numbers.Real):
        raise TypeError(f"kernel_align.{op}: argument '{name}': expected a float, found "
                        f"{_type_name(value)}")
    try:
        return float(value)
    except OverflowError:
        return math.copysign(math.inf, value)


def as_str(op: str, name: str, value) -> str:
    """``value`` if it is a str; TypeError otherwise."""
    if not isinstance(value, str):
        raise TypeError(f"kernel_align.{op}: argument '{name}': expected a str, found "
                        f"{_type_name(value)}")
    return value


def as_dtype(op: str, name: str, value) -> torch.dtype | None:
    """``value`` if it is a torch.dtype or None; TypeError otherwise (a str such as
    "float32")."""
    if value is not None and not isinstance(value, torch.dtype):
        raise TypeError(f"kernel_align.{op}: argument '{name}': expected a torch.dtype or "
                        f"None, found {_type_name(value)}")
    return value


# The optional tensors of the fused ops.
FUSED_WEIGHT_NAMES = ("text_q_weight", "text_k_weight", "image_q_weight", "image_k_weight")


def _no_gradient(like: torch.Tensor) -> torch.Tensor:
    # What the C++ kernels return for a weight gradient nobody asked for.
    return like.new_empty((0,), dtype=torch.float32)


# ---------------------------------------------------------------------------------------
# qk_rmsnorm


@torch.library.register_fake("kernel_align::qk_rmsnorm")
def _qk_rmsnorm_fake(x, weight=None, eps=1e-6, norm_mode="single", out_dtype=None):
    check_tensors("qk_rmsnorm", ("weight",), x=x, weight=weight)
    return torch.empty_like(x, dtype=x.dtype if out_dtype is None else out_dtype)


@torch.library.register_fake("kernel_align::qk_rmsnorm_backward")
def _qk_rmsnorm_backward_fake(x, dy, weight, eps, norm_mode, compute_dw):
    check_tensors("qk_rmsnorm_backward", ("weight",), x=x, dy=dy, weight=weight)
    dw = torch.empty_like(weight) if compute_dw else _no_gradient(x)
    return torch.empty_like(x), dw


# ---------------------------------------------------------------------------------------
# multi_axis_rope


@torch.library.register_fake("kernel_align::multi_axis_rope")
def _multi_axis_rope_fake(x, cos, sin, pairing="interleaved", layout="bshd"):
    check_tensors("multi_axis_rope", x=x, cos=cos, sin=sin)
    return torch.empty_like(x)


@torch.library.register_fake("kernel_align::multi_axis_rope_")
def _multi_axis_rope_inplace_fake(x, cos, sin, pairing="interleaved", layout="bshd"):
    check_tensors("multi_axis_rope_", x=x, cos=cos, sin=sin)


@torch.library.register_fake("kernel_align::multi_axis_rope_backward")
def _multi_axis_rope_backward_fake(dy, cos, sin, pairing, layout):
    check_tensors("multi_axis_rope_backward", dy=dy, cos=cos, sin=sin)
    return torch.empty_like(dy)


# ---------------------------------------------------------------------------------------
# qk_norm_rope


@torch.library.register_fake("kernel_align::qk_norm_rope")
def _qk_norm_rope_fake(q, k, text_q_weight, text_k_weight, image_q_weight, image_k_weight, cos,
                       sin, text_len, eps=1e-6, norm_mode="diffusers", pairing="interleaved",
                       layout="bshd", out_dtype=None):
    check_tensors("qk_norm_rope", FUSED_WEIGHT_NAMES, q=q, k=k, text_q_weight=text_q_weight,
              text_k_weight=text_k_weight, image_q_weight=image_q_weight,
              image_k_weight=image_k_weight, cos=cos, sin=sin)
    return (torch.empty_like(q, dtype=q.dtype if out_dtype is None else out_dtype),
            torch.empty_like(k, dtype=k.dtype if out_dtype is None else out_dtype))


@torch.library.register_fake("kernel_align::qk_norm_rope_")
def _qk_norm_rope_inplace_fake(q, k, text_q_weight, text_k_weight, image_q_weight,
                               image_k_weight, cos, sin, text_len, eps=1e-6, norm_mode="diffusers",
                               pairing="interleaved", layout="bshd"):
    check_tensors("qk_norm_rope_", FUSED_WEIGHT_NAMES, q=q, k=k, text_q_weight=text_q_weight,
              text_k_weight=text_k_weight, image_q_weight=image_q_weight,
              image_k_weight=image_k_weight, cos=cos, sin=sin)


@torch.library.register_fake("kernel_align::qk_norm_rope_backward")
def _qk_norm_rope_backward_fake(q, k, dq_out, dk_out, text_q_weight, text_k_weight,
                                image_q_weight, image_k_weight, cos, sin, text_len, eps, norm_mode,
                                pairing, layout, compute_dw):
    weights = (text_q_weight, text_k_weight, image_q_weight, image_k_weight)
    check_tensors("qk_norm_rope_backward", FUSED_WEIGHT_NAMES, q=q, k=k, dq_out=dq_out, dk_out=dk_out,
              text_q_weight=text_q_weight, text_k_weight=text_k_weight,
              image_q_weight=image_q_weight, image_k_weight=image_k_weight, cos=cos, sin=sin)
    dws = tuple(torch.empty_like(w) if wanted else _no_gradient(q)
                for w, wanted in zip(weights, compute_dw))
    return (torch.empty_like(q), torch.empty_like(k)) + dws




# ---------------------------------------------------------------------------------------
# linear (csrc/linear.cpp): y contiguous, x's leading dims and N; the gradients like the
# tensors they belong to.


@torch.library.register_fake("kernel_align::linear")
def _linear_fake(x, weight, bias=None, activation="none", out_dtype=None):
    check_tensors("linear", ("bias",), x=x, weight=weight, bias=bias)
    return x.new_empty((*x.shape[:-1], weight.shape[0]),
                       dtype=x.dtype if out_dtype is None else out_dtype)


@torch.library.register_fake("kernel_align::linear_backward")
def _linear_backward_fake(x, weight, bias, dy, activation, output_mask):
    check_tensors("linear_backward", ("bias",), x=x, weight=weight, bias=bias, dy=dy)
    wanted = (torch.empty_like(x) if output_mask[0] else x.new_empty((0,)),
              torch.empty_like(weight) if output_mask[1] else x.new_empty((0,)),
              torch.empty_like(bias) if output_mask[2] else x.new_empty((0,)))
    return wanted


# ---------------------------------------------------------------------------------------
# attention (csrc/attention.cpp): out and the gradients like the inputs they belong to.


@torch.library.register_fake("kernel_align::attention")
def _attention_fake(q, k, v, mask=None, layout="bshd"):
    check_tensors("attention", ("mask",), q=q, k=k, v=v, mask=mask)
    return torch.empty_like(q)


@torch.library.register_fake("kernel_align::attention_backward")
def _attention_backward_fake(q, k, v, mask, out, dout, layout):
    check_tensors("attention_backward", ("mask",), q=q, k=k, v=v, mask=mask, out=out, dout=dout)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


# ---------------------------------------------------------------------------------------
# adaln_modulation (csrc/adaln.cpp): y like x, the gradients like x and scale.


@torch.library.register_fake("kernel_align::adaln_modulation")
def _adaln_modulation_fake(x, scale, shift, eps=1e-6, mode="diffusers"):
    check_tensors("adaln_modulation", x=x, scale=scale, shift=shift)
    return torch.empty_like(x)


@torch.library.register_fake("kernel_align::adaln_modulation_backward")
def _adaln_modulation_backward_fake(x, scale, dy, eps, mode):
    check_tensors("adaln_modulation_backward", x=x, scale=scale, dy=dy)
    return torch.empty_like(x), torch.empty_like(scale), torch.empty_like(scale)


# ---------------------------------------------------------------------------------------
# adaln_gate_residual (csrc/gate_residual.cpp): out like x, the gradients like y and gate.


@torch.library.register_fake("kernel_align::adaln_gate_residual")
def _adaln_gate_residual_fake(x, gate, y, mode="diffusers"):
    check_tensors("adaln_gate_residual", x=x, gate=gate, y=y)
    return torch.empty_like(x)


@torch.library.register_fake("kernel_align::adaln_gate_residual_backward")
def _adaln_gate_residual_backward_fake(gate, y, dout, mode):
    check_tensors("adaln_gate_residual_backward", gate=gate, y=y, dout=dout)
    return torch.empty_like(y), torch.empty_like(gate)


# ---------------------------------------------------------------------------------------
# out= variants: the outputs given, written, nothing returned (csrc/ops.cpp). The fake
# kernels check what the schema cannot; shapes and dtypes are the C++ validation's.


@torch.library.register_fake("kernel_align::qk_rmsnorm_out")
def _qk_rmsnorm_out_fake(x, weight, eps, norm_mode, out):
    check_tensors("qk_rmsnorm", ("weight",), x=x, weight=weight, out=out)


@torch.library.register_fake("kernel_align::qk_rmsnorm_backward_out")
def _qk_rmsnorm_backward_out_fake(x, dy, weight, eps, norm_mode, dx, dw):
    check_tensors("qk_rmsnorm_backward_out", ("weight", "dw"), x=x, dy=dy, weight=weight, dx=dx,
                  dw=dw)


@torch.library.register_fake("kernel_align::multi_axis_rope_out")
def _multi_axis_rope_out_fake(x, cos, sin, pairing, layout, out):
    check_tensors("multi_axis_rope", x=x, cos=cos, sin=sin, out=out)


@torch.library.register_fake("kernel_align::multi_axis_rope_backward_out")
def _multi_axis_rope_backward_out_fake(dy, cos, sin, pairing, layout, dx):
    check_tensors("multi_axis_rope_backward_out", dy=dy, cos=cos, sin=sin, dx=dx)


@torch.library.register_fake("kernel_align::qk_norm_rope_out")
def _qk_norm_rope_out_fake(q, k, text_q_weight, text_k_weight, image_q_weight, image_k_weight,
                           cos, sin, text_len, eps, norm_mode, pairing, layout, q_out, k_out):
    check_tensors("qk_norm_rope", FUSED_WEIGHT_NAMES, q=q, k=k, text_q_weight=text_q_weight,
                  text_k_weight=text_k_weight, image_q_weight=image_q_weight,
                  image_k_weight=image_k_weight, cos=cos, sin=sin, q_out=q_out, k_out=k_out)


@torch.library.register_fake("kernel_align::qk_norm_rope_backward_out")
def _qk_norm_rope_backward_out_fake(q, k, dq_out, dk_out, text_q_weight, text_k_weight,
                                    image_q_weight, image_k_weight, cos, sin, text_len, eps,
                                    norm_mode, pairing, layout, dq, dk, dw_text_q, dw_text_k,
                                    dw_image_q, dw_image_k):
    dw_names = ("dw_text_q", "dw_text_k", "dw_image_q", "dw_image_k")
    check_tensors("qk_norm_rope_backward_out", FUSED_WEIGHT_NAMES + dw_names, q=q, k=k,
                  dq_out=dq_out, dk_out=dk_out, text_q_weight=text_q_weight,
                  text_k_weight=text_k_weight, image_q_weight=image_q_weight,
                  image_k_weight=image_k_weight, cos=cos, sin=sin, dq=dq, dk=dk,
                  dw_text_q=dw_text_q, dw_text_k=dw_text_k, dw_image_q=dw_image_q,
                  dw_image_k=dw_image_k)
