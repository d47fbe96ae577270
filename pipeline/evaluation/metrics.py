"""The error metrics of training and evaluation, and how they are printed.

Error of a row = |predicted_ms / measured_ms - 1| x 100 (absolute % error). A summary holds n, the mean
(MAPE), the median and the 90th percentile of it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

ERROR_DEFINITION = "absolute % error |predicted / measured - 1| x 100 per row; MAPE = its mean"


def ape(pred_ms, true_ms) -> np.ndarray:
    """Absolute % error per row."""
    return np.abs(np.asarray(pred_ms, float) / np.asarray(true_ms, float) - 1.0) * 100.0


def summarise(errors) -> dict:
    """{n, mape, median_ape, p90_ape} of absolute % errors; {n: 0} when there are none."""
    errors = np.asarray(errors, float)
    if errors.size == 0:
        return {"n": 0}
    return {"n": int(errors.size), "mape": float(errors.mean()), "median_ape": float(np.median(errors)),
            "p90_ape": float(np.percentile(errors, 90))}


def grouped(errors: pd.DataFrame, by: Sequence[str]) -> dict[str, dict]:
    """``{"a/b": summary}`` per group of the ``by`` columns of an error frame (column ``ape``)."""
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


def summary_rows(errors: pd.DataFrame | None, keys: list[str]) -> list[list]:
    """Table rows ``[*key, n, mape, median, p90]`` per group of ``keys``."""
    if errors is None or errors.empty:
        return []
    rows = []
    for key, part in errors.groupby(keys, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        s = summarise(part["ape"])
        rows.append([*key, s["n"], s["mape"], s["median_ape"], s["p90_ape"]])
    return rows


def error_table(errors: pd.DataFrame) -> pd.DataFrame:
    """Per GPU / precision / phase table (n, mean, median, p90 absolute % error), with an 'all' row per GPU."""
    if errors.empty:
        return pd.DataFrame(columns=["gpu", "precision", "phase", "n", "mape", "median_ape", "p90_ape"])
    rows = []
    for gpu, part in errors.groupby("gpu", sort=True):
        rows.append({"gpu": gpu, "precision": "all", "phase": "all", **summarise(part["ape"].to_numpy())})
        for (p, ph), sub in part.groupby(["precision", "phase"], sort=True):
            rows.append({"gpu": gpu, "precision": p, "phase": ph, **summarise(sub["ape"].to_numpy())})
    rows.append({"gpu": "all", "precision": "all", "phase": "all", **summarise(errors["ape"].to_numpy())})
    return pd.DataFrame(rows)


# ------------------------------------------------------------------------------------------- formatting

def num(value: float, digits: int = 1) -> str:
    """A percentage for a table: fixed point, or scientific when a blown-up prediction makes it huge."""
    if not math.isfinite(value):
        return "inf" if value > 0 else "n/a"
    return f"{value:.{digits}f}" if abs(value) < 1e4 else f"{value:.1e}"


def pct(value, digits: int = 1) -> str:
    return "n/a" if value is None else f"{num(float(value), digits)} %"


def describe(summary: Mapping) -> str:
    """One line for the console: n, mean, median and p90."""
    if not summary or not summary.get("n"):
        return "n=0"
    return (f"n={summary['n']} mean {summary['mape']:.1f} % median {summary['median_ape']:.1f} % "
            f"p90 {summary['p90_ape']:.1f} %")


def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]], digits: int = 1) -> str:
    """A plain Markdown table (no extra dependency); floats through ``num``."""
    def cell(v):
        if isinstance(v, (float, np.floating)):
            return num(float(v), digits)
        return str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def frame_markdown(table: pd.DataFrame, title: str = "") -> str:
    """A DataFrame as a Markdown table under an optional ``###`` title (two decimals)."""
    head = f"### {title}\n\n" if title else ""
    return head + md_table(list(table.columns), table.itertuples(index=False), digits=2)
