"""Wave / roofline scaling of "other" ops (pipeline.step.wave), on made-up GPU specs with round numbers."""

import math

import numpy as np
import pytest

from pipeline.step import wave

# Two made-up GPUs with round numbers: the destination has 2x the bandwidth, 1.5x the clock, 2x the SMs and 4x the
# FP32 rate (so its per-SM per-clock rate differs: "peak" and "clock_sm" compute factors disagree on purpose).
ORIGIN = {"name": "Origin", "sm_count": 40, "boost_clock_mhz": 1000, "memory_bandwidth_gbps": 500,
          "fp32_tflops": 10.0, "tf32_tflops": None, "fp16_tflops": 40.0, "bf16_tflops": None}
DEST = {"name": "Dest", "sm_count": 80, "boost_clock_mhz": 1500, "memory_bandwidth_gbps": 1000,
        "fp32_tflops": 40.0, "tf32_tflops": 80.0, "fp16_tflops": 160.0, "bf16_tflops": 160.0}
RIDGE_FP32_DEST = 40e12 / 1000e9  # 40 FLOP/byte


def test_launch_bound_ops_keep_their_time():
    # under 10 us, or fewer blocks than SMs on both GPUs (40): kept whatever their counters say
    pred, method = wave.scale_other([0.005, 0.5, 0.5], [1e9, 1e9, 1e9], [1e6, 1e6, 1e6], ORIGIN, DEST,
                                    blocks=[np.nan, 40, 41])
    assert pred[0] == 0.005 and pred[1] == 0.5
    assert list(method[:2]) == ["wave-launch", "wave-launch"]
    assert method[2] != "wave-launch"  # 41 blocks: more than one wave on the origin


def test_memory_bound_scales_by_bandwidth_ratio():
    # intensity 1e-6 FLOP/byte: gamma ~ 1 -> bandwidth ratio 0.5; roofline: memory side exactly
    pred, method = wave.scale_other(1.0, 1.0, 1e6, ORIGIN, DEST)
    assert method[0] == "wave-gamma" and pred[0] == pytest.approx(0.5, rel=1e-5)
    pred, method = wave.scale_other(1.0, 1.0, 1e6, ORIGIN, DEST, mode="roofline")
    assert method[0] == "wave-memory" and pred[0] == pytest.approx(0.5)


def test_without_counters_bandwidth_ratio():
    pred, method = wave.scale_other(2.0, np.nan, np.nan, ORIGIN, DEST)
    assert method[0] == "wave-bandwidth" and pred[0] == pytest.approx(1.0)


def test_compute_bound_scales_by_flops_ratio_of_its_precision():
    # intensity 1e6 FLOP/byte >> ridge: roofline -> peak ratio of the compute class
    pred, method = wave.scale_other(1.0, 1e12, 1e6, ORIGIN, DEST, mode="roofline")
    assert method[0] == "wave-compute" and pred[0] == pytest.approx(10.0 / 40.0)
    # fp16 on Tensor Cores uses the fp16 rate: 40 -> 160
    pred, _ = wave.scale_other(1.0, 1e12, 1e6, ORIGIN, DEST, "fp16", tensor_core=True, mode="roofline")
    assert pred[0] == pytest.approx(40.0 / 160.0)
    # gamma -> ~0 at huge intensity: the compute factor alone (peak ratio, or clock x SM ratio)
    pred, _ = wave.scale_other(1.0, 1e15, 1.0, ORIGIN, DEST)
    assert pred[0] == pytest.approx(0.25, rel=1e-4)
    pred, _ = wave.scale_other(1.0, 1e15, 1.0, ORIGIN, DEST, compute="clock_sm")
    assert pred[0] == pytest.approx((1000 / 1500) * (40 / 80), rel=1e-4)


def test_gamma_blend_matches_habitat_formula():
    bw, clk, sm = 500 / 1000, 1000 / 1500, 40 / 80
    for intensity in (10.0, 40.0, 160.0):
        g = 1 - 0.5 * intensity / RIDGE_FP32_DEST if intensity <= RIDGE_FP32_DEST else 0.5 * RIDGE_FP32_DEST / intensity
        expected = 3.0 * bw ** g * clk ** (1 - g) * sm ** (1 - g)
        pred, method = wave.scale_other(3.0, intensity * 1e6, 1e6, ORIGIN, DEST, compute="clock_sm")
        assert method[0] == "wave-gamma"
        assert pred[0] == pytest.approx(expected)
    assert wave.gamma(40.0, 40.0) == pytest.approx(0.5)
    assert wave.gamma(0.0, 40.0) == pytest.approx(1.0)
    assert wave.gamma(400.0, 40.0) == pytest.approx(0.05)


def test_unsupported_precision_is_nan_and_bad_mode_raises():
    pred, method = wave.scale_other(1.0, 1e9, 1e6, DEST, ORIGIN, "bf16", tensor_core=True)
    assert math.isnan(pred[0]) and method[0] == "unsupported"
    with pytest.raises(ValueError, match="mode"):
        wave.scale_other(1.0, 1.0, 1.0, ORIGIN, DEST, mode="nope")


def test_same_gpu_is_identity_for_every_rule():
    t = np.array([0.001, 0.5, 2.0, 3.0])
    for mode in wave.MODES:
        pred, _ = wave.scale_other(t, [1.0, 1e3, 1e12, np.nan], [1.0, 1e6, 1e6, np.nan], DEST, DEST, mode=mode)
        np.testing.assert_allclose(pred, t)
