"""Feature building and physics of pipeline.features (numpy only; configs here are synthetic test inputs)."""

from __future__ import annotations

import time

import numpy as np
import pandas as pd
import pytest

from pipeline import features as F
from pipeline import physics
from pipeline.gpus import gpu_spec
from pipeline.schema import OP_CONFIG_COLUMNS, PHASES, PRECISIONS


def synthetic_configs(op: str, n: int = 64, seed: int = 0) -> pd.DataFrame:
    """Random but valid configs of ``op`` (synthetic test inputs, not measurements)."""
    rng = np.random.default_rng(seed)
    r = lambda lo, hi: rng.integers(lo, hi + 1, n)  # noqa: E731
    if op == "bmm":
        return pd.DataFrame({"batch": r(1, 64), "m": r(1, 2048), "k": r(1, 2048), "n": r(1, 2048)})
    if op == "linear":
        return pd.DataFrame({"batch": r(1, 4096), "in_features": r(1, 8192), "out_features": r(1, 8192),
                             "bias": rng.random(n) < 0.5})
    if op == "conv2d":
        k = r(1, 5)
        return pd.DataFrame({"batch": r(1, 32), "in_channels": r(1, 256), "out_channels": r(1, 256),
                             "height": r(8, 128), "width": r(8, 128), "kernel_h": k, "kernel_w": k,
                             "stride_h": r(1, 2), "stride_w": r(1, 2), "pad_h": r(0, 2), "pad_w": r(0, 2),
                             "dilation_h": np.ones(n, int), "dilation_w": np.ones(n, int), "groups": np.ones(n, int),
                             "bias": rng.random(n) < 0.5})
    return pd.DataFrame({"batch": r(1, 128), "seq_len": r(1, 64), "input_size": r(1, 1024),
                         "hidden_size": r(1, 1024), "num_layers": r(1, 3), "bidirectional": rng.random(n) < 0.3,
                         "bias": np.ones(n, bool)})


@pytest.mark.parametrize("op", list(OP_CONFIG_COLUMNS))
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("phase", PHASES)
def test_shapes_finite_and_names(op, precision, phase):
    cfgs = synthetic_configs(op)
    X = F.build_features(op, cfgs, gpu_spec("h200"), precision, phase)
    names = F.feature_names(op)
    assert X.shape == (len(cfgs), len(names)) and X.dtype == np.float64
    assert len(set(names)) == len(names)
    assert np.isfinite(X).all()
    # one-hot columns say what was asked
    assert (X[:, names.index(f"precision_{precision}")] == 1).all()
    assert (X[:, names.index(f"phase_{phase}")] == 1).all()
    assert X[:, [names.index(f"precision_{p}") for p in PRECISIONS]].sum(axis=1).tolist() == [1.0] * len(cfgs)


def test_gpu_by_name_equals_spec_and_per_row_arguments():
    cfgs = synthetic_configs("bmm", 20)
    a = F.build_features("bmm", cfgs, "t4", "fp16", "forward")
    b = F.build_features("bmm", cfgs, gpu_spec("t4"), ["fp16"] * 20, np.array(["forward"] * 20))
    np.testing.assert_array_equal(a, b)
    prec = np.where(np.arange(20) % 2 == 0, "fp32", "fp16")
    mixed = F.build_features("bmm", cfgs, "t4", prec, "forward")
    np.testing.assert_array_equal(mixed[1::2], a[1::2])
    np.testing.assert_array_equal(mixed[::2], F.build_features("bmm", cfgs, "t4", "fp32", "forward")[::2])


def _cols(frame: pd.DataFrame) -> dict:
    return {c: frame[c].to_numpy(dtype=float) for c in frame.columns}


