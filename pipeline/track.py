"""Track one training step of a PyTorch model on this device and predict its time on other GPUs.

    import pipeline
    trace = pipeline.track(step_fn)            # runs step_fn (forward, backward, optimizer) after warm-up
    trace.total_ms                             # measured step (median of untracked steps)
    trace.ops                                  # one row per executed ATen op
    pred = trace.to("h100")                    # Habitat-style scaling to another GPU
    pred.total_ms, pred.breakdown()            # predicted step, ms per op kind and phase

How tracking works
------------------
``track`` runs ``step_fn`` ``warmup`` times, then ``repeats`` more times untracked to measure the step
(CUDA events around the whole step on a GPU, wall clock on the CPU; the median is ``Trace.total_ms``), then once
under a ``TorchDispatchMode`` that sees every ATen op below autograd and autocast -- forward, backward and
optimizer ops alike -- and records its name, input shapes, dtypes, time, estimated FLOPs and bytes.

- **Phase**: ``optimizer`` while a ``torch.optim.Optimizer.step`` runs (global optimizer step pre/post hooks,
  registered only while tracking); ``backward`` while the autograd engine runs a graph task
  (``torch._C._current_graph_task_id() != -1``, also true in the engine's device threads, where the dispatch
  mode is propagated); ``forward`` otherwise (so work between ``backward()`` and ``optimizer.step()``, such as
  gradient clipping, counts as forward).
- **Precision**: an op on bf16/fp16 tensors is bf16/fp16 (autocast included: it inserts the casts, and the
  matmuls then run on 16-bit tensors); an fp32 conv/rnn is ``tf32`` when cuDNN may use TF32
  (``torch.backends.cudnn.allow_tf32``) and an fp32 matmul when cuBLAS may
  (``torch.get_float32_matmul_precision() != "highest"``); everything else is ``fp32``. The flags decide, not
  the device, so a CPU demo run with TF32 allowed is treated as the GPU would run it.
- **Timing on a GPU** (``timing="queued"``, default): CUDA events are recorded around each op without a
  synchronisation per op; a ``torch.cuda._sleep`` spin kernel is queued first (and again whenever the GPU comes
  within a few ops of the CPU) so that the GPU never waits for the slower, tracked CPU: each op's events then
  bracket only its own kernels, back to back, as in an untracked GPU-bound step. ``timing="sync"`` synchronises
  around each op instead (times then include the launch latency). On the CPU: ``time.perf_counter`` around
  each op. View ops and allocations that launch no kernel get time 0 and are not timed.
- **Op kinds** (``Trace.ops["op"]``): ``aten.convolution`` (2-D, not transposed) and ``convolution_backward``
  -> ``conv2d``; ``mm``/``addmm``/``linear`` -> ``linear`` (batch = rows, in_features = k, out_features = n,
  the backward's GEMMs too); ``bmm``/``baddbmm`` -> ``bmm``; ``_cudnn_rnn``/``mkldnn_rnn_layer`` in LSTM mode
  and their backward -> ``lstm``; everything else ``other``.

Prediction
----------
``predict_trace(ops, origin, dest)`` adds ``pred_ms`` and ``method`` per row. conv2d/linear/bmm/lstm rows use
the published per-op scaler (``pipeline.load_scaler(op).scale``: ``measured * model(dest) / model(origin)``)
when it loads, with the scaler phase of column ``scaler_phase``: ``backward`` for rows that are a whole backward
of the op (``convolution_backward``, the rnn backward, a module's backward from a node table), ``forward`` for
forward-type kernels -- including the GEMMs and bmm's that run in the backward pass, which are scaled as the
GEMM they are, with their own shapes. Ops without a usable scaler, and all ``other`` ops, use wave scaling
(``pipeline.wave``). ``method`` says which rule produced each row; ``note`` why a scaler was not used.

The predicted step is the sum of the predicted op times, as in Habitat. The part of the measured step that no
op accounts for (``Trace.unattributed_ms``: host-bound gaps where the GPU waited for Python) is reported
separately, and ``Prediction.total_with_unattributed_ms`` adds it unscaled.
"""

from __future__ import annotations

import json
import math
import statistics
import time
import warnings
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import pandas as pd

from pipeline import wave
from pipeline.ops.conv2d import SPEC as CONV2D
from pipeline.physics import out_size
from pipeline.ops.lstm import SPEC as LSTM
from pipeline.schema import BOOL_COLUMNS, CONFIG_COLUMNS, OP_CONFIG_COLUMNS


__all__ = ["track", "Trace", "Prediction", "predict_trace", "OP_KINDS", "PHASES", "TRACE_COLUMNS",
           "resolve_origin", "clear_scaler_cache"]

