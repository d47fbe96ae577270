"""What a per-op scaler predicts, and how its MLP output becomes a time that physics bounds from below.

numpy only (the light prediction API imports it). Every kind predicts ``y = ln(time / reference)`` for a
reference time of the row (``pipeline.features.Rows``); they differ in the reference and in how the MLP's raw
outputs ``z`` become ``y``:

- ``bounded_utilisation`` (the default): reference = the physical lower bound ``max(finest wave schedule, FLOPs /
  peak, L2-aware memory time)`` (a convolution's FLOPs over its Winograd or FFT saving); ``time = bound / u +
  kernels x latency`` with a utilisation ``u = U_MIN + (1 - U_MIN) sigmoid(z0)`` in (U_MIN, 1) and a per-kernel GPU
  latency ``KERNEL_LATENCY_MAX_S x sigmoid(z1)`` for each of the GEMM kernels the op runs one after another (an
  LSTM's steps, a backward's two GEMMs): the MLP is a bounded correction, never below the bound and never more than
  1 / U_MIN times it plus the latencies.
- ``neusight_utilisation``: NeuSight's form (S. Lee, A. Phanishayee, D. Mahajan, ASPLOS'25): reference =
  ``waves x per-tile time`` of the schedule a library picks (the tile at the per-SM peak and per-SM bandwidth),
  utilisation ``u = alpha - beta / waves`` with ``alpha = sigmoid(z0)`` and ``beta = alpha sigmoid(z1)`` (beta <
  alpha keeps u in (0, 1)): two outputs.
- ``log_roofline_ratio``: the earlier unbounded target, reference = the plain roofline, ``y = z``.

``to_ms`` returns ``max(reference x exp(y), bound)``: for the bounded kinds the clamp never binds; for the others
it keeps the promise that no prediction falls below the bound at the row's precision.
"""

from __future__ import annotations

import numpy as np

from pipeline.features import Rows, features_version

TARGET_KIND = "bounded_utilisation"
TARGET_KINDS = ("bounded_utilisation", "neusight_utilisation", "log_roofline_ratio")
HEAD_OUTPUTS = {"bounded_utilisation": 2, "neusight_utilisation": 2, "log_roofline_ratio": 1}
U_MIN = 0.005
"""Lowest utilisation of the bounded form: no measured kernel of 50 us or more runs below it (their 99.9th
percentile of time / bound is 130-320 for bmm and linear; an LSTM's are latencies, which have their own term)."""
KERNEL_LATENCY_MAX_S = 50e-6
"""Upper end of the per-kernel latency term (s): a GEMM kernel's fixed cost on the GPU is a few microseconds."""
_DEFINITIONS = {
    "bounded_utilisation": ("y = ln(time_ms / bound_ms); bound_ms = max(finest wave schedule, FLOPs / peak, "
                            "L2-aware memory time) on the target GPU at the row's precision, a convolution's "
                            "FLOPs over physics.fast_algorithm_saving (Winograd, FFT) "
                            "(pipeline.features.bound_ms); y = ln(1 / u + "
                            "kernels x latency / bound), u = U_MIN + (1 - U_MIN) sigmoid(z0), latency = "
                            "KERNEL_LATENCY_MAX_S sigmoid(z1)",
                            "time_ms = bound_ms / u + kernels x latency"),
    "neusight_utilisation": ("y = ln(time_ms / (waves x tile_ms)) for the library schedule's waves and per-tile "
                             "time; y = -ln(alpha - beta / waves), alpha = sigmoid(z0), beta = alpha sigmoid(z1)",
                             "time_ms = max(waves x tile_ms / (alpha - beta / waves), bound_ms)"),
    "log_roofline_ratio": ("y = ln(time_ms / roofline_ms); roofline_ms = max(flops / peak, bytes / DRAM bandwidth); "
                           "y = z", "time_ms = max(roofline_ms x exp(z), bound_ms)"),
}


