"""Leave-GPU-out: a model trained without one GPU predicts that GPU, directly and by Habitat's ratio.

Used by training (a few passes whose errors go into the card) and by the evaluation report (one pass per GPU,
plus the ratio errors of every origin -> destination pair). Both read the settings under ``eval.logo`` (the
shared config group ``conf/eval/``): which GPUs (``gpus``: auto | all | [labels] | []; ``max_gpus``,
``min_rows``), and how much each pass trains (``max_epochs``, ``patience``, ``max_train_rows``, ``members``).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from pipeline import features as F
from pipeline import gpus as G
from pipeline import transfer
from pipeline.evaluation.metrics import ape, describe, grouped, summarise
from pipeline.evaluation.predictions import error_frame, roofline_rows
from pipeline.schema import OP_CONFIG_COLUMNS
from pipeline.training.data import TRAINED_DOMAINS

# Candidates of gpus=auto, most informative first: the newest generation, a datacenter Ampere part, an
# inference Turing part, an old Pascal part.
AUTO_PREFERENCE = ("h200", "a100-pcie-40gb", "a100-pcie-80gb", "t4", "v100-pcie-32gb", "p100", "p4")
RATIO_KEYS = ["config_id", "precision", "phase"]


def choose_logo_gpus(logo_cfg: Mapping, table, exclude: Sequence[str] = ()) -> list[str]:
    """The GPUs to hold out, one pass each. A GPU qualifies with at least ``min_rows`` rows when another GPU
    remains to train on; ``gpus`` picks among them (``auto`` from ``AUTO_PREFERENCE``), ``max_gpus`` caps them."""
    spec = logo_cfg.get("gpus")
    candidates = [g for g in table.training_gpus() if g not in exclude]
    if len(candidates) < 2 or not spec:
        return []
    counts = table.frame.loc[table.frame["domain"] == "train", "gpu"].value_counts()
    candidates = [g for g in candidates if int(counts.get(g, 0)) >= int(logo_cfg.get("min_rows") or 0)]
    if isinstance(spec, str) and spec == "all":
        chosen = candidates
    elif isinstance(spec, str) and spec == "auto":
        chosen = [g for g in AUTO_PREFERENCE if g in candidates]
    else:
        chosen = [g for g in ([spec] if isinstance(spec, str) else list(spec)) if g in candidates]
    cap = logo_cfg.get("max_gpus")
    return chosen if cap is None else chosen[: int(cap)]


def held_out_with(gpu: str, table, logo_cfg: Mapping) -> list[str]:
    """The labels one pass for ``gpu`` holds out: ``gpu`` and, with ``with_partitions`` (the default), its SM
    partitions among ``table``'s GPUs. A partition is the same chip, kernels and libraries: kept in training, it
    would stand in for the GPU the pass is meant not to have seen (the H200's fp16/bf16 linear rows, left out
    with their partitions in training, err 35 %; with them out, 113 %: reports/model_experiments.md, section 17).
    A partition's own pass holds out that partition only: its full GPU is another device balance of the chip."""
    if not logo_cfg.get("with_partitions", True):
        return [gpu]
    labels = sorted(table.frame["gpu"].unique())   # also a partition with heuristic rows only (OpTable.masks)
    parts = [g for g in labels if g != gpu and G.gpu_spec(g).get("partition_of") == gpu]
    return [gpu, *parts]


def balanced_subsample(table, exclude: Sequence[str], max_rows: int | None, seed: int):
    """A copy of ``table`` whose trainable rows (training domain and heuristic) outside the ``exclude`` GPUs are cut
    to ``max_rows`` in total, each GPU and domain keeping min(its rows, a common cap), so groups with few rows keep
    all (a GPU's autotuned rows never give way to its heuristic ones); other rows stay."""
    if not max_rows:
        return table
    dom = (table.frame["domain"].isin(TRAINED_DOMAINS).to_numpy()
           & ~table.frame["gpu"].isin(list(exclude)).to_numpy())
    if dom.sum() <= max_rows:
        return table
    rng = np.random.default_rng(seed)
    keep = ~dom
    groups = table.frame[dom].groupby(["gpu", "domain"]).indices
    index = np.flatnonzero(dom)
    cap = _water_level(sorted(len(v) for v in groups.values()), int(max_rows))
    for pos in groups.values():
        rows = index[pos]
        keep[rng.choice(rows, cap, replace=False) if len(rows) > cap else rows] = True
    return table.subset(keep)