OP_KINDS = ("conv2d", "linear", "bmm", "lstm", "other")
PHASES = ("forward", "backward", "optimizer")
TRACE_COLUMNS = (("seq", "name", "op", "phase", "scaler_phase", "precision", "dtype", "time_ms", "flops", "bytes",
                  "elements", "blocks", "tensor_core", "input_shapes") + CONFIG_COLUMNS)

_PRIME_MS = 20.0          # spin-kernel length queued ahead of the tracked ops
_LOOKBACK = 8             # re-prime when the op this many ops back has finished on the GPU
_CYCLES_PER_MS = 2.0e6    # ~2 GHz; a slower clock only makes the spin longer
_NO_KERNEL = frozenset({"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "lift_fresh",
                        "_record_function_enter", "_record_function_enter_new", "_record_function_exit"})
_CONV = frozenset({"convolution", "_convolution", "cudnn_convolution", "mkldnn_convolution",
                   "convolution_overrideable"})
_SDPA = frozenset({"_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                   "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
                   "_flash_attention_forward", "_efficient_attention_forward"})
_TC_OTHER = frozenset({"mv", "addmv", "dot", "vdot", "addbmm", "_int_mm", "_scaled_mm", "cudnn_convolution_transpose",
                       "convolution_transpose"})  # matmul-like ops that run on Tensor Cores, scaled as "other"


# ---------------------------------------------------------------------------------------------- op analysis

def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _conv2d_config(inp, weight, bias: bool, stride, padding, dilation, groups) -> dict:
    n, c, h, w = (int(x) for x in inp.shape)
    return {"batch": n, "in_channels": c, "out_channels": int(weight.shape[0]), "height": h, "width": w,
            "kernel_h": int(weight.shape[2]), "kernel_w": int(weight.shape[3]),
            "stride_h": int(stride[0]), "stride_w": int(stride[-1]), "pad_h": int(padding[0]),
            "pad_w": int(padding[-1]), "dilation_h": int(dilation[0]), "dilation_w": int(dilation[-1]),
            "groups": int(groups), "bias": bool(bias)}


def _rnn_layout(inp, batch_first: bool, batch_sizes) -> tuple[int, int, int]:
    """(batch, seq_len, input_size) of an rnn input, packed or padded."""
    if batch_sizes is not None and len(batch_sizes) > 0:
        return int(batch_sizes[0]), len(batch_sizes), int(inp.shape[-1])
    if inp.dim() == 2:  # unbatched
        return 1, int(inp.shape[0]), int(inp.shape[1])
    if batch_first:
        return int(inp.shape[0]), int(inp.shape[1]), int(inp.shape[2])
    return int(inp.shape[1]), int(inp.shape[0]), int(inp.shape[2])


