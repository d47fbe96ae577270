"""A tracked step (``Trace``) and its prediction on another GPU (``Prediction``); numpy/pandas only.

The predicted step is the sum of the predicted op times, as in Habitat. The part of the measured step that no
op accounts for (``Trace.unattributed_ms``: host-bound gaps where the GPU waited for Python) is reported
separately, and ``Prediction.total_with_unattributed_ms`` adds it unscaled.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline import gpus
from pipeline.atomic import atomic_write
from pipeline.step.classify import OP_KINDS, STEP_PHASES, conform
from pipeline.step.predict import predict_trace, resolve_origin

__all__ = ["Trace", "Prediction"]


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
                          columns=[p for p in STEP_PHASES if p in table.columns] +
                          [p for p in table.columns if p not in STEP_PHASES])
    table["total"] = table.sum(axis=1)
    table.loc["total"] = table.sum(axis=0)
    table.columns.name = None
    return table


def _label(gpu) -> str:
    return "cpu" if isinstance(gpu, str) and gpu == "cpu" else gpus.gpu_label(gpu)


@dataclass
class Trace:
    """One tracked training step: ``ops`` (one row per ATen op) and the measured step ``total_ms``; ``grads``: one
    row per parameter (``param``, ``numel``, ``bytes``, ``dtype``, ``ready_seq``: ops run before its gradient was
    ready), what a data-parallel prediction buckets and all-reduces (None where unknown)."""

    ops: pd.DataFrame
    total_ms: float
    origin: str | None = None
    meta: dict = field(default_factory=dict)
    grads: pd.DataFrame | None = None

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

    def to(self, dest, origin=None, **kwargs) -> Prediction:
        """Predict this step on ``dest`` (a registry name or spec dict); ``origin`` overrides the detected
        device (required when it is not in the registry, or to treat CPU times as a GPU's: demos only).
        ``kwargs`` go to ``predict_trace`` (``scalers``, ``fallback``, ``scaler_root``, ``wave_mode``, ...)."""
        origin = resolve_origin(self.origin if origin is None else origin)
        ops = predict_trace(self.ops, origin, dest, **kwargs)
        return Prediction(ops=ops, origin=_label(origin), dest=_label(dest), measured_ms=self.total_ms,
                          unattributed_ms=self.unattributed_ms)

    def summary(self) -> str:
        m = self.meta
        lines = [f"device {m.get('device_name', '?')} ({m.get('device', '?')}, origin {self.origin}), "
                 f"timing {m.get('timing', '?')}, cudnn.benchmark {m.get('cudnn_benchmark', '?')}",
                 f"measured step {self.total_ms:.3f} ms (median of {m.get('repeats', '?')}); tracked ops "
                 f"{len(self.ops)}, sum {self.tracked_ms:.3f} ms = {100 * self.coverage:.1f} % of the step "
                 f"(unattributed {self.unattributed_ms:+.3f} ms); tracking overhead {self.overhead:.1f}x"]
        return "\n".join(lines)

    def save(self, directory) -> Path:
        """Write ``ops.csv`` (and ``ops.parquet``), ``grads.csv`` (where known) and ``trace.json`` to a folder, each
        file atomically."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        atomic_write(directory / "ops.csv", self.ops.to_csv(index=False).encode())
        atomic_write(directory / "ops.parquet", self.ops.to_parquet(index=False))
        if self.grads is not None:
            atomic_write(directory / "grads.csv", self.grads.to_csv(index=False).encode())
        info = {"total_ms": self.total_ms, "origin": self.origin, "tracked_ms": self.tracked_ms,
                "coverage": self.coverage, "meta": self.meta}
        atomic_write(directory / "trace.json", json.dumps(info, indent=2, default=str).encode())
        return directory

    @classmethod
    def load(cls, directory) -> Trace:
        directory = Path(directory)
        info = json.loads((directory / "trace.json").read_text())
        ops = conform(pd.read_csv(directory / "ops.csv"))
        grads = pd.read_csv(directory / "grads.csv") if (directory / "grads.csv").exists() else None
        return cls(ops=ops, total_ms=float(info["total_ms"]), origin=info.get("origin"), meta=info.get("meta", {}),
                   grads=grads)


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
