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

An op whose precision either GPU has no fast path for (``physics.has_fast_path``: the precisions
``pipeline.gpus.supports_precision`` refuses) is not scaled: NaN, ``method = "unsupported"``.

Peak rates come from ``pipeline.physics.compute_tflops`` (one fallback rule for every module). Specs are plain
dicts with the fields of ``pipeline.gpus.SPEC_FIELDS`` (resolve names with ``pipeline.gpus.gpu_spec``); numpy only.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from pipeline import physics

__all__ = ["LAUNCH_BOUND_MS", "MODES", "COMPUTE_FACTORS", "ridge_point", "gamma", "scale_other"]

LAUNCH_BOUND_MS = 0.010
"""Ops faster than this (10 us) are launch-bound: their time is kept."""

MODES = ("gamma", "roofline")
COMPUTE_FACTORS = ("peak", "clock_sm")


def ridge_point(spec: Mapping, precision: str = "fp32", tensor_core: bool = False) -> float:
    """FLOP per byte at which the GPU turns from memory- to compute-bound (peak FLOP/s of the op's compute
    class, ``physics.compute_tflops``, over peak bandwidth)."""
    return (physics.compute_tflops(spec, precision, tensor_core) * 1e12
            / (float(spec["memory_bandwidth_gbps"]) * 1e9))


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


def _compute_classes(origin: Mapping, dest: Mapping, prec: np.ndarray, tc: np.ndarray):
    """Per row: (origin/dest peak ratio of the op's compute class, dest ridge point, both GPUs run it)."""
    n = len(prec)
    peak_ratio, ridge, runnable = np.full(n, np.nan), np.full(n, np.nan), np.zeros(n, dtype=bool)
    cache: dict[tuple[str, bool], tuple[float, float, bool]] = {}
    for i in range(n):
        key = (str(prec[i]), bool(tc[i]))
        if key not in cache:
            ok = physics.has_fast_path(origin, key[0]) and physics.has_fast_path(dest, key[0])
            cache[key] = ((physics.compute_tflops(origin, *key) / physics.compute_tflops(dest, *key),
                           ridge_point(dest, *key), True) if ok else (np.nan, np.nan, False))
        peak_ratio[i], ridge[i], runnable[i] = cache[key]
    return peak_ratio, ridge, runnable


def _scale_by_intensity(t, intensity, peak_ratio, ridge, bw_ratio: float, clock_sm: float, mode: str,
                        compute: str) -> tuple[np.ndarray, np.ndarray]:
    """Rule 3 of the module docstring on rows with known counters: (pred_ms, method)."""
    if mode == "gamma":
        g = gamma(intensity, ridge)
        g = np.where(np.isfinite(g), g, 0.0)  # I = inf (no bytes): fully compute-bound
        cfac = peak_ratio if compute == "peak" else clock_sm
        return t * bw_ratio ** g * cfac ** (1.0 - g), np.full(len(t), "wave-gamma", dtype=object)
    mem = intensity < ridge
    return (np.where(mem, t * bw_ratio, t * peak_ratio),
            np.where(mem, "wave-memory", "wave-compute").astype(object))


def scale_other(time_ms, flops, bytes_, origin: Mapping, dest: Mapping, precision="fp32", *, blocks=None,
                tensor_core=False, mode: str = "gamma", compute: str = "peak",
                launch_ms: float = LAUNCH_BOUND_MS) -> tuple[np.ndarray, np.ndarray]:
    """Scale measured op times from ``origin`` to ``dest`` (spec dicts); returns ``(pred_ms, method)`` arrays.

    ``time_ms``, ``flops``, ``bytes_``, ``blocks`` (estimated thread blocks, NaN = unknown), ``precision``
    (a string or one per op) and ``tensor_core`` (bool or one per op) broadcast against each other. A NaN
    prediction with ``method == "unsupported"`` marks ops whose precision one of the GPUs cannot run (e.g. bf16
    on a V100).
    """
    if mode not in MODES:
        raise ValueError(f"mode: unknown wave-scaling mode {mode!r}; allowed: {', '.join(MODES)}")
    if compute not in COMPUTE_FACTORS:
        raise ValueError(f"compute: unknown compute factor {compute!r}; allowed: {', '.join(COMPUTE_FACTORS)}")
    t = np.atleast_1d(np.asarray(time_ms, dtype=float))
    n = len(t)
    fl, by, bl = _as_array(flops, n), _as_array(bytes_, n), _as_array(blocks, n)
    prec = np.broadcast_to(np.asarray(precision, dtype=object), (n,))
    tc = np.broadcast_to(np.asarray(tensor_core, dtype=bool), (n,))
    peak_ratio, ridge, runnable = _compute_classes(origin, dest, prec, tc)
    bw_ratio = float(origin["memory_bandwidth_gbps"]) / float(dest["memory_bandwidth_gbps"])
    clock_sm = (float(origin["boost_clock_mhz"]) / float(dest["boost_clock_mhz"])) * \
               (float(origin["sm_count"]) / float(dest["sm_count"]))
    min_sms = min(int(origin["sm_count"]), int(dest["sm_count"]))

    pred = np.full(n, np.nan)
    method = np.full(n, "unsupported", dtype=object)
    with np.errstate(divide="ignore", invalid="ignore"):
        intensity = np.where(by > 0, fl / by, np.where(fl > 0, np.inf, 0.0))
    known = (np.isfinite(fl) & (fl > 0)) | (np.isfinite(by) & (by > 0))
    launch = runnable & ((t < launch_ms) | (np.isfinite(bl) & (bl <= min_sms)))
    pred[launch], method[launch] = t[launch], "wave-launch"
    rest = runnable & ~launch & ~known
    pred[rest], method[rest] = t[rest] * bw_ratio, "wave-bandwidth"
    rest = runnable & ~launch & known
    pred[rest], method[rest] = _scale_by_intensity(t[rest], intensity[rest], peak_ratio[rest], ridge[rest],
                                                   bw_ratio, clock_sm, mode, compute)
    return pred, method
