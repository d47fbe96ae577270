"""The evaluation run: per op, the leave-one-GPU-out retrains (cached) and the champion; then the report, written
atomically into ``report_dir`` and logged to MLflow (experiment ``pipeline-evaluate``)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline import atomic
from pipeline.evaluation import cache, goals
from pipeline.evaluation.champion import run_champion
from pipeline.evaluation.compare import compare_models
from pipeline.evaluation.logo import ratio_matrix, run_logo
from pipeline.evaluation.metrics import pct, summarise
from pipeline.evaluation.report import markdown
from pipeline.evaluation.speed import api_speed
from pipeline.evaluation.summary import op_summary
from pipeline.provenance import git_describe
from pipeline.training.config import NoTrainingData, require_datasets, resolve_ops, target_kind, to_dict
from pipeline.training.data import OpTable


def logo_results(cfg, op: str, table) -> dict:
    """``run_logo``'s result, from the cache when the data, settings and code are unchanged."""
    where = cache.cache_dir(cfg, op, table)
    logo = cache.load(where) if where is not None else None
    if logo is not None:
        print(f"{op}: leave-one-GPU-out results reused from {where} (same data, settings and code)", flush=True)
        return {**logo, "reused_from_cache": True}
    logo = run_logo(cfg, op, table)
    if where is not None:
        cache.save(where, logo)
    return logo


def evaluate_op(cfg, op: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    table = OpTable.load(Path(cfg.data.root), op, to_dict(cfg.data), target_kind=target_kind(cfg))
    frame = table.frame
    result: dict[str, Any] = {"op": op, "rows": int(len(frame)), "dropped": dict(table.dropped),
                              "rows_by_domain": frame["domain"].value_counts().to_dict() if len(frame) else {}}
    if frame.empty or not (frame["domain"] == "train").any():
        result["skipped"] = f"no usable {op} rows under {cfg.data.root}/"
        return result
    result["gpus"] = table.training_gpus()
    result["rows_by_gpu"] = frame.loc[frame["domain"] == "train", "gpu"].value_counts().sort_index().to_dict()
    result["logo"] = logo_results(cfg, op, table)
    result["champion"] = run_champion(cfg, op, table)
    result["comparison"] = compare_models(cfg, op, table, result["logo"])
    result["seconds"] = time.perf_counter() - t0
    result["table"] = table
    return result


def _jsonable(o):
    """Plain JSON of a result tree: frames and tables dropped, numpy numbers converted, non-finite -> null."""
    if isinstance(o, Mapping):
        return {str(k): _jsonable(v) for k, v in o.items() if not isinstance(v, (pd.DataFrame, OpTable))}
    if isinstance(o, (list, tuple)):
        return [_jsonable(v) for v in o]
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, (float, np.floating)):
        return float(o) if math.isfinite(float(o)) else None
    return o


def _op_json(cfg, r: Mapping) -> dict:
    entry = {k: v for k, v in r.items() if k not in ("logo", "champion", "table", "comparison")}
    entry["comparison"] = r.get("comparison") or {}
    if "logo" in r:
        mape, n = ratio_matrix(r["logo"]["ratio"], int(cfg.ratio.min_rows))
        entry["leave_one_gpu_out"] = r["logo"]["gpus"]
        entry["leave_one_gpu_out_reused_from_cache"] = bool(r["logo"].get("reused_from_cache"))
        entry["ratio_matrix_mape"] = {o: dict(row.items()) for o, row in mape.iterrows()}
        entry["ratio_matrix_rows"] = {o: {d: int(v) for d, v in row.items()} for o, row in n.iterrows()}
    if "champion" in r:
        entry["champion"] = {k: v for k, v in r["champion"].items() if k != "frames"}
        for role, f in (r["champion"].get("frames") or {}).items():
            if f is not None and not f.empty:
                entry["champion"][role] = {"all": summarise(f["ape"]),
                                           "by_gpu": {g: summarise(p["ape"]) for g, p in f.groupby("gpu")}}
    return entry


