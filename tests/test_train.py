"""Training pipeline: data split hygiene, Hydra config, Lightning fit, MLflow tracking, publishing, champion rules.

All data here are SYNTHETIC FIXTURES written to a temp dir in the dataset schema (source "synthetic-fixture",
times made up from the roofline); they are not measurements. Runs are tiny (a 2-layer MLP, 1-2 epochs).
"""

from __future__ import annotations

import copy
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from synthetic import SOURCE as SYNTHETIC
from synthetic import synthetic_rows, write_datasets

from pipeline import checkpoint as ck
from pipeline import features as F
from pipeline import targets as T
from pipeline.training import publish as P
from pipeline.training.data import OpTable, fingerprint, split_of
from pipeline.transfer import WEIGHTS

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")
pytestmark = pytest.mark.filterwarnings("ignore:.*noload.*")  # sqlalchemy 2.1 vs MLflow's store


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> Path:
    """A datasets/ tree of synthetic fixtures: 3 training GPUs, plus an 'unseen' source on l4 (also synthetic)."""
    return write_datasets(tmp_path_factory.mktemp("datasets"))


def compose(overrides=(), config_name: str = "train"):
    """``conf/<config_name>.yaml`` with ``overrides``, through Hydra's compose API (as the apps see it)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        return hydra_compose(config_name=config_name, overrides=list(overrides))


def tiny_cfg(datasets: Path, tmp: Path, extra=()):
    return compose([f"data.root={datasets}", "model=mlp_small", "trainer.max_epochs=2", "eval.logo.gpus=[]",
                    "eval.logo.min_rows=0", "fit.patience=null", f"checkpoints_dir={tmp / 'checkpoints'}",
                    f"logger.tracking_uri=sqlite:///{tmp / 'mlflow.db'}", f"logger.artifact_location={tmp / 'mlruns'}",
                    "data.batch_size=256", *extra])


# ------------------------------------------------------------------------------------------------ Hydra

def test_compose_train_yaml_with_overrides():
    from hydra.utils import instantiate

    cfg = compose(["op=[bmm,lstm]", "trainer.max_epochs=3", "model=mlp_small", "optimizer=adamw_step",
                   "eval.holdout_gpus=[t4]", "trainer=gpu"])
    assert list(cfg.op) == ["bmm", "lstm"] and cfg.trainer.max_epochs == 3 and cfg.trainer.accelerator == "gpu"
    assert list(cfg.model.hidden) == [32, 32] and cfg.eval.holdout_gpus == ["t4"]
    assert cfg.data.exclude_sources == ["neusight-label"]
    assert cfg.logger._target_.startswith("pytorch_lightning.")  # one Lightning namespace everywhere
    assert cfg.trainer._target_ == "pytorch_lightning.Trainer"
    model = instantiate(cfg.model, n_features=7, optimizer=instantiate(cfg.optimizer.optim),
                        scheduler=instantiate(cfg.optimizer.scheduler))
    import pytorch_lightning as pl

    assert isinstance(model, pl.LightningModule)
    opt = model.configure_optimizers()
    assert type(opt["optimizer"]).__name__ == "AdamW"
    default = compose()
    assert default.op == "all" and default.logger.tracking_uri is None and default.promote is False
    from pipeline.training.runner import resolve_ops

    assert resolve_ops("all") == ["conv2d", "linear", "bmm", "lstm"] and resolve_ops("bmm,lstm") == ["bmm", "lstm"]
    with pytest.raises(ValueError, match="matmul"):
        resolve_ops("matmul")


def test_tracking_uri_resolution(monkeypatch):
    from pipeline.training import tracking as T

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert T.resolve_tracking_uri(None) == "sqlite:///mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///elsewhere.db")
    assert T.resolve_tracking_uri(None) == "sqlite:///elsewhere.db"
    assert T.resolve_tracking_uri("sqlite:///given.db") == "sqlite:///given.db"
    assert T.resolve_artifact_location("mlruns").startswith("file://")


def test_no_data_exits_2_saying_what_to_run(tmp_path):
    """A fresh clone has no rows under datasets/ (the first sweep is retired): a clear message, not a traceback."""
    import subprocess
    import sys

    repo = Path(CONF_DIR).parent
    retired = write_datasets(tmp_path / "datasets" / "_retired" / "v1", n_configs=5)  # skipped by the readers
    res = subprocess.run([sys.executable, "-m", "pipeline.train", f"data.root={tmp_path / 'datasets'}", "~logger",
                          f"hydra.run.dir={tmp_path / 'hydra'}"], cwd=repo, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2, res.stderr
    assert "no measurements under" in res.stderr and "make import" in res.stderr and "make collect" in res.stderr
    assert f"data.root={retired.as_posix()}" in res.stderr and "Traceback" not in res.stderr
    # rows of other ops only: the op is skipped, and with nothing trained the run fails the same clear way
    from pipeline.training.config import NoTrainingData
    from pipeline.training.runner import run

    datasets = write_datasets(tmp_path / "bmm-only", n_configs=20)
    with pytest.raises(NoTrainingData, match="no training rows for lstm"):
        run(compose([f"data.root={datasets}", "op=lstm", "~logger"]))


# ------------------------------------------------------------------------------------------------ data

def test_split_hygiene_and_holdout(datasets):
    table = OpTable.load(datasets, "bmm", {"exclude_sources": ["neusight-label"]})
    assert set(table.frame["status"]) == {"ok"}
    assert set(table.frame["source"]) == {SYNTHETIC, "neusight-label"}
    m = table.masks(["t4"])
    ids = {s: set(table.frame.loc[m[s], "config_id"]) for s in ("train", "val", "test")}
    assert ids["train"] and ids["val"] and ids["test"]
    assert not ids["train"] & ids["val"] and not ids["train"] & ids["test"] and not ids["val"] & ids["test"]
    trained = m["train"] | m["val"] | m["test"]
    assert "t4" not in set(table.frame.loc[trained, "gpu"])
    assert set(table.frame.loc[m["holdout"], "gpu"]) == {"t4"}
    assert set(table.frame.loc[m["unseen"], "source"]) == {"neusight-label"}
    assert not (m["unseen"] & trained).any()
    # the split depends on the config alone: the same on every GPU and stable across runs
    assert list(split_of(["a", "b", "a"])) == list(split_of(["a", "b", "a"]))
    per_cfg = table.frame.groupby("config_id")["split"].nunique()
    assert (per_cfg == 1).all()
    # fingerprints ignore row order and see changes
    f = table.frame[m["train"]]
    assert fingerprint(f) == fingerprint(f.sample(frac=1.0, random_state=1))
    assert fingerprint(f) != fingerprint(f.assign(time_ms=f["time_ms"] * 1.01))
    card = table.data_card(m, ["t4"])
    assert card["holdout_gpus"] == ["t4"] and "t4" not in card["gpus"]
    assert card["rows"] == int(trained.sum()) and card["unseen_rows"] == int(m["unseen"].sum())
    assert all(v["fingerprint"] for v in card["by_source_gpu"].values())


def test_heuristic_rows_train_only_on_train_configs_of_gpus_not_held_out(tmp_path):
    from synthetic import synthetic_conv2d_rows

    from pipeline import features as F
    from pipeline.schema import write_partition
    from pipeline.training.data import HEURISTIC_SOURCE

    root = tmp_path / "datasets"
    note = {"note": "synthetic test fixture"}
    write_partition(synthetic_conv2d_rows(gpus=("h200", "t4", "a100-pcie-40gb")), root, "synthetic", metadata=note)
    heuristic = synthetic_conv2d_rows(gpus=("h200", "t4", "h200-sm32"), source="own")   # the same configs
    heuristic = heuristic.assign(time_ms=heuristic["time_ms"] * 1.3, time_p20_ms=heuristic["time_p20_ms"] * 1.3,
                                 time_p80_ms=heuristic["time_p80_ms"] * 1.3)   # timed the other way
    write_partition(heuristic, root / "_retired" / "heur", "heur", metadata=note)
    write_partition(synthetic_rows(gpus=("h200",), n_configs=20), root / "_retired" / "heur", "heur-bmm",
                    metadata=note)
    cfg = {"exclude_sources": ["neusight-label"], "heuristic_roots": ["_retired/heur", "_retired/missing"]}
    table = OpTable.load(root, "conv2d", cfg)
    heur = (table.frame["domain"] == "heuristic").to_numpy()
    assert heur.sum() == len(heuristic) and set(table.frame.loc[heur, "source"]) == {HEURISTIC_SOURCE}
    assert set(table.frame.loc[~heur, "source"]) == {SYNTHETIC}
    assert list(table.X[:, F.feature_names("conv2d").index("cudnn_heuristic")]) == list(heur.astype(float))
    assert not (OpTable.load(root, "bmm", cfg).frame["domain"] == "heuristic").any()   # bmm has no such input
    with pytest.raises(ValueError, match="no 'cudnn_heuristic' input"):
        OpTable.from_frame(synthetic_rows(gpus=("h200",), n_configs=5, source=HEURISTIC_SOURCE), "bmm", {})
    m = table.masks(["t4"])
    train_split = (table.frame["split"] == "train").to_numpy()
    on_t4 = (table.frame["gpu"] == "t4").to_numpy()
    assert (m["train"] & heur).sum() == (heur & train_split & ~on_t4).sum() > 0
    for role in ("val", "test", "holdout", "unseen"):   # never an error that is reported
        assert not (m[role] & heur).any(), role
    assert set(table.frame.loc[m["holdout"], "source"]) == {SYNTHETIC}
    assert table.training_gpus() == ["a100-pcie-40gb", "h200", "t4"]
    card = table.data_card(m, ["t4"])
    assert card["by_source_gpu"][f"{HEURISTIC_SOURCE}/h200"]["rows_by_split"]["test"] == 0
    assert card["gpus"] == ["a100-pcie-40gb", "h200"]   # trained on h200-sm32's heuristic rows, yet not "seen"
    plain = OpTable.load(root, "conv2d", {"exclude_sources": ["neusight-label"]})
    assert not (plain.frame["domain"] == "heuristic").any() and len(plain.frame) == (~heur).sum()


def test_data_filters(datasets):
    table = OpTable.load(datasets, "bmm", {"exclude_sources": ["neusight-label"], "gpus": ["h200"],
                                           "precisions": ["bf16"], "phases": ["forward"]})
    dom = table.frame[table.frame["domain"] == "train"]
    assert set(dom["gpu"]) == {"h200"} and set(table.frame["precision"]) == {"bf16"}
    assert set(table.frame["phase"]) == {"forward"}
    assert table.dropped["gpu not in data.gpus"] > 0
    only = OpTable.load(datasets, "bmm", {"sources": ["neusight-label"], "exclude_sources": []})
    assert set(only.frame["source"]) == {"neusight-label"} and (only.frame["domain"] == "train").all()
    rule = {"gpu": ["h200"], "phase": "backward"}
    ruled = OpTable.load(datasets, "bmm", {"exclude_sources": ["neusight-label"], "exclude_rows": [rule]})
    h200 = ruled.frame[ruled.frame["gpu"] == "h200"]
    assert len(h200) and set(h200["phase"]) == {"forward"} and ruled.dropped[f"data.exclude_rows[0] {rule}"] > 0
    with pytest.raises(ValueError, match=r"data.exclude_rows\[0\]: unknown column 'device'"):
        OpTable.load(datasets, "bmm", {"exclude_rows": [{"device": "h200"}]})


def test_datamodule_batches(datasets):
    from pipeline.training.datamodule import OpDataModule

    table = OpTable.load(datasets, "bmm", {"exclude_sources": ["neusight-label"]})
    dm = OpDataModule(table, ["a100-pcie-40gb"], batch_size=100, seed=3)
    dm.setup("fit")
    z, y, aux, weight, y_floor = next(iter(dm.train_dataloader()))
    assert z.shape == (100, table.X.shape[1]) and y.shape == (100,) and str(z.dtype) == "torch.float32"
    assert aux.shape == weight.shape == y_floor.shape == (100,) and bool((aux > 0).all())
    assert bool(((weight > 0) & (y_floor == float("-inf"))).all())  # synthetic rows: no host launch floor
    zs = dm.standardise(table.X[dm.masks["train"]])
    np.testing.assert_allclose(zs.mean(axis=0), 0, atol=1e-3)
    n_train = sum(len(b[1]) for b in dm.train_dataloader())
    assert n_train == int(dm.masks["train"].sum())
    first = next(iter(OpDataModule(table, batch_size=100, seed=3).train_dataloader()))[1][:5].tolist()
    again = next(iter(OpDataModule(table, batch_size=100, seed=3).train_dataloader()))[1][:5].tolist()
    other = next(iter(OpDataModule(table, batch_size=100, seed=4).train_dataloader()))[1][:5].tolist()
    assert first == again and first != other  # seeded order
    every = table.training_gpus()
    with pytest.raises(ValueError, match=r"no training rows with GPUs .* held out; the data's training GPUs are"):
        OpDataModule(table, every, batch_size=100, seed=3)


def test_fitted_model_beats_the_roofline_on_held_out_rows(tmp_path):
    """Synthetic times follow a known law (launch floor + roofline x a shape-dependent inefficiency, 2 % noise):
    a model that learns nothing scores the roofline's error; the fitted one must be far better on configs it
    never saw (test split) and on a GPU it never saw (t4 held out)."""
    from pipeline.training.runner import run

    datasets = write_datasets(tmp_path / "datasets")
    cfg = compose([f"data.root={datasets}", "model=mlp_small", "trainer.max_epochs=30", "fit.patience=null",
                   "eval.logo.gpus=[]", "eval.holdout_gpus=[t4]", "publish=false", "~logger"])
    cfg.op = "bmm"
    metrics = run(cfg)["bmm"]["metrics"]
    test, held = metrics["test"], metrics["holdout"]
    assert test["all"]["n"] > 50 and held["all"]["n"] > 100 and set(held["by_gpu"]) == {"t4"}
    assert test["roofline_baseline"]["mape"] > 20  # the law is far from the plain roofline
    assert test["all"]["mape"] < 0.25 * test["roofline_baseline"]["mape"] and test["all"]["mape"] < 8
    assert held["all"]["mape"] < 0.5 * held["roofline_baseline"]["mape"]


def test_restarts_keep_the_seed_with_the_lowest_validation_error(datasets):
    """``fit.restarts`` trains the main fit once per seed and keeps the lowest validation error (as the champion
    rules measure the test error); the kept fit is the plain fit of that seed, weight for weight."""
    from pipeline.training.fit import fit
    from pipeline.training.runner import load_table, main_fit

    cfg = compose([f"data.root={datasets}", "model=mlp_small", "trainer.max_epochs=3", "fit.patience=null",
                   "eval.logo.gpus=[]", "publish=false", "~logger", "data.batch_size=256", "seed=4",
                   "fit.restarts.bmm=3", "fit.members.bmm=1"])
    table = load_table(cfg, "bmm")
    res = main_fit(cfg, "bmm", table, [])
    tried = {r["seed"]: r["val_group_mape"] for r in res.restarts}
    assert sorted(tried) == [4, 5, 6] and len(set(tried.values())) == 3
    assert res.seed == min(tried, key=tried.get) and tried[res.seed] == min(tried.values())
    cfg.seed = res.seed
    alone = fit(cfg, "bmm", table, patience=None)
    assert all(np.array_equal(alone.weights[k], res.weights[k]) for k in res.weights)
    assert len(main_fit(compose(["fit.restarts.lstm=3", "fit.members.lstm=1", "fit.members.bmm=1",
                                 f"data.root={datasets}", "model=mlp_small", "trainer.max_epochs=1", "~logger"]),
                        "bmm", table, []).restarts) == 1
    assert compose(["fit.restarts=2"]).fit.restarts == 2   # one int for every op


def test_restarts_tag_which_mlflow_run_is_kept(datasets, tmp_path):
    from mlflow import MlflowClient

    from pipeline.training.runner import load_table, main_fit

    cfg = tiny_cfg(datasets, tmp_path, ["fit.restarts.bmm=2", "fit.members.bmm=1", "trainer.max_epochs=1"])
    res = main_fit(cfg, "bmm", load_table(cfg, "bmm"), [])
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("pipeline-bmm").experiment_id])
    kept = {r.info.run_id: r.data.tags.get("pipeline.restart_kept") for r in runs}
    assert len(kept) == 2 and kept[res.run_id] == "True" and sorted(kept.values()) == ["False", "True"]


def test_ensemble_keeps_every_seed_and_predicts_their_geometric_mean(datasets, tmp_path):
    """``fit.members`` trains one fit per seed and keeps them all: the ensemble's weights are the plain fits'
    weights, weight for weight, and it predicts the geometric mean of their predictions; each fit's MLflow run is
    tagged as a member, and the published card says how many members it holds."""
    from mlflow import MlflowClient

    from pipeline.training.fit import fit
    from pipeline.training.runner import load_table, main_fit

    cfg = tiny_cfg(datasets, tmp_path, ["fit.members.bmm=2", "trainer.max_epochs=3", "seed=4"])
    table = load_table(cfg, "bmm")
    res = main_fit(cfg, "bmm", table, [])
    assert [m["seed"] for m in res.members] == [4, 5] and res.card_core["architecture"]["members"] == 2
    alone = []
    for seed in (4, 5):
        one = copy.deepcopy(cfg)
        one.seed, one.logger = seed, None
        alone.append(fit(one, "bmm", table, patience=None))
        assert all(np.array_equal(w, res.weights[f"members.{seed - 4}.{k}"]) for k, w in alone[-1].weights.items())
    assert len(res.weights) == 2 * len(alone[0].weights)
    for role, pred in res.preds.items():
        want = np.exp((np.log(alone[0].preds[role]) + np.log(alone[1].preds[role])) / 2)
        np.testing.assert_allclose(pred, want, rtol=1e-6)
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("pipeline-bmm").experiment_id])
    assert len(runs) == 2 and all(r.data.tags.get("pipeline.ensemble_member") == "True" for r in runs)


def test_leave_gpu_out_pass_is_an_ensemble_of_seeds_on_one_subsample(datasets, tmp_path):
    """``eval.logo.members``: a leave-GPU-out pass fits that many seeds on the same subsample and predicts the held-out
    GPU with their geometric mean, as the published champions do; one member is the plain pass of ``seed``."""
    from pipeline.evaluation.logo import reduced_fit
    from pipeline.training.config import to_dict
    from pipeline.training.fit import fit

    cfg = tiny_cfg(datasets, tmp_path, ["eval.logo.members={bmm:2}", "eval.logo.max_train_rows=200",
                                        "eval.logo.max_epochs=2", "eval.logo.patience=null", "seed=4"])
    cfg.logger = None
    table = OpTable.load(datasets, "bmm", to_dict(cfg.data))
    res, sub = reduced_fit(cfg, "bmm", table, ["t4"], "leave-gpu-out")
    assert res.card_core["architecture"]["members"] == 2 and res.masks["holdout"].any()
    assert len(sub.frame) < len(table.frame)   # a real subsample: another seed would draw other rows
    one = copy.deepcopy(cfg)
    one.eval.logo.members = 1
    first, first_sub = reduced_fit(one, "bmm", table, ["t4"], "leave-gpu-out")
    assert first_sub.frame.equals(sub.frame)
    one.seed = 5   # the second member: seed 5 on the first member's subsample
    second = fit(one, "bmm", sub, holdout=["t4"], kind="leave-gpu-out", max_epochs=2, patience=None)
    want = np.exp((np.log(first.preds["holdout"]) + np.log(second.preds["holdout"])) / 2)
    np.testing.assert_allclose(res.preds["holdout"], want, rtol=1e-6)
    cfg.eval.logo.members = {"bmm": 0}
    with pytest.raises(ValueError, match="eval.logo.members: .*>= 1"):
        reduced_fit(cfg, "bmm", table, ["t4"], "leave-gpu-out")


@pytest.mark.parametrize("setting, op, want", [(None, "bmm", 1), (2, "bmm", 2), ({"lstm": 5}, "lstm", 5),
                                               ({"lstm": 5}, "conv2d", 1)])
def test_count_for(setting, op, want):
    from pipeline.training.config import count_for

    assert count_for(setting, op, "fit.restarts") == want


@pytest.mark.parametrize("name", ["restarts", "members"])
@pytest.mark.parametrize("setting, match", [({"lsmt": 2}, r"unknown ops \['lsmt'\]"), (0, ">= 1"), ("3", ">= 1"),
                                            ({"bmm": 0}, ">= 1"), (True, ">= 1")])
def test_count_for_rejects_bad_settings(setting, match, name):
    from pipeline.training.config import count_for

    with pytest.raises(ValueError, match=f"fit.{name}: .*{match}"):
        count_for(setting, "bmm", f"fit.{name}")


# ------------------------------------------------------------------------------------------------ end to end

@pytest.fixture(scope="module")
def trained(datasets, tmp_path_factory):
    """One full run: a leave-t4-out pass, the main fit, MLflow logging, publish v1 as champion."""
    from pipeline.training.runner import run

    tmp = tmp_path_factory.mktemp("run")
    cfg = tiny_cfg(datasets, tmp, ["eval.logo.gpus=[t4]", "eval.logo.max_epochs=1"])
    cfg.op = ["bmm"]  # what `make train OP=bmm` passes; each run logs its own op as the op parameter
    out = run(cfg)
    return {"cfg": cfg, "tmp": tmp, "out": out["bmm"]}


def test_publish_and_card(trained):
    out, tmp = trained["out"], trained["tmp"]
    root = tmp / "checkpoints"
    assert out["version"] == 1 and out["promoted"] is True
    assert ck.list_versions(root, "bmm") == [1] and ck.champion_version(root, "bmm") == 1
    assert not [p for p in (root / "bmm").iterdir() if p.name.startswith(".")]  # no temp folders left
    card, weights = ck.load(root, "bmm")
    assert card["features"]["names"] == F.feature_names("bmm")
    assert card["target"]["kind"] == T.TARGET_KIND and card["architecture"]["hidden"] == [32, 32]
    assert set(card["interval"]["quantiles"]) == {"seen/small", "seen/large", "unseen/small", "unseen/large"}
    assert card["mlflow_run_id"] == out["run_id"]
    assert card["training"]["seed"] == 0 and [r["seed"] for r in card["training"]["members"]] == [0, 1, 2]
    assert card["architecture"]["members"] == 3 and len(ck.split_members(weights)) == 3  # the default ensemble
    td = card["training_data"]
    assert set(td["gpus"]) == {"h200", "t4", "a100-pcie-40gb"} and td["unseen_rows"] > 0
    assert f"{SYNTHETIC}/h200" in td["by_source_gpu"] and td["fingerprint"]
    met = card["metrics"]
    assert met["test"]["all"]["n"] > 0 and "h200/bf16/backward" in met["test"]["by_gpu_precision_phase"]
    assert met["leave_gpu_out"]["t4"]["all"]["n"] > 0 and "t4" not in met["leave_gpu_out"]["t4"]["trained_on"]
    assert "l4" in met["unseen"]["by_gpu"]
    transfer = card["transfer"]   # calibrated on the leave-GPU-out passes' origin -> destination pairs
    assert transfer["ratio_weight"] in WEIGHTS and transfer["pairs"] >= 1 and set(transfer["mean_pair_mape"]) == {
        f"{w:g}" for w in WEIGHTS}
    assert min(transfer["mean_pair_mape"].values()) == transfer["mean_pair_mape"][f"{transfer['ratio_weight']:g}"]
    assert set(card["ranges"]) == set(F.feature_names("bmm"))
    assert "report.png" in card["files"] and (root / "bmm" / "v1" / "report.png").stat().st_size > 1000
    assert sum(w.nbytes for w in weights.values()) < 1 << 20


def test_published_card_metrics_are_what_load_scaler_predicts(trained, datasets):
    """The card's test metrics are reproduced by the published checkpoint through the prediction API."""
    from pipeline.api import load_scaler
    from pipeline.evaluation.metrics import ape, summarise
    from pipeline.evaluation.predictions import predict_rows

    root = trained["tmp"] / "checkpoints"
    scaler = load_scaler("bmm", root=root)
    card = scaler.card
    table = OpTable.load(datasets, "bmm", {"exclude_sources": ["neusight-label"]})
    test = table.masks()["test"]
    pred, _ = predict_rows(scaler, table, test)
    got = summarise(ape(pred, table.frame["time_ms"].to_numpy()[test]))
    want = card["metrics"]["test"]["all"]
    assert got["n"] == want["n"] > 0
    for key in ("mape", "median_ape", "p90_ape"):
        assert got[key] == pytest.approx(want[key], rel=1e-9)