def _classify(name: str, a: dict) -> tuple[str, dict | None, float | None, bool]:
    """(op kind, canonical config or None, FLOPs if known specially, runs on Tensor Cores) of one ATen op."""
    import torch

    def t(key, *alts):
        for k in (key,) + alts:
            v = a.get(k)
            if isinstance(v, torch.Tensor):
                return v
        return None

    if name in _CONV or name == "convolution_backward":
        inp, weight = t("input", "self"), t("weight")
        transposed = bool(a.get("transposed", False))
        if inp is not None and weight is not None and inp.dim() == 4 and weight.dim() == 4 and not transposed:
            if name == "convolution_backward":
                bias = a.get("bias_sizes") is not None
                mask = a.get("output_mask") or (True, True, True)
            else:
                bias = t("bias") is not None
                mask = None
            cfg = _conv2d_config(inp, weight, bias, a.get("stride", (1, 1)), a.get("padding", (0, 0)),
                                 a.get("dilation", (1, 1)), a.get("groups", 1))
            fwd = CONV2D.flops(cfg)
            flops = fwd if mask is None else fwd * (int(bool(mask[0])) + int(bool(mask[1])))
            return "conv2d", cfg, flops, True
        if inp is not None and weight is not None:  # 1-D/3-D or transposed: scaled as "other", on Tensor Cores
            return "other", None, None, True
        return "other", None, None, False
    if name in ("mm", "addmm", "_addmm_activation"):
        m1, m2 = (t("self"), t("mat2")) if name == "mm" else (t("mat1"), t("mat2"))
        if m1 is not None and m2 is not None and m1.dim() == 2 and m2.dim() == 2:
            m, k, n = int(m1.shape[0]), int(m1.shape[1]), int(m2.shape[1])
            cfg = {"batch": m, "in_features": k, "out_features": n, "bias": name != "mm"}
            return "linear", cfg, 2.0 * m * k * n, True
        return "other", None, None, True
    if name == "linear":
        x, w = t("input"), t("weight")
        if x is not None and w is not None and x.dim() >= 1 and w.dim() == 2:
            rows = _numel(x.shape[:-1]) if x.dim() > 1 else 1
            cfg = {"batch": rows, "in_features": int(w.shape[1]), "out_features": int(w.shape[0]),
                   "bias": t("bias") is not None}
            return "linear", cfg, 2.0 * rows * cfg["in_features"] * cfg["out_features"], True
        return "other", None, None, True
    if name in ("bmm", "baddbmm"):
        b1, b2 = (t("self"), t("mat2")) if name == "bmm" else (t("batch1"), t("batch2"))
        if b1 is not None and b2 is not None and b1.dim() == 3 and b2.dim() == 3:
            b, m, k, n = int(b1.shape[0]), int(b1.shape[1]), int(b1.shape[2]), int(b2.shape[2])
            return "bmm", {"batch": b, "m": m, "k": k, "n": n}, 2.0 * b * m * k * n, True
        return "other", None, None, True
    if name in ("_cudnn_rnn", "_cudnn_rnn_backward"):
        inp = t("input")
        weights = a.get("weight") or []
        layers, bidir = int(a.get("num_layers", 1)), bool(a.get("bidirectional", False))
        if inp is not None and int(a.get("mode", -1)) == 2 and int(a.get("proj_size", 0) or 0) == 0:
            batch, seq, isz = _rnn_layout(inp, bool(a.get("batch_first", False)), a.get("batch_sizes"))
            per = len(weights) // max(layers * (2 if bidir else 1), 1)
            cfg = {"batch": batch, "seq_len": seq, "input_size": isz, "hidden_size": int(a["hidden_size"]),
                   "num_layers": layers, "bidirectional": bidir, "bias": per >= 4}
            fwd = LSTM.flops(cfg)
            return "lstm", cfg, fwd if name == "_cudnn_rnn" else 2.0 * fwd, True
        return "other", None, None, True
    if name in ("mkldnn_rnn_layer", "mkldnn_rnn_layer_backward"):
        inp = t("input")
        w_ih = t("weight0", "weight1")
        hidden = int(a.get("hidden_size", 0))
        if inp is not None and w_ih is not None and hidden > 0 and int(w_ih.shape[0]) == 4 * hidden:
            # at::lstm hands mkldnn a time-major input whatever its batch_first flag says
            batch, seq, isz = _rnn_layout(inp, False, a.get("batch_sizes"))
            cfg = {"batch": batch, "seq_len": seq, "input_size": isz, "hidden_size": hidden, "num_layers": 1,
                   "bidirectional": False, "bias": bool(a.get("has_biases", True))}
            fwd = LSTM.flops(cfg)
            return "lstm", cfg, fwd if name == "mkldnn_rnn_layer" else 2.0 * fwd, True
        return "other", None, None, False
    base = name[:-len("_backward")] if name.endswith("_backward") else name
    if base in _SDPA:
        q, k = t("query", "q"), t("key", "k")
        if q is not None and k is not None and q.dim() >= 3:
            lead = _numel(q.shape[:-2])
            fwd = 4.0 * lead * int(q.shape[-2]) * int(k.shape[-2]) * int(q.shape[-1])
            return "other", None, fwd if base == name else 2.5 * fwd, True
        return "other", None, None, True
    return "other", None, None, name in _TC_OTHER


