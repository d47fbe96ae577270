"""Predictions of dataset rows through the prediction API (``pipeline.api.Scaler``), the one forward pass.

Training (test-split metrics, the champion comparison) and evaluation (leave-GPU-out, ratio scaling, the
champion report) all predict here, so every reported number is what ``load_scaler(...).predict`` returns.
A freshly trained model becomes an in-memory Scaler (``scaler_from``) without being published.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from pipeline import api, gpus
from pipeline import features as F
from pipeline.evaluation.metrics import ape
from pipeline.schema import OP_CONFIG_COLUMNS

ERROR_COLUMNS = ["config_id", "source", "gpu", "precision", "phase", "split", "time_ms", "launch_bound", "pred_ms",
                 "ape"]


def scaler_from(op: str, card_core: Mapping, weights: Mapping[str, np.ndarray], ranges: Mapping | None = None,
                version: int = 0) -> api.Scaler:
    """An unpublished Scaler of ``weights`` and a card's ``features/target/architecture`` (and ``ranges``)."""
    card = {**card_core, "ranges": dict(ranges or {}), "op": op, "version": version}
    return api.Scaler(op, version, card, dict(weights))


def row_indices(rows) -> np.ndarray:
    """Row positions from a boolean mask or from positions."""
    rows = np.asarray(rows)
    return np.flatnonzero(rows) if rows.dtype == bool else rows.astype(np.int64)


def _groups(table, idx: np.ndarray):
    """(GPU spec, precision, phase, positions in idx, configs) per (gpu, precision, phase) group of rows."""
    sub = table.frame.iloc[idx]
    cols = list(OP_CONFIG_COLUMNS[table.op])
    for (gpu, precision, phase), pos in sub.groupby(["gpu", "precision", "phase"], sort=False).indices.items():
        yield gpus.gpu_spec(gpu), precision, phase, pos, sub.iloc[pos][cols]


def predict_rows(scaler: api.Scaler, table, idx) -> tuple[np.ndarray, np.ndarray]:
    """(predicted ms, out-of-range flags) of table rows ``idx`` (indices or a boolean mask) by ``scaler``."""
    idx = row_indices(idx)
    pred = np.empty(len(idx))
    flags = np.zeros(len(idx), dtype=bool)
    for spec, precision, phase, pos, configs in _groups(table, idx):
        pred[pos], flags[pos] = scaler.predict(configs, spec, precision, phase, return_flags=True)
    return pred, flags


def roofline_rows(table, idx) -> np.ndarray:
    """The model-free baseline of table rows ``idx``: max(FLOPs / peak, bytes / bandwidth) in ms, at least the
    launch floor of the row's measurement (``with_floor``) like every prediction compared."""
    idx = row_indices(idx)
    out = np.empty(len(idx))
    for spec, precision, phase, pos, configs in _groups(table, idx):
        out[pos] = F.roofline_ms(table.op, configs, spec, precision, phase)
    return with_floor(table, idx, out)


def error_frame(table, idx, pred_ms: np.ndarray) -> pd.DataFrame:
    """Rows ``idx`` with measured and predicted ms and the absolute % error (for tables and plots). Where a
    host-timed source's launch floor bounds the measurement (``table.floor_ms``), the prediction compared is
    ``max(predicted GPU time, floor)``, as the measurement is; ``gpu_ms`` keeps the GPU time."""
    idx = row_indices(idx)
    frame = table.frame.iloc[idx][ERROR_COLUMNS[:-2]].reset_index(drop=True)
    frame["launch_bound"] = frame["launch_bound"].fillna(False).astype(bool)
    frame["gpu_ms"] = np.asarray(pred_ms, float)
    frame["pred_ms"] = with_floor(table, idx, frame["gpu_ms"].to_numpy())
    floor = table.floor_ms[idx] if table.floor_ms is not None else np.full(len(idx), np.nan)
    frame["at_floor"] = np.isfinite(floor) & (floor >= frame["time_ms"].to_numpy())  # the time IS the floor
    frame["ape"] = ape(frame["pred_ms"], frame["time_ms"])
    return frame


def with_floor(table, idx, ms: np.ndarray) -> np.ndarray:
    """``max(ms, launch floor)`` of rows ``idx`` where their measurement has one (``table.floor_ms``)."""
    idx = row_indices(idx)
    floor = table.floor_ms[idx] if table.floor_ms is not None else np.full(len(idx), np.nan)
    return np.where(np.isfinite(floor), np.fmax(ms, floor), ms)
