"""Record one training step: every ATen op it runs, with its time, counters and canonical config.

``track`` runs ``step_fn`` ``warmup`` times, then ``repeats`` more times untracked to measure the step
(CUDA events around the whole step on a GPU, wall clock on the CPU; the median is ``Trace.total_ms``), then once
under a ``TorchDispatchMode`` that sees every ATen op below autograd and autocast -- forward, backward and
optimizer ops alike -- and records its name, input shapes, dtypes, time, FLOPs and bytes
(``pipeline.step.classify`` reads each op).

- **Phase**: ``optimizer`` while a ``torch.optim.Optimizer.step`` runs (global optimizer step pre/post hooks,
  registered only while tracking); ``backward`` while the autograd engine runs a graph task
  (``torch._C._current_graph_task_id() != -1``, also true in the engine's device threads, where the dispatch
  mode is propagated); ``forward`` otherwise (so work between ``backward()`` and ``optimizer.step()``, such as
  gradient clipping, counts as forward).
- **Timing on a GPU** (``timing="queued"``, default): CUDA events are recorded around each op without a
  synchronisation per op; a busy-wait kernel (``pipeline.timing.busy_wait``) is queued first (and again whenever
  the GPU comes within a few ops of the CPU) so that the GPU never waits for the slower, tracked CPU: each op's
  events then bracket only its own kernels, back to back, as in an untracked GPU-bound step. ``timing="sync"``
  synchronises around each op instead (times then include the launch latency). On the CPU: ``time.perf_counter``
  around each op. View ops and allocations that launch no kernel get time 0 and are not timed.
- **Gradients** (``Trace.grads``, for data-parallel predictions): the parameters the step's optimizers update
  (found during the untracked steps), their sizes and dtypes, and when each gradient is ready in the tracked step
  (a post-accumulate-grad hook notes how many ops had run).
"""

from __future__ import annotations

import contextlib
import statistics
import time
import warnings
from collections.abc import Callable
from functools import lru_cache

import pandas as pd

from pipeline import gpus
from pipeline.step.classify import NO_KERNEL, conform, describe, unknown_row
from pipeline.step.trace import Trace
from pipeline.timing import busy_wait

__all__ = ["track", "device_of", "detect_origin", "grads_table"]

_PRIME_MS = 20.0          # spin-kernel length queued ahead of the tracked ops
_LOOKBACK = 8             # re-prime when the op this many ops back has finished on the GPU


# -------------------------------------------------------------------------------------------------- timers

class _CpuTimer:
    def run(self, fn):
        t0 = time.perf_counter_ns()
        out = fn()
        return out, (time.perf_counter_ns() - t0) / 1e6

    def finish(self, handles):
        return [h if isinstance(h, float) else 0.0 for h in handles]


class _CudaTimer:
    """CUDA events around each op; ``queued`` keeps the GPU busy with spin kernels so it never waits for the CPU."""

    def __init__(self, queued: bool):
        import torch
        self.torch = torch
        self.queued = queued
        self.ends: list = []
        if queued:
            self._prime()

    def _prime(self):
        busy_wait(_PRIME_MS)  # calibrated on first use, here in the constructor, before any op is timed

    def run(self, fn):
        cuda = self.torch.cuda
        if self.queued:
            if len(self.ends) >= _LOOKBACK and self.ends[-_LOOKBACK].query():
                self._prime()
        else:
            cuda.synchronize()
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        end.record()
        self.ends.append(end)
        if not self.queued:
            cuda.synchronize()
        return out, (start, end)

    def finish(self, handles):
        self.torch.cuda.synchronize()
        return [h[0].elapsed_time(h[1]) if isinstance(h, tuple) else 0.0 for h in handles]