def test_mlflow_runs_metrics_artifacts_registry(trained):
    from mlflow import MlflowClient

    tmp, out = trained["tmp"], trained["out"]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp / 'mlflow.db'}")
    exp = client.get_experiment_by_name("pipeline-bmm")
    assert exp is not None and exp.artifact_location.startswith("file://")
    runs = client.search_runs([exp.experiment_id])
    kinds = sorted(r.data.tags["pipeline.kind"] for r in runs)
    # the leave-t4-out pass and bmm's main fit: each an ensemble of three seeds
    assert kinds == ["leave-gpu-out"] * 3 + ["main"] * 3
    assert sum(r.data.tags.get("pipeline.ensemble_member") == "True" for r in runs) == 6
    logo = [r for r in runs if r.data.tags["pipeline.kind"] == "leave-gpu-out"]
    scored = [r.info.run_id for r in logo if any(k.startswith("holdout/") for k in r.data.metrics)]
    assert len(scored) == 1 and all(r.data.tags.get("pipeline.ensemble_run") == scored[0] for r in logo)
    main = client.get_run(out["run_id"])
    assert main.data.params["op"] == "bmm" and main.data.params["model/hidden"] == "[32, 32]"
    assert len(client.get_metric_history(out["run_id"], "val/mape")) == 2  # one per epoch
    m = main.data.metrics
    assert "test/all/mape" in m and "test/by_gpu/h200/mape" in m and "leave_gpu_out/t4/all/mape" in m
    assert "unseen/by_gpu/l4/median_ape" in m and "test/by_precision/bf16/p90_ape" in m
    arts = {a.path for a in client.list_artifacts(out["run_id"], "report")}
    assert {"report/report.png", "report/scatter_test.png", "report/error_cdf_test.png", "report/errors.md",
            "report/errors_test.csv"} <= arts
    ckpt = {a.path for a in client.list_artifacts(out["run_id"], "checkpoint/v1")}
    assert "checkpoint/v1/card.json" in ckpt and "checkpoint/v1/weights.safetensors" in ckpt
    mv = client.get_model_version_by_alias("pipeline-bmm", "champion")
    assert mv.run_id == out["run_id"] and mv.tags["checkpoint_version"] == "1"
    assert mv.source.startswith("models:/")  # a python_function model wrapping the prediction API


