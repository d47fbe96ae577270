"""Timing one op call: its GPU execution time, and separately the host's time per call.

GPU (``device_type="cuda"``): a first call (cuDNN autotuning, lazy initialisation), an estimate, then one
queue: a busy-wait kernel that keeps the GPU busy for longer than the host needs to enqueue everything behind
it, a sustained warm-up (back-to-back calls, so a large op is timed at the clock the GPU holds under load,
not the boost right after idling), and the timed repetitions. The GPU never waits for the host, so each
repetition's CUDA events bracket the op's kernels, not the host's launch rate (as PyTorch's and Triton's
benchmark helpers do); without that, an op under ~30 us measures the Python dispatch speed of the host,
which transfers to no other machine. A repetition is a group of back-to-back calls for short ops: an event
pair around every single call adds a few microseconds of pipeline drain to a 3 us kernel. The host's own
time per call (``host_ms``, wall clock around each enqueue) is recorded beside it: an eager loop of the op
runs at about ``max(gpu, host)`` per call.

An op that launches a chain of kernels per call (an LSTM: kernels per layer and step) cannot be covered by one
busy-wait: the launches of all its queued calls overflow the launch queue (about a thousand entries), the host
blocks, and the GPU then runs at the host's pace. Such an op (``chain=True``), unless its GPU time clearly
outlasts its enqueueing, gets a busy-wait before every group, sized to the host's time to enqueue that group,
and its ``host_ms`` is timed on calls queued one at a time (in the loop the host also stalls on a full queue).
A group the GPU had already begun when the host finished queueing it (a call launching more kernels than the
queue holds) makes the measurement ``host_paced``: the GPU may have waited on the host, so its time is not GPU
time.

CPU: a wall clock around each call (GPU time and host time are then the same thing).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

TIMING_METHOD = ("GPU time: after a first (autotuning) call, the reps are queued behind a busy-wait kernel that "
                 "keeps the GPU busy until the host has queued all of them (only the first {few_calls} when one "
                 "synced call takes over {host_margin:g}x its enqueue time: such an op stays ahead of the host), and "
                 "behind >= {warmup_ms} ms of back-to-back warm-up calls for calls >= {heat_ms} ms (a GPU at its "
                 "sustained clock), {short_warmup_calls} for shorter ones; CUDA events bracket groups of "
                 "back-to-back calls (enough calls for ~{group_ms} ms per group, at most {max_group}), time per call "
                 "= group time / calls; reps = clamp(ceil({min_time_ms} ms / group time), {min_reps} ({long_op_reps} "
                 "for calls over {long_op_ms} ms), {max_reps}) groups; time_ms/p20/p80 = median and percentiles over "
                 "groups; host_ms = median wall-clock time the host needs to enqueue one call; L2 flushed before "
                 "each rep (then one call per group): {flush_l2}; ops that launch a chain of kernels per call (LSTM) "
                 "and do not clearly outlast their enqueueing queue every group behind its own busy-wait (one wait "
                 "covering all calls would overflow the launch queue; their host_ms is timed on calls queued one at a "
                 "time): {chain_busy_wait}, status host_paced where the GPU had begun a group before the host "
                 "finished queueing it")
CPU_METHOD = ("wall clock around each call; a first call, warm-up >= {warmup_ms} ms; reps = clamp(ceil({min_time_ms} "
              "ms / estimate), {min_reps}, {max_reps}); median, p20, p80; host_ms = time_ms; L2 flushed before each "
              "rep: {flush_l2}")
_SLEEP_MARGIN = 2.0        # busy-wait for this many times the host's estimated enqueue time...
_SLEEP_EXTRA_MS = 0.2      # ...plus this much
_MAX_SLEEP_MS = 500.0
_GAP_TOLERANCE = 0.05      # idle share of the timed span (or share of groups the GPU began before the host had
#                            queued them) above which the reps are re-timed with a longer wait
_BURST = 8                 # calls timed together to estimate a short op's GPU time
_SHORT_MS = 1.0            # below this synced wall time per call, estimate GPU time with a burst


@dataclass(frozen=True)
class TimingSettings:
    warmup_ms: float = 100.0    # back-to-back calls right before the reps: a GPU at its sustained, power-capped
    #                             clock (an H200 runs large GEMMs 5-13 % faster in the first ~100 ms of load)
    heat_ms: float = 0.1        # calls at least this long get the full warm-up; shorter ones draw little power...
    short_warmup_calls: int = 30  # ...and get this many warm-up calls
    min_time_ms: float = 10.0
    min_reps: int = 5
    max_reps: int = 100
    long_op_ms: float = 2.0     # calls longer than this vary by well under 1 %...
    long_op_reps: int = 3       # ...so fewer reps suffice
    group_ms: float = 0.05      # calls per timed group: enough for this much GPU time...
    max_group: int = 16         # ...but at most this many
    max_calls: int = 200        # queued calls (warm-up excluded) per measurement: bounds the launch queue
    max_warmup_calls: int = 2000
    few_calls: int = 4          # calls the busy-wait covers for an op that clearly outlasts its enqueueing...
    host_margin: float = 2.0    # ...i.e. one synced call takes more than this many times its enqueue time
    chain_busy_wait: bool = True  # ops launching a chain of kernels per call (LSTM): a busy-wait before every group
    flush_l2: bool = False

    def describe(self, device_type: str) -> str:
        return (TIMING_METHOD if device_type == "cuda" else CPU_METHOD).format(**self.__dict__)


@dataclass(frozen=True)
class Timing:
    """One op's measurement: GPU time per call (median, p20, p80), reps, and the host's time per call.
    ``first_s`` and ``total_s`` (wall clock of the first call and of the whole measurement) tell where a
    sweep's time goes; rows store ``first_s`` as ``first_call_ms``."""
    median_ms: float
    p20_ms: float
    p80_ms: float
    reps: int
    host_ms: float
    first_s: float = 0.0
    total_s: float = 0.0
    host_paced: bool = False    # the GPU waited on the host despite the busy-waits: not GPU time