def test_roofline_monotonic_in_flops_and_exact_when_compute_bound():
    m = np.array([64, 128, 256, 512, 1024, 2048, 4096, 8192])
    cfgs = pd.DataFrame({"batch": 8, "m": m, "k": 4096, "n": 4096})
    spec = gpu_spec("a100-pcie-40gb")
    roof = F.roofline_ms("bmm", cfgs, spec, "fp32", "forward")
    fl = physics.flops("bmm", _cols(cfgs), "forward")
    assert np.all(np.diff(fl) > 0) and np.all(np.diff(roof) > 0)
    # large GEMMs are compute bound: roofline = flops / peak
    np.testing.assert_allclose(roof[-1], fl[-1] / (spec["fp32_tflops"] * 1e12) * 1e3, rtol=1e-12)
    # tiny ops are memory bound: roofline = bytes / bandwidth
    tiny = pd.DataFrame({"batch": [1], "m": [1], "k": [1024], "n": [1]})
    by = physics.bytes_moved("bmm", _cols(tiny), "fp32", "forward")
    np.testing.assert_allclose(F.roofline_ms("bmm", tiny, spec, "fp32", "forward"),
                               by / (spec["memory_bandwidth_gbps"] * 1e9) * 1e3)


def test_feature_flops_are_gemm_flops_and_defaults_are_pytorchs():
    """FLOPs count the GEMM only (the bias enters as bytes); optional conv columns take PyTorch's defaults."""
    names = F.feature_names("conv2d")
    conv = pd.DataFrame({"batch": [2], "in_channels": [4], "out_channels": [8], "height": [10], "width": [10],
                         "kernel_h": [3], "kernel_w": [3]})
    x = F.build_features("conv2d", conv, "h200", "fp32", "forward")
    # stride 1, no padding (8 x 8 output), groups 1
    assert np.exp(x[0, names.index("log_flops")]) == pytest.approx(2 * 2 * 8 * 8 * 8 * 4 * 9)
    assert np.exp(x[0, names.index("log_out_height")]) == pytest.approx(8)
    lin = pd.DataFrame({"batch": [64, 64], "in_features": [32, 32], "out_features": [16, 16], "bias": [True, False]})
    with_bias, without = F.build_features("linear", lin, "h200", "fp32", "backward")
    lnames = F.feature_names("linear")
    assert "bias" not in lnames  # no flag to key on: the bias is traffic and a kernel
    assert with_bias[lnames.index("log_flops")] == without[lnames.index("log_flops")]
    # the backward's bias gradient reads dY (64 x 16 fp32 elements) once more
    extra = np.exp(with_bias[lnames.index("log_bytes")]) - np.exp(without[lnames.index("log_bytes")])
    assert extra == pytest.approx(64 * 16 * 4)
    rows = F.prepare("linear", lin, "h200", "fp32", "backward")
    assert rows.kernels.tolist() == [3.0, 2.0]


def test_per_gpu_differences_and_precision_peaks():
    cfgs = synthetic_configs("linear", 32)
    names = F.feature_names("linear")
    h200 = F.build_features("linear", cfgs, "h200", "fp32", "forward")
    t4 = F.build_features("linear", cfgs, "t4", "fp32", "forward")
    assert not np.allclose(h200, t4)
    config_cols = [names.index(n) for n in ("log_batch", "log_in_features", "log_out_features", "log_flops",
                                             "log_bytes")]
    np.testing.assert_array_equal(h200[:, config_cols], t4[:, config_cols])  # same op, same config features
    assert (F.roofline_ms("linear", cfgs, "h200", "fp32", "forward")
            < F.roofline_ms("linear", cfgs, "t4", "fp32", "forward")).all()
    big = pd.DataFrame({"batch": [8192], "in_features": [8192], "out_features": [8192], "bias": [False]})
    assert F.roofline_ms("linear", big, "h200", "bf16", "forward")[0] < F.roofline_ms("linear", big, "h200", "fp32",
                                                                                       "forward")[0] / 10
    # no bf16 path on a Maxwell GPU: fp32 rate, flagged
    m40 = F.build_features("linear", big, "m40", "bf16", "forward")
    assert m40[0, names.index("no_fast_path")] == 1 and m40[0, names.index("tensor_core")] == 0
    np.testing.assert_allclose(F.roofline_ms("linear", big, "m40", "bf16", "forward"),
                               physics.flops("linear", _cols(big)) / 6.84e12 * 1e3)
    h = F.build_features("linear", big, "h200", "bf16", "forward")
    assert h[0, names.index("no_fast_path")] == 0 and h[0, names.index("tensor_core")] == 1


