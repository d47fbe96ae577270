"""Train, evaluate, track and publish the per-op scalers (called by ``pipeline.train``; plain functions).

Per op: load every dataset under ``data.root`` and print what is used; leave-GPU-out passes (``eval.logo``:
a model trained without one GPU, evaluated on it); the main fit; errors on the test split (in-distribution),
the held-out GPUs and the unseen source, all through the prediction API; MLflow metrics and artifacts; a new
checkpoint version; the champion rules (``publish.decide``).
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline import api, transfer
from pipeline import checkpoint as ck
from pipeline.evaluation import logo as L
from pipeline.evaluation.metrics import ape, describe, error_table, frame_markdown, metrics_block, summarise
from pipeline.evaluation.predictions import ERROR_COLUMNS, error_frame, roofline_rows
from pipeline.training import tracking as T
from pipeline.training.calibration import interval_card, launch_floor_card
from pipeline.training.card import build_card, data_card
from pipeline.training.config import NoTrainingData, count_for, require_datasets, resolve_ops, target_kind, to_dict
from pipeline.training.data import OpTable, format_summary
from pipeline.training.fit import FitResult, ensemble, fit
from pipeline.training.publish import decide, group_mape

REPORTED_ROLES = ("val", "test", "holdout", "unseen")


def load_table(cfg, op: str) -> OpTable:
    root = Path(cfg.data.root)
    print(f"\n=== {op}: reading {root}/ (own measurements and {root}/external if present)", flush=True)
    table = OpTable.load(root, op, to_dict(cfg.data), target_kind=target_kind(cfg))
    print(format_summary(table), flush=True)
    if table.dropped:
        print(f"dropped rows: {table.dropped}", flush=True)
    return table


def leave_gpu_out(cfg, op: str, table: OpTable, main_holdout: list[str]
                  ) -> tuple[dict, list[pd.DataFrame], pd.DataFrame]:
    """The ``eval.logo`` passes: {gpu: entry} for the card, their error frames (for the report figure and the
    interval) and the origin -> destination pairs of their rows (``logo.pair_frame``, for ``transfer``)."""
    chosen = L.choose_logo_gpus(cfg.eval.logo, table, exclude=main_holdout)
    if cfg.eval.logo.get("gpus") and not chosen:
        print(f"{op}: leave-GPU-out skipped (needs at least two training GPUs with eval.logo.min_rows rows)",
              flush=True)
    entries, frames, pairs = {}, [], []
    measured = L.measured_by_gpu(table) if chosen else {}
    for gpu in chosen:
        res, sub = L.reduced_fit(cfg, op, table, [*main_holdout, *L.held_out_with(gpu, table, cfg.eval.logo)],
                                 "leave-gpu-out")
        err = L.holdout_errors(sub, res, gpu)
        entries[gpu] = L.logo_entry(err, res, sub)
        frames.append(err)
        pairs.append(L.pair_frame(table, res.scaler(), gpu, measured))
        L.print_entry(op, gpu, entries[gpu])
        if res.run_id:
            T.log_metrics(res.tracking_uri, res.run_id, T.flatten({"holdout": entries[gpu]}))
            T.log_artifact_bytes(res.tracking_uri, res.run_id, {
                f"holdout_{gpu}_errors.md": frame_markdown(error_table(err), f"{op} without {gpu}")})
    return entries, frames, pd.concat(pairs, ignore_index=True) if pairs else pd.DataFrame()


def role_errors(table: OpTable, res: FitResult) -> dict[str, pd.DataFrame]:
    """role -> error frame of the main fit's predictions (empty frames for roles without rows)."""
    return {role: error_frame(table, res.masks[role], res.preds[role]) if role in res.preds
            else pd.DataFrame(columns=ERROR_COLUMNS) for role in REPORTED_ROLES}


def roofline_baseline(table: OpTable, mask: np.ndarray) -> dict:
    """Error of the plain roofline on ``mask`` rows: the floor the MLP must beat."""
    return summarise(ape(roofline_rows(table, mask), table.frame["time_ms"].to_numpy(float)[mask]))