def _leaves(x):
    import torch
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _leaves(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from _leaves(v)


def _tensor_bytes(t) -> int:
    n = t.numel() * t.element_size()
    try:  # broadcast (expanded) tensors read their storage, not numel elements
        return min(n, t.untyped_storage().nbytes())
    except Exception:  # noqa: BLE001 - sparse, meta or wrapper tensors
        return n


def _precision_of(dtypes, tf32_ok: bool) -> str:
    import torch
    if torch.bfloat16 in dtypes:
        return "bf16"
    if torch.float16 in dtypes:
        return "fp16"
    return "tf32" if tf32_ok and (torch.float32 in dtypes) else "fp32"


def _arg_dict(func, args, kwargs) -> dict:
    names = [arg.name for arg in func._schema.arguments]
    out = dict(zip(names, args))
    out.update(kwargs)
    return out


def _describe(func, args, kwargs, out, phase: str) -> dict:
    """The trace row (without its time) of one executed op."""
    import torch
    name = func._opname
    a = _arg_dict(func, args, kwargs)
    kind, cfg, flops, tensor_core = _classify(name, a)
    ins = list(_leaves(list(args) + list(kwargs.values())))
    outs = list(_leaves(out))
    dtypes = {x.dtype for x in ins + outs if x.is_floating_point()}
    if kind in ("conv2d", "lstm"):
        tf32_ok = bool(torch._C._get_cudnn_allow_tf32())
    elif kind in ("linear", "bmm") or (tensor_core and kind == "other"):
        tf32_ok = torch.get_float32_matmul_precision() != "highest"
    else:
        tf32_ok = False
    precision = _precision_of(dtypes, tf32_ok and tensor_core)
    if func.is_view:
        nbytes, elements, flops = 0.0, 0.0, 0.0
    else:
        seen, nbytes = set(), 0
        for x in ins + outs:
            if id(x) not in seen:
                seen.add(id(x))
                nbytes += _tensor_bytes(x)
        sizes = [sum(int(v.numel()) for v in _leaves(arg)) for arg in list(args) + list(kwargs.values())]
        sizes += [int(x.numel()) for x in outs]
        elements = float(max(sizes, default=0))
        if flops is None:
            flops = elements if (outs or ins) else 0.0  # ~1 FLOP per element touched: elementwise/reduction
    first = next((x for x in ins if x.is_floating_point()), ins[0] if ins else (outs[0] if outs else None))
    row = {"name": f"{func.namespace}.{name}" + ("" if func._overloadname == "default" else
                                                 f".{func._overloadname}"),
           "op": kind, "phase": phase,
           "scaler_phase": "backward" if name in ("convolution_backward", "_cudnn_rnn_backward",
                                                  "mkldnn_rnn_layer_backward") else "forward",
           "precision": precision, "dtype": str(first.dtype).replace("torch.", "") if first is not None else "",
           "flops": float(flops), "bytes": float(nbytes), "elements": elements,
           "tensor_core": bool(tensor_core and precision != "fp32"),
           "input_shapes": json.dumps([list(x.shape) for x in ins])}
    if cfg:
        row.update(cfg)
        row["blocks"] = _gemm_blocks(kind, cfg)
    return row


_TILE = 128  # output tile edge of a typical cuBLAS/cuDNN GEMM kernel, for the one-wave rule


def _gemm_blocks(kind: str, cfg: dict) -> float:
    """Estimated thread blocks (output tiles) of a conv2d/linear/bmm kernel; NaN for lstm (time rule only)."""
    def tiles(m, n):
        return math.ceil(m / _TILE) * math.ceil(n / _TILE)
    if kind == "linear":
        return float(tiles(cfg["batch"], cfg["out_features"]))
    if kind == "bmm":
        return float(cfg["batch"] * tiles(cfg["m"], cfg["n"]))
    if kind == "conv2d":
        ho = out_size(cfg["height"], cfg["kernel_h"], cfg["stride_h"], cfg["pad_h"], cfg["dilation_h"])
        wo = out_size(cfg["width"], cfg["kernel_w"], cfg["stride_w"], cfg["pad_w"], cfg["dilation_w"])
        return float(tiles(cfg["batch"] * max(ho, 1) * max(wo, 1), cfg["out_channels"]))
    return math.nan


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
        self.torch.cuda._sleep(int(_PRIME_MS * _CYCLES_PER_MS))

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
            if func.is_view or func._opname in _NO_KERNEL:
                out, handle = func(*args, **kwargs), 0.0
            else:
                out, handle = self.timer.run(lambda: func(*args, **kwargs))
            try:
                row = _describe(func, args, kwargs, out, phase)
            except Exception as exc:  # noqa: BLE001 - never break the user's step over bookkeeping
                row = {"name": str(func), "op": "other", "phase": phase, "scaler_phase": "forward",
                       "precision": "fp32", "dtype": "", "flops": math.nan, "bytes": math.nan,
                       "elements": math.nan, "tensor_core": False, "input_shapes": f"<{type(exc).__name__}>"}
            self.rows.append(row)
            self.handles.append(handle)
            return out

    return Recorder


# --------------------------------------------------------------------------------------------------- track

def _device_of(device) -> str:
    import torch
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    dev = str(device)
    if dev.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {dev!r} asked for, but CUDA is not available here")
    if not (dev.startswith("cuda") or dev == "cpu"):
        raise ValueError(f"device: 'cuda', 'cuda:N' or 'cpu', got {dev!r}")
    return dev


def _detect_origin(device: str) -> tuple[str | None, str]:
    """(registry label or None, device name) of the device the step ran on; 'cpu' on the CPU."""
    if not device.startswith("cuda"):
        import platform
        return "cpu", platform.processor() or platform.machine() or "cpu"
    import torch
    from pipeline import gpus
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


def track(step_fn: Callable, *args, warmup: int = 2, repeats: int = 5, device=None, timing: str = "queued",
          **kwargs) -> "Trace":
    """Run ``step_fn(*args, **kwargs)`` -- one training step: forward, backward, optimizer -- and record it.

    ``warmup`` untracked steps first (allocator, cuDNN autotuning, lazy init), then ``repeats`` untracked steps
    timed as a whole (median -> ``Trace.total_ms``), then one tracked step (its ops -> ``Trace.ops``). The step
    runs on whatever device its tensors are on; ``device`` (default: CUDA if available, else CPU) only says how
    to time it. ``timing``: ``"queued"`` (default) or ``"sync"`` on a GPU (see the module docstring).
    ``warmup``, ``repeats``, ``device`` and ``timing`` are not passed to ``step_fn``.
    """
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    if timing not in ("queued", "sync"):
        raise ValueError(f"timing: 'queued' or 'sync', got {timing!r}")
    if warmup < 0 or repeats < 1:
        raise ValueError(f"warmup must be >= 0 and repeats >= 1, got warmup={warmup}, repeats={repeats}")
    dev = _device_of(device)
    cuda = dev.startswith("cuda")
    with torch.cuda.device(torch.device(dev)) if cuda else _nullcontext():
        for _ in range(warmup):
            step_fn(*args, **kwargs)
        step_times = _time_steps(step_fn, args, kwargs, dev, repeats)

        timer = _CudaTimer(queued=timing == "queued") if cuda else _CpuTimer()
        recorder = _recorder_class()(timer)

        def pre(*_):
            recorder.optimizer_depth += 1

        def post(*_):
            recorder.optimizer_depth = max(recorder.optimizer_depth - 1, 0)

        h1, h2 = register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)
        try:
            if cuda:
                torch.cuda.synchronize(dev)
            t0 = time.perf_counter_ns()
            with recorder:
                step_fn(*args, **kwargs)
            times = timer.finish(recorder.handles)
            tracked_wall = (time.perf_counter_ns() - t0) / 1e6
        finally:
            h1.remove()
            h2.remove()

    rows = recorder.rows
    for i, (row, t) in enumerate(zip(rows, times)):
        row["seq"] = i
        row["time_ms"] = float(t)
    ops = _conform(pd.DataFrame(rows))
    origin, device_name = _detect_origin(dev)
    meta = {"device": dev, "device_name": device_name, "torch": torch.__version__, "timing": timing if cuda else
            "wall-clock", "warmup": warmup, "repeats": repeats, "step_times_ms": step_times,
            "tracked_wall_ms": tracked_wall}
    return Trace(ops=ops, total_ms=float(statistics.median(step_times)), origin=origin, meta=meta)


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _blocks(ops: pd.DataFrame) -> np.ndarray:
    """The ``blocks`` column, estimated from ``elements`` for "other" rows that have none."""
    n = len(ops)
    blocks = (pd.to_numeric(ops["blocks"], errors="coerce").to_numpy(dtype=float).copy() if "blocks" in ops
              else np.full(n, np.nan))
    elements = (pd.to_numeric(ops["elements"], errors="coerce").to_numpy(dtype=float) if "elements" in ops
                else np.full(n, np.nan))
    fill = np.isnan(blocks) & (ops["op"].astype(str).to_numpy() == "other")
    blocks[fill] = wave.estimate_blocks(elements[fill])
    return blocks