def _water_level(counts: list[int], total: int) -> int:
    """The largest cap with sum(min(n, cap) for n in counts) <= total (``counts`` ascending)."""
    left, remaining = total, len(counts)
    for c in counts:
        if c * remaining > left:
            return left // remaining
        left -= c
        remaining -= 1
    return counts[-1]


def reduced_fit(cfg, op: str, table, holdout: Sequence[str], kind: str):
    """(fit result, the table it used): a fit without ``holdout`` under the ``eval.logo`` settings. With
    ``members`` > 1, that many seeds (``seed``, ``seed + 1``, ...) on the same subsample, as one ensemble like the
    published champions: one seed's pass on a GPU moves by up to 12 points with the seed alone (conv2d's A100,
    ``reports/model_experiments.md``, section 45)."""
    from pipeline.training.config import count_for
    from pipeline.training.fit import ensemble, fit

    logo = cfg.eval.logo
    sub = balanced_subsample(table, holdout, logo.get("max_train_rows"), int(cfg.seed))
    fits = []
    for i in range(count_for(logo.get("members"), op, "eval.logo.members")):
        seeded = copy.deepcopy(cfg)
        seeded.seed = int(cfg.seed) + i
        fits.append(fit(seeded, op, sub, holdout=list(holdout), kind=kind, max_epochs=logo.get("max_epochs"),
                        patience=logo.get("patience")))
    return (fits[0] if len(fits) == 1 else ensemble(fits, sub)), sub


def holdout_errors(sub, res, gpu: str) -> pd.DataFrame:
    """Error frame of the held-out ``gpu``'s rows (with ``flag``: outside training ranges; ``roof_ape``)."""
    held = res.masks["holdout"]
    on_gpu = sub.frame["gpu"].to_numpy() == gpu
    mine = on_gpu[held]
    err = error_frame(sub, held & on_gpu, res.preds["holdout"][mine] if held.any() else np.zeros(0))
    err["flag"] = res.flags["holdout"][mine] if held.any() else np.zeros(0, dtype=bool)
    err["roof_ape"] = ape(roofline_rows(sub, held & on_gpu), err["time_ms"])
    return err


def logo_entry(err: pd.DataFrame, res, sub) -> dict:
    """What a leave-GPU-out pass reports (card ``metrics.leave_gpu_out.<gpu>`` and the evaluation report)."""
    return {"all": summarise(err["ape"]), "by_precision_phase": grouped(err, ["precision", "phase"]),
            "by_source": grouped(err, ["source"]), "test_configs": summarise(err.loc[err["split"] == "test", "ape"]),
            "roofline_baseline": summarise(err["roof_ape"]),
            "out_of_range_fraction": float(err["flag"].mean()) if len(err) else 0.0,
            "train_rows": int(res.masks["train"].sum()),
            "trained_on": sorted(set(sub.frame.loc[res.masks["train"], "gpu"])),
            "epochs": int(res.epochs), "best_epoch": int(res.best_epoch),
            "train_seconds": round(res.train_seconds, 1), "mlflow_run_id": res.run_id}


def print_entry(op: str, gpu: str, entry: Mapping) -> None:
    print(f"{op} leave-{gpu}-out: {describe(entry['all'])} (roofline alone: {describe(entry['roofline_baseline'])}; "
          f"{entry['train_rows']} training rows, {entry['epochs']} epochs, {entry['train_seconds']:.0f} s)", flush=True)


# ------------------------------------------------------------------------------------------ ratio scaling

