"""The report's analyses of leave-one-GPU-out errors: size classes, per precision/phase tables, the interval's
coverage on held-out GPUs, where each GPU's device features sit against the training range, and the targets.

Rows whose measurement is a host's launch floor (``at_floor``: a host-timed source's launch-bound rows) measure
the host, not the GPU: they are left out of every mean here and reported on their own (``launch_bound_check``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from pipeline import features as F
from pipeline import intervals
from pipeline.evaluation.metrics import summarise
from pipeline.gpus import supports_precision

SMALL = "< 50 us"
LARGE = ">= 50 us"


def gpu_rows(errors: pd.DataFrame) -> pd.DataFrame:
    """The rows that measure the GPU (not a launch floor), with their size class (measured time vs 50 us)."""
    if errors is None or errors.empty:
        return pd.DataFrame(columns=["gpu", "precision", "phase", "ape", "size", "time_ms", "pred_ms"])
    kept = errors[~errors["at_floor"].astype(bool)] if "at_floor" in errors else errors
    return kept.assign(size=np.where(kept["time_ms"] < intervals.SMALL_MS, SMALL, LARGE))


def launch_bound_check(errors: pd.DataFrame) -> dict:
    """On rows whose time is a launch floor: how often the predicted GPU time stays at or below it (it must)."""
    if errors is None or errors.empty or "at_floor" not in errors:
        return {"n": 0}
    part = errors[errors["at_floor"].astype(bool)]
    if part.empty:
        return {"n": 0}
    return {"n": int(len(part)), "gpu_time_at_most_measured": float(np.mean(part["gpu_ms"] <= part["time_ms"] * 1.1))}


def precision_phase_size_rows(errors: pd.DataFrame, roof: bool = True) -> list[list]:
    """Rows ``[precision, phase, size, n, MAPE, median, p90, (roofline MAPE)]`` of GPU-measuring rows."""
    rows = []
    for (p, ph, size), part in gpu_rows(errors).groupby(["precision", "phase", "size"], sort=True):
        s = summarise(part["ape"])
        rows.append([p, ph, size, s["n"], s["mape"], s["median_ape"], s["p90_ape"]]
                    + ([summarise(part["roof_ape"])["mape"]] if roof and "roof_ape" in part else []))
    return rows


def coverage_by_gpu(errors: pd.DataFrame, level: float = intervals.LEVEL) -> dict[str, dict]:
    """The 80 % interval's coverage on each held-out GPU, calibrated on the OTHER GPUs' leave-out errors only (each
    of them weighing the same, as in the card)."""
    rows = gpu_rows(errors)
    out = {}
    for gpu in sorted(rows["gpu"].unique()):
        mine, rest = rows[rows["gpu"] == gpu], rows[rows["gpu"] != gpu]
        if len(rest) < intervals.MIN_GROUP_ROWS or mine.empty:
            continue
        card = intervals.calibrate(rest["pred_ms"], rest["time_ms"],
                                   intervals.group_names(rest["pred_ms"].to_numpy(float), False), level,
                                   devices=rest["gpu"].astype(str).to_numpy())
        pred = mine["pred_ms"].to_numpy(float)
        lo, hi = intervals.interval(card, pred, np.zeros(len(pred)), False)
        out[gpu] = {"n": int(len(mine)), "coverage": intervals.coverage(lo, hi, mine["time_ms"]),
                    "median_width": float(np.median(hi / lo))}
    return out


def card_coverage(scaler, frame: pd.DataFrame) -> dict:
    """Coverage of a published card's interval on an error frame the model never trained on (per GPU and all)."""
    if frame is None or frame.empty or not scaler.card.get("interval"):
        return {}
    rows = gpu_rows(frame)
    seen = rows["gpu"].isin((scaler.card.get("training_data") or {}).get("gpus") or []).to_numpy()
    pred = rows["pred_ms"].to_numpy(float)
    lo, hi = intervals.interval(scaler.card["interval"], pred, np.zeros(len(pred)), seen)
    inside = (rows["time_ms"].to_numpy() >= lo) & (rows["time_ms"].to_numpy() <= hi)
    out = {g: {"n": int(m.sum()), "coverage": float(inside[m].mean())}
           for g, m in ((g, (rows["gpu"] == g).to_numpy()) for g in sorted(rows["gpu"].unique()))}
    return {"all": {"n": int(len(rows)), "coverage": float(inside.mean()) if len(rows) else float("nan")}, **out}


def device_range_rows(table, gpus: Sequence[str]) -> list[list]:
    """Per GPU and precision it has rows of: the device features outside the range of the other training GPUs at
    that precision (at any precision where no other GPU has it), with the value and the range; "-" where every one
    lies inside."""
    dom = table.frame[table.frame["domain"] == "train"]
    pairs = dom[["gpu", "precision"]].drop_duplicates()
    values = {(g, p): F.device_feature_values(g, p) for g, p in pairs.itertuples(index=False)}
    rows = []
    frame_pairs = table.frame[table.frame["gpu"].isin(list(gpus))][["gpu", "precision"]].drop_duplicates()
    for gpu, precision in sorted(frame_pairs.itertuples(index=False)):
        if not supports_precision(gpu, precision):
            continue
        mine = F.device_feature_values(gpu, precision)
        others = ([v for (g, p), v in values.items() if g != gpu and p == precision]
                  or [v for (g, _), v in values.items() if g != gpu])
        if not others:
            continue
        outside = []
        for name, value in mine.items():
            lo, hi = min(o[name] for o in others), max(o[name] for o in others)
            if not lo - 1e-9 <= value <= hi + 1e-9:
                outside.append(f"{name} {value:.2f} (training {lo:.2f}..{hi:.2f})")
        rows.append([gpu, precision, "; ".join(outside) or "-"])
    return rows


def per_gpu_mape(errors: pd.DataFrame, precisions: Sequence[str] | None = None, large_only: bool = False
                 ) -> dict[str, float]:
    """Mean absolute % error per held-out GPU on GPU-measuring rows (of ``precisions``; >= 50 us)."""
    rows = gpu_rows(errors)
    if precisions is not None:
        rows = rows[rows["precision"].isin(list(precisions))]
    if large_only:
        rows = rows[rows["size"] == LARGE]
    return {g: float(p["ape"].mean()) for g, p in rows.groupby("gpu", sort=True)}


def mean_of(values: Mapping[str, float]) -> float | None:
    vals = [v for v in values.values() if v is not None and np.isfinite(v)]
    return float(np.mean(vals)) if vals else None
