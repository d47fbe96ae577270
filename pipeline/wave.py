"""Wave / roofline scaling of the ops the per-op scalers do not cover (Habitat's "wave scaling").

Every op of a tracked training step that is not conv2d, linear, bmm or lstm (elementwise ops, norms,
reductions, softmax, copies, optimizer updates...) is scaled from its measured time on the origin GPU to the
destination GPU by simple device ratios, chosen per op:

1. **launch-bound** -- the op took less than ``launch_ms`` (default 10 us: about the launch floor, kernel time is
   not what limits it), or it runs fewer thread blocks than either GPU has SMs (it fits in one wave on both, so a
   bigger GPU cannot run it faster): its time is kept. ``method = "wave-launch"``.
2. **no counters** -- neither FLOPs nor bytes are known: scale by the memory-bandwidth ratio ``BW_o/BW_d``
   (Habitat's default for kernels without profiler metrics). ``method = "wave-bandwidth"``.
3. otherwise by the arithmetic intensity ``I = flops / bytes`` against the destination's ridge point
   ``R = peak_FLOPS_d / BW_d`` (the op's compute class: the Tensor Core rate of its precision for ops that run on
   Tensor Cores, the plain FP32 rate for everything else), in one of two modes:

   - ``mode="gamma"`` (default), Habitat's blend::

         t_d = t_o * (BW_o/BW_d)**g * C**(1-g),   g = 1 - 0.5*I/R  (I <= R),   g = 0.5*R/I  (I > R)

     where the compute factor ``C`` is ``(clk_o/clk_d) * (SM_o/SM_d)`` -- Habitat's formula, exactly --
     with ``compute="clock_sm"``, or the ratio of peak FLOP/s of the op's compute class with
     ``compute="peak"`` (default). The two agree between GPUs with the same FLOPs per SM per clock; ``peak``
     also sees the per-SM differences between architectures (Tensor Core generations, Ampere's doubled FP32).
     A memory-bound op (``I << R``) scales by the bandwidth ratio, a compute-bound one (``I >> R``) by the
     compute factor. ``method = "wave-gamma"``.
   - ``mode="roofline"``: a hard switch: ``I < R`` scales by the bandwidth ratio (``"wave-memory"``), otherwise
     by the peak-FLOP/s ratio of the op's compute class and precision (``"wave-compute"``).

Specs are plain dicts with the fields of ``pipeline.gpus.SPEC_FIELDS`` (resolve names with
``pipeline.gpus.gpu_spec``); this module needs numpy only.
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

__all__ = ["LAUNCH_BOUND_MS", "ELEMENTS_PER_BLOCK", "MODES", "COMPUTE_FACTORS", "estimate_blocks",
           "compute_tflops", "ridge_point", "gamma", "scale_other"]

LAUNCH_BOUND_MS = 0.010
"""Ops faster than this (10 us) are launch-bound: their time is kept."""

ELEMENTS_PER_BLOCK = 512
"""Heuristic for the thread blocks of an elementwise-style kernel without a profile: PyTorch's vectorised
elementwise kernels run 128 threads x 4 elements per block. Used only for the one-wave rule."""

MODES = ("gamma", "roofline")
COMPUTE_FACTORS = ("peak", "clock_sm")


def estimate_blocks(elements) -> np.ndarray:
    """Estimated thread blocks of a kernel touching ``elements`` elements (NaN stays NaN)."""
    e = np.asarray(elements, dtype=float)
    return np.where(np.isfinite(e), np.ceil(np.maximum(e, 0.0) / ELEMENTS_PER_BLOCK), np.nan)


def compute_tflops(spec: Mapping, precision: str = "fp32", tensor_core: bool = False) -> float:
    """Peak TFLOP/s of the op's compute class: the precision's Tensor Core rate for Tensor Core ops (``tf32``,
    ``fp16``, ``bf16``), the plain FP32 rate otherwise. NaN where the GPU has no such rate."""
    if tensor_core and precision in ("tf32", "fp16", "bf16"):
        rate = spec.get(f"{precision}_tflops")
    else:
        rate = spec.get("fp32_tflops")
    return float(rate) if rate is not None else math.nan


def ridge_point(spec: Mapping, precision: str = "fp32", tensor_core: bool = False) -> float:
    """FLOP per byte at which the GPU turns from memory- to compute-bound (peak FLOP/s / peak bandwidth)."""
    return compute_tflops(spec, precision, tensor_core) * 1e12 / (float(spec["memory_bandwidth_gbps"]) * 1e9)


def gamma(intensity, ridge) -> np.ndarray:
    """Habitat's memory weight: ``1 - 0.5*I/R`` at or below the ridge point, ``0.5*R/I`` above it (in (0, 1])."""
    i = np.asarray(intensity, dtype=float)
    r = np.asarray(ridge, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        below = 1.0 - 0.5 * i / r
        above = 0.5 * r / i
    return np.where(i <= r, below, above)


def _as_array(x, n: int, dtype=float) -> np.ndarray:
    a = np.asarray(x if x is not None else np.nan, dtype=dtype)
    return np.broadcast_to(a, (n,)).copy() if a.ndim == 0 else a


def scale_other(time_ms, flops, bytes_, origin: Mapping, dest: Mapping, precision="fp32", *, blocks=None,
                tensor_core=False, mode: str = "gamma", compute: str = "peak",
                launch_ms: float = LAUNCH_BOUND_MS) -> tuple[np.ndarray, np.ndarray]:
    """Scale measured op times from ``origin`` to ``dest`` (spec dicts); returns ``(pred_ms, method)`` arrays.

    ``time_ms``, ``flops``, ``bytes_``, ``blocks`` (estimated thread blocks, NaN = unknown), ``precision``
    (a string or one per op) and ``tensor_core`` (bool or one per op) broadcast against each other. A NaN
    prediction with ``method == "unsupported"`` marks ops whose compute class has no rate on one of the GPUs
    (e.g. a bf16 Tensor Core op on a V100).
    """
    if mode not in MODES:
        raise ValueError(f"mode: unknown wave-scaling mode {mode!r}; allowed: {', '.join(MODES)}")
    if compute not in COMPUTE_FACTORS:
        raise ValueError(f"compute: unknown compute factor {compute!r}; allowed: {', '.join(COMPUTE_FACTORS)}")
    t = np.atleast_1d(np.asarray(time_ms, dtype=float))
    n = len(t)
    fl = _as_array(flops, n)
    by = _as_array(bytes_, n)
    bl = _as_array(blocks, n)
    prec = np.broadcast_to(np.asarray(precision, dtype=object), (n,))
    tc = np.broadcast_to(np.asarray(tensor_core, dtype=bool), (n,))

    bw_ratio = float(origin["memory_bandwidth_gbps"]) / float(dest["memory_bandwidth_gbps"])
    clock_sm = (float(origin["boost_clock_mhz"]) / float(dest["boost_clock_mhz"])) * \
               (float(origin["sm_count"]) / float(dest["sm_count"]))
    min_sms = min(int(origin["sm_count"]), int(dest["sm_count"]))

    # Per compute class (precision, tensor core): peak ratio and the destination's ridge point.
    peak_ratio = np.empty(n)
    ridge = np.empty(n)
    cache: dict[tuple[str, bool], tuple[float, float]] = {}
    for i in range(n):
        key = (str(prec[i]), bool(tc[i]))
        if key not in cache:
            po = compute_tflops(origin, *key)
            pd_ = compute_tflops(dest, *key)
            cache[key] = (po / pd_, ridge_point(dest, *key))
        peak_ratio[i], ridge[i] = cache[key]

    pred = np.full(n, np.nan)
    method = np.full(n, "", dtype=object)
    with np.errstate(divide="ignore", invalid="ignore"):
        intensity = np.where(by > 0, fl / by, np.where(fl > 0, np.inf, 0.0))
    known = (np.isfinite(fl) & (fl > 0)) | (np.isfinite(by) & (by > 0))
    launch = (t < launch_ms) | (np.isfinite(bl) & (bl <= min_sms))
    unsupported = ~launch & known & ~np.isfinite(peak_ratio)

    pred[launch] = t[launch]
    method[launch] = "wave-launch"

    rest = ~launch & ~known
    pred[rest] = t[rest] * bw_ratio
    method[rest] = "wave-bandwidth"

    rest = ~launch & known & ~unsupported
    if mode == "gamma":
        g = gamma(intensity[rest], ridge[rest])
        g = np.where(np.isfinite(g), g, 0.0)  # I = inf (no bytes): fully compute-bound
        cfac = peak_ratio[rest] if compute == "peak" else clock_sm
        pred[rest] = t[rest] * bw_ratio ** g * cfac ** (1.0 - g)
        method[rest] = "wave-gamma"
    else:
        mem = intensity[rest] < ridge[rest]
        idx = np.flatnonzero(rest)
        pred[idx[mem]] = t[idx[mem]] * bw_ratio
        method[idx[mem]] = "wave-memory"
        pred[idx[~mem]] = t[idx[~mem]] * peak_ratio[idx[~mem]]
        method[idx[~mem]] = "wave-compute"

    method[unsupported] = "unsupported"
    return pred, method