@lru_cache(maxsize=1)
def _recorder_class():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorder(TorchDispatchMode):
        def __init__(self, timer):
            super().__init__()
            self.timer = timer
            self.rows: list[dict] = []
            self.handles: list = []
            self.optimizer_depth = 0

        def phase(self) -> str:
            if self.optimizer_depth > 0:
                return "optimizer"
            return "backward" if torch._C._current_graph_task_id() != -1 else "forward"

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func.namespace == "profiler":
                return func(*args, **kwargs)
            phase = self.phase()
            if func.is_view or func._opname in NO_KERNEL:
                out, handle = func(*args, **kwargs), 0.0
            else:
                out, handle = self.timer.run(lambda: func(*args, **kwargs))
            try:
                row = describe(func, args, kwargs, out, phase)
            except Exception as exc:  # noqa: BLE001 - never break the user's step over bookkeeping
                row = unknown_row(func, phase, exc)
            self.rows.append(row)
            self.handles.append(handle)
            return out

    return Recorder


# --------------------------------------------------------------------------------------------------- track

def device_of(device) -> str:
    """The device to time on: ``device`` checked, or CUDA where available, else the CPU."""
    import torch
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    dev = str(device)
    if dev.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {dev!r} asked for, but CUDA is not available here")
    if not (dev.startswith("cuda") or dev == "cpu"):
        raise ValueError(f"device: 'cuda', 'cuda:N' or 'cpu', got {dev!r}")
    return dev


def detect_origin(device: str) -> tuple[str | None, str]:
    """(registry label or None, device name) of the device the step ran on; 'cpu' on the CPU."""
    if not device.startswith("cuda"):
        import platform
        return "cpu", platform.processor() or platform.machine() or "cpu"
    import torch
    name = torch.cuda.get_device_name(torch.device(device))
    try:
        return gpus.gpu_label(name), name
    except ValueError:
        warnings.warn(f"GPU {name!r} is not in the registry (conf/gpus.yaml); pass origin=<label or spec dict> "
                      "to Trace.to / predict_trace", UserWarning, stacklevel=3)
        return None, name


def _time_steps(step_fn, args, kwargs, device: str, repeats: int) -> list[float]:
    import torch
    times = []
    for _ in range(repeats):
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step_fn(*args, **kwargs)
            end.record()
            torch.cuda.synchronize(device)
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter_ns()
            step_fn(*args, **kwargs)
            times.append((time.perf_counter_ns() - t0) / 1e6)
    return times


@contextlib.contextmanager
def _optimizer_parameters(found: list):
    """While open, every parameter a ``torch.optim`` optimizer steps is appended to ``found`` (in the optimizer's
    order, which is the model's registration order for ``model.parameters()``), once."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    seen = {id(p) for p in found}

    def pre(optimizer, *_):
        for group in optimizer.param_groups:
            for p in group["params"]:
                if id(p) not in seen:
                    seen.add(id(p))
                    found.append(p)

    handle = register_optimizer_step_pre_hook(pre)
    try:
        yield found
    finally:
        handle.remove()


def _grad_hooks(params: list, recorder) -> tuple[list, list]:
    """Post-accumulate-grad hooks noting, per parameter, how many ops had run when its gradient was ready."""
    ready: list = [None] * len(params)
    handles = []
    for i, p in enumerate(params):
        def hook(_, i=i):
            ready[i] = len(recorder.rows)
        handles.append(p.register_post_accumulate_grad_hook(hook))
    return ready, handles


def grads_table(params: list, ready: list) -> pd.DataFrame:
    """One row per parameter, in registration order: ``param``, ``numel``, ``bytes``, ``dtype`` and ``ready_seq``
    (ops recorded before its gradient was ready; -1 if it got none) -- what DDP's buckets are made of."""
    return pd.DataFrame({"param": range(len(params)), "numel": [int(p.numel()) for p in params],
                         "bytes": [int(p.numel() * p.element_size()) for p in params],
                         "dtype": [str(p.dtype).replace("torch.", "") for p in params],
                         "ready_seq": [-1 if r is None else int(r) for r in ready]})


