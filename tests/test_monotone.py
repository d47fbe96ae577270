"""The more-work pairs and penalty of training (pipeline/training/monotone.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from synthetic import write_datasets

from pipeline import features as F
from pipeline.training import monotone
from pipeline.training.data import OpTable
from pipeline.training.datamodule import OpDataModule
from pipeline.training.model import MLPRegressor


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> OpTable:
    return OpTable.load(write_datasets(tmp_path_factory.mktemp("datasets")), "bmm",
                        {"exclude_sources": ["neusight-label"]})


def test_pairs_are_the_rows_at_three_times_the_batch(table):
    X, aux, gain = monotone.more_work_rows(table)
    f = table.frame
    on = (f["gpu"] == "h200").to_numpy()
    larger = f[on].assign(batch=f.loc[on, "batch"] * monotone.WORK_FACTOR)
    np.testing.assert_allclose(X[on], F.build_features("bmm", larger, "h200", larger["precision"].to_numpy(),
                                                       larger["phase"].to_numpy()))
    assert np.all(aux > 0) and np.all(np.isfinite(gain))
    assert np.all(gain >= 0) and np.mean(gain > 0) > 0.5  # three times the work: a bound at least as high


def test_penalty_counts_only_a_larger_batch_predicted_faster():
    y_row, gain = torch.tensor([0.0, 0.0, 0.0]), torch.tensor([0.5, 0.5, 0.5])
    assert monotone.penalty(y_row, torch.tensor([0.0, -0.5, 1.0]), gain).item() == 0.0  # t(3x) >= t(x) everywhere
    # row 2: ln t(3x) - ln t(x) = -1.0 + 0.5 = -0.5, i.e. predicted faster by e^0.5: penalty 0.5 / 3 rows
    assert monotone.penalty(y_row, torch.tensor([0.0, -1.0, 1.0]), gain).item() == pytest.approx(0.5 / 3)


def test_training_batches_carry_the_pairs_and_the_loss_adds_the_penalty(table):
    dm = OpDataModule(table, batch_size=64, seed=0, monotone=True)
    batch = next(iter(dm.train_dataloader()))
    assert len(batch) == 8 and batch[5].shape == batch[0].shape
    assert len(next(iter(dm.val_dataloader()))) == 5  # validation scores the rows only
    model = MLPRegressor(table.X.shape[1], hidden=[8], monotone_weight=0.0)
    model.log = lambda *args, **kwargs: None
    # the larger batch as the same row whose reference is e times smaller: predicted e times faster, penalty 1
    z, y, aux, weight, y_floor = batch[:5]
    rigged = (z, y, aux, weight, y_floor, z, aux, torch.full_like(y, -1.0))
    base = model.training_step(rigged, 0).item()
    model.monotone_weight = 30.0
    assert model.training_step(rigged, 0).item() == pytest.approx(base + 30.0, rel=1e-5)
    assert model.training_step(batch[:5], 0).item() == pytest.approx(base)  # no pairs: no penalty


def test_pairs_elsewhere_move_each_row_to_a_gpu_it_was_not_measured_on(table):
    from pipeline.gpus import gpu_spec, supports_precision

    f = table.frame
    moved = monotone.elsewhere_frame(f)
    assert (moved["gpu"].to_numpy() != f["gpu"].to_numpy()).all()
    assert moved["gpu"].nunique() > 10                               # spread over the registry
    assert all(supports_precision(gpu_spec(g), p) for g, p in zip(moved["gpu"], moved["precision"]))
    X_row, aux_row, X_big, aux_big, gain = monotone.elsewhere_rows(table)
    assert X_row.shape == X_big.shape == table.X.shape and len(gain) == len(f)
    assert np.all(np.isfinite(gain)) and np.all(gain >= 0)       # three times the work, at least as high a bound
    on = (moved["gpu"] == "t4").to_numpy()
    t4 = moved[on]
    np.testing.assert_allclose(X_row[on], F.build_features("bmm", t4, "t4", t4["precision"].to_numpy(),
                                                           t4["phase"].to_numpy()))


def test_training_batches_carry_the_pairs_elsewhere_when_asked(table):
    dm = OpDataModule(table, batch_size=64, seed=0, monotone=True, monotone_elsewhere=True)
    batch = next(iter(dm.train_dataloader()))
    assert len(batch) == 13 and batch[8].shape == batch[10].shape == batch[0].shape
    model = MLPRegressor(table.X.shape[1], hidden=[8], monotone_weight=0.0)
    model.log = lambda *args, **kwargs: None
    z, y, aux, weight, y_floor = batch[:5]
    # the pairs on the measured GPU rigged to no penalty, those elsewhere to a larger batch e times faster
    rigged = (z, y, aux, weight, y_floor, z, aux, torch.full_like(y, 1.0), z, aux, z, aux, torch.full_like(y, -1.0))
    base = model.training_step(rigged, 0).item()
    model.monotone_weight = 30.0
    assert model.training_step(rigged, 0).item() == pytest.approx(base + 30.0, rel=1e-5)
    assert not OpDataModule(table, batch_size=64, seed=0, monotone=False, monotone_elsewhere=True).monotone_elsewhere


def test_pairs_elsewhere_setting_is_per_op_and_checked():
    from pipeline.training.fit import elsewhere_for

    assert elsewhere_for(True, "bmm") and not elsewhere_for(False, "bmm") and not elsewhere_for(None, "bmm")
    assert elsewhere_for(["conv2d", "lstm"], "lstm") and not elsewhere_for(["conv2d", "lstm"], "bmm")
    for bad in (["conv3d"], "yes", 1):
        with pytest.raises(ValueError, match="^data.monotone_elsewhere:"):
            elsewhere_for(bad, "bmm")