def _conform(ops: pd.DataFrame) -> pd.DataFrame:
    """All TRACE_COLUMNS, in order, with nullable integer/bool config columns."""
    ops = ops.copy()
    for col in TRACE_COLUMNS:
        if col not in ops:
            ops[col] = None
    extra = [c for c in ops.columns if c not in TRACE_COLUMNS]
    ops = ops[list(TRACE_COLUMNS) + extra]
    for col in ("time_ms", "flops", "bytes", "elements"):
        ops[col] = pd.to_numeric(ops[col], errors="coerce").astype(float)
    ops["blocks"] = _blocks(ops)
    ops["tensor_core"] = ops["tensor_core"].fillna(False).astype(bool)
    for col in CONFIG_COLUMNS:
        ops[col] = ops[col].astype("boolean" if col in BOOL_COLUMNS else "Int64")
    return ops.reset_index(drop=True)


# -------------------------------------------------------------------------------------------- trace / result

def _weights(ops: pd.DataFrame) -> np.ndarray:
    """How many times each row counts (column ``count`` where present, e.g. a repeated transformer block)."""
    if "count" in ops:
        return pd.to_numeric(ops["count"], errors="coerce").fillna(1.0).to_numpy(dtype=float)
    return np.ones(len(ops))


def _breakdown(ops: pd.DataFrame, column: str) -> pd.DataFrame:
    frame = pd.DataFrame({"op": ops["op"], "phase": ops["phase"],
                          column: ops[column].to_numpy(dtype=float) * _weights(ops)})
    table = frame.pivot_table(index="op", columns="phase", values=column, aggfunc="sum", fill_value=0.0)
    table = table.reindex(index=[k for k in OP_KINDS if k in table.index],
                          columns=[p for p in PHASES if p in table.columns] +
                          [p for p in table.columns if p not in PHASES])
    table["total"] = table.sum(axis=1)
    table.loc["total"] = table.sum(axis=0)
    table.columns.name = None
    return table


