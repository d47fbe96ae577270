"""pipeline.transfer: the ratio weight, calibrated on origin -> destination pairs, and the pairs themselves
(pipeline.evaluation.logo.pair_frame) on a small synthetic table."""

import numpy as np
import pandas as pd
import pytest

from pipeline import transfer
from pipeline.evaluation import logo


def _pairs(origin_residual: np.ndarray, dest_residual: np.ndarray, pairs=(("a", "b"), ("b", "a"), ("a", "c"))):
    """SYNTHETIC pair rows, not measurements: a model predicting 1 ms everywhere, off by exp(residual) per GPU."""
    rows = []
    for origin, dest in pairs:
        n = len(origin_residual)
        rows.append(pd.DataFrame({"origin": origin, "dest": dest, "measured_ms": np.exp(origin_residual),
                                  "dest_ms": np.exp(dest_residual), "pred_origin_ms": np.ones(n),
                                  "pred_dest_ms": np.ones(n), "floor_dest_ms": np.full(n, np.nan)}))
    return pd.concat(rows, ignore_index=True)


def test_a_residual_both_gpus_share_calls_for_the_full_ratio():
    shared = np.random.default_rng(0).normal(0, 0.3, 200)      # the config's own error, the same on both GPUs
    card = transfer.calibrate(_pairs(shared, shared))
    assert card["ratio_weight"] == 1.0
    assert card["mean_pair_mape"]["1"] == pytest.approx(0.0)
    assert card["pairs"] == 3 and card["rows"] == 600 and card["formula"] == transfer.FORMULA


def test_an_origin_level_the_destination_does_not_share_calls_for_the_direct_prediction():
    rng = np.random.default_rng(1)
    card = transfer.calibrate(_pairs(0.4 + rng.normal(0, 0.05, 200), rng.normal(0, 0.05, 200)))
    assert card["ratio_weight"] == 0.0
    means = [card["mean_pair_mape"][f"{w:g}"] for w in transfer.WEIGHTS]
    assert means == sorted(means)                  # every step towards the ratio costs more


def test_half_shared_residuals_land_in_between():
    rng = np.random.default_rng(2)
    config = rng.normal(0, 0.3, 400)
    card = transfer.calibrate(_pairs(config + rng.normal(0, 0.3, 400), config + rng.normal(0, 0.3, 400)))
    assert 0.25 <= card["ratio_weight"] <= 0.75


def test_apply_is_the_direct_prediction_at_zero_and_the_ratio_at_one():
    np.testing.assert_allclose(transfer.apply([2.0, 3.0], [5.0, 1.0], [4.0, 2.0], 0.0), [2.0, 3.0])
    np.testing.assert_allclose(transfer.apply([2.0, 3.0], [5.0, 1.0], [4.0, 2.0], 1.0), [2.5, 1.5])
    np.testing.assert_allclose(transfer.apply([2.0], [8.0], [2.0], 0.5), [4.0])


def test_small_pairs_are_left_out_and_floors_bound_the_prediction():
    pairs = _pairs(np.zeros(30), np.zeros(30))
    assert transfer.calibrate(pairs, min_rows=31) is None
    assert transfer.calibrate(pd.DataFrame()) is None
    errors = transfer.pair_errors(pairs.iloc[:25], min_rows=20)              # only the first pair has 20+ rows
    assert list(errors.index) == [("a", "b")]
    floored = pairs.assign(dest_ms=2.0, floor_dest_ms=2.0)                   # a destination at its launch floor
    assert transfer.pair_errors(floored)[0.0].max() == pytest.approx(0.0)    # max(1 ms predicted, 2 ms floor)


class _Table:
    """SYNTHETIC op table (two GPUs, bmm): the attributes pair_frame reads."""

    op = "bmm"

    def __init__(self):
        cfg = pd.DataFrame({"batch": [8, 16, 32], "m": [512] * 3, "k": [256] * 3, "n": [1024] * 3})
        frames = []
        for gpu, times in (("a100-pcie-40gb", [0.2, 0.4, 0.8]), ("v100-pcie-32gb", [0.3, 0.6, 0.05])):
            frames.append(cfg.assign(gpu=gpu, source="synthetic", time_ms=times, precision="fp32", phase="forward",
                                     domain="train", config_id=["c1", "c2", "c3"]))
        self.frame = pd.concat(frames, ignore_index=True)
        self.floor_ms = np.array([np.nan, np.nan, np.nan, np.nan, np.nan, 0.05])  # v100's c3 is its launch floor


class _Model:
    """TEST DOUBLE, not a model: 1 ms per batch of 8 on any GPU."""

    def predict(self, configs, gpu, precision, phase, return_flags=False):
        ms = configs["batch"].to_numpy(float) / 8
        return (ms, np.zeros(len(ms), bool)) if return_flags else ms


def test_pair_frame_pairs_the_common_rows_and_drops_launch_floors():
    table = _Table()
    pairs = logo.pair_frame(table, _Model(), "v100-pcie-32gb", logo.measured_by_gpu(table))
    assert list(pairs["origin"].unique()) == ["a100-pcie-40gb"]
    assert len(pairs) == 2                                          # c3 measured the v100's launch floor
    np.testing.assert_allclose(pairs["measured_ms"], [0.2, 0.4])
    np.testing.assert_allclose(pairs["dest_ms"], [0.3, 0.6])
    np.testing.assert_allclose(pairs["pred_dest_ms"], [1.0, 2.0])
    errs = logo.ratio_errors(pairs, weight=0.0)
    np.testing.assert_allclose(errs["direct_ape"], errs["transfer_ape"])
    np.testing.assert_allclose(errs["ape"], [abs(0.2 * 1 / 1 / 0.3 - 1) * 100] * 2)   # the ratio 0.2 / 0.3
