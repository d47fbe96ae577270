"""Predict a whole training step -- time, steps/s and cost -- on GPUs you do not have.

Command line (tracks a built-in model on this machine's GPU, or its CPU for demos)::

    python -m pipeline.step --model resnet50 --batch 64 --precision bf16 --gpus a100,h100,l4,t4 [--plot out.png]

Your own model, from Python::

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

Cost: ``conf/prices.yaml`` gives $/GPU-hour (list prices as of a date; edit them). Cost per 1,000 steps =
predicted step time x 1,000 x price per hour / 3,600 s.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping

import numpy as np
import pandas as pd
import yaml

__all__ = ["PRICES_PATH", "load_prices", "price_for", "predict_step", "StepPrediction", "plot_step", "main"]

PRICES_PATH = Path(__file__).resolve().parent.parent / "conf" / "prices.yaml"
_DATE = re.compile(r"^\d{4}(-\d{2}(-\d{2})?)?$")


# ------------------------------------------------------------------------------------------------- prices

def load_prices(path=None) -> dict[str, dict]:
    """The price table, validated: ``{gpu label: {price_usd_per_hour, date, source[, note], key}}``.

    Raises ValueError naming the entry and field for a missing or bad price, date or source, a key the GPU
    registry does not know, or two keys naming one GPU.
    """
    from pipeline import gpus
    path = Path(path) if path is not None else PRICES_PATH
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"price table not found: {path}") from None
    if not isinstance(raw, Mapping) or not isinstance(raw.get("prices"), Mapping):
        raise ValueError(f"{path.name}: expected a top-level 'prices' mapping of GPU name -> entry")
    out: dict[str, dict] = {}
    for key, entry in raw["prices"].items():
        where = f"{path.name} entry {key!r}"
        try:
            label = gpus.gpu_label(str(key))
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        if label in out:
            raise ValueError(f"{where}: names the same GPU ({label}) as entry {out[label]['key']!r}")
        if not isinstance(entry, Mapping):
            raise ValueError(f"{where}: expected a mapping with price_usd_per_hour, date and source")
        missing = [f for f in ("price_usd_per_hour", "date", "source") if f not in entry]
        if missing:
            raise ValueError(f"{where}: missing {missing}; every entry needs price_usd_per_hour, date, source")
        unknown = sorted(set(entry) - {"price_usd_per_hour", "date", "source", "note"})
        if unknown:
            raise ValueError(f"{where}: unknown fields {unknown} (allowed: price_usd_per_hour, date, source, note)")
        price = entry["price_usd_per_hour"]
        if isinstance(price, bool) or not isinstance(price, (int, float)) or not math.isfinite(price) or price <= 0:
            raise ValueError(f"{where}: price_usd_per_hour must be a number > 0, got {price!r}")
        date = str(entry["date"])
        if not _DATE.match(date):
            raise ValueError(f"{where}: date must be 'YYYY', 'YYYY-MM' or 'YYYY-MM-DD' (quoted), got {entry['date']!r}")
        source = entry["source"]
        if not isinstance(source, str) or not source.strip():
            raise ValueError(f"{where}: source must name where the price comes from, got {source!r}")
        out[label] = {"key": str(key), "price_usd_per_hour": float(price), "date": date, "source": source.strip(),
                      "note": str(entry.get("note", "") or "")}
    return out


def price_for(gpu, prices: Mapping | None = None) -> dict:
    """The price entry of ``gpu`` (any registry name); ValueError if it has none."""
    from pipeline import gpus
    prices = load_prices() if prices is None else prices
    label = gpus.gpu_label(gpu)
    if label not in prices:
        raise ValueError(f"no price for GPU {gpu!r} ({label}) in the price table; add an entry with "
                         f"price_usd_per_hour, date and source to conf/prices.yaml "
                         f"(priced: {', '.join(sorted(prices)) or 'none'})")
    return dict(prices[label])


# ---------------------------------------------------------------------------------------------- prediction

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


def predict_step(step_fn: Callable | None, gpus_list: Iterable, *, origin=None, origin_gpu=None, trace=None,
                 prices: Mapping | str | Path | None = None, plot=None, scalers=None, wave_mode: str = "gamma",
                 warmup: int = 2, repeats: int = 5, title: str = "", **track_kwargs) -> StepPrediction:
    """Track ``step_fn`` (or reuse ``trace``) and predict its step time, steps/s and cost on each GPU.

    ``gpus_list``: registry names or spec dicts. ``origin``: the GPU the step runs on, if detection fails.
    ``origin_gpu``: required when tracking on the CPU -- the GPU the CPU times stand for (demo only).
    ``prices``: a table from ``load_prices`` or a path (default conf/prices.yaml). ``plot``: a PNG path.
    ``scalers``/``wave_mode`` go to ``predict_trace``; ``warmup``/``repeats``/``track_kwargs`` to ``track``.
    """
    from pipeline import gpus
    from pipeline.track import track as _track

    if trace is None:
        if step_fn is None:
            raise ValueError("give step_fn or trace")
        trace = _track(step_fn, warmup=warmup, repeats=repeats, **track_kwargs)
    origin_gpu_, demo = _origin_for(trace, origin, origin_gpu)
    table_prices = prices if isinstance(prices, Mapping) else load_prices(prices)
    rows, preds = [], {}
    for gpu in gpus_list:
        spec = gpus.gpu_spec(gpu)
        pred = trace.to(spec, origin=origin_gpu_, scalers=scalers, wave_mode=wave_mode)
        preds[spec["label"]] = pred
        total = pred.total_ms if pred.supported else math.nan
        note = "" if pred.supported else "; ".join(sorted(set(pred.ops.loc[pred.ops["method"] == "unsupported",
                                                                           "note"])))
        weights = pred.ops["pred_ms"].fillna(0.0)
        scaled = float(weights[pred.ops["method"] == "scaler"].sum() / weights.sum()) if weights.sum() > 0 else 0.0
        try:
            entry = price_for(spec, table_prices)
        except ValueError:
            entry = {"price_usd_per_hour": math.nan, "date": "", "source": ""}
            note = (note + "; " if note else "") + "no price in conf/prices.yaml"
        price = entry["price_usd_per_hour"]
        rows.append({"gpu": spec["label"], "name": spec["name"], "step_ms": total,
                     "steps_per_s": 1000.0 / total if total > 0 else math.nan,
                     "usd_per_hour": price, "usd_per_1k_steps": total * price / 3600.0,
                     "scaler_share": scaled, "price_date": entry["date"], "price_source": entry["source"],
                     "note": note})
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
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ---------------------------------------------------------------------------------------------------- CLI

def _format(table: pd.DataFrame) -> str:
    lines = [f"{'GPU':<16} {'step ms':>10} {'steps/s':>9} {'$/GPU-h':>8} {'$ / 1k steps':>13}  {'scaler':>6}  note"]
    for r in table.itertuples(index=False):
        def num(v, fmt):
            return format(v, fmt) if np.isfinite(v) else "n/a"
        lines.append(f"{r.gpu:<16} {num(r.step_ms, '10.2f'):>10} {num(r.steps_per_s, '9.2f'):>9} "
                     f"{num(r.usd_per_hour, '8.3f'):>8} {num(r.usd_per_1k_steps, '13.4f'):>13}  "
                     f"{100 * r.scaler_share:5.0f}%  {r.note}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.step",
                                 description="Track a training step here and predict its time and cost on other "
                                             "GPUs.")
    ap.add_argument("--model", default="resnet50", help="built-in model: resnet50, bert, gnmt, dcgan")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "fp16", "bf16"])
    ap.add_argument("--gpus", default="a100,h100,l4,t4", help="comma-separated registry names")
    ap.add_argument("--origin", default=None, help="registry name of the GPU this runs on (default: detected)")
    ap.add_argument("--origin-gpu", default=None,
                    help="on a CPU only, for demos: treat the CPU-measured op times as if measured on this GPU")
    ap.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda if available)")
    ap.add_argument("--plot", default=None, help="write a bar chart of time and cost to this PNG")
    ap.add_argument("--csv", default=None, help="write the table to this CSV")
    ap.add_argument("--prices", default=None, help="price table (default: conf/prices.yaml)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--wave-mode", default="gamma", choices=["gamma", "roofline"])
    ap.add_argument("--no-scalers", action="store_true", help="wave/roofline scaling only, even if scalers exist")
    ap.add_argument("--tiny", action="store_true", help="a tiny version of the model (smoke tests on a CPU)")
    ap.add_argument("--breakdown", action="store_true", help="also print the per-op-kind breakdown per GPU")
    args = ap.parse_args(argv)

    from pipeline import models
    from pipeline.track import _device_of

    try:
        device = _device_of(args.device)
        gpu_list = [g.strip() for g in args.gpus.split(",") if g.strip()]
        if not gpu_list:
            raise ValueError("--gpus: give at least one GPU")
        from pipeline import gpus as registry
        for g in gpu_list:
            registry.gpu_spec(g)
        if device == "cpu" and args.origin not in (None, "cpu") and args.origin_gpu is None:
            raise ValueError(f"--origin {args.origin}: this runs on the CPU; --origin names the GPU it runs on. To "
                             f"treat CPU times as {args.origin}'s (demo only), use --origin-gpu {args.origin}")
        if device == "cpu" and args.origin_gpu is None:
            raise ValueError("this runs on the CPU: scaling CPU op times to a GPU is not meaningful (the scalers "
                             "and wave scaling are ratios between two GPUs). Run it on a GPU, or -- for a demo of "
                             "the machinery only -- add --origin-gpu <gpu> to treat the CPU times as if measured "
                             "on that GPU.")
        step_fn = models.make_step(args.model, args.batch, args.precision, device, tiny=args.tiny)
        title = (f"{args.model}{' (tiny)' if args.tiny else ''}, batch {args.batch}, {args.precision}")
        print(f"tracking {title} on {device} ...", flush=True)
        result = predict_step(step_fn, gpu_list, origin=None if args.origin == "cpu" else args.origin,
                              origin_gpu=args.origin_gpu, prices=args.prices, scalers=False if args.no_scalers
                              else None, wave_mode=args.wave_mode, warmup=args.warmup, repeats=args.repeats,
                              device=device, title=title)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    trace = result.trace
    print(trace.summary())
    if result.demo:
        print(f"DEMO: CPU op times treated as measured on {result.origin}; the numbers below are not a "
              f"prediction for this model.")
    print(f"origin {result.origin}; predicted training step, sorted by time:")
    print(_format(result.table))
    if args.breakdown:
        for label, pred in result.predictions.items():
            print(f"\n{label}: predicted ms by op kind and phase")
            print(pred.breakdown().round(3).to_string())
    prices_used = result.table[result.table["price_source"] != ""]
    if len(prices_used):
        print("prices: list prices, edit conf/prices.yaml -- " +
              "; ".join(f"{r.gpu}: {r.price_source} ({r.price_date})" for r in prices_used.itertuples()))
    print("scaler = share of the predicted time from the per-op scalers; the rest is wave/roofline scaling.")
    if args.csv:
        Path(args.csv).parent.mkdir(parents=True, exist_ok=True)
        result.table.to_csv(args.csv, index=False)
        print(f"wrote {args.csv}")
    if args.plot:
        result.plot(args.plot)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