@dataclass
class Trace:
    """One tracked training step: ``ops`` (one row per ATen op) and the measured step ``total_ms``."""

    ops: pd.DataFrame
    total_ms: float
    origin: str | None = None
    meta: dict = field(default_factory=dict)

    @property
    def tracked_ms(self) -> float:
        """Sum of the tracked op times."""
        return float(np.nansum(self.ops["time_ms"].to_numpy(dtype=float) * _weights(self.ops)))

    @property
    def coverage(self) -> float:
        """Tracked op time / measured step time (1.0 = every ms accounted for)."""
        return self.tracked_ms / self.total_ms if self.total_ms > 0 else math.nan

    @property
    def unattributed_ms(self) -> float:
        """Measured step minus the tracked ops: host-bound gaps (negative if the ops over-count)."""
        return self.total_ms - self.tracked_ms

    @property
    def overhead(self) -> float:
        """Wall time of the tracked step / the untracked step (how much tracking slows the step down)."""
        wall = self.meta.get("tracked_wall_ms")
        return wall / self.total_ms if wall and self.total_ms > 0 else math.nan

    def breakdown(self) -> pd.DataFrame:
        """Measured ms by op kind (rows) and phase (columns), with totals."""
        return _breakdown(self.ops, "time_ms")

    def to(self, dest, origin=None, **kwargs) -> "Prediction":
        """Predict this step on ``dest`` (a registry name or spec dict); ``origin`` overrides the detected
        device (required when it is not in the registry, or to treat CPU times as a GPU's: demos only).
        ``kwargs`` go to ``predict_trace``."""
        origin = resolve_origin(self.origin if origin is None else origin)
        ops = predict_trace(self.ops, origin, dest, **kwargs)
        return Prediction(ops=ops, origin=_label(origin), dest=_label(dest), measured_ms=self.total_ms,
                          unattributed_ms=self.unattributed_ms)

    def summary(self) -> str:
        m = self.meta
        lines = [f"device {m.get('device_name', '?')} ({m.get('device', '?')}, origin {self.origin}), "
                 f"timing {m.get('timing', '?')}",
                 f"measured step {self.total_ms:.3f} ms (median of {m.get('repeats', '?')}); tracked ops "
                 f"{len(self.ops)}, sum {self.tracked_ms:.3f} ms = {100 * self.coverage:.1f} % of the step "
                 f"(unattributed {self.unattributed_ms:+.3f} ms); tracking overhead {self.overhead:.1f}x"]
        return "\n".join(lines)

    def save(self, directory) -> Path:
        """Write ``ops.csv`` (and ``ops.parquet`` where pyarrow is installed) and ``trace.json`` to a folder."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.ops.to_csv(directory / "ops.csv", index=False)
        try:
            self.ops.to_parquet(directory / "ops.parquet", index=False)
        except Exception:  # noqa: BLE001 - CSV is enough
            pass
        info = {"total_ms": self.total_ms, "origin": self.origin, "tracked_ms": self.tracked_ms,
                "coverage": self.coverage, "meta": self.meta}
        (directory / "trace.json").write_text(json.dumps(info, indent=2, default=str))
        return directory

    @classmethod
    def load(cls, directory) -> "Trace":
        directory = Path(directory)
        info = json.loads((directory / "trace.json").read_text())
        ops = _conform(pd.read_csv(directory / "ops.csv"))
        return cls(ops=ops, total_ms=float(info["total_ms"]), origin=info.get("origin"), meta=info.get("meta", {}))


@dataclass
class Prediction:
    """A trace predicted on another GPU: ``ops`` with ``pred_ms``/``method``; ``total_ms`` their sum."""

    ops: pd.DataFrame
    origin: str
    dest: str
    measured_ms: float = math.nan
    unattributed_ms: float = 0.0

    @property
    def total_ms(self) -> float:
        """Predicted step: the sum of the predicted op times (NaN if any op cannot run on ``dest``)."""
        return float(np.sum(self.ops["pred_ms"].to_numpy(dtype=float) * _weights(self.ops)))

    @property
    def total_with_unattributed_ms(self) -> float:
        """``total_ms`` plus the origin's unattributed (host-bound) time, unscaled, if positive."""
        return self.total_ms + max(self.unattributed_ms, 0.0)

    @property
    def supported(self) -> bool:
        return bool(np.isfinite(self.ops["pred_ms"].to_numpy(dtype=float)).all())

    def breakdown(self) -> pd.DataFrame:
        """Predicted ms by op kind (rows) and phase (columns), with totals."""
        return _breakdown(self.ops, "pred_ms")

    def methods(self) -> pd.DataFrame:
        """Rows and predicted ms per (op kind, method)."""
        frame = self.ops.assign(_w=self.ops["pred_ms"].to_numpy(dtype=float) * _weights(self.ops))
        return (frame.groupby(["op", "method"], sort=True)
                .agg(rows=("method", "size"), pred_ms=("_w", "sum")).reset_index())