def test_waves_and_tiles_of_the_library_schedule():
    names = F.feature_names("bmm")
    spec = gpu_spec("h200")  # 132 SMs
    cfgs = pd.DataFrame({"batch": [1, 132, 133], "m": [128] * 3, "k": [64] * 3, "n": [128] * 3})
    X = F.build_features("bmm", cfgs, spec, "bf16", "forward")
    # one 128 x 128 GEMM cannot fill 132 SMs with any tile: the smallest (64 x 64) runs 4 blocks in one wave;
    # 132 and 133 GEMMs fill the GPU with their own 128 x 128 tile: one wave, then two
    np.testing.assert_allclose(np.exp(X[:, names.index("log_waves")]), [1, 1, 2])
    np.testing.assert_allclose(np.exp(X[:, names.index("log_tile_m")]), [64, 128, 128])
    np.testing.assert_allclose(X[:, names.index("wave_efficiency")], [4 / 132, 1.0, 133 / 264])


def test_device_feature_values_are_the_feature_columns():
    cfgs = synthetic_configs("bmm", 5)
    x = F.build_features("bmm", cfgs, "l4", "bf16", "forward")
    names = F.feature_names("bmm")
    for name, value in F.device_feature_values("l4", "bf16").items():
        np.testing.assert_allclose(x[:, names.index(name)], value)
    assert set(F.device_feature_values("t4", "fp32")) == set(F.device_features())


def test_bad_inputs_name_the_field():
    cfgs = synthetic_configs("bmm", 4)
    with pytest.raises(ValueError, match="op"):
        F.build_features("matmul", cfgs, "h200", "fp32", "forward")
    with pytest.raises(ValueError, match="precision"):
        F.build_features("bmm", cfgs, "h200", "fp64", "forward")
    with pytest.raises(ValueError, match="phase"):
        F.build_features("bmm", cfgs, "h200", "fp32", ["forward"] * 3 + ["sideways"])
    with pytest.raises(ValueError, match="'k'"):
        F.build_features("bmm", cfgs.drop(columns=["k"]), "h200", "fp32", "forward")


def test_vectorised_speed():
    cfgs = synthetic_configs("linear", 200_000)
    spec = gpu_spec("h200")
    F.build_features("linear", cfgs.iloc[:100], spec, "bf16", "forward")
    t0 = time.perf_counter()
    F.build_features("linear", cfgs, spec, "bf16", "forward")
    # ~2 M rows/s on one core; generous bound for a busy shared machine
    assert time.perf_counter() - t0 < 2.0


def test_conv2d_says_how_its_algorithm_was_chosen():
    """conv2d's last input is ``cudnn_heuristic``: 0 (autotuned) unless the rows say otherwise; other ops lack it."""
    cfg = {"batch": [8, 8], "in_channels": [64, 64], "out_channels": [64, 64], "height": [56, 56],
           "width": [56, 56], "kernel_h": [3, 3], "kernel_w": [3, 3], "pad_h": [1, 1], "pad_w": [1, 1]}
    names = F.feature_names("conv2d")
    assert names[-1] == "cudnn_heuristic" and "cudnn_heuristic" not in F.feature_names("bmm")
    rows = F.prepare("conv2d", cfg, "h200", "bf16", "forward")
    assert list(F.matrix(rows)[:, -1]) == [0.0, 0.0]
    rows.heuristic = np.array([1.0, 0.0])
    x = F.matrix(rows)
    assert list(x[:, -1]) == [1.0, 0.0] and np.array_equal(x[:, :-1], F.build_features(
        "conv2d", cfg, "h200", "bf16", "forward")[:, :-1])
