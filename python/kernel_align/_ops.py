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
from types import SimpleNamespace
from typing import Callable, NamedTuple

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


def _like(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    # empty_like keeps a dense input's strides, as the C++ kernels' outputs do.
    return torch.empty_like(tensor, dtype=tensor.dtype if dtype is None else dtype)


class _Operator(NamedTuple):
    """One operator of ``torch.ops.kernel_align`` that runs a library op: its schema (the
    name and everything after it) and its outputs as a function of the bound arguments
    (None for the operators that write into their arguments). ``reported_as`` is the name
    the fake kernel's errors give (the Python function whose out= reaches the operator)."""
    schema: str
    outputs: Callable[[SimpleNamespace], object] | None = None
    reported_as: str | None = None


# The library ops' torch operators, written once: the definitions (with the pt2_compliant
# tag) and the fake kernels (shapes, dtypes and strides, for FakeTensor and torch.compile)
# are derived from these rows; csrc/*.cpp registers only the kernels (CPU, CUDA, Autograd)
# under these names. The norm mode is `norm_mode` in the norms' and every out= schema:
# torch's dispatch to Python modes (functionalisation of a mutating op, for one) passes a
# `mode` argument of its own, which an op argument of that name collides with. The out=
# variants take the outputs given, mutate them and return nothing (as the in-place ops:
# torch.compile functionalises such ops), their dtypes the outputs' own; their fake kernels
# check what the schema cannot, and the shapes and dtypes are the C++ validation's.
_OPERATORS = (
    # qk_rmsnorm (csrc/ops.cpp)
    _Operator("qk_rmsnorm(Tensor x, Tensor? weight=None, float eps=1e-06, "
              "str norm_mode='single', ScalarType? out_dtype=None) -> Tensor",
              lambda a: _like(a.x, a.out_dtype)),
    _Operator("qk_rmsnorm_backward(Tensor x, Tensor dy, Tensor? weight, float eps, "
              "str norm_mode, bool compute_dw) -> (Tensor dx, Tensor dw)",
              lambda a: (_like(a.x), _like(a.weight) if a.compute_dw else _no_gradient(a.x))),
    _Operator("qk_rmsnorm_out(Tensor x, Tensor? weight, float eps, str norm_mode, "
              "Tensor(a!) out) -> ()", reported_as="qk_rmsnorm"),
    _Operator("qk_rmsnorm_backward_out(Tensor x, Tensor dy, Tensor? weight, float eps, "
              "str norm_mode, Tensor(a!) dx, Tensor(b!)? dw) -> ()"),
    # multi_axis_rope (csrc/ops.cpp)
    _Operator("multi_axis_rope(Tensor x, Tensor cos, Tensor sin, str pairing='interleaved', "
              "str layout='bshd') -> Tensor", lambda a: _like(a.x)),
    _Operator("multi_axis_rope_(Tensor(a!) x, Tensor cos, Tensor sin, "
              "str pairing='interleaved', str layout='bshd') -> ()"),
    _Operator("multi_axis_rope_backward(Tensor dy, Tensor cos, Tensor sin, str pairing, "
              "str layout) -> Tensor", lambda a: _like(a.dy)),
    _Operator("multi_axis_rope_out(Tensor x, Tensor cos, Tensor sin, str pairing, str layout, "
              "Tensor(a!) out) -> ()", reported_as="multi_axis_rope"),
    _Operator("multi_axis_rope_backward_out(Tensor dy, Tensor cos, Tensor sin, str pairing, "
              "str layout, Tensor(a!) dx) -> ()"),
    # qk_norm_rope (csrc/ops.cpp)
    _Operator("qk_norm_rope(Tensor q, Tensor k, Tensor? text_q_weight, Tensor? text_k_weight, "
              "Tensor? image_q_weight, Tensor? image_k_weight, Tensor cos, Tensor sin, "
              "int text_len, float eps=1e-06, str norm_mode='diffusers', "
              "str pairing='interleaved', str layout='bshd', ScalarType? out_dtype=None) -> "
              "(Tensor q_out, Tensor k_out)",
              lambda a: (_like(a.q, a.out_dtype), _like(a.k, a.out_dtype))),
    _Operator("qk_norm_rope_(Tensor(a!) q, Tensor(b!) k, Tensor? text_q_weight, "
              "Tensor? text_k_weight, Tensor? image_q_weight, Tensor? image_k_weight, "
              "Tensor cos, Tensor sin, int text_len, float eps=1e-06, "
              "str norm_mode='diffusers', str pairing='interleaved', str layout='bshd') -> ()"),
    _Operator("qk_norm_rope_backward(Tensor q, Tensor k, Tensor dq_out, Tensor dk_out, "
              "Tensor? text_q_weight, Tensor? text_k_weight, Tensor? image_q_weight, "
              "Tensor? image_k_weight, Tensor cos, Tensor sin, int text_len, float eps, "
              "str norm_mode, str pairing, str layout, bool[4] compute_dw) -> (Tensor dq, "
              "Tensor dk, Tensor dw_text_q, Tensor dw_text_k, Tensor dw_image_q, "
              "Tensor dw_image_k)",
              lambda a: (_like(a.q), _like(a.k)) + tuple(
                  _like(w) if wanted else _no_gradient(a.q)
                  for w, wanted in zip((a.text_q_weight, a.text_k_weight, a.image_q_weight,
                                        a.image_k_weight), a.compute_dw))),
    _Operator("qk_norm_rope_out(Tensor q, Tensor k, Tensor? text_q_weight, "
              "Tensor? text_k_weight, Tensor? image_q_weight, Tensor? image_k_weight, "
              "Tensor cos, Tensor sin, int text_len, float eps, str norm_mode, str pairing, "
              "str layout, Tensor(a!) q_out, Tensor(b!) k_out) -> ()", reported_as="qk_norm_rope"),
    _Operator("qk_norm_rope_backward_out(Tensor q, Tensor k, Tensor dq_out, Tensor dk_out, "
              "Tensor? text_q_weight, Tensor? text_k_weight, Tensor? image_q_weight, "
              "Tensor? image_k_weight, Tensor cos, Tensor sin, int text_len, float eps, "
              "str norm_mode, str pairing, str layout, Tensor(a!) dq, Tensor(b!) dk, "
              "Tensor(c!)? dw_text_q, Tensor(d!)? dw_text_k, Tensor(e!)? dw_image_q, "
              "Tensor(f!)? dw_image_k) -> ()"),
    # linear (csrc/linear.cpp): y contiguous, x's leading dims and N; the gradients like the
    # tensors they belong to, an empty tensor for one the mask leaves out.
    _Operator("linear(Tensor x, Tensor weight, Tensor? bias=None, str activation='none', "
              "ScalarType? out_dtype=None) -> Tensor",
              lambda a: a.x.new_empty((*a.x.shape[:-1], a.weight.shape[0]),
                                      dtype=a.x.dtype if a.out_dtype is None else a.out_dtype)),
    _Operator("linear_backward(Tensor x, Tensor weight, Tensor? bias, Tensor dy, "
              "str activation, bool[3] output_mask) -> (Tensor, Tensor, Tensor)",
              lambda a: tuple(_like(t) if wanted else a.x.new_empty((0,))
                              for t, wanted in zip((a.x, a.weight, a.bias), a.output_mask))),
    # attention (csrc/attention.cpp): out and the gradients like the inputs they belong to.
    _Operator("attention(Tensor q, Tensor k, Tensor v, Tensor? mask=None, "
              "str layout='bshd') -> Tensor", lambda a: _like(a.q)),
    _Operator("attention_backward(Tensor q, Tensor k, Tensor v, Tensor? mask, Tensor out, "
              "Tensor dout, str layout) -> (Tensor, Tensor, Tensor)",
              lambda a: (_like(a.q), _like(a.k), _like(a.v))),
    # adaln_modulation (csrc/adaln.cpp): y like x, the gradients like x and scale; out=.
    _Operator("adaln_modulation(Tensor x, Tensor scale, Tensor shift, float eps=1e-6, "
              "str mode='diffusers') -> Tensor", lambda a: _like(a.x)),
    _Operator("adaln_modulation_out(Tensor x, Tensor scale, Tensor shift, float eps, "
              "str norm_mode, Tensor(a!) out) -> ()", reported_as="adaln_modulation"),
    _Operator("adaln_modulation_backward(Tensor x, Tensor scale, Tensor dy, float eps, "
              "str mode) -> (Tensor, Tensor, Tensor)",
              lambda a: (_like(a.x), _like(a.scale), _like(a.scale))),
    # activation (csrc/activation.cpp): y and dx like x.
    _Operator("activation(Tensor x, str activation='silu') -> Tensor", lambda a: _like(a.x)),
    _Operator("activation_backward(Tensor x, Tensor dy, str activation) -> Tensor",
              lambda a: _like(a.x)),
    # adaln_gate_residual (csrc/gate_residual.cpp): out like x, the gradients like y and gate;
    # out=.
    _Operator("adaln_gate_residual(Tensor x, Tensor gate, Tensor y, str mode='diffusers') -> "
              "Tensor", lambda a: _like(a.x)),
    _Operator("adaln_gate_residual_out(Tensor x, Tensor gate, Tensor y, str norm_mode, "
              "Tensor(a!) out) -> ()", reported_as="adaln_gate_residual"),
    _Operator("adaln_gate_residual_backward(Tensor gate, Tensor y, Tensor dout, str mode) -> "
              "(Tensor, Tensor)", lambda a: (_like(a.y), _like(a.gate))),
    # flow_sde_step, flow_sde_logp (csrc/flow_sde.cpp): prev like x, logp fp32 [B]; the
    # gradients like the tensors they belong to (the step's in the dtypes given), an empty
    # tensor for one the mask leaves out.
    _Operator("flow_sde_step(Tensor x, Tensor v, Tensor noise, float sigma, float sigma_prev, "
              "float noise_level, float sigma_max) -> Tensor", lambda a: _like(a.x)),
    _Operator("flow_sde_step_backward(Tensor dprev, ScalarType dx_dtype, ScalarType dv_dtype, "
              "float sigma, float sigma_prev, float noise_level, float sigma_max, "
              "bool[2] output_mask) -> (Tensor, Tensor)",
              lambda a: tuple(_like(a.dprev, dtype) if wanted else a.dprev.new_empty((0,))
                              for dtype, wanted in zip((a.dx_dtype, a.dv_dtype),
                                                       a.output_mask))),
    _Operator("flow_sde_logp(Tensor x, Tensor v, Tensor prev, float sigma, float sigma_prev, "
              "float noise_level, float sigma_max) -> Tensor",
              lambda a: a.x.new_empty((a.x.shape[0],), dtype=torch.float32)),
    _Operator("flow_sde_logp_backward(Tensor x, Tensor v, Tensor prev, Tensor dlogp, "
              "float sigma, float sigma_prev, float noise_level, float sigma_max, "
              "bool[2] output_mask) -> (Tensor, Tensor)",
              lambda a: tuple(_like(t) if wanted else a.x.new_empty((0,))
                              for t, wanted in zip((a.x, a.v), a.output_mask))),
    # latent_normalize, latent_pack (csrc/latent.cpp): y like z, dz like dy; the tokens
    # [B, H/2 * W/2, 4C] of latents [B, C, H, W] and the latents [B, C, height, width] of
    # tokens [B, S, 4C], both new and contiguous. height and width are SymInts: the pack's
    # gradient passes the latents' sizes, symbolic under dynamic shapes.
    _Operator("latent_normalize(Tensor z, Tensor mean, Tensor std, str transform='normalize') "
              "-> Tensor", lambda a: _like(a.z)),
    _Operator("latent_normalize_backward(Tensor dy, Tensor std, str transform) -> Tensor",
              lambda a: _like(a.dy)),
    _Operator("latent_pack(Tensor latents) -> Tensor",
              lambda a: a.latents.new_empty((a.latents.shape[0], (a.latents.shape[2] // 2)
                                             * (a.latents.shape[3] // 2),
                                             4 * a.latents.shape[1]))),
    _Operator("latent_pack_backward(Tensor tokens, SymInt height, SymInt width) -> Tensor",
              lambda a: a.tokens.new_empty((a.tokens.shape[0], a.tokens.shape[2] // 4, a.height,
                                            a.width))),
    # true_cfg (csrc/true_cfg.cpp): v like cond; the gradients like cond and uncond, an
    # empty tensor for one the mask leaves out.
    _Operator("true_cfg(Tensor cond, Tensor uncond, float scale) -> Tensor",
              lambda a: _like(a.cond)),
    _Operator("true_cfg_backward(Tensor cond, Tensor uncond, Tensor dv, float scale, "
              "bool[2] output_mask) -> (Tensor, Tensor)",
              lambda a: tuple(_like(t) if wanted else a.cond.new_empty((0,))
                              for t, wanted in zip((a.cond, a.uncond), a.output_mask))),
)


def _is_tensor_argument(argument) -> bool:
    kind = argument.type
    if isinstance(kind, torch.OptionalType):
        kind = kind.getElementType()
    return kind == torch.TensorType.get()


def _fake_kernel(schema, row: _Operator):
    """The fake kernel of one row: the arguments bound to the schema's names (defaults
    filled in), every tensor argument checked as the Python functions check them (the
    optional ones may be None), then the row's outputs."""
    names = [argument.name for argument in schema.arguments]
    defaults = {argument.name: argument.default_value for argument in schema.arguments
                if argument.has_default_value()}
    tensors = [argument.name for argument in schema.arguments if _is_tensor_argument(argument)]
    optional = tuple(argument.name for argument in schema.arguments
                     if _is_tensor_argument(argument)
                     and isinstance(argument.type, torch.OptionalType))
    reported = row.reported_as or schema.name.split("::")[1]

    def fake(*args, **kwargs):
        bound = {**defaults, **dict(zip(names, args)), **kwargs}
        check_tensors(reported, optional, **{name: bound[name] for name in tensors})
        return None if row.outputs is None else row.outputs(SimpleNamespace(**bound))

    fake.__name__ = f"_{schema.name.split('::')[1]}_fake"
    return fake


def _define_operators() -> torch.library.Library:
    library = torch.library.Library("kernel_align", "FRAGMENT")
    for row in _OPERATORS:
        library.define(row.schema, tags=(torch.Tag.pt2_compliant_tag,))
        schema = torch._C.parse_schema(f"kernel_align::{row.schema}")
        torch.library.register_fake(schema.name, _fake_kernel(schema, row), lib=library)
    return library


# Held for the life of the process: the definitions go with the Library object.
_LIBRARY = _define_operators()
