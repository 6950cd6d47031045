"""The benchmarks' one timing harness: wall-clock medians, contenders run interleaved so that a change of load on a
shared machine hits each of them alike."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any


def timed(fn: Callable[[], Any], repeats: int = 1, warmup: bool = False) -> tuple[float, Any]:
    """``(median seconds of ``repeats`` calls, the last call's output)``; ``warmup``: one untimed call first."""
    if warmup:
        fn()
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def interleaved(fns: Mapping[str, Callable[[], Any]], repeats: int, warmup: bool = True) -> dict[str, float]:
    """Median seconds of each function over ``repeats`` rounds, each round calling every function once in turn
    (``warmup``: one untimed call of each first)."""
    if warmup:
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}
