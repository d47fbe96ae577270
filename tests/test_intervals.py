"""pipeline.intervals: quantiles of the log error per group, every device weighing the same when devices are
given, and the interval they make."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline import intervals


def test_weighted_quantile_with_equal_weights_is_the_hazen_quantile():
    values = np.random.default_rng(0).normal(size=101)
    got = intervals.weighted_quantile(values, np.ones(101), [0.1, 0.5, 0.9])
    assert np.allclose(got, np.quantile(values, [0.1, 0.5, 0.9], method="hazen"))


def test_device_weights_give_every_device_the_same_total():
    w = intervals.device_weights(np.array(["a"] * 9 + ["b"]))
    assert w[:9].sum() == pytest.approx(w[9:].sum())


def _two_devices(rng):
    """A device with 2000 rows predicted well (log error sd 0.05) and one with 100 rows predicted badly (sd 0.8)."""
    err = np.concatenate([rng.normal(0, 0.05, 2000), rng.normal(0, 0.8, 100)])
    devices = np.array(["many"] * 2000 + ["few"] * 100)
    pred = np.full(len(err), 1.0)
    return pred, pred * np.exp(err), devices


def test_device_weighting_widens_the_interval_for_the_device_with_few_rows():
    pred, measured, devices = _two_devices(np.random.default_rng(1))
    groups = intervals.group_names(pred, False)
    by_row = intervals.calibrate(pred, measured, groups)
    by_device = intervals.calibrate(pred, measured, groups, devices=devices)
    assert by_row["weighting"] == "every row the same" and by_device["weighting"] == "every device the same"

    def coverage(card, sel):
        lo, hi = intervals.interval(card, pred[sel], np.zeros(sel.sum()), False)
        return intervals.coverage(lo, hi, measured[sel])

    few = devices == "few"
    # row weighting: the interval is the well-predicted device's, and misses most of the other's measurements
    assert coverage(by_row, few) < 0.4
    # device weighting: the mean coverage over the two devices comes near the 80 % level
    mean = (coverage(by_device, few) + coverage(by_device, ~few)) / 2
    assert 0.7 < mean <= 1.0
    assert coverage(by_device, few) > coverage(by_row, few) + 0.2


def test_calibrate_rejects_bad_input():
    pred = np.ones(40)
    groups = intervals.group_names(pred, True)
    with pytest.raises(ValueError, match="level"):
        intervals.calibrate(pred, pred, groups, level=1.5)
    with pytest.raises(ValueError, match="devices"):
        intervals.calibrate(pred, pred, groups, devices=["a"] * 3)
    with pytest.raises(ValueError, match="at least"):
        intervals.calibrate(pred[:5], pred[:5], groups[:5])


def test_a_small_group_borrows_its_class_quantiles():
    pred = np.concatenate([np.full(50, 1.0), np.full(5, 0.01)])     # 5 launch-scale rows: too few for their group
    measured = pred * np.exp(np.random.default_rng(2).normal(0, 0.2, 55))
    card = intervals.calibrate(pred, measured, intervals.group_names(pred, True), devices=["x"] * 55)
    assert card["calibrated_on"]["seen/large"] == "seen/large"
    assert card["calibrated_on"]["seen/small"] == "seen"
    assert card["calibrated_on"]["unseen/large"] == "all"
