"""Report figures: predicted-vs-measured scatter and the CDF of absolute % errors, per GPU."""

from __future__ import annotations

import io

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


def _png(fig, dpi: int = 100) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    _plt().close(fig)
    return buf.getvalue()


def scatter_png(errors: pd.DataFrame, title: str) -> bytes:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 5.5), layout="constrained")
    _scatter(ax, errors, title)
    return _png(fig)


def cdf_png(errors: pd.DataFrame, title: str) -> bytes:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4.5), layout="constrained")
    _cdf(ax, errors, title)
    return _png(fig)


def report_png(panels: list[tuple[str, pd.DataFrame]], op: str) -> bytes:
    """One figure: for every (name, error frame) panel a scatter and a CDF, side by side."""
    plt = _plt()
    panels = [(n, e) for n, e in panels if not e.empty] or panels[:1]
    fig, axes = plt.subplots(len(panels), 2, figsize=(12, 5 * len(panels)), layout="constrained", squeeze=False)
    for row, (name, errors) in enumerate(panels):
        _scatter(axes[row, 0], errors, f"{op} {name}: predicted vs measured")
        _cdf(axes[row, 1], errors, f"{op} {name}: error CDF")
    return _png(fig, dpi=70)  # committed with every checkpoint version: keep it small
