"""Timing one op call the way the measurement notes prescribe: CUDA events per repetition, time-based
warm-up (so cuDNN autotuning and lazy initialisation finish first), adaptive repetitions, median with
p20/p80. On the CPU, a wall clock.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

TIMING_METHOD = ("cuda events around each call; warm-up >= {warmup_ms} ms and >= 2 calls after a first "
                 "(autotuning) call; reps = clamp(ceil({min_time_ms} ms / est), {min_reps}, {max_reps}); "
                 "median, p20, p80; L2 flushed before each rep: {flush_l2}")


@dataclass(frozen=True)
class TimingSettings:
    warmup_ms: float = 5.0
    min_time_ms: float = 10.0
    min_reps: int = 5
    max_reps: int = 100
    flush_l2: bool = False

    def describe(self, device_type: str) -> str:
        text = TIMING_METHOD.format(**self.__dict__)
        return text if device_type == "cuda" else text.replace("cuda events around each call", "wall clock")


def measure(fn: Callable[[], object], device_type: str, settings: TimingSettings,
            l2_flush: Callable[[], None] | None = None) -> tuple[float, float, float, int]:
    """(median_ms, p20_ms, p80_ms, reps) of ``fn``; ``device_type`` is 'cuda' or 'cpu'."""
    if device_type == "cuda":
        import torch

        sync = torch.cuda.synchronize
    else:
        def sync():
            return None
    fn()  # first call: autotuning, lazy init
    sync()
    calls, start = 0, time.perf_counter()
    while True:
        fn()
        sync()
        calls += 1
        elapsed_ms = (time.perf_counter() - start) * 1e3
        if (calls >= 2 and elapsed_ms >= settings.warmup_ms) or calls >= settings.max_reps:
            break
    estimate = max(elapsed_ms / calls, 1e-4)
    reps = int(min(settings.max_reps, max(settings.min_reps, math.ceil(settings.min_time_ms / estimate))))
    times = _time_reps(fn, device_type, reps, l2_flush if settings.flush_l2 else None)
    p20, p50, p80 = np.percentile(times, [20, 50, 80])
    return float(p50), float(p20), float(p80), reps


def _time_reps(fn, device_type: str, reps: int, l2_flush) -> np.ndarray:
    if device_type == "cuda":
        import torch

        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for begin, end in events:
            if l2_flush is not None:
                l2_flush()
            begin.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return np.array([b.elapsed_time(e) for b, e in events])
    times = []
    for _ in range(reps):
        if l2_flush is not None:
            l2_flush()
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return np.array(times)
