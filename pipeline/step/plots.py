"""Charts of a step prediction: bar charts per GPU (one GPU each), throughput against GPU count per GPU type."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.atomic import atomic_write_with

__all__ = ["plot_step", "plot_scaling"]


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_with(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    _pyplot().close(fig)
    return path


def plot_step(table: pd.DataFrame, path, title: str = "") -> Path:
    """Bar charts of predicted step time and cost per 1,000 steps, one bar per GPU."""
    plt = _pyplot()
    t = table.iloc[::-1]
    fig, axes = plt.subplots(1, 2, figsize=(11, 0.5 * len(t) + 1.8))
    for ax, col, label, color in ((axes[0], "step_ms", "predicted step time (ms)", "tab:blue"),
                                  (axes[1], "usd_per_1k_steps", "cost per 1,000 steps (USD, list price)",
                                   "tab:green")):
        values = t[col].to_numpy(dtype=float)
        ax.barh(t["gpu"], np.nan_to_num(values), color=color)
        for y, v in enumerate(values):
            ax.text(v if np.isfinite(v) else 0.0, y, f" {v:.3g}" if np.isfinite(v) else " n/a", va="center",
                    fontsize=8)
        ax.set_xlabel(label)
        ax.margins(x=0.2)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path)


def plot_scaling(table: pd.DataFrame, path, title: str = "") -> Path:
    """Throughput against GPU count, one line per GPU type (dotted: perfect scaling from one GPU), and the cost of
    the same work (1,000 per-GPU batches) against GPU count."""
    plt = _pyplot()
    unit = table.attrs.get("throughput_unit", "per-GPU batches/s")
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.4))
    for gpu, sub in table.groupby("gpu", sort=False):
        sub = sub.sort_values("n_gpus")
        line = axes[0].plot(sub["n_gpus"], sub["throughput"], "o-", label=f"{gpu} ({sub['interconnect'].iloc[-1]})")[0]
        one = sub[sub["n_gpus"] == 1]["throughput"]
        if len(one) and np.isfinite(one.iloc[0]):
            axes[0].plot(sub["n_gpus"], one.iloc[0] * sub["n_gpus"], ":", color=line.get_color(), lw=0.8)
        axes[1].plot(sub["n_gpus"], sub["usd_per_1k_batches"], "o-", color=line.get_color())
    for ax, ylabel in ((axes[0], f"throughput ({unit})"),
                       (axes[1], "cost per 1,000 per-GPU batches (USD, list price)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(table["n_gpus"].unique()), [str(n) for n in sorted(table["n_gpus"].unique())])
        ax.set_xlabel("GPUs (data parallel)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title + "  (dotted: perfect scaling)")
    fig.tight_layout()
    return _save(fig, path)
