"""Train, evaluate, track and publish the per-op scalers (called by ``pipeline.train``; plain functions).

Per op: load every dataset under ``data.root``; print what is used; optional leave-GPU-out passes (a model
trained without one GPU, evaluated on it); the main fit; evaluation through the numpy path on the test split
(in-distribution), the held-out GPUs and the unseen source (``neusight-label``); MLflow metrics and
artifacts; publish a new checkpoint version; apply the champion rules (``publish.decide``).
"""

from __future__ import annotations

import io
import logging
import math
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from pipeline import features as F
from pipeline.schema import OPS
from pipeline.training import evaluate as E
from pipeline.training import publish as P
from pipeline.training import tracking as T
from pipeline.training.data import OpTable, format_summary

CITATIONS = {
    "neusight": "NeuSight: S. Lee, A. Phanishayee, D. Mahajan, 'Forecasting GPU Performance for Deep Learning "
                "Training and Inference', ASPLOS'25; data from github.com/sitar-lab/NeuSight (MIT license)",
    "neusight-label": "NeuSight (ASPLOS'25) whole-model node tables, github.com/sitar-lab/NeuSight (MIT license)",
    "deepbench": "DeepBench, Baidu Research, github.com/baidu-research/DeepBench (Apache-2.0 license)",
}
# Leave-GPU-out candidates for eval.logo_gpus=auto, most informative first: the newest generation, a
# datacenter Ampere part, an inference Turing part, an old Pascal part.
AUTO_LOGO_PREFERENCE = ("h200", "a100-pcie-40gb", "a100-pcie-80gb", "t4", "v100-pcie-32gb", "p100", "p4")


def _quiet() -> None:
    for name in ("pytorch_lightning", "lightning", "lightning.pytorch", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    warnings.filterwarnings("ignore", message=".*is smaller than the logging interval.*")
    warnings.filterwarnings("ignore", message=".*Checkpoint directory.*")


def _container(cfg) -> dict:
    from omegaconf import DictConfig, OmegaConf

    return OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)


def resolve_ops(op) -> list[str]:
    if op is None or op == "all":
        return list(OPS)
    ops = [op] if isinstance(op, str) else list(op)
    ops = [o for part in ops for o in str(part).split(",") if o]
    unknown = [o for o in ops if o not in OPS]
    if unknown:
        raise ValueError(f"op: unknown {unknown}; allowed: all, {', '.join(OPS)}")
    return ops


@dataclass
class FitResult:
    op: str
    holdout: tuple
    weights: dict
    card_core: dict  # features / target / architecture: what the numpy path needs
    masks: dict
    run_id: str | None
    tracking_uri: str | None
    train_seconds: float
    epochs: int
    best_epoch: int
    preds: dict = field(default_factory=dict)  # role -> predicted ms of table rows in masks[role]


