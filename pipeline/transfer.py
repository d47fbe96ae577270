"""From a time measured on one GPU to another GPU: how much of the origin's measurement to keep.

A scaler predicts any GPU directly; a measurement on the origin adds what the model got wrong there. Habitat's
ratio keeps all of it, ``measured * model(dest) / model(origin)``; the direct prediction keeps none. In between:

    ms(dest) = model(dest) * (measured / model(origin)) ** ratio_weight

The ratio helps where the model's error on a config is the config's own (a convolution algorithm every GPU picks
alike) and hurts where it is the origin GPU's level (its clock under load, a model that never saw it), which says
nothing about another GPU. Which one dominates is measured, per op: ``calibrate`` picks the weight with the
lowest mean error over origin -> destination pairs of leave-GPU-out passes (a model that never saw the
destination, on the rows both GPUs measured), and the card carries it (``transfer.ratio_weight``).

numpy/pandas only: the prediction API applies the weight.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

WEIGHTS = tuple(np.round(np.linspace(0.0, 1.0, 9), 3))   # the grid ``calibrate`` searches (0 = direct, 1 = ratio)
MIN_PAIR_ROWS = 20                                       # pairs with fewer common rows are left out
FORMULA = "model(dest) * (measured / model(origin)) ** ratio_weight"


def apply(pred_dest_ms, measured_ms, pred_origin_ms, weight: float) -> np.ndarray:
    """``pred_dest * (measured / pred_origin) ** weight`` per row (ms)."""
    pred_dest = np.asarray(pred_dest_ms, dtype=np.float64)
    if weight == 0:
        return pred_dest.copy()
    residual = np.asarray(measured_ms, dtype=np.float64) / np.asarray(pred_origin_ms, dtype=np.float64)
    return pred_dest * residual ** weight


def dest_errors(pairs: pd.DataFrame, pred_dest_ms) -> np.ndarray:
    """Absolute % error of ``pred_dest_ms`` against each pair row's destination measurement (``dest_ms``); where
    the row has a ``floor_dest_ms`` (a host-timed destination's launch floor) the prediction compared is at least
    that, as the measurement is."""
    pred = np.asarray(pred_dest_ms, dtype=np.float64)
    if "floor_dest_ms" in pairs:
        floor = pairs["floor_dest_ms"].to_numpy(float)
        pred = np.where(np.isfinite(floor), np.fmax(pred, floor), pred)
    return np.abs(pred / pairs["dest_ms"].to_numpy(float) - 1.0) * 100.0


def pair_errors(pairs: pd.DataFrame, weights=WEIGHTS, min_rows: int = MIN_PAIR_ROWS) -> pd.DataFrame:
    """Mean absolute % error per (origin, dest) pair (rows) and weight (columns), pairs of ``min_rows`` rows or more.

    ``pairs``: one row per config, precision and phase both GPUs measured, with ``origin, dest, measured_ms``
    (origin), ``dest_ms`` (measured on dest), ``pred_origin_ms``, ``pred_dest_ms`` (the model, which never saw
    dest) and optionally ``floor_dest_ms`` (a host-timed destination's launch floor: the prediction compared is at
    least that, as the measurement is)."""
    if pairs.empty:
        return pd.DataFrame(columns=list(weights))
    cols = {float(w): dest_errors(pairs, apply(pairs["pred_dest_ms"], pairs["measured_ms"], pairs["pred_origin_ms"],
                                               float(w)))
            for w in weights}
    frame = pd.DataFrame(cols).assign(origin=pairs["origin"].to_numpy(), dest=pairs["dest"].to_numpy())
    grouped = frame.groupby(["origin", "dest"], sort=True)
    sizes = grouped.size()
    return grouped.mean()[sizes >= min_rows]


def calibrate(pairs: pd.DataFrame, weights=WEIGHTS, min_rows: int = MIN_PAIR_ROWS) -> dict | None:
    """The card's ``transfer``: the weight with the lowest mean over pairs of the pair's error (every pair weighs
    the same, as in the evaluation's ratio matrix), and that mean for every weight tried; None without pairs."""
    errors = pair_errors(pairs, weights, min_rows)
    if errors.empty:
        return None
    means = errors.mean()
    best = float(means.idxmin())
    return {"ratio_weight": best, "formula": FORMULA,
            "mean_pair_mape": {f"{w:g}": round(float(v), 3) for w, v in means.items()},
            "pairs": int(len(errors)), "rows": int(pairs.groupby(["origin", "dest"]).size().loc[errors.index].sum()),
            "calibrated_on": "origin -> destination pairs of the training run's leave-GPU-out passes (the model "
                             "never saw the destination), on the rows both GPUs measured; each pair weighs the same"}
