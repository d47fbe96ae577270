"""80 % prediction intervals: empirical quantiles of the log error, calibrated on data the model never trained on.

numpy only (the light prediction API imports it). A scaler's card holds ``interval``::

    {"level": 0.8, "small_ms": 0.05, "quantiles": {"<group>": [q_lo, q_hi], ...}, "rows": {"<group>": n}, ...}

with ``q = quantile(ln(measured / predicted))`` at ``(1 - level) / 2`` and ``(1 + level) / 2``, per group:
whether the GPU is one the model trained on (``seen``: calibrated on held-out configs of training GPUs) or not
(``unseen``: calibrated on leave-one-GPU-out passes), and whether the prediction is under ``small_ms`` (launch-
scale kernels, whose relative spread differs). The interval of a prediction is ``[max(p e^q_lo, bound),
p e^q_hi]``: it never reaches below the physical bound either.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

LEVEL = 0.8
SMALL_MS = 0.05
MIN_GROUP_ROWS = 30
GROUPS = ("seen/small", "seen/large", "unseen/small", "unseen/large")


def group_names(pred_ms: np.ndarray, seen, small_ms: float = SMALL_MS) -> np.ndarray:
    """The calibration group of each prediction (``seen``: a bool or a bool per row)."""
    pred_ms = np.asarray(pred_ms, dtype=np.float64)
    seen = np.broadcast_to(np.asarray(seen, dtype=bool), pred_ms.shape)
    return np.where(seen, "seen/", "unseen/").astype(object) + np.where(pred_ms < small_ms, "small", "large")


def device_weights(devices) -> np.ndarray:
    """Row weights that give every device the same total, so the GPU with the most rows does not set the interval
    of all others (the coverage target counts each held-out GPU once)."""
    _, inverse, counts = np.unique(np.asarray(devices).astype(str), return_inverse=True, return_counts=True)
    return 1.0 / counts[inverse]


def weighted_quantile(values: np.ndarray, weights: np.ndarray, probs) -> np.ndarray:
    """Quantiles of ``values`` under ``weights`` (midpoint rule; equal weights give numpy's 'hazen' quantile)."""
    order = np.argsort(values)
    v, w = values[order], weights[order]
    cum = (np.cumsum(w) - 0.5 * w) / w.sum()
    return np.interp(probs, cum, v)


def calibrate(pred_ms, measured_ms, groups, level: float = LEVEL, small_ms: float = SMALL_MS,
              min_rows: int = MIN_GROUP_ROWS, devices=None) -> dict:
    """The card's ``interval`` from predictions and measurements on data the model did not train on.

    With ``devices`` (the GPU of each row), every device weighs the same within a group; without, every row.
    A group with fewer than ``min_rows`` rows borrows the quantiles of its seen/unseen class, then of all rows."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level: must be in (0, 1), got {level!r}")
    resid = np.log(np.asarray(measured_ms, dtype=np.float64) / np.asarray(pred_ms, dtype=np.float64))
    groups = np.asarray(groups, dtype=object)
    probs = [(1.0 - level) / 2.0, (1.0 + level) / 2.0]
    if len(resid) < min_rows:
        raise ValueError(f"interval calibration needs at least {min_rows} rows, got {len(resid)}")
    if devices is not None and len(devices) != len(resid):
        raise ValueError(f"devices: {len(devices)} entries for {len(resid)} rows")
    weighting = "every row the same" if devices is None else "every device the same"
    devices = np.zeros(len(resid)) if devices is None else np.asarray(devices)

    def quantiles_of(mask):
        return [float(q) for q in weighted_quantile(resid[mask], device_weights(devices[mask]), probs)]

    pooled = quantiles_of(np.ones(len(resid), dtype=bool))
    quantiles, rows, source = {}, {}, {}
    for g in GROUPS:
        cls = g.split("/")[0]
        for name, mask in ((g, groups == g), (cls, np.char.startswith(groups.astype(str), cls + "/"))):
            if mask.sum() >= min_rows:
                quantiles[g] = quantiles_of(mask)
                rows[g], source[g] = int(mask.sum()), name
                break
        else:
            quantiles[g], rows[g], source[g] = pooled, int(len(resid)), "all"
    return {"level": level, "small_ms": small_ms, "quantiles": quantiles, "rows": rows, "calibrated_on": source,
            "residual": "ln(measured_ms / predicted_ms)",
            "weighting": weighting}


def interval(card_interval: Mapping, pred_ms: np.ndarray, bound_ms: np.ndarray, seen) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) ms of each prediction from a card's ``interval`` entry."""
    groups = group_names(pred_ms, seen, float(card_interval.get("small_ms", SMALL_MS)))
    lo, hi = np.empty(len(pred_ms)), np.empty(len(pred_ms))
    for g in GROUPS:
        sel = groups == g
        if sel.any():
            q_lo, q_hi = card_interval["quantiles"][g]
            lo[sel], hi[sel] = pred_ms[sel] * np.exp(q_lo), pred_ms[sel] * np.exp(q_hi)
    return np.maximum(lo, bound_ms), np.maximum(hi, pred_ms)


def coverage(low, high, measured) -> float:
    """Share of measurements inside their interval."""
    measured = np.asarray(measured, dtype=np.float64)
    return float(np.mean((measured >= low) & (measured <= high))) if len(measured) else float("nan")