def main_metrics(table: OpTable, res: FitResult, errs: dict[str, pd.DataFrame]) -> dict[str, Any]:
    """Per-role metric blocks with the roofline baseline; the unseen source split by GPUs absent from training."""
    blocks = {}
    for role, err in errs.items():
        if not err.empty:
            blocks[role] = {**metrics_block(err), "roofline_baseline": roofline_baseline(table, res.masks[role])}
    if "unseen" in blocks:  # the unseen source's rows on GPUs absent from training: the hardest case
        trained = set(table.frame.loc[res.masks["train"], "gpu"])
        new_gpu = errs["unseen"][~errs["unseen"]["gpu"].isin(trained)]
        blocks["unseen"]["gpus_not_trained_on"] = sorted(new_gpu["gpu"].unique())
        blocks["unseen"]["on_gpus_not_trained_on"] = summarise(new_gpu["ape"])
    for role in ("test", "holdout", "unseen"):
        if role in blocks:
            print(f"{table.op} {role}: {describe(blocks[role]['all'])}  (roofline alone: "
                  f"{describe(blocks[role]['roofline_baseline'])})", flush=True)
            for gpu, s in blocks[role]["by_gpu"].items():
                print(f"    {gpu:>16}: {describe(s)}", flush=True)
    return blocks


def report_files(table: OpTable, errs: dict, logo: dict, logo_frames: list) -> dict[str, bytes | str]:
    """The run's figures and error tables; ``report.png`` is also published with the checkpoint."""
    from pipeline.evaluation import plots

    op = table.op
    panels = [("test split", errs["test"]), ("held-out GPUs", errs["holdout"]),
              ("leave-GPU-out", pd.concat(logo_frames) if logo_frames else pd.DataFrame()),
              ("unseen source", errs["unseen"])]
    tables_md = "".join(frame_markdown(error_table(errs[r]), f"{op} {r}") for r in ("test", "holdout", "unseen")
                        if not errs[r].empty)
    if logo:
        logo_tab = pd.DataFrame([{"held_out_gpu": g, **v["all"], "roofline_mape": v["roofline_baseline"].get("mape")}
                                 for g, v in logo.items()])
        tables_md += frame_markdown(logo_tab, f"{op} leave-GPU-out")
    files = {"report.png": plots.report_png(panels, op),
             "scatter_test.png": plots.scatter_png(errs["test"], f"{op} test"),
             "error_cdf_test.png": plots.cdf_png(errs["test"], f"{op} test"), "errors.md": tables_md,
             "errors_test.csv": error_table(errs["test"]).to_csv(index=False),
             "data_summary.csv": table.summary().to_csv(index=False)}
    for role in ("holdout", "unseen"):
        if not errs[role].empty:
            files[f"errors_{role}.csv"] = error_table(errs[role]).to_csv(index=False)
            files[f"scatter_{role}.png"] = plots.scatter_png(errs[role], f"{op} {role}")
    return files


def publish_and_promote(cfg, table: OpTable, res: FitResult, metrics: dict, training_data: dict,
                        report_png: bytes, extras: dict) -> dict:
    """Publish a new version and apply the champion rules; returns what the summary reports about it."""
    op = table.op
    root = Path(cfg.checkpoints_dir)
    decision = decide(root, op, table, res.masks["test"], res.preds.get("test", np.zeros(0)), training_data,
                      force=bool(cfg.get("promote", False)),
                      min_improvement=float(cfg.eval.get("min_improvement", 0.0)), new_scaler=res.scaler(),
                      new_weights=res.weights)
    metrics["champion_comparison"] = decision.as_dict()
    card = {**build_card(cfg, res, training_data, metrics), **{k: v for k, v in extras.items() if v}}
    version = ck.publish(root, op, res.weights, card, {"report.png": report_png})
    folder = root / op / f"v{version}"
    print(f"{op}: published {folder} ({card['training']['n_parameters']} parameters)", flush=True)
    mv = None
    if res.run_id:
        mv = T.register_checkpoint(res.tracking_uri, op, res.run_id, folder, version)
        T.set_tags(res.tracking_uri, res.run_id, {"pipeline.checkpoint_version": version,
                                                  "pipeline.promoted": decision.promote})
    if decision.promote:
        ck.promote(root, op, version, decision.reason)
        if mv is not None:
            T.set_champion_alias(res.tracking_uri, op, mv)
        print(f"{op}: v{version} is the champion ({decision.reason})", flush=True)
    else:
        print(f"{op}: v{version} published, champion stays v{decision.champion_version}: {decision.reason}",
              flush=True)
    return {"version": version, "promoted": decision.promote, "reason": decision.reason, "model_version": mv}


