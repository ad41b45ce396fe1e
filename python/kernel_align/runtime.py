"""Process-wide settings of the C++ library: which backend the registry tries first
(registry.hpp), strict mode, the trace file and the CPU thread count (runtime.hpp).
None of them changes an output bit."""

from __future__ import annotations

import os
from typing import NamedTuple

from ._ops import ops

__all__ = ["backends", "get_backend", "set_backend", "strict", "is_strict", "trace_to",
           "last_call", "fallback_count", "get_num_threads", "set_num_threads", "CallReport"]


def backends() -> list[str]:
    """Names of the registered backends, in registration order ("simd": the SIMD paths
    and thread pool, the default; "reference": the scalar reference)."""
    return list(ops.backends())


def get_backend() -> str | None:
    """The backend forced by set_backend, or None when the registry's order applies."""
    return ops.get_backend() or None


def set_backend(name: str | None) -> None:
    """Make ``name`` the first choice of every later call (None: the registry's own
    order). An unknown name, the empty one included, is a ValueError listing the valid
    ones."""
    if name == "":
        raise ValueError("kernel_align.set_backend: argument 'name': expected a backend name, "
                         f"one of {', '.join(backends())} (None restores the registry's "
                         "order), found ''")
    ops.set_backend("" if name is None else name)


def strict(flag: bool = True) -> None:
    """In strict mode a call that its first-choice backend cannot run fails (ValueError
    with the reason) instead of falling back."""
    ops.set_strict(bool(flag))


def is_strict() -> bool:
    return ops.get_strict()


def trace_to(path: str | os.PathLike | None) -> None:
    """Append one JSON record per call to ``path`` (created if absent, never truncated:
    each opening is a new session; format in docs/trace.md); None stops tracing."""
    ops.set_trace_path("" if path is None else os.fspath(path))


class CallReport(NamedTuple):
    requested_backend: str
    backend: str
    isa: str
    fallback: str  # "" unless the call fell back: why the requested backend did not run it
    # Wall time of the backend running the call, without validation, the registry's
    # choice and tracing.
    backend_seconds: float
    # Wall time of the whole C++ library call (validation, choice, backend, tracing):
    # the raw C++ call that the torch binding's overhead is measured against.
    call_seconds: float


def last_call() -> CallReport:
    """What the last call made by this thread ran on, and why."""
    return CallReport(*ops.last_call())


def fallback_count() -> int:
    """Calls that ran on a backend other than their first choice, since the start."""
    return ops.fallback_count()


def get_num_threads() -> int:
    return ops.get_num_threads()


def set_num_threads(n: int) -> None:
    """Threads of the CPU backend (>= 1); torch's own thread count is separate."""
    ops.set_num_threads(n)
