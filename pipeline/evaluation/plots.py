"""Figures of training runs and of the evaluation report: predicted-vs-measured scatter and error CDFs per GPU,
leave-one-GPU-out bars and the origin -> destination ratio-error matrix. PNG bytes; matplotlib (Agg) only here."""

from __future__ import annotations

import io
from collections.abc import Mapping

import numpy as np
import pandas as pd


def _plt():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _scatter(ax, errors: pd.DataFrame, title: str) -> None:
    if errors.empty:
        ax.set_title(f"{title}: no rows")
        return
    for gpu, part in errors.groupby("gpu", sort=True):
        ax.scatter(part["time_ms"], part["pred_ms"], s=3, alpha=0.4, label=f"{gpu} ({len(part)})", rasterized=True)
    lo = float(min(errors["time_ms"].min(), errors["pred_ms"].min()))
    hi = float(max(errors["time_ms"].max(), errors["pred_ms"].max()))
    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured ms")
    ax.set_ylabel("predicted ms")
    ax.set_title(title)
    ax.legend(fontsize=6, markerscale=3, loc="upper left")


def _cdf(ax, errors: pd.DataFrame, title: str) -> None:
    if errors.empty:
        ax.set_title(f"{title}: no rows")
        return
    for gpu, part in errors.groupby("gpu", sort=True):
        e = np.sort(part["ape"].to_numpy())
        ax.plot(e, np.arange(1, len(e) + 1) / len(e), lw=1.2, label=f"{gpu} (mean {e.mean():.1f} %)")
    e = np.sort(errors["ape"].to_numpy())
    ax.plot(e, np.arange(1, len(e) + 1) / len(e), "k", lw=2, label=f"all (mean {e.mean():.1f} %)")
    ax.set_xscale("symlog", linthresh=1.0)
    ax.set_xlim(0, max(100.0, float(np.percentile(e, 99))))
    ax.set_xlabel("absolute % error")
    ax.set_ylabel("fraction of rows")
    ax.grid(alpha=0.3)
    ax.set_title(title)
    ax.legend(fontsize=6, loc="lower right")


def _png(fig, dpi: int = 110) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    _plt().close(fig)
    return buf.getvalue()


def scatter_png(errors: pd.DataFrame, title: str) -> bytes:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 5.5), layout="constrained")
    _scatter(ax, errors, title)
    return _png(fig, dpi=100)


def cdf_png(errors: pd.DataFrame, title: str) -> bytes:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4.5), layout="constrained")
    _cdf(ax, errors, title)
    return _png(fig, dpi=100)


def report_png(panels: list[tuple[str, pd.DataFrame]], op: str) -> bytes:
    """One figure: for every (name, error frame) panel a scatter and a CDF, side by side."""
    plt = _plt()
    panels = [(n, e) for n, e in panels if not e.empty] or panels[:1]
    fig, axes = plt.subplots(len(panels), 2, figsize=(12, 5 * len(panels)), layout="constrained", squeeze=False)
    for row, (name, errors) in enumerate(panels):
        _scatter(axes[row, 0], errors, f"{op} {name}: predicted vs measured")
        _cdf(axes[row, 1], errors, f"{op} {name}: error CDF")
    return _png(fig, dpi=70)  # committed with every checkpoint version: keep it small


def logo_png(op: str, entries: Mapping[str, dict], target: float | None, neusight: float | None) -> bytes:
    """Bars per held-out GPU: the MLP trained without it beside the roofline, with the target and NeuSight's."""
    plt = _plt()
    names = list(entries)
    fig, ax = plt.subplots(figsize=(max(6, 0.8 * len(names) + 2), 4.2), layout="constrained")
    x = np.arange(len(names))
    ax.bar(x - 0.2, [entries[g]["all"].get("mape", np.nan) for g in names], 0.4,
           label="MLP (trained without that GPU)")
    ax.bar(x + 0.2, [entries[g]["roofline_baseline"].get("mape", np.nan) for g in names], 0.4, label="roofline alone",
           alpha=0.6)
    if target is not None:
        ax.axhline(target, color="k", ls="--", lw=1, label=f"target {target:g} %")
    if neusight is not None:
        ax.axhline(neusight, color="r", ls=":", lw=1, label=f"NeuSight unseen-GPU {neusight:g} %")
    ax.set_xticks(x, names, rotation=30, ha="right")
    ax.set_ylabel("mean absolute % error")
    ax.set_yscale("symlog", linthresh=10)
    ax.set_title(f"{op}: leave-one-GPU-out error per held-out GPU")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _png(fig)


def ratio_png(op: str, mape: pd.DataFrame) -> bytes:
    """Heat map of the ratio-scaling MAPE per origin (rows) -> destination (columns)."""
    plt = _plt()
    k = len(mape)
    fig, ax = plt.subplots(figsize=(1.0 * k + 3, 0.8 * k + 2.5), layout="constrained")
    data = mape.to_numpy(dtype=float)
    top = max(10.0, float(np.nanpercentile(data, 95))) if np.isfinite(data).any() else 10.0
    im = ax.imshow(np.where(np.isfinite(data), data, np.nan), cmap="viridis_r", vmin=0, vmax=top)
    for i in range(k):
        for j in range(k):
            if np.isfinite(data[i, j]):
                ax.text(j, i, f"{data[i, j]:.1f}", ha="center", va="center", fontsize=7,
                        color="w" if data[i, j] > 0.6 * top else "k")
    ax.set_xticks(range(k), mape.columns, rotation=40, ha="right", fontsize=8)
    ax.set_yticks(range(k), mape.index, fontsize=8)
    ax.set_xlabel("destination (held out of training)")
    ax.set_ylabel("origin (measured)")
    ax.set_title(f"{op}: ratio-scaling MAPE (%), origin -> destination")
    fig.colorbar(im, ax=ax, label="mean absolute % error")
    return _png(fig)


def size_png(op: str, errors: pd.DataFrame) -> bytes:
    """Absolute % error against measured time (log), per precision: every row, and the median per size bin, beside
    the roofline alone's median."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 4.5), layout="constrained")
    if errors.empty:
        ax.set_title(f"{op}: no rows")
        return _png(fig)
    edges = np.logspace(np.log10(errors["time_ms"].min()), np.log10(errors["time_ms"].max()) + 1e-9, 16)
    for precision, part in errors.groupby("precision", sort=True):
        ax.scatter(part["time_ms"], part["ape"], s=2, alpha=0.15, rasterized=True)
        mid, med = _binned(part["time_ms"], part["ape"], edges)
        ax.plot(mid, med, lw=1.8, label=f"{precision}: median per size bin")
    if "roof_ape" in errors:
        mid, med = _binned(errors["time_ms"], errors["roof_ape"], edges)
        ax.plot(mid, med, "k--", lw=1.2, label="roofline alone: median")
    ax.axvline(0.05, color="grey", lw=0.8, ls=":", label="50 us")
    ax.set_xscale("log")
    ax.set_yscale("symlog", linthresh=10)
    ax.set_xlabel("measured ms")
    ax.set_ylabel("absolute % error (held-out GPU)")
    ax.set_title(f"{op}: leave-one-GPU-out error vs op size")
    ax.legend(fontsize=7)
    return _png(fig)


def _binned(x: pd.Series, y: pd.Series, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    idx = np.digitize(x.to_numpy(), edges)
    mids, meds = [], []
    for b in range(1, len(edges)):
        sel = idx == b
        if sel.sum() >= 5:
            mids.append(np.sqrt(edges[b - 1] * edges[b]))
            meds.append(float(np.median(y.to_numpy()[sel])))
    return np.array(mids), np.array(meds)
