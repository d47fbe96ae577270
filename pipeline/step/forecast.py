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
    result = predict_step(step_fn, ["h100", "l40s"], n_gpus=[1, 2, 4, 8], batch=32, plot="scaling.png")

Data parallel (``n_gpus``): each GPU runs the one-GPU step on its own batch; DDP's gradient buckets are all-reduced
while backward goes on, and only the part that outlasts backward is added, with DDP's gradient copies
(``pipeline.step.parallel``), with
all-reduce times from the collective model (``pipeline.collectives``) on the path ``interconnect`` names
(``auto``: NVLink where one NVLink domain holds the node's GPUs, else PCIe; ``nvlink``, ``pcie``, ``host``). More
GPUs than a node holds need ``inter_node_gbps`` (or ``conf/multigpu.yaml``). Per GPU type and count: step time,
throughput (``n x batch`` samples per step; per-GPU batches where ``batch`` is not given), scaling efficiency
(one-GPU step / n-GPU step), the price of all ``n`` GPUs, the cost per 1,000 steps (of all ``n`` GPUs) and per
1,000 per-GPU batches (the same work at any ``n``: it rises only where scaling falls short).

The origin is the GPU the step was tracked on (detected; ``origin=`` if the registry does not know it). Tracked
on a CPU, there is no GPU to scale from: wave scaling and the scalers' transfer carry measured GPU times to
another GPU, and a CPU's op times say little about a GPU's. ``predict_step`` and the CLI refuse, unless
``origin_gpu`` / ``--origin-gpu`` names a GPU whose times the CPU measurements are to stand for -- a demo of the
machinery, not a prediction.
Cost: ``pipeline.step.prices``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from pipeline import gpus
from pipeline.step.parallel import (
    DDP_BUCKET_MB,
    DDP_FIRST_BUCKET_MB,
    check_gpu_counts,
    configured_inter_node_gbps,
    data_parallel_step,
)
from pipeline.step.plots import plot_scaling, plot_step
from pipeline.step.prices import load_prices, price_for

__all__ = ["predict_step", "StepPrediction", "plot_step", "plot_scaling"]


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
        """Bar charts per GPU for one GPU count; throughput against GPU count for several."""
        draw = plot_scaling if self.table["n_gpus"].nunique() > 1 else plot_step
        return draw(self.table, path, title=self.table.attrs.get("title", ""))


def _origin_for(trace, origin, origin_gpu) -> tuple[object, bool]:
    """(origin GPU, demo?) from the trace's device and the caller's overrides."""
    measured_on_cpu = trace.origin == "cpu"
    if measured_on_cpu:
        if origin_gpu is None:
            raise ValueError("this step was tracked on the CPU. Scaling CPU op times to a GPU is not meaningful: "
                             "wave scaling and the scalers' transfer carry measured GPU times to another GPU. Run "
                             "on a GPU, or -- for a demo only -- pass origin_gpu=<gpu> (CLI: --origin-gpu <gpu>) to "
                             "treat the CPU times as if measured on that GPU.")
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


def _price(spec: dict, prices: Mapping) -> tuple[dict, list[str]]:
    try:
        return price_for(spec, prices), []
    except ValueError:
        return {"price_usd_per_hour": math.nan, "date": "", "source": ""}, ["no price in conf/prices.yaml"]


def _gpu_row(spec: dict, pred, prices: Mapping, n: int, parallel: dict | None, batch: int | None) -> dict:
    """The table row of one GPU type and count: step, throughput, efficiency, price of the n GPUs, cost, notes."""
    single = pred.total_ms if pred.supported else math.nan
    notes = [] if pred.supported else sorted(set(pred.ops.loc[pred.ops["method"] == "unsupported", "note"]))
    weights = pred.ops["pred_ms"].fillna(0.0)
    scaled = float(weights[pred.ops["method"] == "scaler"].sum() / weights.sum()) if weights.sum() > 0 else 0.0
    entry, price_notes = _price(spec, prices)
    total = single if parallel is None else single + parallel["copy_ms"] + parallel["exposed_ms"]
    price = entry["price_usd_per_hour"] * n
    steps_per_s = 1000.0 / total if total > 0 else math.nan
    return {"gpu": spec["label"], "name": spec["name"], "n_gpus": n,
            "interconnect": "-" if parallel is None else parallel["interconnect"], "step_ms": total,
            "comm_ms": 0.0 if parallel is None else parallel["comm_ms"],
            "exposed_comm_ms": 0.0 if parallel is None else parallel["exposed_ms"],
            "ddp_copy_ms": 0.0 if parallel is None else parallel["copy_ms"],
            "steps_per_s": steps_per_s, "throughput": n * steps_per_s * (batch or 1),
            "scaling_efficiency": single / total if total > 0 else math.nan,
            "usd_per_hour": price, "usd_per_1k_steps": total * price / 3600.0,
            "usd_per_1k_batches": total * price / 3600.0 / n, "scaler_share": scaled,
            "price_date": entry["date"], "price_source": entry["source"],
            "comm_basis": "" if parallel is None else parallel["basis"], "note": "; ".join(notes + price_notes)}


def _plan(specs: list[dict], counts: list[int], interconnect, inter_node_gbps) -> dict:
    """{(label, n): path} for every GPU type and count, checked before any tracking: the path exists on the GPU
    and the count fits a node or the network bandwidth is given."""
    from pipeline.collectives.model import node_count, resolve_interconnect

    paths = {}
    for spec in specs:
        for n in counts:
            paths[(spec["label"], n)] = resolve_interconnect(spec, interconnect, n)
            node_count(spec, n, inter_node_gbps)
    return paths


def _parallel(trace, pred, spec: dict, n: int, path: str, model, inter_node_gbps, ddp: dict) -> dict:
    """The data-parallel result of one GPU type and count (all-reduce of DDP's buckets over ``path``)."""
    def comm(nbytes, dtype):
        return model.time_ms("all_reduce", nbytes, n, spec, path, inter_node_gbps=inter_node_gbps)

    copy_gbps = None if ddp["gradient_as_bucket_view"] else float(spec["memory_bandwidth_gbps"])
    result = data_parallel_step(pred.ops, trace.grads, comm, ddp["bucket_mb"], ddp["first_bucket_mb"],
                                copy_gbps=copy_gbps)
    return {**result, "interconnect": path, "basis": model.describe(spec, path, n)}


def predict_step(step_fn: Callable | None, gpus_list: Iterable, *, n_gpus=None, interconnect: str | None = None,
                 inter_node_gbps: float | None = None, batch: int | None = None, collective_model=None,
                 bucket_mb: float = DDP_BUCKET_MB, first_bucket_mb: float = DDP_FIRST_BUCKET_MB,
                 gradient_as_bucket_view: bool = False, origin=None,
                 origin_gpu=None, trace=None, prices: Mapping | str | Path | None = None, plot=None, scalers=None,
                 fallback: str = "error", scaler_root=None, scaler_mode: str = "calibrated", wave_mode: str = "gamma",
                 warmup: int = 2, repeats: int = 5, title: str = "", **track_kwargs) -> StepPrediction:
    """Track ``step_fn`` (or reuse ``trace``) and predict its step time, throughput and cost on each GPU type and
    count.

    ``gpus_list``: registry names or spec dicts. ``n_gpus``: a count or a list (default 1): data parallel, as DDP.
    ``interconnect``: ``None``/``"auto"``, ``"nvlink"``, ``"pcie"``, ``"host"``. ``inter_node_gbps``: a node's
    network bandwidth per direction (GB/s; default ``conf/multigpu.yaml``), needed past one node. ``batch``: the
    per-GPU batch, for throughput in samples/s. ``collective_model``: a ``CollectiveModel`` (default the fitted
    ``conf/collectives_model.yaml``). ``bucket_mb``/``first_bucket_mb``: DDP's bucket caps (MiB);
    ``gradient_as_bucket_view``: as DDP's (False, its default, copies the gradients into and out of the buckets).
    ``origin``: the GPU the step runs on, if detection fails. ``origin_gpu``: required when tracking on the CPU --
    the GPU the CPU times stand for (demo only). ``prices``: a table from ``load_prices`` or a path (default
    conf/prices.yaml). ``plot``: a PNG path. ``scalers``/``fallback``/``scaler_root``/``scaler_mode``/``wave_mode``
    go to ``predict_trace``;
    ``warmup``/``repeats``/``track_kwargs`` (e.g. ``parameters``) to ``track``.
    """
    from pipeline.step.record import track

    counts = check_gpu_counts(1 if n_gpus is None else n_gpus)
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, int) or batch < 1):
        raise ValueError(f"batch: a whole number >= 1 (the per-GPU batch), got {batch!r}")
    specs = [gpus.gpu_spec(g) for g in gpus_list]
    inter_node_gbps = configured_inter_node_gbps() if inter_node_gbps is None else inter_node_gbps
    paths = _plan(specs, counts, interconnect, inter_node_gbps)
    model = None
    if max(counts) > 1:
        from pipeline.collectives.model import CollectiveModel
        model = collective_model if collective_model is not None else CollectiveModel.load()
    if trace is None:
        if step_fn is None:
            raise ValueError("give step_fn or trace")
        trace = track(step_fn, warmup=warmup, repeats=repeats, **track_kwargs)
    origin_gpu_, demo = _origin_for(trace, origin, origin_gpu)
    table_prices = prices if isinstance(prices, Mapping) else load_prices(prices)
    rows, preds = [], {}
    ddp = {"bucket_mb": bucket_mb, "first_bucket_mb": first_bucket_mb,
           "gradient_as_bucket_view": gradient_as_bucket_view}
    for spec in specs:
        pred = preds[spec["label"]] = trace.to(spec, origin=origin_gpu_, scalers=scalers, fallback=fallback,
                                               scaler_root=scaler_root, scaler_mode=scaler_mode, wave_mode=wave_mode)
        for n in counts:
            parallel = (None if n == 1 else _parallel(trace, pred, spec, n, paths[(spec["label"], n)], model,
                                                      inter_node_gbps, ddp))
            rows.append(_gpu_row(spec, pred, table_prices, n, parallel, batch))
    table = pd.DataFrame(rows).sort_values(["n_gpus", "step_ms"], na_position="last").reset_index(drop=True)
    table.attrs.update(title=title, throughput_unit="samples/s" if batch else "per-GPU batches/s")
    result = StepPrediction(table=table, trace=trace, origin=gpus.gpu_label(origin_gpu_), demo=demo,
                            predictions=preds)
    if plot:
        result.plot(plot)
    return result