def measure(fn: Callable[[], object], device_type: str, settings: TimingSettings,
            l2_flush: Callable[[], None] | None = None, chain: bool = False) -> Timing:
    """Measure ``fn`` on ``device_type`` ('cuda' or 'cpu'); see the module docstring for the method. ``chain``:
    ``fn`` launches a chain of kernels per call (a busy-wait before every group)."""
    start = time.perf_counter()
    sync = _cuda_sync if device_type == "cuda" else _no_sync
    fn()  # first call: autotuning, lazy init
    sync()
    first_s = time.perf_counter() - start
    flush = l2_flush if settings.flush_l2 else None
    paced = False
    if device_type == "cuda":
        p20, p50, p80, reps, host, paced = _measure_gpu(fn, settings, flush, chain)
    else:
        times = _time_reps_wall(fn, settings, flush)
        p20, p50, p80 = np.percentile(times, [20, 50, 80])
        reps, host = len(times), float(np.median(times))
    return Timing(float(p50), float(p20), float(p80), reps, host, first_s, time.perf_counter() - start, paced)


def _cuda_sync():
    import torch

    torch.cuda.synchronize()


def _no_sync():
    return None


def _time_reps_wall(fn, settings: TimingSettings, l2_flush) -> np.ndarray:
    calls, start = 0, time.perf_counter()
    while calls < 1 or ((time.perf_counter() - start) * 1e3 < settings.warmup_ms and calls < settings.max_reps):
        fn()
        calls += 1
    estimate = max((time.perf_counter() - start) * 1e3 / calls, 1e-4)
    reps = int(min(settings.max_reps, max(settings.min_reps, math.ceil(settings.min_time_ms / estimate))))
    times = np.empty(reps)
    for i in range(reps):
        if l2_flush is not None:
            l2_flush()
        t0 = time.perf_counter()
        fn()
        times[i] = (time.perf_counter() - t0) * 1e3
    return times


