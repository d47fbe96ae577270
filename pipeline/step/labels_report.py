"""The report of ``pipeline.step.labels``: error matrices, heatmaps and ``label_validation.{md,png,csv}``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.atomic import atomic_write, atomic_write_with
from pipeline.markdown import markdown_table

__all__ = ["error_matrix", "write_report"]


def error_matrix(pred: pd.DataFrame, mode: str = "wave", column: str = "err_pct", model: str | None = None):
    """Origin x destination mean absolute % error (over the configs both GPUs have)."""
    sub = pred[(pred["mode"] == mode)]
    if model is not None:
        sub = sub[sub["model"] == model]
    return sub.assign(abs_err=sub[column].abs()).pivot_table(index="origin", columns="dest", values="abs_err",
                                                            aggfunc="mean")


def _heatmaps(pred: pd.DataFrame, path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes, cols = list(pred["mode"].unique()), ("err_pct", "err_vs_composed_pct")
    fig, axes = plt.subplots(len(modes), len(cols), figsize=(4.6 * len(cols), 4.2 * len(modes)), squeeze=False)
    for ax, (mode, col) in zip(axes.ravel(), [(m, c) for m in modes for c in cols]):  # a row per mode
        mat = error_matrix(pred, mode, col)
        vmax = max(30.0, float(np.nanmax(mat.to_numpy(dtype=float))))
        im = ax.imshow(mat.to_numpy(dtype=float), cmap="viridis_r", vmin=0, vmax=vmax)
        ax.set_xticks(range(len(mat.columns)), mat.columns, rotation=45, ha="right", fontsize=8)
        ax.set_yticks(range(len(mat.index)), mat.index, fontsize=8)
        for (i, j), v in np.ndenumerate(mat.to_numpy(dtype=float)):
            if np.isfinite(v):
                ax.text(j, i, f"{v:.1f}", ha="center", va="center", fontsize=8,
                        color="white" if v > 0.5 * vmax else "black")
        ax.set_xlabel("destination")
        ax.set_ylabel("origin")
        ref = "measured step" if col == "err_pct" else "dest. composed nodes"
        ax.set_title(f"{mode}: mean |err| % vs {ref}", fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_with(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    plt.close(fig)
    return path


def _gap_section(gaps: pd.DataFrame) -> list[str]:
    g = gaps.set_index(["config", "gpu"])[["num_layer", "e2e_ms", "composed_ms", "gap_pct", "composed_all_nodes_ms",
                                            "gap_all_nodes_pct", "fw_ms", "composed_fw_ms", "bw_ms",
                                            "composed_bw_ms"]]
    g["num_layer"] = g["num_layer"].astype(int).astype(str)
    g.index = [f"{c} @ {gpu}" for c, gpu in g.index]
    g.index.name = "config @ GPU"
    return ["## Composition gap: composed node sum vs measured step, same GPU", "",
            "`gap` = composed / measured - 1 with kernel nodes only; `gap all` with every node (Python scalar ops "
            "and views too, each timed at the CUDA-event floor).", "",
            markdown_table(g, index=True, nonfinite=""), "",
            f"Mean |gap|: {gaps['gap_pct'].abs().mean():.1f} % (kernel nodes), "
            f"{gaps['gap_all_nodes_pct'].abs().mean():.1f} % (all nodes).", ""]


def _mode_section(pred: pd.DataFrame, mode: str) -> list[str]:
    sub = pred[pred["mode"] == mode]
    off = sub[sub["origin"] != sub["dest"]]
    lines = [f"## Mode `{mode}`: origin x destination mean |error| % vs the destination's measured step", "",
             "Mean over the train configs both GPUs have (BERT-Large seq 512 batch 2/8, GPT-2-Large seq 1024 "
             "batch 1/4). The diagonal is the composition gap.", "",
             markdown_table(error_matrix(pred, mode, "err_pct"), index=True, nonfinite=""), "",
             f"Off-diagonal mean |error|: {off['err_pct'].abs().mean():.1f} % vs measured step, "
             f"{off['err_vs_composed_pct'].abs().mean():.1f} % vs the destination's composed node sum "
             f"(scaling error alone); share of predicted time from scalers: "
             f"{100 * off['scaler_share'].mean():.0f} %.", ""]
    for model in sorted(sub["model"].unique()):
        lines += [f"### `{mode}`, {model}: mean |error| % vs measured step", "",
                  markdown_table(error_matrix(pred, mode, "err_pct", model), index=True, nonfinite=""), ""]
    return lines + [f"### `{mode}`: mean |error| % vs the destination's composed node sum (scaling only)", "",
                    markdown_table(error_matrix(pred, mode, "err_vs_composed_pct"), index=True, nonfinite=""), ""]


def write_report(pred: pd.DataFrame, gaps: pd.DataFrame, meta: dict, out) -> list[Path]:
    """``label_validation.md``, ``label_validation.png`` (heatmaps) and ``label_validation.csv`` under ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    png = _heatmaps(pred, out / "label_validation.png")
    csv = atomic_write(out / "label_validation.csv", pred.to_csv(index=False))
    lines = ["# Whole-step validation on NeuSight's measured BERT-Large / GPT-2-Large training steps", "",
             "Generated by `python -m pipeline.step.labels` from NeuSight's `label/` node tables (fp32, TF32 off, "
             "one GPU). Each GPU's step is composed from its own node table (one transformer layer x `num_layer` + "
             "the rest); predictions scale the origin GPU's node times to the destination "
             f"(`pipeline.step.predict_trace`). Modes: {', '.join(meta['modes'])}. Scalers: {meta['scalers']}. "
             f"Kernel nodes only: {meta['kernel_only']}.", ""]
    lines += _gap_section(gaps)
    for mode in pred["mode"].unique():
        lines += _mode_section(pred, mode)
    lines += ["## Every prediction", "", "See `label_validation.csv` (signed errors).", ""]
    md = atomic_write(out / "label_validation.md", "\n".join(lines))
    return [md, png, csv]