def check_kind(kind: str) -> str:
    if kind not in TARGET_KINDS:
        raise ValueError(f"target kind {kind!r} is not one of {list(TARGET_KINDS)}")
    return kind


def reference_s(kind: str, rows: Rows) -> np.ndarray:
    """The reference time (seconds) that ``kind`` predicts a ratio to."""
    check_kind(kind)
    if kind == "bounded_utilisation":
        return rows.bound_s
    if kind == "neusight_utilisation":
        return rows.work.steps * rows.library.waves * rows.tile_s
    return rows.roofline_s


def aux(kind: str, rows: Rows) -> np.ndarray:
    """What the output head needs besides the MLP's outputs: the largest latency share ``kernels x
    KERNEL_LATENCY_MAX_S / bound`` (bounded), the library schedule's waves (NeuSight's), else 1."""
    if kind == "bounded_utilisation":
        return rows.kernels * KERNEL_LATENCY_MAX_S / rows.bound_s
    if kind == "neusight_utilisation":
        return np.asarray(rows.library.waves, dtype=np.float64)
    return np.ones(rows.n)


def ms_to_target(kind: str, ms, rows: Rows) -> np.ndarray:
    """Measured times (ms) -> the regression target ``y`` of ``kind``."""
    ms = np.asarray(ms, dtype=np.float64).reshape(-1)
    return np.log(ms) - np.log(reference_s(kind, rows) * 1e3)


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(0.0, x)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return np.exp(-_softplus(-x))


def output_to_target(kind: str, out: np.ndarray, extra: np.ndarray) -> np.ndarray:
    """The MLP's raw outputs (n,) or (n, k) -> ``y``; ``extra`` is ``aux(kind, rows)``."""
    check_kind(kind)
    out = np.asarray(out, dtype=np.float64)
    z = out.reshape(len(out), -1)
    if z.shape[1] != HEAD_OUTPUTS[kind]:
        raise ValueError(f"target kind {kind!r} needs {HEAD_OUTPUTS[kind]} model outputs, got {z.shape[1]}")
    with np.errstate(divide="ignore"):
        if kind == "bounded_utilisation":  # ln(1 / u + aux sigmoid(z1))
            inv_u = -np.log(U_MIN + (1.0 - U_MIN) * _sigmoid(z[:, 0]))
            return np.logaddexp(inv_u, np.log(extra) - _softplus(-z[:, 1]))
        if kind == "neusight_utilisation":  # u = alpha (1 - sigmoid(z1) / waves), alpha = sigmoid(z0)
            return _softplus(-z[:, 0]) - np.log1p(-_sigmoid(z[:, 1]) / extra)
    return z[:, 0]


def to_ms(kind: str, out: np.ndarray, rows: Rows) -> np.ndarray:
    """The MLP's raw outputs -> predicted times in ms, never below the bound (``bound_ms``)."""
    y = output_to_target(kind, out, aux(kind, rows))
    return np.maximum(reference_s(kind, rows) * np.exp(y), rows.bound_s) * 1e3


def members_to_ms(kind: str, outs: list[np.ndarray], rows: Rows) -> np.ndarray:
    """An ensemble's time: the geometric mean of its members' ``to_ms`` (the mean of their ln-time targets); one
    member's time as it is."""
    if len(outs) == 1:
        return to_ms(kind, outs[0], rows)
    extra, log_ref, log_bound = aux(kind, rows), np.log(reference_s(kind, rows) * 1e3), np.log(rows.bound_s * 1e3)
    return np.exp(np.mean([np.maximum(log_ref + output_to_target(kind, out, extra), log_bound) for out in outs],
                          axis=0))


def target_card(op: str, kind: str = TARGET_KIND) -> dict:
    """The ``target`` entry of ``op``'s model card: the kind, its outputs and what it means."""
    definition, inverse = _DEFINITIONS[check_kind(kind)]
    return {"kind": kind, "features_version": features_version(op), "outputs": HEAD_OUTPUTS[kind],
            "definition": definition, "inverse": inverse, "module": "pipeline.targets"}