# ---------------------------------------------------------------------------------------------- prediction

def _label(gpu) -> str:
    from pipeline import gpus
    return gpus.gpu_spec(gpu)["label"] if not isinstance(gpu, str) or gpu != "cpu" else "cpu"


def resolve_origin(origin):
    """Check that ``origin`` names a GPU; a CPU origin is refused with the way out."""
    if origin is None:
        raise ValueError("origin: the device this trace was measured on is not in the GPU registry; pass "
                         "origin=<registry name or spec dict>")
    if isinstance(origin, str) and origin.strip().lower() == "cpu":
        raise ValueError("origin: this trace was measured on a CPU. Scaling CPU op times to a GPU is not "
                         "meaningful (the scalers and wave scaling are ratios between two GPUs). Track on a GPU, "
                         "or -- for a demo only -- pass origin='<gpu>' (CLI: --origin-gpu) to treat the CPU "
                         "times as if measured on that GPU.")
    return origin


_SCALER_CACHE: dict[str, tuple[Any, str]] = {}


def clear_scaler_cache() -> None:
    """Forget loaded scalers (and load failures), e.g. after publishing a new checkpoint."""
    _SCALER_CACHE.clear()


def _published_scaler(op: str) -> tuple[Any, str]:
    """(scaler or None, why not) -- ``pipeline.load_scaler(op)``, cached per process."""
    if op not in _SCALER_CACHE:
        try:
            from pipeline.api import load_scaler
            _SCALER_CACHE[op] = (load_scaler(op), "")
        except Exception as exc:  # noqa: BLE001 - any failure means: no scaler, use wave scaling
            text = str(exc).replace(str(Path(__file__).resolve().parents[1]), "<repo>")[:160]
            _SCALER_CACHE[op] = (None, f"no published {op} scaler ({type(exc).__name__}: {text})")
    return _SCALER_CACHE[op]


def _scaler_for(op: str, scalers) -> tuple[Any, str]:
    if scalers is None:
        return _published_scaler(op)
    if scalers is False:
        return None, "scalers disabled"
    if op in scalers and scalers[op] is not None:
        return scalers[op], ""
    return None, f"no {op} scaler given"


def _call_scale(scaler, cfg: pd.DataFrame, measured: np.ndarray, origin, dest, precision: str, phase: str):
    """``scaler.scale`` -> (ms, out-of-range flags or None)."""
    try:
        res = scaler.scale(cfg, measured, origin, dest, precision=precision, phase=phase, return_flags=True)
    except TypeError:  # a scaler without return_flags
        return np.asarray(scaler.scale(cfg, measured, origin, dest, precision=precision, phase=phase),
                          dtype=float), None
    if isinstance(res, tuple):
        return np.asarray(res[0], dtype=float), np.asarray(res[1], dtype=bool)
    return np.asarray(res, dtype=float), None


