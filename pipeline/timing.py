"""Timing one op call: its GPU execution time, and separately the host's time per call.

GPU (``device_type="cuda"``): a first call (cuDNN autotuning, lazy initialisation), a warm-up by time, then
the timed repetitions. Before the repetitions a busy-wait kernel is queued that keeps the GPU busy for longer
than the host needs to enqueue all of them, so the GPU never waits for the host: each repetition's pair of
CUDA events brackets the op's kernels only, not the host's launch rate (as PyTorch's and Triton's benchmark
helpers do). Without it, an op under ~30 us measures the Python dispatch speed of the host, which transfers
to no other machine. The host's own time per call (``host_ms``, wall clock around each enqueue) is recorded
beside it: an eager loop of the op runs at about ``max(gpu, host)`` per call.

CPU: a wall clock around each call (GPU time and host time are then the same thing).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

TIMING_METHOD = ("GPU time: CUDA events around each call, enqueued behind a busy-wait kernel that keeps the GPU "
                 "busy until the host has queued every repetition; a first (autotuning) call, warm-up >= "
                 "{warmup_ms} ms and >= 1 call; reps = clamp(ceil({min_time_ms} ms / estimate), {min_reps} "
                 "({long_op_reps} for calls over {long_op_ms} ms), {max_reps}); time_ms/p20/p80 = median and percentiles over reps; host_ms = median wall-clock "
                 "time the host needs to enqueue one call; L2 flushed before each rep: {flush_l2}")
CPU_METHOD = ("wall clock around each call; a first call, warm-up >= {warmup_ms} ms and >= 1 call; reps = "
              "clamp(ceil({min_time_ms} ms / estimate), {min_reps}, {max_reps}); median, p20, p80; host_ms = "
              "time_ms; L2 flushed before each rep: {flush_l2}")
_SLEEP_MARGIN = 2.0        # busy-wait for this many times the host's estimated enqueue time...
_SLEEP_EXTRA_MS = 0.1      # ...plus this much
_MAX_SLEEP_MS = 500.0
_GAP_TOLERANCE = 0.05      # idle share of the timed span above which the reps are re-timed with a longer wait


@dataclass(frozen=True)
class TimingSettings:
    warmup_ms: float = 5.0
    min_time_ms: float = 10.0
    min_reps: int = 5
    max_reps: int = 100
    long_op_ms: float = 2.0     # calls longer than this vary by well under 1 %...
    long_op_reps: int = 3       # ...so fewer reps suffice
    flush_l2: bool = False

    def describe(self, device_type: str) -> str:
        return (TIMING_METHOD if device_type == "cuda" else CPU_METHOD).format(**self.__dict__)


@dataclass(frozen=True)
class Timing:
    """One op's measurement: GPU time per call (median, p20, p80), reps, and the host's time per call."""
    median_ms: float
    p20_ms: float
    p80_ms: float
    reps: int
    host_ms: float


def measure(fn: Callable[[], object], device_type: str, settings: TimingSettings,
            l2_flush: Callable[[], None] | None = None) -> Timing:
    """Measure ``fn`` on ``device_type`` ('cuda' or 'cpu'); see the module docstring for the method."""
    sync = _cuda_sync if device_type == "cuda" else _no_sync
    fn()  # first call: autotuning, lazy init
    sync()
    calls, host_s, start = 0, 0.0, time.perf_counter()
    while True:
        t0 = time.perf_counter()
        fn()
        host_s += time.perf_counter() - t0
        sync()
        calls += 1
        elapsed_ms = (time.perf_counter() - start) * 1e3
        if elapsed_ms >= settings.warmup_ms or calls >= settings.max_reps:
            break
    estimate = max(elapsed_ms / calls, 1e-4)
    fewest = settings.long_op_reps if estimate > settings.long_op_ms else settings.min_reps
    reps = int(min(settings.max_reps, max(fewest, math.ceil(settings.min_time_ms / estimate))))
    flush = l2_flush if settings.flush_l2 else None
    if device_type == "cuda":
        times, host = _time_reps_gpu(fn, reps, host_s * 1e3 / calls, flush)
    else:
        times = host = _time_reps_wall(fn, reps, flush)
    p20, p50, p80 = np.percentile(times, [20, 50, 80])
    return Timing(float(p50), float(p20), float(p80), reps, float(np.median(host)))


def _cuda_sync():
    import torch

    torch.cuda.synchronize()


def _no_sync():
    return None


def _time_reps_wall(fn, reps: int, l2_flush) -> np.ndarray:
    times = np.empty(reps)
    for i in range(reps):
        if l2_flush is not None:
            l2_flush()
        t0 = time.perf_counter()
        fn()
        times[i] = (time.perf_counter() - t0) * 1e3
    return times


def _time_reps_gpu(fn, reps: int, host_estimate_ms: float, l2_flush) -> tuple[np.ndarray, np.ndarray]:
    """(GPU ms per rep, host ms per rep). Re-timed once with a longer busy-wait if the GPU went idle."""
    margin = _SLEEP_MARGIN
    for _ in range(2):
        times, host, idle = _timed_loop(fn, reps, host_estimate_ms * margin, l2_flush)
        if l2_flush is not None or idle <= _GAP_TOLERANCE:
            break
        margin *= 4
    return times, host


def _timed_loop(fn, reps: int, busy_ms: float, l2_flush) -> tuple[np.ndarray, np.ndarray, float]:
    import torch

    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    host = np.empty(reps)
    torch.cuda.synchronize()
    busy_wait(min(_MAX_SLEEP_MS, busy_ms * reps + _SLEEP_EXTRA_MS))
    for i, (begin, end) in enumerate(events):
        if l2_flush is not None:
            l2_flush()
        begin.record()
        t0 = time.perf_counter()
        fn()
        host[i] = (time.perf_counter() - t0) * 1e3
        end.record()
    torch.cuda.synchronize()
    times = np.array([b.elapsed_time(e) for b, e in events])
    span = events[0][0].elapsed_time(events[-1][1])
    idle = max(span - float(times.sum()), 0.0) / span if span > 0 else 0.0
    return times, host, idle


_CYCLES_PER_MS: dict[int, float] = {}


def busy_wait(ms: float) -> None:
    """Queue a kernel on the current stream that spins for about ``ms`` milliseconds (calibrated once per
    device against CUDA events; the GPU's clock under load is assumed steady)."""
    import torch

    device = torch.cuda.current_device()
    if device not in _CYCLES_PER_MS:
        torch.cuda._sleep(1_000_000)  # raise the clock before calibrating
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        torch.cuda._sleep(20_000_000)
        end.record()
        end.synchronize()
        _CYCLES_PER_MS[device] = 20_000_000 / max(begin.elapsed_time(end), 1e-3)
    torch.cuda._sleep(int(max(ms, 0.0) * _CYCLES_PER_MS[device]))
