"""kernel-align for PyTorch: bitwise-reproducible, batch-invariant QK RMSNorm and
multi-axis RoPE (forward and backward) as ``torch.ops.kernel_align`` custom operators,
running the C++ library's backends: the CPU's, and the CUDA backend on CUDA tensors where
the extension was built with it (``HAS_CUDA``). See docs/python.md.

The diffusers attention processor lives in ``kernel_align.diffusers`` (it imports
diffusers, which this package does not require).
"""

from ._ops import HAS_CUDA  # loads the operators before anything uses them
from .functional import multi_axis_rope, multi_axis_rope_, qk_norm_rope, qk_norm_rope_, qk_rmsnorm
from .modules import MultiAxisRope, QkRmsNorm
from .positions import qwen_image_positions, qwen_image_rope_positions, rope_tables
from .runtime import (
    CallReport,
    backends,
    fallback_count,
    get_backend,
    get_num_threads,
    is_strict,
    last_call,
    set_backend,
    set_num_threads,
    strict,
    trace_to,
)

__version__ = "0.1.0"

__all__ = [
    "HAS_CUDA",
    "qk_rmsnorm",
    "multi_axis_rope",
    "multi_axis_rope_",
    "qk_norm_rope",
    "qk_norm_rope_",
    "QkRmsNorm",
    "MultiAxisRope",
    "qwen_image_positions",
    "qwen_image_rope_positions",
    "rope_tables",
    "backends",
    "get_backend",
    "set_backend",
    "get_num_threads",
    "set_num_threads",
    "strict",
    "is_strict",
    "trace_to",
    "last_call",
    "fallback_count",
    "CallReport",
]