def predict_trace(ops: pd.DataFrame, origin, dest, *, scalers: Mapping | bool | None = None,
                  wave_mode: str = "gamma", compute: str = "peak",
                  launch_ms: float = wave.LAUNCH_BOUND_MS) -> pd.DataFrame:
    """Predict each op of ``ops`` (measured on ``origin``) on ``dest``: a copy with ``pred_ms``, ``method`` and
    ``note``.

    ``ops`` needs ``op`` and ``time_ms``; optional: ``phase`` (forward), ``scaler_phase`` (its phase, optimizer
    -> forward), ``precision`` (fp32), ``flops``, ``bytes``, ``blocks`` (or ``elements``), ``tensor_core``,
    ``count`` (weight of the row in totals) and the canonical config columns of conv2d/linear/bmm/lstm rows.
    ``origin``/``dest``: registry names or spec dicts. ``scalers``: ``None`` loads the published scalers
    (``pipeline.load_scaler``) where they exist; ``False`` uses wave scaling only; a mapping ``{op: scaler}``
    injects scaler objects (anything with ``.scale(configs, measured_ms, origin, dest, precision=, phase=)``).
    ``method``: ``scaler`` or a ``pipeline.wave`` rule (``wave-launch``, ``wave-bandwidth``, ``wave-gamma``,
    ``wave-memory``, ``wave-compute``), ``unsupported`` (NaN: the precision has no path on a GPU),
    ``zero`` (a 0 ms op).
    """
    from pipeline import gpus

    if "op" not in ops or "time_ms" not in ops:
        raise ValueError("ops: needs the columns 'op' and 'time_ms' (see pipeline.track.TRACE_COLUMNS)")
    ospec, dspec = gpus.gpu_spec(resolve_origin(origin)), gpus.gpu_spec(dest)
    out = ops.copy().reset_index(drop=True)
    n = len(out)
    kind = out["op"].astype(str).to_numpy()
    bad = sorted(set(kind) - set(OP_KINDS))
    if bad:
        raise ValueError(f"ops: unknown op kinds {bad}; allowed: {', '.join(OP_KINDS)}")
    t = pd.to_numeric(out["time_ms"], errors="coerce").to_numpy(dtype=float)
    phase = out["phase"].astype(str).to_numpy() if "phase" in out else np.full(n, "forward", dtype=object)
    prec = out["precision"].astype(str).to_numpy() if "precision" in out else np.full(n, "fp32", dtype=object)
    if "scaler_phase" in out:
        sphase = out["scaler_phase"].where(out["scaler_phase"].notna(), None).to_numpy(dtype=object)
        sphase = np.array([s if s in ("forward", "backward") else ("backward" if p == "backward" else "forward")
                           for s, p in zip(sphase, phase)], dtype=object)
    else:
        sphase = np.where(phase == "backward", "backward", "forward").astype(object)

    def col(name, default=np.nan):
        if name in out:
            return pd.to_numeric(out[name], errors="coerce").to_numpy(dtype=float)
        return np.full(n, default, dtype=float)

    flops, nbytes = col("flops"), col("bytes")
    blocks = _blocks(out)
    if "tensor_core" in out:
        tc = out["tensor_core"].fillna(False).astype(bool).to_numpy()
    else:
        tc = np.isin(kind, ("conv2d", "linear", "bmm", "lstm")) & (prec != "fp32")

    pred = np.full(n, np.nan)
    method = np.full(n, "", dtype=object)
    note = np.full(n, "", dtype=object)
    why_not: dict[str, str] = {}
    for p in set(prec):
        if p not in gpus.PRECISIONS:
            why_not[p] = f"unknown precision {p!r}"
        elif not gpus.supports_precision(ospec, p):
            why_not[p] = f"{p} has no path on {ospec['name']}"
        elif not gpus.supports_precision(dspec, p):
            why_not[p] = f"{p} has no path on {dspec['name']}"
    supported = np.array([p not in why_not for p in prec], dtype=bool)
    method[~supported] = "unsupported"
    note[~supported] = [why_not[p] for p in prec[~supported]]
    zero = supported & ~(t > 0)
    pred[zero] = np.where(np.isfinite(t[zero]), t[zero], 0.0)
    method[zero] = "zero"
    todo = supported & (t > 0)

    for op in ("conv2d", "linear", "bmm", "lstm"):
        rows = todo & (kind == op)
        if not rows.any():
            continue
        scaler, why = _scaler_for(op, scalers)
        if scaler is None:
            note[rows] = why
            continue
        cols = list(OP_CONFIG_COLUMNS[op])
        missing = [c for c in cols if c not in out]
        if missing:
            note[rows] = f"no config columns {missing}"
            continue
        for (p, ph), idx in pd.Series(np.flatnonzero(rows)).groupby([prec[rows], sphase[rows]]):
            idx = idx.to_numpy()
            cfg = out.loc[idx, cols]
            if cfg.isna().any().any():
                note[idx] = f"{op}: incomplete config columns"
                continue
            cfg = cfg.astype({c: (bool if c in BOOL_COLUMNS else np.int64) for c in cols}).reset_index(drop=True)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    ms, flags = _call_scale(scaler, cfg, t[idx], ospec, dspec, p, ph)
            except Exception as exc:  # noqa: BLE001 - fall back to wave scaling for these rows
                note[idx] = f"{op} scaler failed ({type(exc).__name__}: {str(exc)[:120]})"
                continue
            ok = np.isfinite(ms) & (ms > 0)
            pred[idx[ok]] = ms[ok]
            method[idx[ok]] = "scaler"
            if flags is not None:
                note[idx[ok & flags]] = "outside the scaler's training ranges"
            note[idx[~ok]] = f"{op} scaler gave no finite positive time"

    rest = todo & (method == "")
    if rest.any():
        p_ms, p_method = wave.scale_other(t[rest], flops[rest], nbytes[rest], ospec, dspec, prec[rest],
                                          blocks=blocks[rest], tensor_core=tc[rest], mode=wave_mode,
                                          compute=compute, launch_ms=launch_ms)
        pred[rest] = p_ms
        method[rest] = p_method
    out["pred_ms"] = pred
    out["method"] = method
    out["note"] = note
    return out