def test_less_data_retrain_does_not_replace_champion(trained, datasets, capsys):
    from mlflow import MlflowClient

    from pipeline.training.runner import run

    tmp = trained["tmp"]
    cfg = tiny_cfg(datasets, tmp, ["data.gpus=[h200]", "trainer.max_epochs=1"])
    cfg.op = "bmm"
    out = run(cfg)["bmm"]
    root = tmp / "checkpoints"
    assert out["version"] == 2 and out["promoted"] is False
    assert ck.list_versions(root, "bmm") == [1, 2] and ck.champion_version(root, "bmm") == 1
    assert "less data" in out["reason"] and "t4" in out["reason"]
    assert "champion stays v1" in capsys.readouterr().out
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp / 'mlflow.db'}")
    assert client.get_model_version_by_alias("pipeline-bmm", "champion").tags["checkpoint_version"] == "1"
    card, _ = ck.load(root, "bmm", 2)
    assert card["metrics"]["champion_comparison"]["promoted"] is False
    # promote=true overrides the rules
    cfg = tiny_cfg(datasets, tmp, ["data.gpus=[h200]", "trainer.max_epochs=1", "promote=true"])
    cfg.op = "bmm"
    out = run(cfg)["bmm"]
    assert out["version"] == 3 and out["promoted"] and ck.champion_version(root, "bmm") == 3
    assert client.get_model_version_by_alias("pipeline-bmm", "champion").tags["checkpoint_version"] == "3"


