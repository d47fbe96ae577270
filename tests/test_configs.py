"""Every Hydra config group option composes into both apps (train, evaluate) and its ``_target_``s instantiate;
both apps read the shared settings under the same names."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_train import CONF_DIR, compose

GROUPS = ("data", "model", "optimizer", "trainer", "logger", "eval")
OPTIONS = [(group, path.stem) for group in GROUPS for path in sorted((Path(CONF_DIR) / group).glob("*.yaml"))]
pytestmark = pytest.mark.filterwarnings("ignore:.*noload.*")  # sqlalchemy 2.1 vs MLflow's store


def test_every_group_has_options():
    assert {g for g, _ in OPTIONS} == set(GROUPS)


def _check_model_and_optimizer(cfg):
    import torch

    from pipeline.targets import HEAD_OUTPUTS
    from pipeline.training.fit import build_model

    model = build_model(cfg, n_features=7, epochs=3)
    assert model(torch.zeros(5, 7)).shape == (5, HEAD_OUTPUTS[cfg.model.target])
    opt = model.configure_optimizers()
    optimizer = opt["optimizer"] if isinstance(opt, dict) else opt
    assert isinstance(optimizer, torch.optim.Optimizer)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(cfg.optimizer.optim.lr)


def _check_trainer(cfg):
    import pytorch_lightning as pl
    import torch
    from hydra.utils import instantiate

    # trainer=gpu on a machine without CUDA: every other key is still instantiated, on the CPU
    cpu_only = cfg.trainer.accelerator == "gpu" and not torch.cuda.is_available()
    trainer = instantiate(cfg.trainer, logger=False, **({"accelerator": "cpu"} if cpu_only else {}))
    assert isinstance(trainer, pl.Trainer) and trainer.max_epochs == cfg.trainer.max_epochs


def _check_logger(cfg):
    from pytorch_lightning.loggers import MLFlowLogger

    from pipeline.training import tracking as T

    logger = T.make_logger(cfg.logger, "bmm", "config-test")
    assert isinstance(logger, MLFlowLogger) and logger.resolved_tracking_uri.startswith("sqlite:///")


def _check_data_and_eval(cfg):
    from synthetic import synthetic_rows

    from pipeline.evaluation.logo import choose_logo_gpus
    from pipeline.training.config import to_dict
    from pipeline.training.data import OpTable

    table = OpTable.from_frame(synthetic_rows(n_configs=40), "bmm", to_dict(cfg.data))
    assert len(table.frame) > 0 and set(table.frame["split"]) <= {"train", "val", "test"}
    assert np.isfinite(table.X).all()
    chosen = choose_logo_gpus(cfg.eval.logo, table)
    assert set(chosen) <= {"h200", "t4", "a100-pcie-40gb"}


@pytest.fixture(scope="module")
def tracking_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("mlflow")


@pytest.mark.parametrize("app", ["train", "evaluate"])
@pytest.mark.parametrize("group,option", OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_group_option_composes_and_instantiates(app, group, option, tracking_dir, monkeypatch):
    monkeypatch.chdir(tracking_dir)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tracking_dir / 'mlflow.db'}")
    cfg = compose([f"{group}={option}"], config_name=app)
    _check_model_and_optimizer(cfg)
    _check_trainer(cfg)
    _check_logger(cfg)
    _check_data_and_eval(cfg)


def test_train_and_evaluate_share_the_eval_vocabulary():
    train, evaluate = compose(), compose(config_name="evaluate")
    assert set(train.eval.logo) == set(evaluate.eval.logo) == {"gpus", "max_gpus", "min_rows", "max_epochs",
                                                               "patience", "max_train_rows", "with_partitions",
                                                               "members"}
    # one place for the defaults: the report's leave-one-GPU-out passes are the training run's (every GPU, reduced
    # retrains), so a card's passes and the report's are the same experiment
    assert dict(train.eval.logo) == dict(evaluate.eval.logo)
    assert train.eval.logo.gpus == "all" and train.eval.logo.max_train_rows is not None
    assert train.eval.logo.with_partitions is True   # a GPU's pass holds out its SM partitions (the same chip)
