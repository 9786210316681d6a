"""Timing helpers shared by the benchmarks (run as ``python bench/<name>.py``, so this imports as ``timing``)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so a clock read afterwards includes it (CUDA is asynchronous)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def best_seconds(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """Wall time of the fastest of ``repeats`` calls after one warm-up call: the least disturbed by
    other load on a shared machine."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


def best_seconds_each(fns: dict[str, Callable[[], object]], device: torch.device, repeats: int) -> dict[str, float]:
    """``best_seconds`` of several functions, timed in turn (one call of each per round, after a
    warm-up round): on a shared machine every figure then sees the same spells of load, so their
    ratios are fairer than those of figures taken one after another."""
    for fn in fns.values():
        fn()
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeats):
        for name, fn in fns.items():
            synchronize(device)
            start = time.perf_counter()
            fn()
            synchronize(device)
            best[name] = min(best[name], time.perf_counter() - start)
    return best