def test_recalibrate_republishes_the_champions_weights_with_a_new_transfer(trained, datasets, tmp_path, monkeypatch):
    import shutil

    from pipeline.training.runner import run

    root = tmp_path / "checkpoints"
    shutil.copytree(trained["tmp"] / "checkpoints", root)
    shutil.copy(trained["tmp"] / "mlflow.db", tmp_path / "mlflow.db")  # the runs that trained the champions
    champion = ck.champion_version(root, "bmm")
    old_card, old_weights = ck.load(root, "bmm", champion)
    cfg = tiny_cfg(datasets, tmp_path, ["eval.logo.gpus=[t4]", "eval.logo.max_epochs=1", "recalibrate=true"])
    cfg.op = "bmm"
    reads, load = [], ck.load
    monkeypatch.setattr(ck, "load", lambda root, op, version=None: reads.append((op, version))
                        or load(root, op, version))
    out = run(cfg)["bmm"]
    monkeypatch.setattr(ck, "load", load)
    assert reads.count(("bmm", champion)) == 1  # the champion is read (and its checksum checked) once
    assert out["promoted"] and "bit for bit" in out["reason"] and ck.champion_version(root, "bmm") == out["version"]
    card, weights = ck.load(root, "bmm")
    assert P.same_weights(weights, old_weights) and card["version"] == out["version"] > champion
    assert card["transfer"]["recalibrated"]["from_version"] == champion and card["transfer"]["ratio_weight"] in WEIGHTS
    assert card["metrics"] == old_card["metrics"] and card["interval"] == old_card["interval"]
    assert card["created"] == old_card["created"] and card["git_commit"] == old_card["git_commit"]  # the model's own
    from mlflow import MlflowClient  # registered under the run that trained the weights, and the champion there

    champion_mv = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}").get_model_version_by_alias(
        "pipeline-bmm", "champion")
    assert champion_mv.tags["checkpoint_version"] == str(out["version"]) and champion_mv.run_id == card["mlflow_run_id"]
    # nothing to recalibrate: a clear error (exit code 2 from the app)
    from pipeline.training.config import NoTrainingData

    cfg = tiny_cfg(datasets, tmp_path / "empty", ["recalibrate=true"])
    cfg.op = "bmm"
    with pytest.raises(NoTrainingData, match="nothing recalibrated: bmm: no champion of bmm"):
        run(cfg)
    # a champion this code cannot load (other features) is left alone, and nothing is published
    table = OpTable.load(datasets, "bmm", {"exclude_sources": ["neusight-label"]})
    n_in = table.X.shape[1]
    card = _card_for(table, None, np.zeros(n_in), np.ones(n_in), table.data_card(table.masks()))
    card["features"]["names"] = [f"other_{i}" for i in range(n_in)]
    foreign = tmp_path / "foreign"
    ck.publish(foreign / "checkpoints", "bmm", _zero_weights(n_in), card)
    ck.promote(foreign / "checkpoints", "bmm", 1, "test")
    cfg = tiny_cfg(datasets, foreign, ["recalibrate=true"])
    cfg.op = "bmm"
    with pytest.raises(NoTrainingData, match="champion v1 cannot be loaded by this code"):
        run(cfg)
    assert ck.list_versions(foreign / "checkpoints", "bmm") == [1]


