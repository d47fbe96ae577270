"""benchmarks/distill.py: a student's targets moved towards the ensemble's predictions on the train rows only."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from conftest import ROOT
from synthetic import synthetic_rows

from pipeline.training.data import OpTable

spec = importlib.util.spec_from_file_location("distill", ROOT / "benchmarks" / "distill.py")
distill = importlib.util.module_from_spec(spec)
spec.loader.exec_module(distill)


def test_targets_move_towards_the_teacher_on_train_rows_only():
    table = OpTable.from_frame(synthetic_rows(n_configs=40), "bmm", {})
    train = table.masks(())["train"]
    assert train.any() and (~train).any()
    teacher = table.frame["time_ms"].to_numpy(float) * 2.0   # a teacher twice the measured time everywhere
    for alpha in (0.0, 0.5, 1.0):
        out = distill.distilled(table, teacher, train, alpha)
        np.testing.assert_allclose(out.y[train] - table.y[train], alpha * np.log(2.0))
        np.testing.assert_array_equal(out.y[~train], table.y[~train])   # validation and test keep measured times
    assert table.y is not distill.distilled(table, teacher, train, 1.0).y   # the table itself is left alone


def test_alpha_one_makes_the_teacher_the_target():
    table = OpTable.from_frame(synthetic_rows(n_configs=40), "bmm", {})
    train = table.masks(())["train"]
    teacher = table.frame["time_ms"].to_numpy(float) * np.linspace(0.5, 1.5, len(table.y))
    out = distill.distilled(table, teacher, train, 1.0)
    # y is ln(ms) minus a per-row reference: the student's target is the teacher's time, in y's units
    assert out.y[train] - np.log(teacher[train]) == pytest.approx(table.y[train] - np.log(
        table.frame["time_ms"].to_numpy(float)[train]))
