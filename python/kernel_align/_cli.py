"""The ``kernel-align`` command of the wheel: the C++ executable ships as package data
(``kernel_align/bin/kernel-align``, python/CMakeLists.txt) and this console entry point
(pyproject.toml's ``[project.scripts]``) replaces the Python process with it, as the cmake
and ninja wheels do, so its exit status, signals and streams are the executable's own."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from . import __path__ as _package_path


def executable() -> str | None:
    """The kernel-align executable installed with this package, or None (a checkout's
    editable install whose build has not made it)."""
    for directory in _package_path:
        candidate = Path(directory) / "bin" / "kernel-align"
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


def main() -> None:
    path = executable()
    if path is None:
        sys.exit("kernel-align: error: the executable is not installed with the kernel_align "
                 "package (expected kernel_align/bin/kernel-align; reinstall the wheel, or "
                 "build from source: scripts/setup.sh)")
    os.execv(path, [path, *sys.argv[1:]])
