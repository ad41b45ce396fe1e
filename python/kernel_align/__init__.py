"""kernel-align for PyTorch: bitwise-reproducible, batch-invariant QK RMSNorm, multi-axis
RoPE, Linear, joint attention and LayerNorm with AdaLN modulation (forward and backward) as ``torch.ops.kernel_align`` custom operators,
running the C++ library's backends: the CPU's, and the CUDA backend on CUDA tensors where
the extension was built with it (``HAS_CUDA``). See docs/python.md and docs/api.md.

The diffusers attention processor lives in ``kernel_align.diffusers`` (it imports
diffusers, which this package does not require).

Contents: the ops (every name of ``kernel_align.functional.__all__``: ``qk_rmsnorm``,
``multi_axis_rope``, ``qk_norm_rope``, ``linear``, ``attention``, ``adaln_modulation``,
...; re-exported here from that one list), the
batch-invariant mode for whole models (``batch_invariant``, ``set_batch_invariant``,
``patch_linear``: kernel_align.batch_invariant), their modules
(``QkRmsNorm``, ``MultiAxisRope``: kernel_align.modules), positions and tables
(``qwen_image_positions``, ``qwen_image_rope_positions``, ``rope_tables``,
``timestep_embedding``:
kernel_align.positions) and the runtime settings (``backends``, ``set_backend``,
``strict``, ``trace_to``, ``last_call``, ...: kernel_align.runtime).

Errors: what the C++ library refuses (``kernel_align::Error``) is a ``ValueError``
"kernel_align.<op>: argument '<name>': expected ..., found ..."; an argument that is not
a dense tensor, or a dtype other than fp32/bf16/fp16, is a ``TypeError``. A refused call
writes nothing.

Constants:
    HAS_CUDA: bool, whether the extension runs CUDA tensors (built with the library's
        CUDA backend for a CUDA build of torch); without it only CPU tensors are accepted.
    __version__: str, the library's version "MAJOR.MINOR.PATCH" (CMakeLists.txt's
        project(), read from the extension: ``kernel_align::version()``).
    CONTRACT_VERSION: str, the arithmetic contract the results follow,
        "kernel-align-contract/N" (docs/contract.md; ``kernel_align::contract_version()``).
        A release that changes no result bit keeps it; a contract change bumps both.
"""

from ._ops import HAS_CUDA  # loads the operators before anything uses them
from ._ops import ops as _ops
from .batch_invariant import (
    LinearPatch,
    batch_invariant,
    is_batch_invariant,
    patch_linear,
    set_batch_invariant,
)
from . import functional as _functional
from .functional import *  # noqa: F403 (the ops, as functional.__all__ lists them)
from .modules import MultiAxisRope, QkRmsNorm
from .positions import (
    qwen_image_positions,
    qwen_image_rope_positions,
    rope_tables,
    timestep_embedding,
)
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

# The library's version (CMakeLists.txt's project(), read from the extension) and the
# version of the arithmetic contract its results follow (docs/contract.md).
__version__: str = _ops.version()
CONTRACT_VERSION: str = _ops.contract_version()

__all__ = [
    "HAS_CUDA",
    "CONTRACT_VERSION",
    *_functional.__all__,
    "batch_invariant",
    "set_batch_invariant",
    "is_batch_invariant",
    "patch_linear",
    "LinearPatch",
    "QkRmsNorm",
    "MultiAxisRope",
    "qwen_image_positions",
    "qwen_image_rope_positions",
    "rope_tables",
    "timestep_embedding",
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
