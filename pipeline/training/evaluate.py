"""Evaluation through the numpy path (what the prediction API runs): predictions and error tables.

Error of a row = |predicted_ms / measured_ms - 1| x 100 (absolute % error). Summaries: n, mean (MAPE),
median and p90 of it.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from pipeline import features as F
from pipeline.training.model import numpy_mlp


class IncompatibleModel(ValueError):
    """A published model whose features or target this code cannot rebuild (it was trained by other code)."""


def predict_rows(table, rows: np.ndarray, card: Mapping, weights: Mapping[str, np.ndarray]) -> np.ndarray:
    """Predicted ms of ``table`` rows (boolean mask or indices) by a published ``card`` + ``weights``."""
    names = list(card["features"]["names"])
    current = F.feature_names(table.op)
    missing = [n for n in names if n not in current]
    if missing:
        raise IncompatibleModel(f"the model uses features this code does not build: {missing}")
    kind = card["target"]["kind"]
    if kind not in F.TARGET_KINDS:
        raise IncompatibleModel(f"target kind {kind!r} is not one of {list(F.TARGET_KINDS)}")
    idx = np.flatnonzero(rows) if np.asarray(rows).dtype == bool else np.asarray(rows)
    cols = [current.index(n) for n in names]
    X = table.X[idx][:, cols]
    z = (X - np.asarray(card["features"]["mean"], float)) / np.asarray(card["features"]["std"], float)
    y = numpy_mlp(weights, card["architecture"]["activation"], z)
    return target_to_ms_rows(table, idx, kind, y)


def target_to_ms_rows(table, idx: np.ndarray, kind: str, y: np.ndarray) -> np.ndarray:
    """``features.target_to_ms`` over table rows of several GPUs (grouped by GPU)."""
    from pipeline.gpus import gpu_spec

    out = np.empty(len(idx))
    sub = table.frame.iloc[idx]
    for label, pos in sub.groupby("gpu", sort=False).indices.items():
        part = sub.iloc[pos]
        out[pos] = F.target_to_ms(table.op, kind, y[pos], part, gpu_spec(label), part["precision"].to_numpy(),
                                  part["phase"].to_numpy())
    return out


def ape(pred_ms: np.ndarray, true_ms: np.ndarray) -> np.ndarray:
    """Absolute % error per row."""
    return np.abs(np.asarray(pred_ms, float) / np.asarray(true_ms, float) - 1.0) * 100.0


def summarise(errors: np.ndarray) -> dict:
    errors = np.asarray(errors, float)
    if errors.size == 0:
        return {"n": 0}
    return {"n": int(errors.size), "mape": float(errors.mean()), "median_ape": float(np.median(errors)),
            "p90_ape": float(np.percentile(errors, 90))}


def error_frame(table, rows: np.ndarray, pred_ms: np.ndarray) -> pd.DataFrame:
    """Rows with measured/predicted ms and the absolute % error (for tables and plots)."""
    sub = table.frame.loc[np.asarray(rows), ["config_id", "source", "gpu", "precision", "phase", "split",
                                         "time_ms"]]
    sub = sub.reset_index(drop=True)
    sub["pred_ms"] = pred_ms
    sub["ape"] = ape(pred_ms, sub["time_ms"].to_numpy(float))
    return sub


def grouped(errors: pd.DataFrame, by: Sequence[str]) -> dict[str, dict]:
    """``{"a/b": summary}`` per group of ``by`` columns."""
    out = {}
    if errors.empty:
        return out
    for key, part in errors.groupby(list(by), sort=True):
        key = key if isinstance(key, tuple) else (key,)
        out["/".join(str(k) for k in key)] = summarise(part["ape"].to_numpy())
    return out


def metrics_block(errors: pd.DataFrame) -> dict:
    """Overall, per GPU, per precision, per phase and per GPU/precision/phase summaries of an error frame."""
    return {"all": summarise(errors["ape"].to_numpy()),
            "by_gpu": grouped(errors, ["gpu"]),
            "by_precision": grouped(errors, ["precision"]),
            "by_phase": grouped(errors, ["phase"]),
            "by_gpu_precision_phase": grouped(errors, ["gpu", "precision", "phase"]),
            "by_source": grouped(errors, ["source"])}


def error_table(errors: pd.DataFrame) -> pd.DataFrame:
    """Per GPU / precision / phase table (n, mean, median, p90 absolute % error), with an 'all' row per GPU."""
    rows = []
    if errors.empty:
        return pd.DataFrame(columns=["gpu", "precision", "phase", "n", "mape", "median_ape", "p90_ape"])
    for gpu, part in errors.groupby("gpu", sort=True):
        rows.append({"gpu": gpu, "precision": "all", "phase": "all", **summarise(part["ape"].to_numpy())})
        for (p, ph), sub in part.groupby(["precision", "phase"], sort=True):
            rows.append({"gpu": gpu, "precision": p, "phase": ph, **summarise(sub["ape"].to_numpy())})
    rows.append({"gpu": "all", "precision": "all", "phase": "all", **summarise(errors["ape"].to_numpy())})
    return pd.DataFrame(rows)


def to_markdown(table: pd.DataFrame, title: str = "") -> str:
    """A plain Markdown table (no extra dependency)."""
    cols = list(table.columns)
    lines = [f"### {title}", ""] if title else []
    lines.append("| " + " | ".join(cols) + " |")
    lines.append("|" + "|".join("---" for _ in cols) + "|")
    for _, r in table.iterrows():
        cells = [f"{v:.2f}" if isinstance(v, float) else str(v) for v in r.tolist()]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
