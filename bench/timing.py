"""Timing of the Python benchmarks that compare calls measured in one process
(compare_adaln, compare_flow_sde): each call warmed up once, then `repeats` rounds in which
every call runs once in turn (interleaved, so a slow spell of a shared machine hits them
all alike), the best time of each."""

from __future__ import annotations

import time
from collections.abc import Callable


def interleaved_minima(timed: list[tuple[str, Callable[[], object]]],
                       repeats: int) -> dict[str, float]:
    """{name: the least seconds one call of it took} over `repeats` interleaved rounds."""
    for _, fn in timed:
        fn()  # warm-up (and compile)
    minima = {name: float("inf") for name, _ in timed}
    for _ in range(repeats):
        for name, fn in timed:
            t0 = time.perf_counter()
            fn()
            minima[name] = min(minima[name], time.perf_counter() - t0)
    return minima