def main_fit(cfg, op: str, table, holdout: list) -> FitResult:
    """The main fit, trained ``n`` times (seeds ``seed``, ``seed + 1``, ...). With ``fit.members`` > 1 all of
    them are kept as one ensemble (``pipeline.training.fit.ensemble``), which predicts their geometric mean; the
    first member's MLflow run carries the ensemble's metrics and registered model. With ``fit.restarts``
    > 1 the one with the lowest validation error, measured as the champion rules measure the test error
    (``group_mape``), is kept: early stopping ends a fit at a lucky epoch while the learning rate is still high,
    so two seeds differ by more than new data moves the error (``reports/model_experiments.md``, sections 24 and
    43). Each fit is an MLflow run, tagged ``pipeline.restart_kept`` or ``pipeline.ensemble_member``."""
    restarts = count_for(cfg.fit.get("restarts"), op, "fit.restarts")
    members = count_for(cfg.fit.get("members"), op, "fit.members")
    if restarts > 1 and members > 1:
        raise ValueError(f"fit.restarts and fit.members: {op} has {restarts} restarts and {members} members; "
                         "set one of them to 1 for it (an ensemble keeps every fit, restarts keep the best)")
    n = max(restarts, members)
    best, tried, fits = None, [], []
    for i in range(n):
        seeded = copy.deepcopy(cfg)
        seeded.seed = int(cfg.seed) + i
        res = fit(seeded, op, table, holdout=holdout, kind="main", patience=cfg.fit.get("patience"))
        val_mape = group_mape(table, res.masks["val"], res.preds["val"]) if "val" in res.preds else None
        tried.append({"seed": res.seed, "val_group_mape": val_mape, "epochs": res.epochs,
                      "best_epoch": res.best_epoch})
        val = f", validation {val_mape:.2f} %" if val_mape is not None else ""
        print(f"{op} main fit{f' (seed {res.seed})' if n > 1 else ''}: {res.epochs} epochs (best {res.best_epoch}), "
              f"{res.train_seconds:.0f} s{val}", flush=True)
        fits.append(res)
        score = np.inf if val_mape is None else val_mape
        if best is None or score < best[0]:
            best = (score, res)
    if members > 1:
        res = ensemble(fits, table)
        res.members = tried
        val_mape = group_mape(table, res.masks["val"], res.preds["val"]) if "val" in res.preds else None
        val = f", validation {val_mape:.2f} %" if val_mape is not None else ""
        print(f"{op} main fit: an ensemble of the {n} seeds{val}", flush=True)
        return res
    res = best[1]
    res.restarts = tried
    for r in fits if n > 1 else ():   # each restart is an MLflow run; say which one is kept
        if r.run_id:
            T.set_tags(r.tracking_uri, r.run_id, {"pipeline.restart_kept": r.seed == res.seed})
    if n > 1:
        print(f"{op} main fit: kept seed {res.seed} of {n} (lowest validation error)", flush=True)
    return res