def fit(cfg, op: str, table: OpTable, holdout: Sequence[str] = (), kind: str = "main",
        max_epochs: int | None = None) -> FitResult:
    """One seeded Lightning fit of ``op`` without ``holdout`` GPUs; predictions for every role via numpy."""
    import pytorch_lightning as pl
    from hydra.utils import instantiate
    from pytorch_lightning.callbacks import EarlyStopping

    from pipeline.training.datamodule import OpDataModule
    from pipeline.training.model import BestWeights

    _quiet()
    if cfg.get("threads"):
        import torch

        torch.set_num_threads(int(cfg.threads))
    pl.seed_everything(int(cfg.seed), workers=True, verbose=False)
    batch = int(cfg.data.batch_size)
    min_batches = int(cfg.data.get("min_batches_per_epoch") or 1)
    n_train = int(table.masks(holdout)["train"].sum())
    batch = max(32, min(batch, n_train // min_batches))  # small data: smaller batches, enough steps per epoch
    dm = OpDataModule(table, holdout, batch_size=batch, seed=int(cfg.seed))
    epochs = int(max_epochs or cfg.trainer.max_epochs)
    sched_cfg = cfg.optimizer.get("scheduler")
    sched = None
    if sched_cfg is not None:
        extra = {"T_max": epochs} if "T_max" in sched_cfg else {}
        sched = instantiate(sched_cfg, **extra)
    model = instantiate(cfg.model, n_features=table.X.shape[1], optimizer=instantiate(cfg.optimizer.optim),
                        scheduler=sched)
    tags = {"pipeline.op": op, "pipeline.kind": kind, "pipeline.holdout_gpus": ",".join(holdout) or "-",
            "pipeline.features_version": str(F.FEATURES_VERSION)}
    run_name = f"{op}-{kind}" + (f"-without-{'+'.join(holdout)}" if holdout else "")
    logger = None
    if cfg.get("logger") is not None:
        logger = T.make_logger(cfg.logger, op, run_name, tags)
        params = _container(cfg)
        params["data_rows"] = {s: int(dm.masks[s].sum()) for s in ("train", "val", "test", "holdout", "unseen")}
        params["n_features"] = table.X.shape[1]
        logger.log_hyperparams(params)
    best = BestWeights(monitor="val/mape")
    callbacks = [best]
    patience = cfg.fit.get("patience")
    if patience:
        callbacks.append(EarlyStopping(monitor="val/mape", patience=int(patience), mode="min"))
    trainer = instantiate(cfg.trainer, logger=logger if logger is not None else False, callbacks=callbacks,
                          max_epochs=epochs, _convert_="partial")
    t0 = time.perf_counter()
    trainer.fit(model, datamodule=dm)
    seconds = time.perf_counter() - t0
    weights = model.export_weights()
    core = {"features": {"names": F.feature_names(op), "mean": dm.mean.tolist(), "std": dm.std.tolist()},
            "target": F.target_card(table.target_kind),
            "architecture": {"hidden": list(model.hidden), "activation": model.activation}}
    result = FitResult(op=op, holdout=tuple(holdout), weights=weights, card_core=core, masks=dm.masks,
                       run_id=getattr(logger, "run_id", None), tracking_uri=getattr(logger, "resolved_tracking_uri",
                                                                                   None),
                       train_seconds=seconds, epochs=int(trainer.current_epoch), best_epoch=best.best_epoch)
    for role, mask in dm.masks.items():
        if mask.any():
            result.preds[role] = E.predict_rows(table, mask, core, weights)
    return result


def errors_of(table: OpTable, res: FitResult, role: str) -> pd.DataFrame:
    if role not in res.preds:
        return pd.DataFrame(columns=["config_id", "source", "gpu", "precision", "phase", "split", "time_ms",
                                     "pred_ms", "ape"])
    return E.error_frame(table, res.masks[role], res.preds[role])


def roofline_baseline(table: OpTable, mask: np.ndarray) -> dict:
    """Error of the plain roofline (y = 0) on ``mask`` rows: the floor the MLP must beat."""
    if not mask.any():
        return {"n": 0}
    idx = np.flatnonzero(mask)
    pred = E.target_to_ms_rows(table, idx, "log_roofline_ratio", np.zeros(len(idx)))
    return E.summarise(E.ape(pred, table.frame["time_ms"].to_numpy(float)[idx]))


def choose_logo_gpus(spec, table: OpTable, exclude: Sequence[str] = (), min_rows: int = 0) -> list[str]:
    """GPUs for leave-GPU-out passes: ``auto`` (from a preference list), ``all``, a list, or none. A GPU
    qualifies only if it has at least ``min_rows`` rows and other GPUs remain to train on."""
    gpus = [g for g in table.training_gpus() if g not in exclude]
    if len(gpus) < 2 or not spec:
        return []
    dom = table.frame[table.frame["domain"] == "train"]
    counts = dom["gpu"].value_counts()
    gpus = [g for g in gpus if int(counts.get(g, 0)) >= int(min_rows or 0)]
    if isinstance(spec, str) and spec == "all":
        return gpus
    if isinstance(spec, str) and spec == "auto":
        return [g for g in AUTO_LOGO_PREFERENCE if g in gpus]
    wanted = [spec] if isinstance(spec, str) else list(spec)
    return [g for g in wanted if g in gpus]


def _fmt(summary: Mapping) -> str:
    if not summary or not summary.get("n"):
        return "n=0"
    return (f"n={summary['n']} mean {summary['mape']:.1f} % median {summary['median_ape']:.1f} % "
            f"p90 {summary['p90_ape']:.1f} %")


def train_op(cfg, op: str) -> dict:
    """Everything for one op; returns a summary dict (also printed)."""
    root = Path(cfg.data.root)
    print(f"\n=== {op}: reading {root}/ (own measurements and {root}/external if present)", flush=True)
    table = OpTable.load(root, op, _container(cfg.data), target_kind=str(cfg.get("target") or F.TARGET_KIND))
    print(format_summary(table), flush=True)
    if table.dropped:
        print(f"dropped rows: {table.dropped}", flush=True)
    main_holdout = [g for g in (cfg.eval.get("holdout_gpus") or [])]
    masks = table.masks(main_holdout)
    if not masks["train"].any():
        print(f"{op}: no training rows under {root}/ with this config; skipped", flush=True)
        return {"op": op, "skipped": "no training rows"}

    # ---- leave-GPU-out passes
    logo: dict[str, dict] = {}
    logo_errors = []
    logo_epochs = cfg.eval.get("logo_max_epochs")
    max_logo = cfg.eval.get("logo_max_gpus")
    chosen = choose_logo_gpus(cfg.eval.get("logo_gpus"), table, exclude=main_holdout,
                              min_rows=int(cfg.eval.get("logo_min_rows") or 0))
    if max_logo is not None:
        chosen = chosen[: int(max_logo)]
    if cfg.eval.get("logo_gpus") and not chosen:
        print(f"{op}: leave-GPU-out skipped (needs at least two training GPUs)", flush=True)
    for gpu in chosen:
        res = fit(cfg, op, table, holdout=[*main_holdout, gpu], kind="leave-gpu-out", max_epochs=logo_epochs)
        err = errors_of(table, res, "holdout")
        err = err[err["gpu"] == gpu]
        test_cfg = err[err["split"] == "test"]
        entry = {"all": E.summarise(err["ape"].to_numpy()),
                 "by_precision_phase": E.grouped(err, ["precision", "phase"]),
                 "by_source": E.grouped(err, ["source"]),
                 "test_configs": E.summarise(test_cfg["ape"].to_numpy()),
                 "roofline_baseline": roofline_baseline(table, res.masks["holdout"] & (table.frame["gpu"] == gpu).to_numpy()),
                 "trained_on": sorted(set(table.training_gpus()) - {gpu} - set(main_holdout)),
                 "epochs": res.epochs, "train_seconds": round(res.train_seconds, 1), "mlflow_run_id": res.run_id}
        logo[gpu] = entry
        logo_errors.append(err)
        print(f"{op} leave-{gpu}-out: {_fmt(entry['all'])} (roofline alone: {_fmt(entry['roofline_baseline'])}; "
              f"{res.epochs} epochs, {res.train_seconds:.0f} s)", flush=True)
        if res.run_id:
            T.log_metrics(res.tracking_uri, res.run_id, T.flatten({"holdout": entry}, ""))
            T.log_artifact_bytes(res.tracking_uri, res.run_id, {
                f"holdout_{gpu}_errors.md": E.to_markdown(E.error_table(err), f"{op} without {gpu}")})

    # ---- main fit
    res = fit(cfg, op, table, holdout=main_holdout, kind="main")
    print(f"{op} main fit: {res.epochs} epochs (best {res.best_epoch}), {res.train_seconds:.0f} s", flush=True)
    blocks = {}
    errs = {}
    for role in ("val", "test", "holdout", "unseen"):
        errs[role] = errors_of(table, res, role)
        if not errs[role].empty:
            blocks[role] = E.metrics_block(errs[role])
            blocks[role]["roofline_baseline"] = roofline_baseline(table, res.masks[role])
    if "unseen" in blocks:  # the unseen source's rows on GPUs absent from training: the hardest case
        trained_gpus = set(table.frame.loc[res.masks["train"], "gpu"])
        new_gpu = errs["unseen"][~errs["unseen"]["gpu"].isin(trained_gpus)]
        blocks["unseen"]["gpus_not_trained_on"] = sorted(new_gpu["gpu"].unique())
        blocks["unseen"]["on_gpus_not_trained_on"] = E.summarise(new_gpu["ape"].to_numpy())
    for role in ("test", "holdout", "unseen"):
        if role in blocks:
            print(f"{op} {role}: {_fmt(blocks[role]['all'])}  (roofline alone: "
                  f"{_fmt(blocks[role]['roofline_baseline'])})", flush=True)
            for gpu, s in blocks[role]["by_gpu"].items():
                print(f"    {gpu:>16}: {_fmt(s)}", flush=True)
    metrics: dict[str, Any] = dict(blocks)
    if logo:
        metrics["leave_gpu_out"] = logo
        metrics["leave_gpu_out_mean_mape"] = float(np.mean([v["all"]["mape"] for v in logo.values()
                                                            if v["all"].get("n")]))
    data_card = table.data_card(res.masks, main_holdout)
    data_card["citations"] = {s: CITATIONS[s] for s in sorted(set(table.frame["source"])) if s in CITATIONS}

    # ---- artifacts
    from pipeline.training import plots

    panels = [("test split", errs["test"])]
    if not errs["holdout"].empty:
        panels.append(("held-out GPUs", errs["holdout"]))
    if logo_errors:
        panels.append(("leave-GPU-out", pd.concat(logo_errors)))
    if not errs["unseen"].empty:
        panels.append(("unseen source", errs["unseen"]))
    report = plots.report_png(panels, op)
    tables_md = "".join(E.to_markdown(E.error_table(errs[r]), f"{op} {r}") for r in ("test", "holdout", "unseen")
                        if not errs[r].empty)
    if logo:
        logo_tab = pd.DataFrame([{"held_out_gpu": g, **v["all"], "roofline_mape": v["roofline_baseline"].get("mape")}
                                 for g, v in logo.items()])
        tables_md += E.to_markdown(logo_tab, f"{op} leave-GPU-out")
    if res.run_id:
        T.log_metrics(res.tracking_uri, res.run_id, T.flatten(metrics))
        T.log_metrics(res.tracking_uri, res.run_id, {"train_seconds": res.train_seconds})
        files = {"report.png": report, "scatter_test.png": plots.scatter_png(errs["test"], f"{op} test"),
                 "error_cdf_test.png": plots.cdf_png(errs["test"], f"{op} test"),
                 "errors.md": tables_md, "errors_test.csv": E.error_table(errs["test"]).to_csv(index=False),
                 "data_summary.csv": table.summary().to_csv(index=False)}
        for role in ("holdout", "unseen"):
            if not errs[role].empty:
                files[f"errors_{role}.csv"] = E.error_table(errs[role]).to_csv(index=False)
                files[f"scatter_{role}.png"] = plots.scatter_png(errs[role], f"{op} {role}")
        T.log_artifact_bytes(res.tracking_uri, res.run_id, files, "report")

    summary = {"op": op, "run_id": res.run_id, "train_seconds": res.train_seconds, "epochs": res.epochs,
               "metrics": metrics, "rows": data_card["rows_by_split"]}
    if not cfg.get("publish", True):
        return summary

    # ---- publish + champion
    ckpt_root = Path(cfg.checkpoints_dir)
    test_mask = res.masks["test"]
    decision = P.decide(ckpt_root, op, table, test_mask, res.preds.get("test", np.zeros(0)), data_card,
                        force=bool(cfg.get("promote", False)),
                        min_improvement=float(cfg.eval.get("min_improvement", 0.0)))
    metrics["champion_comparison"] = decision.as_dict()
    n_params = int(sum(v.size for v in res.weights.values()))
    card = {**res.card_core,
            "mlflow_run_id": res.run_id,
            "training_data": data_card,
            "metrics": _finite(metrics),
            "ranges": P.ranges(table.X[res.masks["train"]], F.feature_names(op)),
            "training": {"seed": int(cfg.seed), "epochs": res.epochs, "best_epoch": res.best_epoch,
                         "train_seconds": round(res.train_seconds, 1), "n_parameters": n_params,
                         "loss": cfg.model.get("loss"), "optimizer": _container(cfg.optimizer),
                         "trainer": {k: v for k, v in _container(cfg.trainer).items() if k != "_target_"},
                         "framework": "pytorch_lightning"},
            "metric_definition": "absolute % error |predicted_ms / measured_ms - 1| x 100 per row; mape = mean, "
                                 "median_ape, p90_ape; 'test' = configs hashed into the test split on training "
                                 "GPUs; 'leave_gpu_out' = a model trained without that GPU; 'unseen' = rows of "
                                 "excluded sources (never trained on)"}
    version = P.publish(ckpt_root, op, res.weights, card, {"report.png": report})
    folder = ckpt_root / op / f"v{version}"
    print(f"{op}: published {folder} ({n_params} parameters)", flush=True)
    mv = None
    if res.run_id:
        mv = T.register_checkpoint(res.tracking_uri, op, res.run_id, folder, version)
        T.set_tags(res.tracking_uri, res.run_id, {"pipeline.checkpoint_version": version,
                                                  "pipeline.promoted": decision.promote})
    if decision.promote:
        P.promote(ckpt_root, op, version, decision.reason)
        if mv is not None:
            T.set_champion_alias(res.tracking_uri, op, mv)
        print(f"{op}: v{version} is the champion ({decision.reason})", flush=True)
    else:
        print(f"{op}: v{version} published, champion stays v{decision.champion_version}: {decision.reason}",
              flush=True)
    summary.update({"version": version, "promoted": decision.promote, "reason": decision.reason,
                    "model_version": mv})
    return summary


def _finite(obj):
    """Drop non-finite numbers (cards are strict JSON)."""
    if isinstance(obj, Mapping):
        return {k: _finite(v) for k, v in obj.items() if not (isinstance(v, float) and not math.isfinite(v))}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def run(cfg) -> dict[str, dict]:
    """Train every op of ``cfg.op`` (``all`` or one op) and print a closing summary."""
    ops = resolve_ops(cfg.op)
    out = {}
    t0 = time.perf_counter()
    for op in ops:
        out[op] = train_op(cfg, op)
    print(f"\n=== done in {time.perf_counter() - t0:.0f} s", flush=True)
    for op, s in out.items():
        if "skipped" in s:
            print(f"{op:>7}: skipped ({s['skipped']})")
            continue
        test = s["metrics"].get("test", {}).get("all", {})
        line = f"{op:>7}: test {_fmt(test)}; fit {s['train_seconds']:.0f} s"
        if "leave_gpu_out" in s["metrics"]:
            line += "; leave-GPU-out mean % " + ", ".join(
                f"{g} {v['all']['mape']:.1f}" for g, v in s["metrics"]["leave_gpu_out"].items() if v["all"].get("n"))
        if "version" in s:
            line += f"; v{s['version']} {'champion' if s['promoted'] else 'not promoted'}"
        print(line, flush=True)
    return out