def measured_by_gpu(table) -> dict[str, tuple[pd.Series, pd.Series]]:
    """gpu -> (median time per (config, precision, phase), the table row of its first measurement)."""
    dom = table.frame[table.frame["domain"] == "train"]
    out = {}
    for gpu, part in dom.groupby("gpu", sort=True):
        first = part.reset_index().drop_duplicates(RATIO_KEYS).set_index(RATIO_KEYS)["index"]
        out[gpu] = (part.groupby(RATIO_KEYS, sort=False)["time_ms"].median(), first)
    return out


def _floors(table, rows: np.ndarray) -> np.ndarray:
    return table.floor_ms[rows] if table.floor_ms is not None else np.full(len(rows), np.nan)


def pair_frame(table, scaler, dest: str, measured: Mapping) -> pd.DataFrame:
    """Every origin GPU's rows that ``dest`` also measured, with both measurements, the model's prediction on both
    GPUs (a model that never saw ``dest``) and the plain roofline's on both: the input of ``pipeline.transfer``.

    Rows where either measurement is a host's launch floor say nothing about the GPU time and are left out; a
    host-timed origin's predictions (model and roofline) are at least its floor, as its measurement is, so the
    origin's error compares like with like (a GPU-time origin, as the API's users give, has no floor)."""
    dest_med, dest_first = measured[dest]
    d_spec = G.gpu_spec(dest)
    out = []
    for origin in sorted(set(measured) - {dest}):
        src_med, src_first = measured[origin]
        common = src_med.index.intersection(dest_med.index)
        if len(common) == 0:
            continue
        o_rows, d_rows = src_first.loc[common].to_numpy(), dest_first.loc[common].to_numpy()
        meas_o, meas_d = src_med.loc[common].to_numpy(), dest_med.loc[common].to_numpy()
        floor_o, floor_d = _floors(table, o_rows), _floors(table, d_rows)
        keep = ~((np.isfinite(floor_o) & (floor_o >= meas_o)) | (np.isfinite(floor_d) & (floor_d >= meas_d)))
        if not keep.any():
            continue
        configs = table.frame.loc[o_rows[keep], list(OP_CONFIG_COLUMNS[table.op])].reset_index(drop=True)
        precision = np.asarray(common.get_level_values("precision"))[keep]
        phase = np.asarray(common.get_level_values("phase"))[keep]
        o_spec = G.gpu_spec(origin)
        n = int(keep.sum())
        pred_o, pred_d, roof_o, roof_d = (np.empty(n) for _ in range(4))
        groups = pd.DataFrame({"p": precision, "ph": phase}).groupby(["p", "ph"], sort=False).indices
        for (p, ph), pos in groups.items():
            cfgs = configs.iloc[pos]
            pred_o[pos] = scaler.predict(cfgs, o_spec, p, ph, return_flags=True)[0]
            pred_d[pos] = scaler.predict(cfgs, d_spec, p, ph, return_flags=True)[0]
            roof_o[pos] = F.roofline_ms(table.op, cfgs, o_spec, p, ph)
            roof_d[pos] = F.roofline_ms(table.op, cfgs, d_spec, p, ph)
        fo = floor_o[keep]
        floored = np.isfinite(fo)
        source = table.frame["source"].to_numpy()
        out.append(pd.DataFrame({"origin": origin, "dest": dest, "precision": precision, "phase": phase,
                                 "origin_source": source[o_rows[keep]], "dest_source": source[d_rows[keep]],
                                 "measured_ms": meas_o[keep], "dest_ms": meas_d[keep],
                                 "pred_origin_ms": np.where(floored, np.fmax(pred_o, fo), pred_o),
                                 "pred_dest_ms": pred_d, "floor_dest_ms": floor_d[keep],
                                 "roof_origin_ms": np.where(floored, np.fmax(roof_o, fo), roof_o),
                                 "roof_dest_ms": roof_d}))
    return pd.concat(out, ignore_index=True) if out else pd.DataFrame()


