"""Process-wide settings of the C++ library: which backend the registry tries first
(registry.hpp), strict mode, the trace file and the CPU thread count (runtime.hpp).
None of them changes an output bit. Each starts from the environment, read once at first
use (``KERNEL_ALIGN_BACKEND``, ``KERNEL_ALIGN_STRICT``, ``KERNEL_ALIGN_HOST_FALLBACK``,
``KERNEL_ALIGN_TRACE``, ``KERNEL_ALIGN_ISA``, ``KERNEL_ALIGN_NUM_THREADS``: registry.hpp,
runtime.hpp, docs/trace.md); a bad value there is a ``ValueError`` at that first use.
The settings are shared by every thread; ``last_call`` is per thread."""

from __future__ import annotations

import os
from typing import NamedTuple

from ._ops import as_int, as_str, ops

__all__ = ["backends", "get_backend", "set_backend", "strict", "is_strict", "trace_to",
           "last_call", "fallback_count", "get_num_threads", "set_num_threads", "CallReport"]


def backends() -> list[str]:
    """Names of the registered backends, in registration order ("simd": the SIMD paths
    and thread pool, the default; "reference": the scalar reference; with ``HAS_CUDA``
    also "cuda" and "cuda-host", the CPU reference on host copies).

    Returns:
        A new list of the names ``set_backend`` accepts.
    """
    return list(ops.backends())


def get_backend() -> str | None:
    """The backend forced by set_backend, or None when the registry's order applies.

    Returns:
        The forced backend's name, or None.
    """
    return ops.get_backend() or None


def set_backend(name: str | None) -> None:
    """Make ``name`` the first choice of every later call (None: the registry's own
    order). An unknown name, the empty one included, is a ValueError listing the valid
    ones. A call the forced backend cannot run falls back (counted, traced, warned about
    once) or, in strict mode, fails.

    Args:
        name: one of ``backends()``, or None.

    Raises:
        TypeError: a name that is neither a str nor None.
        ValueError: an unknown or empty name.
    """
    if name is not None:
        as_str("set_backend", "name", name)
    if name == "":
        raise ValueError("kernel_align.set_backend: argument 'name': expected a backend name, "
                         f"one of {', '.join(backends())} (None restores the registry's "
                         "order), found ''")
    ops.set_backend("" if name is None else name)


def strict(flag: bool = True) -> None:
    """In strict mode a call that its first-choice backend cannot run fails (ValueError
    with the reason) instead of falling back.

    Args:
        flag: True turns strict mode on (the default), False off.
    """
    ops.set_strict(bool(flag))


def is_strict() -> bool:
    """Whether strict mode is on (see ``strict``).

    Returns:
        True in strict mode.
    """
    return ops.get_strict()


def trace_to(path: str | os.PathLike | None) -> None:
    """Append one JSON record per call to ``path`` (created if absent, never truncated:
    each opening is a new session; format in docs/trace.md); None stops tracing.

    Args:
        path: the JSONL file (str or path-like), or None.

    Raises:
        ValueError: a file that cannot be opened for appending (tracing is then off), or
            a path holding a NUL character (tracing stays as it was).
    """
    ops.set_trace_path("" if path is None else os.fspath(path))


class CallReport(NamedTuple):
    """What one call ran on and how long it took: ``last_call()``'s result.

    Attributes:
        requested_backend: the first choice, the forced backend or the registry's first.
        backend: the backend that ran the call.
        isa: its path ("avx512", "avx2", "portable" for simd; "scalar" for reference;
            "cuda" for cuda).
        fallback: "" unless the call fell back: why the requested backend did not run it.
        backend_seconds: wall time of the backend running the call, without validation,
            the registry's choice and tracing.
        call_seconds: wall time of the whole C++ library call (validation, choice,
            backend, tracing), which the binding's overhead is measured against.
    """

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


# help(CallReport) shows these rather than "Alias for field number N".
for _field, _doc in (
    ("requested_backend", "The first-choice backend: the forced one or the registry's first."),
    ("backend", "The backend that ran the call."),
    ("isa", "The backend's instruction-set path (avx512, avx2, portable, scalar, cuda)."),
    ("fallback", "'' unless the call fell back: why the requested backend did not run it."),
    ("backend_seconds", "Wall time of the backend alone (seconds)."),
    ("call_seconds", "Wall time of the whole C++ library call (seconds)."),
):
    getattr(CallReport, _field).__doc__ = _doc
del _field, _doc


def last_call() -> CallReport:
    """What the last call made by this thread ran on, and why.

    Returns:
        The ``CallReport`` of the calling thread's last op call (empty strings and zeros
        before its first; a refused call leaves the previous report). Autograd runs CPU
        backward passes on the calling thread, so they count.
    """
    return CallReport(*ops.last_call())


def fallback_count() -> int:
    """Calls that ran on a backend other than their first choice, since the start.

    Returns:
        The count over the whole process (every thread), since it started.
    """
    return ops.fallback_count()


def get_num_threads() -> int:
    """Threads of the CPU backend (``KERNEL_ALIGN_NUM_THREADS`` or all cores by default).

    Returns:
        The count, 1 to 4096.
    """
    return ops.get_num_threads()


def set_num_threads(n: int) -> None:
    """Threads of the CPU backend (>= 1); torch's own thread count is separate.
    The bytes do not depend on it.

    Args:
        n: 1 to 4096.

    Raises:
        TypeError: n not an int (2.0 is not).
        ValueError: n outside 1..4096.
    """
    ops.set_num_threads(as_int("set_num_threads", "n", n))