# ------------------------------------------------------------------------------------------------ champion rules

def _card_for(table, weights, mean, std, data_card):
    names = F.feature_names(table.op)
    return {"features": {"names": names, "mean": list(mean), "std": list(std)}, "target": T.target_card(table.op),
            "architecture": {"hidden": [4], "activation": "relu"}, "training_data": data_card,
            "metrics": {}, "ranges": {}}


def _zero_weights(n_in):
    k = T.HEAD_OUTPUTS[T.TARGET_KIND]
    return {"layers.0.weight": np.zeros((4, n_in), np.float32), "layers.0.bias": np.zeros(4, np.float32),
            "layers.1.weight": np.zeros((k, 4), np.float32), "layers.1.bias": np.zeros(k, np.float32)}


def test_champion_rules(datasets, tmp_path):
    table = OpTable.load(datasets, "bmm", {"exclude_sources": ["neusight-label"]})
    m = table.masks()
    data_card = table.data_card(m)
    n_in = table.X.shape[1]
    truth = table.frame["time_ms"].to_numpy()[m["test"]]
    # no champion: promote
    d = P.decide(tmp_path, "bmm", table, m["test"], truth * 1.5, data_card)
    assert d.promote and "no champion" in d.reason
    # champion = a model of zero outputs (half the bound's utilisation): exact predictions beat it, bad ones do not
    ck.publish(tmp_path, "bmm", _zero_weights(n_in), _card_for(table, None, np.zeros(n_in), np.ones(n_in), data_card))
    ck.promote(tmp_path, "bmm", 1, "test")
    better = P.decide(tmp_path, "bmm", table, m["test"], truth * 1.01, data_card)
    assert better.promote and "beats champion v1" in better.reason
    assert better.new_mape < better.champion_mape
    # ...unless it predicts more work of the same shape much faster (rule 3)
    def fake(time_of_batch):
        return SimpleNamespace(predict=lambda c, gpu, precision, phase, return_flags: (
            time_of_batch(c["batch"].to_numpy(float)), np.zeros(len(c), bool)))
    dips = P.decide(tmp_path, "bmm", table, m["test"], truth * 1.01, data_card, new_scaler=fake(lambda b: 1 / b))
    assert not dips.promote and "tripling the batch is predicted 3.00x faster" in dips.reason
    flat = P.decide(tmp_path, "bmm", table, m["test"], truth * 1.01, data_card, new_scaler=fake(lambda b: 1 + 0 * b))
    assert flat.promote
    worse = P.decide(tmp_path, "bmm", table, m["test"], truth * 50, data_card)
    assert not worse.promote and "does not beat" in worse.reason
    forced = P.decide(tmp_path, "bmm", table, m["test"], truth * 50, data_card, force=True)
    assert forced.promote and "promote=true" in forced.reason
    # the champion's own weights, retrained bit for bit: the same model, republished with its newer card (rule 4)
    same = P.decide(tmp_path, "bmm", table, m["test"], truth * 50, data_card, new_weights=_zero_weights(n_in))
    assert same.promote and "the weights of champion v1, bit for bit" in same.reason
    # republished without new predictions (recalibrate): the champion's own are the new model's, computed once
    again = P.decide(tmp_path, "bmm", table, m["test"], None, data_card, new_weights=_zero_weights(n_in))
    assert again.promote and again.new_mape == again.champion_mape == better.champion_mape
    # the champion as the caller loaded it: not read again while it is the champion; read when it is not
    loaded = ck.load(tmp_path, "bmm", 1)
    reads = []
    load = ck.load
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ck, "load", lambda *a, **k: reads.append(a) or load(*a, **k))
        given = P.decide(tmp_path, "bmm", table, m["test"], None, data_card, new_weights=_zero_weights(n_in),
                         champion=(1, *loaded))
        assert given.promote and given.champion_mape == again.champion_mape and reads == []
        P.decide(tmp_path, "bmm", table, m["test"], None, data_card, new_weights=_zero_weights(n_in),
                 champion=(7, *loaded))
        assert len(reads) == 1
    moved = _zero_weights(n_in)
    moved["layers.1.bias"][0] = 1e-7
    assert not P.decide(tmp_path, "bmm", table, m["test"], truth * 50, data_card, new_weights=moved).promote
    with pytest.raises(ValueError, match="not champion v1's"):
        P.decide(tmp_path, "bmm", table, m["test"], None, data_card, new_weights=moved)
    with pytest.raises(ValueError, match="needs new_weights"):
        P.decide(tmp_path, "bmm", table, m["test"], None, data_card)
    assert not P.same_weights(_zero_weights(n_in), {**_zero_weights(n_in), "layers.2.bias": np.zeros(1, np.float32)})
    # less data: better numbers do not matter
    smaller = OpTable.load(datasets, "bmm", {"exclude_sources": ["neusight-label"], "gpus": ["h200"]})
    sm = smaller.masks()
    d = P.decide(tmp_path, "bmm", smaller, sm["test"], smaller.frame["time_ms"].to_numpy()[sm["test"]],
                 smaller.data_card(sm))
    assert not d.promote and "less data" in d.reason
    # a champion this code cannot evaluate is not replaced silently
    card = _card_for(table, None, np.zeros(n_in), np.ones(n_in), data_card)
    card["features"]["names"] = [f"other_{i}" for i in range(n_in)]
    ck.publish(tmp_path, "bmm", _zero_weights(n_in), card)
    ck.promote(tmp_path, "bmm", 2, "test")
    d = P.decide(tmp_path, "bmm", table, m["test"], truth, data_card)
    assert not d.promote and "cannot be evaluated" in d.reason


