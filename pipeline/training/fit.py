"""One seeded Lightning fit of one op, and its predictions through the prediction API.

``fit`` trains on a table's train rows (without the held-out GPUs), keeps the best epoch's weights, and
predicts every other role (val, test, holdout, unseen) with an in-memory ``api.Scaler`` of those weights:
the numbers a fit reports are the numbers a user of the published checkpoint gets.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from pipeline import api, targets
from pipeline import features as F
from pipeline.checkpoint_checks import join_members
from pipeline.evaluation.predictions import predict_rows, scaler_from
from pipeline.schema import OPS
from pipeline.training import tracking as T
from pipeline.training.config import to_dict
from pipeline.training.data import OpTable

PREDICTED_ROLES = ("val", "test", "holdout", "unseen")


@dataclass
class FitResult:
    op: str
    holdout: tuple
    weights: dict
    card_core: dict  # features / target / architecture: what a Scaler needs besides the weights
    ranges: dict  # feature -> [min, max] over the train rows (the API flags predictions outside them)
    masks: dict
    run_id: str | None
    tracking_uri: str | None
    train_seconds: float
    epochs: int
    best_epoch: int
    seed: int = 0
    restarts: list = field(default_factory=list)  # every main-fit seed tried: seed, val_group_mape, epochs
    members: list = field(default_factory=list)  # an ensemble's member fits: seed, val_group_mape, epochs
    preds: dict = field(default_factory=dict)  # role -> predicted ms of the table rows in masks[role]
    flags: dict = field(default_factory=dict)  # role -> whether those rows lie outside the training ranges

    def scaler(self) -> api.Scaler:
        """The fitted model as an (unpublished) prediction-API Scaler."""
        return scaler_from(self.op, self.card_core, self.weights, self.ranges)


def _quiet() -> None:
    for name in ("pytorch_lightning", "lightning", "lightning.pytorch", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    for message in (".*does not have many workers.*", ".*LeafSpec.*", ".*is smaller than the logging interval.*",
                    ".*Checkpoint directory.*"):
        warnings.filterwarnings("ignore", message=message)


def build_model(cfg, n_features: int, epochs: int):
    """The configured LightningModule with its optimizer and scheduler factories (cosine T_max = epochs)."""
    from hydra.utils import instantiate

    sched_cfg = cfg.optimizer.get("scheduler")
    sched = None
    if sched_cfg is not None:
        sched = instantiate(sched_cfg, **({"T_max": epochs} if "T_max" in sched_cfg else {}))
    return instantiate(cfg.model, n_features=n_features, optimizer=instantiate(cfg.optimizer.optim), scheduler=sched)


def _logger(cfg, op: str, kind: str, holdout: Sequence[str], dm):
    """The MLflow logger of one fit (None without ``cfg.logger``), with the flattened config as parameters."""
    if cfg.get("logger") is None:
        return None
    tags = {"pipeline.op": op, "pipeline.kind": kind, "pipeline.holdout_gpus": ",".join(holdout) or "-",
            "pipeline.features_version": str(F.features_version(op))}
    run_name = f"{op}-{kind}" + (f"-without-{'+'.join(holdout)}" if holdout else "")
    logger = T.make_logger(cfg.logger, op, run_name, tags)
    params = to_dict(cfg)
    params["op"] = op   # this run's op, not the invocation's list (the registered model logs the same value)
    params["data_rows"] = {s: int(dm.masks[s].sum()) for s in ("train", "val", "test", "holdout", "unseen")}
    params["n_features"] = dm.table.X.shape[1]
    logger.log_hyperparams(params)
    return logger


def _datamodule(cfg, table: OpTable, holdout: Sequence[str]):
    from pipeline.training.datamodule import OpDataModule

    batch = int(cfg.data.batch_size)
    min_batches = int(cfg.data.get("min_batches_per_epoch") or 1)
    n_train = int(table.masks(holdout)["train"].sum())
    batch = max(32, min(batch, n_train // min_batches))  # small data: smaller batches, enough steps per epoch
    balance = float(cfg.data.get("balance") or 0)
    return OpDataModule(table, holdout, batch_size=batch, seed=int(cfg.seed), balance=balance,
                        monotone=float(cfg.model.get("monotone_weight") or 0) > 0,
                        monotone_elsewhere=elsewhere_for(cfg.data.get("monotone_elsewhere"), table.op))


def elsewhere_for(setting, op: str) -> bool:
    """``data.monotone_elsewhere`` for ``op``: true/false for every op, or a list of the ops it is on for."""
    from omegaconf import ListConfig

    if setting is None or isinstance(setting, bool):
        return bool(setting)
    if isinstance(setting, (list, tuple, ListConfig)) and all(isinstance(o, str) for o in setting):
        unknown = sorted(set(setting) - set(OPS))
        if not unknown:
            return op in setting
    raise ValueError(f"data.monotone_elsewhere: true, false or a list of ops ({', '.join(OPS)}); got {setting!r}")


def fit(cfg, op: str, table: OpTable, holdout: Sequence[str] = (), kind: str = "main",
        max_epochs: int | None = None, patience: int | None = None) -> FitResult:
    """Train ``op`` without the ``holdout`` GPUs for up to ``max_epochs`` (default ``trainer.max_epochs``),
    stopping after ``patience`` epochs without a better val MAPE (None: no early stopping); predict every role."""
    import pytorch_lightning as pl
    from hydra.utils import instantiate
    from pytorch_lightning.callbacks import EarlyStopping

    from pipeline.training.model import BestWeights

    _quiet()
    if cfg.get("threads"):
        import torch

        torch.set_num_threads(int(cfg.threads))
    pl.seed_everything(int(cfg.seed), workers=True, verbose=False)
    dm = _datamodule(cfg, table, holdout)
    epochs = int(max_epochs or cfg.trainer.max_epochs)
    model = build_model(cfg, table.X.shape[1], epochs)
    logger = _logger(cfg, op, kind, holdout, dm)
    best = BestWeights(monitor="val/mape")
    callbacks = [best] + ([EarlyStopping(monitor="val/mape", patience=int(patience), mode="min")] if patience else [])
    trainer = instantiate(cfg.trainer, logger=logger if logger is not None else False, callbacks=callbacks,
                          max_epochs=epochs, _convert_="partial")
    t0 = time.perf_counter()
    trainer.fit(model, datamodule=dm)
    seconds = time.perf_counter() - t0
    core = {"features": {"names": F.feature_names(op), "mean": dm.mean.tolist(), "std": dm.std.tolist()},
            "target": targets.target_card(table.op, table.target_kind),
            "architecture": {"hidden": list(model.hidden), "activation": model.activation}}
    result = FitResult(op=op, holdout=tuple(holdout), weights=model.export_weights(), card_core=core,
                       ranges=feature_ranges(table.X[dm.masks["train"]], F.feature_names(op)), masks=dm.masks,
                       run_id=getattr(logger, "run_id", None),
                       tracking_uri=getattr(logger, "resolved_tracking_uri", None),
                       train_seconds=seconds, epochs=int(trainer.current_epoch),
                       best_epoch=best.best_epoch, seed=int(cfg.seed))
    return predict_roles(result, table)


def predict_roles(result: FitResult, table: OpTable) -> FitResult:
    """Fill ``result.preds`` / ``flags`` for every role with rows, through the prediction API."""
    scaler = result.scaler()
    for role in PREDICTED_ROLES:
        if result.masks[role].any():
            result.preds[role], result.flags[role] = predict_rows(scaler, table, result.masks[role])
    return result


def ensemble(results: Sequence[FitResult], table: OpTable) -> FitResult:
    """One model of several fits of the same rows (different seeds): its weights hold every member
    (``members.<j>.layers.<i>.*``) and it predicts their geometric mean (``targets.members_to_ms``). One seed's
    conv2d fit differs from the next by about as much as new data moves it; three members' mean cuts the test
    error by more than that (``reports/model_experiments.md``, section 44). The first member's MLflow run
    carries the ensemble's metrics; each member's run is tagged ``pipeline.ensemble_member`` and
    ``pipeline.ensemble_run`` (that run)."""
    first = results[0]
    for r in results[1:]:
        same = (r.card_core == first.card_core and r.holdout == first.holdout
                and all(np.array_equal(r.masks[k], first.masks[k]) for k in first.masks))
        if not same:
            raise ValueError(f"{first.op}: ensemble members must be fitted on the same rows, features and target "
                             f"(seed {r.seed} differs from seed {first.seed})")
    for r in results:
        if r.run_id:
            T.set_tags(r.tracking_uri, r.run_id,
                       {"pipeline.ensemble_member": True, "pipeline.ensemble_run": first.run_id})
    core = {**first.card_core, "architecture": {**first.card_core["architecture"], "members": len(results)}}
    weights = join_members([r.weights for r in results])
    out = FitResult(op=first.op, holdout=first.holdout, weights=weights, card_core=core, ranges=first.ranges,
                    masks=first.masks, run_id=first.run_id, tracking_uri=first.tracking_uri,
                    train_seconds=float(sum(r.train_seconds for r in results)),
                    epochs=max(r.epochs for r in results), best_epoch=max(r.best_epoch for r in results),
                    seed=first.seed)
    return predict_roles(out, table)


def feature_ranges(X: np.ndarray, names: list[str]) -> dict[str, list[float]]:
    """[min, max] of every feature over the training rows (the API warns outside them)."""
    if len(X) == 0:
        return {}
    lo, hi = X.min(axis=0), X.max(axis=0)
    return {n: [float(a), float(b)] for n, a, b in zip(names, lo, hi)}