def train_op(cfg, op: str) -> dict:
    """Everything for one op; returns a summary dict (also printed). ``skipped`` says why nothing was trained."""
    table = load_table(cfg, op)
    main_holdout = list(cfg.eval.get("holdout_gpus") or [])
    if not table.masks(main_holdout)["train"].any():
        print(f"{op}: no training rows under {cfg.data.root}/ with this config; skipped", flush=True)
        return {"op": op, "skipped": "no training rows"}
    logo, logo_frames, pairs = leave_gpu_out(cfg, op, table, main_holdout)
    res = main_fit(cfg, op, table, main_holdout)
    errs = role_errors(table, res)
    metrics: dict[str, Any] = main_metrics(table, res, errs)
    if logo:
        metrics["leave_gpu_out"] = logo
        metrics["leave_gpu_out_mean_mape"] = float(np.mean([v["all"]["mape"] for v in logo.values()
                                                            if v["all"].get("n")] or [np.nan]))
    training_data = data_card(table, res, main_holdout)
    extras = {"interval": interval_card(pd.concat([errs["val"], errs["test"]]), logo_frames),
              "launch_floor_ms": launch_floor_card(table.frame[res.masks["train"]
                                                               & (table.frame["domain"] == "train").to_numpy()]),
              "transfer": transfer.calibrate(pairs)}
    if extras["transfer"]:
        metrics["transfer"] = {"ratio_weight": extras["transfer"]["ratio_weight"],
                               "mean_pair_mape": extras["transfer"]["mean_pair_mape"]}
        print(f"{op} transfer: ratio weight {extras['transfer']['ratio_weight']:g} (mean pair MAPE by weight "
              f"{extras['transfer']['mean_pair_mape']}, {extras['transfer']['pairs']} pairs)", flush=True)
    if extras["interval"]:
        metrics["interval_calibration"] = {g: {"quantiles": q, "rows": extras["interval"]["rows"][g]}
                                           for g, q in extras["interval"]["quantiles"].items()}
    files = report_files(table, errs, logo, logo_frames)
    if res.run_id:
        T.log_metrics(res.tracking_uri, res.run_id, T.flatten(metrics))
        T.log_metrics(res.tracking_uri, res.run_id, {"train_seconds": res.train_seconds})
        T.log_artifact_bytes(res.tracking_uri, res.run_id, files, "report")
    summary = {"op": op, "run_id": res.run_id, "train_seconds": res.train_seconds, "epochs": res.epochs,
               "metrics": metrics, "rows": training_data["rows_by_split"]}
    if cfg.get("publish", True):
        summary.update(publish_and_promote(cfg, table, res, metrics, training_data, files["report.png"], extras))
    return summary


def recalibrate_op(cfg, op: str) -> dict:
    """The champion's weights and card republished with ``transfer`` calibrated anew on this run's leave-GPU-out
    passes (which do not depend on the main fit), without refitting; promoted by the champion rules' rule 4 (the
    same weights). For a champion published before its card carried that calibration."""
    from pipeline.training.data import fingerprint

    root = Path(cfg.checkpoints_dir)
    current = ck.champion_version(root, op)
    if current is None:
        return {"op": op, "skipped": f"no champion of {op} under {root} to recalibrate"}
    card, weights = ck.load(root, op, current)
    try:
        api.Scaler(op, current, card, weights)
    except api.InputError as exc:  # trained by other code: nothing this code can serve or republish
        return {"op": op, "skipped": f"champion v{current} cannot be loaded by this code ({exc})"}
    table = load_table(cfg, op)
    main_holdout = list(cfg.eval.get("holdout_gpus") or [])
    if not table.masks(main_holdout)["train"].any():
        return {"op": op, "skipped": "no training rows"}
    _, _, pairs = leave_gpu_out(cfg, op, table, main_holdout)
    calibrated = transfer.calibrate(pairs)
    if calibrated is None:
        return {"op": op, "skipped": "no origin -> destination pairs to calibrate on"}
    calibrated["recalibrated"] = {"from_version": current, "at": ck.now_iso(),
                                  "data": fingerprint(table.frame[table.frame["domain"] == "train"])}
    # ``created``, ``git_commit`` and ``mlflow_run_id`` stay the model's own: when and from what it was trained
    new_card = {k: v for k, v in card.items() if k not in ("op", "version", "files")}
    new_card["transfer"] = calibrated
    report = root / op / f"v{current}" / "report.png"
    version = ck.publish(root, op, weights, new_card, {"report.png": report.read_bytes()} if report.exists() else None)
    test = table.masks(main_holdout)["test"]
    decision = decide(root, op, table, test, None, card["training_data"], new_weights=weights,
                      champion=(current, card, weights))
    if decision.promote:
        ck.promote(root, op, version, decision.reason)
    print(f"{op}: v{version} = v{current}'s weights and card with transfer ratio weight "
          f"{calibrated['ratio_weight']:g} ({'champion' if decision.promote else decision.reason})", flush=True)
    _register_republished(cfg, op, card.get("mlflow_run_id"), root / op / f"v{version}", version, decision.promote)
    return {"op": op, "version": version, "promoted": decision.promote, "reason": decision.reason,
            "transfer": calibrated, "train_seconds": 0.0, "epochs": 0, "metrics": card.get("metrics", {})}