def _measure_gpu(fn, settings: TimingSettings, l2_flush, chain: bool):
    """(p20, median, p80, reps, host ms, host-paced) of ``fn``'s GPU time per call."""
    t0 = time.perf_counter()
    fn()
    host_ms = (time.perf_counter() - t0) * 1e3
    _cuda_sync()
    gpu_ms = (time.perf_counter() - t0) * 1e3
    if gpu_ms < _SHORT_MS:  # a synced call measures the host's round trip: time a queued burst instead
        gpu_ms = float(np.median(_timed_loop(fn, 0, _BURST, 1, host_ms * _SLEEP_MARGIN * _BURST, None)[0]))
    group = 1 if l2_flush is not None else int(min(settings.max_group, max(1, math.ceil(settings.group_ms / gpu_ms))))
    fewest = settings.long_op_reps if gpu_ms > settings.long_op_ms else settings.min_reps
    reps = int(min(settings.max_reps, max(fewest, math.ceil(settings.min_time_ms / (gpu_ms * group)))))
    reps = max(1, min(reps, settings.max_calls // group))
    gpu_bound = gpu_ms >= settings.heat_ms
    warm = int(max(1, math.ceil(settings.warmup_ms / gpu_ms)))
    warm = min(warm, settings.max_warmup_calls if gpu_bound else settings.short_warmup_calls)
    covered, per_group = busy_wait_plan(gpu_ms, host_ms, gpu_bound, warm + reps * group, group, chain, settings)
    margin = _SLEEP_MARGIN
    for _ in range(2):
        times, host, shortfall = _timed_loop(fn, warm, group, reps, host_ms * margin * covered, l2_flush, per_group)
        if (l2_flush is not None and not per_group) or shortfall <= _GAP_TOLERANCE:
            break
        margin *= 4
    if per_group:  # the loop's host times include stalls on a full launch queue: time unqueued calls instead
        host = _synced_host_ms(fn, settings.long_op_reps)
    p20, p50, p80 = np.percentile(times, [20, 50, 80])
    return p20, p50, p80, reps, float(np.median(host)), bool(per_group and shortfall > _GAP_TOLERANCE)


def _synced_host_ms(fn, calls: int) -> np.ndarray:
    """The host's time to enqueue one call into an empty launch queue, ``calls`` times."""
    times = np.empty(calls)
    for i in range(calls):
        _cuda_sync()
        t0 = time.perf_counter()
        fn()
        times[i] = (time.perf_counter() - t0) * 1e3
    _cuda_sync()
    return times


def busy_wait_plan(synced_ms: float, host_ms: float, gpu_bound: bool, queued_calls: int, group: int, chain: bool,
                   settings: TimingSettings) -> tuple[int, bool]:
    """(how many calls' enqueueing one busy-wait must cover, whether every group gets a busy-wait of its own).

    Only an op whose GPU time clearly exceeds the host's enqueue time stays ahead of the host once a few calls
    are queued. ``synced_ms`` (one call, host + GPU) near ``host_ms`` may be all host, and then every call is
    covered, or the host's rate would be timed -- unless the op launches a chain of kernels per call (``chain``,
    an LSTM), whose queued calls would overflow the launch queue: then each group is covered by its own wait."""
    if gpu_bound and synced_ms > settings.host_margin * host_ms:
        return settings.few_calls, False
    if chain and settings.chain_busy_wait:
        return group, True
    return queued_calls, False


def _timed_loop(fn, warm: int, group: int, reps: int, busy_ms: float, l2_flush, chain: bool = False):
    """Queue a busy-wait, ``warm`` calls, then ``reps`` event-bracketed groups of ``group`` calls (with ``chain``,
    each group behind a busy-wait of its own). Returns (GPU ms per call of each group, host ms per timed call,
    shortfall): the idle share of the timed span, or with ``chain`` the share of groups the GPU had already begun
    when the host finished queueing them (only such a group can have waited on the host; a GPU still behind its
    queue -- the host blocked on a full queue meanwhile -- ran the group unstarved)."""
    import torch

    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    host, reached = np.empty(reps * group), np.zeros(reps, dtype=bool)
    wait_ms = min(_MAX_SLEEP_MS, busy_ms + _SLEEP_EXTRA_MS)
    torch.cuda.synchronize()
    if not chain:
        busy_wait(wait_ms)
    for _ in range(warm):
        fn()
    for i, (begin, end) in enumerate(events):
        if l2_flush is not None:
            l2_flush()
        if chain:
            busy_wait(wait_ms)
        begin.record()
        for j in range(group):
            t0 = time.perf_counter()
            fn()
            host[i * group + j] = (time.perf_counter() - t0) * 1e3
        end.record()
        reached[i] = chain and begin.query()
    torch.cuda.synchronize()
    times = np.array([b.elapsed_time(e) for b, e in events]) / group
    if chain:
        return times, host, float(np.mean(reached))
    span = events[0][0].elapsed_time(events[-1][1])
    idle = max(span - float(times.sum() * group), 0.0) / span if span > 0 else 0.0
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
