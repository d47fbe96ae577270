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
        cfg = pd.DataFrame({"batch": [8, 16, 32, 64], "m": [512] * 4, "k": [256] * 4, "n": [1024] * 4})
        frames = []
        for gpu, source, times in (("a100-pcie-40gb", "host-timed", [0.2, 0.5, 0.8, 3.0]),
                                   ("v100-pcie-32gb", "gpu-timed", [0.3, 0.9, 0.05, 6.0])):
            frames.append(cfg.assign(gpu=gpu, source=source, time_ms=times, precision="fp32", phase="forward",
                                     domain="train", config_id=["c1", "c2", "c3", "c4"]))
        self.frame = pd.concat(frames, ignore_index=True)
        # the a100 is host-timed with a 0.4 ms floor (c1 is at it); v100's c3 sits at a floor of its own
        self.floor_ms = np.array([0.4, 0.4, 0.4, 0.4, np.nan, np.nan, 0.05, np.nan])


class _Model:
    """TEST DOUBLE, not a model: 1 ms per batch of 8 on the A100, 2 ms on the V100."""

    def predict(self, configs, gpu, precision, phase, return_flags=False):
        per_8 = 1.0 if gpu["label"] == "a100-pcie-40gb" else 2.0
        ms = configs["batch"].to_numpy(float) / 8 * per_8
        return (ms, np.zeros(len(ms), bool)) if return_flags else ms


def test_pair_frame_pairs_the_common_rows_and_drops_launch_floors():
    table = _Table()
    pairs = logo.pair_frame(table, _Model(), "v100-pcie-32gb", logo.measured_by_gpu(table))
    assert list(pairs["origin"].unique()) == ["a100-pcie-40gb"]
    # c1 is the a100's launch floor, c3 the v100's: neither says anything about the GPU time
    np.testing.assert_allclose(pairs["measured_ms"], [0.5, 3.0])
    np.testing.assert_allclose(pairs["dest_ms"], [0.9, 6.0])
    np.testing.assert_allclose(pairs["pred_dest_ms"], [4.0, 16.0])          # the destination's model
    np.testing.assert_allclose(pairs["pred_origin_ms"], [2.0, 8.0])         # the origin's, above its floor
    assert list(pairs["origin_source"]) == ["host-timed"] * 2 and list(pairs["dest_source"]) == ["gpu-timed"] * 2
    errs = logo.ratio_errors(pairs, weight=0.5)
    ratio = np.array([0.5 * 4 / 2, 3.0 * 16 / 8])                           # measured x model(dest) / model(origin)
    np.testing.assert_allclose(errs["ape"], np.abs(ratio / [0.9, 6.0] - 1) * 100)
    np.testing.assert_allclose(errs["direct_ape"], np.abs(np.array([4.0, 16.0]) / [0.9, 6.0] - 1) * 100)
    half = np.array([4.0, 16.0]) * (np.array([0.5, 3.0]) / [2.0, 8.0]) ** 0.5
    np.testing.assert_allclose(errs["transfer_ape"], np.abs(half / [0.9, 6.0] - 1) * 100)


def test_a_host_timed_origins_prediction_is_floored_like_its_measurement():
    table = _Table()
    table.frame.loc[1, "batch"] = 1            # c2 on the a100: the model says 0.125 ms, under the 0.4 ms floor
    table.frame.loc[5, "batch"] = 1
    pairs = logo.pair_frame(table, _Model(), "v100-pcie-32gb", logo.measured_by_gpu(table))
    assert pairs["pred_origin_ms"].iloc[0] == pytest.approx(0.4)
    assert pairs["roof_origin_ms"].iloc[0] >= 0.4


def _ratio_rows():
    """SYNTHETIC ratio_errors rows: a->b 25 rows, b->a 25 rows, a->c 5 rows (too few to count as a pair)."""
    def rows(origin, dest, n, ape, direct, src="s1"):
        return pd.DataFrame({"origin": origin, "dest": dest, "precision": "fp32", "phase": "forward",
                             "origin_source": src, "dest_source": src, "ape": ape, "direct_ape": direct,
                             "transfer_ape": (ape + direct) / 2, "roof_ape": 50.0}, index=range(n))
    return pd.concat([rows("a", "b", 25, 10.0, 20.0), rows("b", "a", 25, 30.0, 10.0), rows("a", "c", 5, 99.0, 99.0)],
                     ignore_index=True)


def test_pair_level_numbers_average_the_pairs_with_enough_rows_only():
    from types import SimpleNamespace

    from pipeline.evaluation import report

    ratio = _ratio_rows()
    means = logo.pair_means(ratio, 20)
    assert list(means.index) == [("a", "b"), ("b", "a")]
    assert means["ape"].mean() == pytest.approx(20.0) and means["direct_ape"].mean() == pytest.approx(15.0)
    by_source = report._by_source_pair(ratio, 20)
    assert by_source == [["s1 -> s1", 2, pytest.approx(20.0), pytest.approx(15.0), pytest.approx(17.5)]]
    card = {"ratio_weight": 0.5, "mean_pair_mape": {"0": 15.0, "0.5": 17.5, "1": 20.0}}
    md = "\n".join(report._ratio_section(SimpleNamespace(ratio=SimpleNamespace(min_rows=20)), "bmm",
                                         {"ratio": ratio, "transfer": card}, {}))
    assert "Mean over 2 pairs: 20.0 %" in md and "errs 15.0 %" in md and "ratio weight 0.5" in md
    assert "| s1 -> s1 | 2 | 20.0 | 15.0 | 17.5 |" in md