def _record_step(step_fn, args, kwargs, timer, params: list) -> tuple[list[dict], list[float], float, list]:
    """Run the step once under the recorder: (rows, op times in ms, wall ms of the tracked step, when each of
    ``params`` got its gradient)."""
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    recorder = _recorder_class()(timer)
    ready, grad_handles = _grad_hooks(params, recorder)

    def pre(*_):
        recorder.optimizer_depth += 1

    def post(*_):
        recorder.optimizer_depth = max(recorder.optimizer_depth - 1, 0)

    h1, h2 = register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)
    try:
        t0 = time.perf_counter_ns()
        with recorder:
            step_fn(*args, **kwargs)
        times = timer.finish(recorder.handles)
        return recorder.rows, times, (time.perf_counter_ns() - t0) / 1e6, ready
    finally:
        for handle in [h1, h2, *grad_handles]:
            handle.remove()


HEURISTIC_CONV_NOTE = ("the step ran with torch.backends.cudnn.benchmark = False: its conv2d times are cuDNN's "
                       "heuristic algorithms, while the conv2d scalers predict autotuned ones (benchmark = True, as "
                       "most training scripts set); set the flag as the step you will run does")


def track(step_fn: Callable, *args, warmup: int = 2, repeats: int = 5, device=None, timing: str = "queued",
          parameters=None, **kwargs) -> Trace:
    """Run ``step_fn(*args, **kwargs)`` -- one training step: forward, backward, optimizer -- and record it.

    ``warmup`` untracked steps first (allocator, cuDNN autotuning, lazy init), then ``repeats`` untracked steps
    timed as a whole (median -> ``Trace.total_ms``), then one tracked step (its ops -> ``Trace.ops``). The step
    runs on whatever device its tensors are on; ``device`` (default: CUDA if available, else CPU) only says how
    to time it. ``timing``: ``"queued"`` (default) or ``"sync"`` on a GPU (see the module docstring).
    ``parameters``: the model's parameters in registration order, for the gradient table (``Trace.grads``: when
    each gradient is ready, which DDP's buckets need); default: those the step's ``torch.optim`` optimizers step.
    ``warmup``, ``repeats``, ``device``, ``timing`` and ``parameters`` are not passed to ``step_fn``.
    ``Trace.meta["cudnn_benchmark"]`` records ``torch.backends.cudnn.benchmark``; a GPU step with conv2d ops and the
    flag off warns (``HEURISTIC_CONV_NOTE``).
    """
    import torch

    if timing not in ("queued", "sync"):
        raise ValueError(f"timing: 'queued' or 'sync', got {timing!r}")
    if warmup < 0 or repeats < 1:
        raise ValueError(f"warmup must be >= 0 and repeats >= 1, got warmup={warmup}, repeats={repeats}")
    dev = device_of(device)
    cuda = dev.startswith("cuda")
    params = list(parameters) if parameters is not None else []
    with torch.cuda.device(torch.device(dev)) if cuda else contextlib.nullcontext():
        with _optimizer_parameters(params) if parameters is None else contextlib.nullcontext():
            for _ in range(warmup):
                step_fn(*args, **kwargs)
            step_times = _time_steps(step_fn, args, kwargs, dev, repeats)
        timer = _CudaTimer(queued=timing == "queued") if cuda else _CpuTimer()
        if cuda:
            torch.cuda.synchronize(dev)
        rows, times, tracked_wall, ready = _record_step(step_fn, args, kwargs, timer, params)

    for i, (row, t) in enumerate(zip(rows, times)):
        row["seq"] = i
        row["time_ms"] = float(t)
    origin, device_name = detect_origin(dev)
    benchmark = bool(torch.backends.cudnn.benchmark)
    if cuda and not benchmark and any(row.get("op") == "conv2d" for row in rows):
        warnings.warn(HEURISTIC_CONV_NOTE, stacklevel=2)
    meta = {"device": dev, "device_name": device_name, "torch": torch.__version__, "timing": timing if cuda else
            "wall-clock", "warmup": warmup, "repeats": repeats, "step_times_ms": step_times,
            "tracked_wall_ms": tracked_wall, "cudnn_benchmark": benchmark}
    return Trace(ops=conform(pd.DataFrame(rows)), total_ms=float(statistics.median(step_times)), origin=origin,
                 meta=meta, grads=grads_table(params, ready))