def report_json(cfg, results: Mapping, summary: Mapping, speed: Mapping, seconds: float, checks: list) -> bytes:
    blob = {"commit": git_describe(), "seconds": seconds, "summary": summary, "speed": speed, "targets": checks,
            "settings": {"eval": to_dict(cfg.eval), "ratio": to_dict(cfg.ratio), "model": to_dict(cfg.model),
                         "targets": to_dict(cfg.targets)},
            "ops": {op: _op_json(cfg, r) for op, r in results.items()}}
    return (json.dumps(_jsonable(blob), indent=2, sort_keys=True) + "\n").encode()


def log_to_mlflow(cfg, files: Mapping[str, bytes], summary: Mapping, seconds: float) -> str:
    from pipeline.training import tracking as T

    logger_cfg = to_dict(cfg.logger) if cfg.get("logger") is not None else {}
    uri = T.resolve_tracking_uri(logger_cfg.get("tracking_uri"))
    c = T.client(uri)
    name = T.experiment_name("evaluate", logger_cfg.get("experiment_prefix", "pipeline-"))
    exp = c.get_experiment_by_name(name)
    exp_id = exp.experiment_id if exp is not None else c.create_experiment(
        name, artifact_location=T.resolve_artifact_location(logger_cfg.get("artifact_location", "mlruns")))
    rid = c.create_run(exp_id, run_name="evaluation-report",
                       tags={"pipeline.kind": "evaluate", "pipeline.commit": git_describe()}).info.run_id
    try:
        c.log_param(rid, "ops", ",".join(summary))
        for key, value in to_dict(cfg.eval.logo).items():
            c.log_param(rid, f"eval.logo.{key}", str(value))
        metrics = T.flatten({op: {k: v for k, v in s.items() if isinstance(v, (int, float))}
                             for op, s in summary.items()})
        T.log_metrics(uri, rid, {**metrics, "seconds": seconds})
        T.log_artifact_bytes(uri, rid, dict(files), "report")
        c.set_terminated(rid, "FINISHED")
    except Exception:
        c.set_terminated(rid, "FAILED")
        raise
    return rid


def _speeds(cfg, results: Mapping) -> dict:
    root = Path(cfg.checkpoints_dir)
    return {op: api_speed(op, root, r["table"], int(cfg.speed.batch_rows)) for op, r in results.items()
            if "skipped" not in r and r["champion"].get("published")}


def run(cfg) -> dict:
    """Evaluate every op of ``cfg.op`` and write the report; NoTrainingData when there is nothing to evaluate."""
    ops = resolve_ops(cfg.op)
    require_datasets(cfg.data.root)
    t0 = time.perf_counter()
    results = {}
    for op in ops:
        print(f"\n=== evaluating {op}", flush=True)
        results[op] = evaluate_op(cfg, op)
        if "skipped" in results[op]:
            print(f"{op}: skipped ({results[op]['skipped']})", flush=True)
    if all("skipped" in r for r in results.values()):
        raise NoTrainingData(f"no usable rows for {', '.join(ops)} under {cfg.data.root}/ with this config")
    speed = _speeds(cfg, results)
    seconds = time.perf_counter() - t0
    summary = {op: op_summary(cfg, r) for op, r in results.items() if "skipped" not in r}
    checks = goals.check_all(to_dict(cfg.targets), results, speed)
    files = markdown(cfg, results, summary, speed, seconds, checks)
    files["evaluation.json"] = report_json(cfg, results, summary, speed, seconds, checks)
    out_dir = Path(cfg.report_dir)
    for name, data in files.items():
        atomic.atomic_write(out_dir / name, data)
    print(f"\nwrote {out_dir / 'evaluation.md'} ({len(files)} files) in {seconds / 60:.1f} min", flush=True)
    if cfg.get("mlflow", True):
        print(f"logged to MLflow run {log_to_mlflow(cfg, files, summary, seconds)}", flush=True)
    for op, s in summary.items():
        print(f"{op:>7}: leave-one-GPU-out {pct(s['logo_mean_mape'])} (>= 50 us {pct(s['logo_large_mean_mape'])}), "
              f"ratio {pct(s['ratio_mean_mape'])}, test {pct(s['test_mape'])}, H200 >= 50 us "
              f"{pct(s['h200_test_large_mape'])}", flush=True)
    for c in checks:
        print(f"target {c['target']}: {c['measured']} ({'n/a' if c['met'] is None else 'met' if c['met'] else 'missed'}"
              f"; goal {c['goal']})", flush=True)
    return {"results": results, "summary": summary, "speed": speed, "files": sorted(files)}