def ratio_errors(pairs: pd.DataFrame, weight: float | None = None) -> pd.DataFrame:
    """Per row of a ``pair_frame``: the error of Habitat's ratio (``ape``), of the direct prediction
    (``direct_ape``), of the plain roofline's ratio (``roof_ape``) and, given ``weight``, of
    ``pipeline.transfer.apply`` with it (``transfer_ape``)."""
    if pairs.empty:
        return pd.DataFrame()
    cols = {"ape": transfer.apply(pairs["pred_dest_ms"], pairs["measured_ms"], pairs["pred_origin_ms"], 1.0),
            "direct_ape": pairs["pred_dest_ms"].to_numpy(float),
            "roof_ape": transfer.apply(pairs["roof_dest_ms"], pairs["measured_ms"], pairs["roof_origin_ms"], 1.0)}
    if weight is not None:
        cols["transfer_ape"] = transfer.apply(pairs["pred_dest_ms"], pairs["measured_ms"], pairs["pred_origin_ms"],
                                              weight)
    keys = ["origin", "dest", "precision", "phase", "origin_source", "dest_source"]
    return pairs[keys].assign(**{k: transfer.dest_errors(pairs, v) for k, v in cols.items()})


PAIR_ERRORS = ("ape", "direct_ape", "transfer_ape", "roof_ape")


def pair_means(ratio: pd.DataFrame, min_rows: int, by: Sequence[str] = ()) -> pd.DataFrame:
    """Mean of each error column of ``ratio_errors`` rows per (``by``..., origin, dest) group, the groups of
    ``min_rows`` rows or more: what every pair-level number of the report averages."""
    if ratio.empty:
        return pd.DataFrame(columns=list(PAIR_ERRORS))
    grouped = ratio.groupby([*by, "origin", "dest"], sort=True)
    means = grouped[[c for c in PAIR_ERRORS if c in ratio]].mean()
    return means[grouped.size() >= min_rows]


def ratio_matrix(ratio: pd.DataFrame, min_rows: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(MAPE matrix origin x dest, row counts); pairs with fewer than ``min_rows`` rows are NaN."""
    if ratio.empty:
        return pd.DataFrame(), pd.DataFrame()
    grouped_ape = ratio.groupby(["origin", "dest"])["ape"]
    mape = grouped_ape.mean().unstack("dest")
    n = grouped_ape.size().unstack("dest").fillna(0).astype(int)
    labels = sorted(set(mape.index) | set(mape.columns))
    mape = mape.reindex(index=labels, columns=labels)
    n = n.reindex(index=labels, columns=labels).fillna(0).astype(int)
    return mape.where(n >= min_rows), n


# ------------------------------------------------------------------------------------ the evaluation's pass

def run_logo(cfg, op: str, table) -> dict[str, Any]:
    """One reduced retrain per chosen GPU: its errors on that GPU, and the ratio errors with it as destination.

    Returns ``{"gpus": {gpu: logo_entry}, "errors": rows of every held-out GPU, "ratio": ratio rows,
    "computed": ISO time, "seconds"}``.
    """
    import datetime as dt

    t0 = time.perf_counter()
    measured = measured_by_gpu(table)
    entries, errors, pairs = {}, [], []
    for gpu in choose_logo_gpus(cfg.eval.logo, table):
        res, sub = reduced_fit(cfg, op, table, held_out_with(gpu, table, cfg.eval.logo), "evaluate-leave-gpu-out")
        err = holdout_errors(sub, res, gpu)
        entries[gpu] = logo_entry(err, res, sub)
        print_entry(op, gpu, entries[gpu])
        errors.append(err)
        pairs.append(pair_frame(table, res.scaler(), gpu, measured))
    pairs = pd.concat(pairs, ignore_index=True) if pairs else pd.DataFrame()
    card = transfer.calibrate(pairs, min_rows=int(cfg.ratio.min_rows))
    return {"gpus": entries, "errors": pd.concat(errors, ignore_index=True) if errors else pd.DataFrame(),
            "ratio": ratio_errors(pairs, card["ratio_weight"] if card else None), "transfer": card,
            "computed": dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(),
            "seconds": round(time.perf_counter() - t0, 1)}