def _register_republished(cfg, op: str, run_id: str | None, folder: Path, version: int, champion: bool) -> None:
    """Register a republished checkpoint in MLflow under the run that trained its weights, where this tracking
    store holds that run (a fresh clone's store does not: then it says so and registers nothing)."""
    logger = cfg.get("logger")
    if not logger or not run_id:
        return
    from mlflow.exceptions import MlflowException

    uri = T.resolve_tracking_uri(logger.get("tracking_uri"))
    try:
        T.client(uri).get_run(run_id)
    except MlflowException as exc:
        print(f"{op}: v{version} not registered in MLflow: its training run {run_id} is not in {uri} "
              f"({type(exc).__name__})", flush=True)
        return
    mv = T.register_checkpoint(uri, op, run_id, folder, version)
    if champion:
        T.set_champion_alias(uri, op, mv)


def _print_summary(out: dict[str, dict]) -> None:
    for op, s in out.items():
        if "skipped" in s:
            print(f"{op:>7}: skipped ({s['skipped']})")
            continue
        line = f"{op:>7}: test {describe(s['metrics'].get('test', {}).get('all', {}))}; fit {s['train_seconds']:.0f} s"
        if "leave_gpu_out" in s["metrics"]:
            line += "; leave-GPU-out mean % " + ", ".join(
                f"{g} {v['all']['mape']:.1f}" for g, v in s["metrics"]["leave_gpu_out"].items() if v["all"].get("n"))
        if "version" in s:
            line += f"; v{s['version']} {'champion' if s['promoted'] else 'not promoted'}"
        print(line, flush=True)


def run(cfg) -> dict[str, dict]:
    """Train every op of ``cfg.op`` (``all`` or some ops), or with ``recalibrate=true`` recalibrate its champions
    (``recalibrate_op``), and print a closing summary.

    Raises NoTrainingData (with what to run) when ``data.root`` holds no dataset, no op has training rows, or no
    champion could be recalibrated.
    """
    ops = resolve_ops(cfg.op)
    require_datasets(cfg.data.root)
    out = {}
    t0 = time.perf_counter()
    for op in ops:
        out[op] = recalibrate_op(cfg, op) if cfg.get("recalibrate", False) else train_op(cfg, op)
    print(f"\n=== done in {time.perf_counter() - t0:.0f} s", flush=True)
    _print_summary(out)
    if all("skipped" in s for s in out.values()):
        if cfg.get("recalibrate", False):
            raise NoTrainingData("nothing recalibrated: " + "; ".join(f"{op}: {s['skipped']}"
                                                                     for op, s in out.items()))
        raise NoTrainingData(f"no training rows for {', '.join(ops)} under {cfg.data.root}/ with this config "
                             "(check data.sources, data.gpus, data.precisions, data.phases and eval.holdout_gpus)")
    return out