def test_champion_error_counts_every_group_once():
    # nine rows of one GPU predicted exactly, one row of another 100 % off: the row mean would be 10 %
    frame = pd.DataFrame({"source": ["a"] * 9 + ["b"], "gpu": ["x"] * 9 + ["y"], "precision": "fp32",
                          "phase": "forward", "time_ms": 1.0})
    table = SimpleNamespace(frame=frame)
    assert P.group_mape(table, np.ones(10, dtype=bool), np.r_[np.ones(9), 2.0]) == pytest.approx(50.0)
    assert P.group_mape(table, np.zeros(10, dtype=bool), np.zeros(0)) is None


def test_champion_error_pools_small_groups_per_source():
    # source a: one group of MIN_GROUP_ROWS rows predicted exactly; two groups of one row each, 100 % and 0 % off,
    # which count as one pooled group (50 %); source b: one row, 40 % off, a group of its own
    big = P.MIN_GROUP_ROWS
    frame = pd.DataFrame({"source": ["a"] * (big + 2) + ["b"], "gpu": ["x"] * big + ["y", "z", "y"],
                          "precision": "fp32", "phase": "forward", "time_ms": 1.0})
    pred = np.r_[np.ones(big), 2.0, 1.0, 1.4]
    table = SimpleNamespace(frame=frame)
    assert P.group_mape(table, np.ones(len(frame), dtype=bool), pred) == pytest.approx((0 + 50 + 40) / 3)
    # one row fewer in the big group: it is small too, and all of source a is one pool of big + 1 rows
    keep = np.ones(len(frame), dtype=bool)
    keep[0] = False
    assert P.group_mape(table, keep, pred[keep]) == pytest.approx((100 / (big + 1) + 40) / 2)


def test_failed_publish_leaves_nothing(datasets, tmp_path):
    table = OpTable.load(datasets, "bmm", {"exclude_sources": ["neusight-label"]})
    n_in = table.X.shape[1]
    card = _card_for(table, None, np.zeros(n_in), np.ones(n_in), {})
    card["metrics"] = {"bad": float("nan")}
    with pytest.raises(ck.CheckpointError):
        ck.publish(tmp_path, "bmm", _zero_weights(n_in), card, {"report.png": b"png"})
    assert ck.list_versions(tmp_path, "bmm") == []
    assert not (tmp_path / "bmm").exists() or not any((tmp_path / "bmm").iterdir())
