"""Predict a whole training step -- time, steps/s and cost -- on GPUs you do not have.

    from pipeline.step import predict_step
    def step_fn():                      # one full training step on your data
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    result = predict_step(step_fn, ["a100", "h100", "l4"], plot="step.png")
    print(result.table)                 # per GPU: step_ms, steps_per_s, usd_per_1k_steps, ...
    result.trace, result.predictions["h100-sxm"].breakdown()

The origin is the GPU the step was tracked on (detected; ``origin=`` if the registry does not know it). Tracked
on a CPU, there is no GPU to scale from: the scalers and wave scaling are ratios between two GPUs, and a CPU's op
times say little about a GPU's. ``predict_step`` and the CLI refuse, unless ``origin_gpu`` / ``--origin-gpu``
names a GPU whose times the CPU measurements are to stand for -- a demo of the machinery, not a prediction.
Cost: ``pipeline.step.prices``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping

import numpy as np
import pandas as pd

from pipeline import gpus
from pipeline.atomic import atomic_write_with
from pipeline.step.prices import load_prices, price_for

__all__ = ["predict_step", "StepPrediction", "plot_step"]


@dataclass
class StepPrediction:
    """``table``: one row per GPU, sorted by predicted step time; ``trace``: the tracked step;
    ``predictions``: ``Prediction`` per GPU label (per-op ``pred_ms``/``method``, ``breakdown()``)."""

    table: pd.DataFrame
    trace: object
    origin: str
    demo: bool = False
    predictions: dict = field(default_factory=dict)

    def plot(self, path) -> Path:
        return plot_step(self.table, path, title=self.table.attrs.get("title", ""))


def _origin_for(trace, origin, origin_gpu) -> tuple[object, bool]:
    """(origin GPU, demo?) from the trace's device and the caller's overrides."""
    measured_on_cpu = trace.origin == "cpu"
    if measured_on_cpu:
        if origin_gpu is None:
            raise ValueError("this step was tracked on the CPU. Scaling CPU op times to a GPU is not meaningful: "
                             "the scalers and wave scaling are ratios between two GPUs. Run on a GPU, or -- for "
                             "a demo only -- pass origin_gpu=<gpu> (CLI: --origin-gpu <gpu>) to treat the CPU "
                             "times as if measured on that GPU.")
        if origin not in (None, "cpu"):
            raise ValueError(f"origin={origin!r}: the step ran on the CPU; origin names the GPU it ran on. To "
                             f"treat the CPU times as a GPU's (demo only) use origin_gpu / --origin-gpu")
        return origin_gpu, True
    if origin_gpu is not None and origin is None and trace.origin is None:
        return origin_gpu, False
    chosen = origin if origin is not None else trace.origin
    if chosen is None:
        raise ValueError(f"the GPU this ran on ({trace.meta.get('device_name')!r}) is not in the registry "
                         "(conf/gpus.yaml): pass origin=<registry name or spec dict> (CLI: --origin)")
    return chosen, False


def _gpu_row(spec: dict, pred, prices: Mapping) -> dict:
    """The table row of one GPU: predicted step, steps/s, price and cost, share of scaler time, notes."""
    total = pred.total_ms if pred.supported else math.nan
    notes = [] if pred.supported else sorted(set(pred.ops.loc[pred.ops["method"] == "unsupported", "note"]))
    weights = pred.ops["pred_ms"].fillna(0.0)
    scaled = float(weights[pred.ops["method"] == "scaler"].sum() / weights.sum()) if weights.sum() > 0 else 0.0
    try:
        entry = price_for(spec, prices)
    except ValueError:
        entry = {"price_usd_per_hour": math.nan, "date": "", "source": ""}
        notes.append("no price in conf/prices.yaml")
    price = entry["price_usd_per_hour"]
    return {"gpu": spec["label"], "name": spec["name"], "step_ms": total,
            "steps_per_s": 1000.0 / total if total > 0 else math.nan,
            "usd_per_hour": price, "usd_per_1k_steps": total * price / 3600.0,
            "scaler_share": scaled, "price_date": entry["date"], "price_source": entry["source"],
            "note": "; ".join(notes)}


def predict_step(step_fn: Callable | None, gpus_list: Iterable, *, origin=None, origin_gpu=None, trace=None,
                 prices: Mapping | str | Path | None = None, plot=None, scalers=None, fallback: str = "error",
                 wave_mode: str = "gamma", warmup: int = 2, repeats: int = 5, title: str = "",
                 **track_kwargs) -> StepPrediction:
    """Track ``step_fn`` (or reuse ``trace``) and predict its step time, steps/s and cost on each GPU.

    ``gpus_list``: registry names or spec dicts. ``origin``: the GPU the step runs on, if detection fails.
    ``origin_gpu``: required when tracking on the CPU -- the GPU the CPU times stand for (demo only).
    ``prices``: a table from ``load_prices`` or a path (default conf/prices.yaml). ``plot``: a PNG path.
    ``scalers``/``fallback``/``wave_mode`` go to ``predict_trace``; ``warmup``/``repeats``/``track_kwargs`` to
    ``track``.
    """
    from pipeline.step.record import track

    if trace is None:
        if step_fn is None:
            raise ValueError("give step_fn or trace")
        trace = track(step_fn, warmup=warmup, repeats=repeats, **track_kwargs)
    origin_gpu_, demo = _origin_for(trace, origin, origin_gpu)
    table_prices = prices if isinstance(prices, Mapping) else load_prices(prices)
    rows, preds = [], {}
    for gpu in gpus_list:
        spec = gpus.gpu_spec(gpu)
        preds[spec["label"]] = trace.to(spec, origin=origin_gpu_, scalers=scalers, fallback=fallback,
                                        wave_mode=wave_mode)
        rows.append(_gpu_row(spec, preds[spec["label"]], table_prices))
    table = pd.DataFrame(rows).sort_values("step_ms", na_position="last").reset_index(drop=True)
    table.attrs["title"] = title
    result = StepPrediction(table=table, trace=trace, origin=gpus.gpu_label(origin_gpu_), demo=demo,
                            predictions=preds)
    if plot:
        result.plot(plot)
    return result


def plot_step(table: pd.DataFrame, path, title: str = "") -> Path:
    """Bar charts of predicted step time and cost per 1,000 steps, one bar per GPU."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
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
    atomic_write_with(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    plt.close(fig)
    return path
