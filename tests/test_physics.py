"""pipeline.physics, and every module that uses it agreeing with it exactly (configs here are random test inputs)."""

from __future__ import annotations

import functools
from collections import namedtuple

import numpy as np
import pandas as pd
import pytest

from pipeline import features as F
from pipeline import gpus, physics
from pipeline.ingest import node_config
from pipeline.ops import get_op
from pipeline.schema import OP_CONFIG_COLUMNS, PHASES, PRECISIONS
from pipeline.step import labels, wave

OPS = tuple(OP_CONFIG_COLUMNS)
N_CONFIGS = 300


def random_configs(op: str, n: int = N_CONFIGS, seed: int = 0) -> list[dict]:
    """``n`` valid configs of ``op`` with Python ints/bools (strides, padding, dilation, groups, bias varied)."""
    rng = np.random.default_rng([seed, OPS.index(op)])
    r = lambda lo, hi: int(rng.integers(lo, hi + 1))  # noqa: E731
    out = []
    while len(out) < n:
        if op == "bmm":
            cfg = {"batch": r(1, 64), "m": r(1, 2048), "k": r(1, 2048), "n": r(1, 2048)}
        elif op == "linear":
            cfg = {"batch": r(1, 8192), "in_features": r(1, 8192), "out_features": r(1, 8192),
                   "bias": bool(rng.random() < 0.5)}
        elif op == "lstm":
            cfg = {"batch": r(1, 128), "seq_len": r(1, 64), "input_size": r(1, 1024), "hidden_size": r(1, 1024),
                   "num_layers": r(1, 4), "bidirectional": bool(rng.random() < 0.3), "bias": bool(rng.random() < 0.9)}
        else:
            groups = int(rng.choice([1, 1, 1, 2, 4, 8]))
            cfg = {"batch": r(1, 32), "in_channels": groups * r(1, 64), "out_channels": groups * r(1, 64),
                   "height": r(4, 96), "width": r(4, 96), "kernel_h": r(1, 7), "kernel_w": r(1, 7),
                   "stride_h": r(1, 3), "stride_w": r(1, 3), "pad_h": r(0, 3), "pad_w": r(0, 3),
                   "dilation_h": r(1, 2), "dilation_w": r(1, 2), "groups": groups, "bias": bool(rng.random() < 0.5)}
            if min(physics.conv_output_hw(cfg)) < 1:
                continue
        out.append(cfg)
    return out


def _columns(cfgs: list[dict]) -> dict[str, np.ndarray]:
    return {c: np.array([cfg[c] for cfg in cfgs], dtype=float) for c in cfgs[0]}


# ------------------------------------------------------------------------------------------- the conventions

def test_known_formulas_and_the_elementwise_convention():
    assert physics.flops("bmm", {"batch": 2, "m": 3, "k": 5, "n": 7}) == 2 * 2 * 3 * 5 * 7
    lin = {"batch": 10, "in_features": 20, "out_features": 30, "bias": True}
    assert physics.flops("linear", lin) == 2 * 10 * 20 * 30                       # GEMM only by default
    assert physics.flops("linear", lin, include_elementwise=True) == 2 * 10 * 20 * 30 + 10 * 30  # + bias adds
    conv = {"batch": 2, "in_channels": 4, "out_channels": 8, "height": 10, "width": 10, "kernel_h": 3,
            "kernel_w": 3, "stride_h": 1, "stride_w": 1, "pad_h": 1, "pad_w": 1, "dilation_h": 1, "dilation_w": 1,
            "groups": 2, "bias": False}
    assert physics.flops("conv2d", conv) == 2 * 2 * 8 * 10 * 10 * (4 // 2) * 9
    assert physics.flops("conv2d", conv, "backward") == 2 * physics.flops("conv2d", conv)
    assert physics.flops("conv2d", conv, "backward", gradients=1) == physics.flops("conv2d", conv)
    lstm = {"batch": 3, "seq_len": 5, "input_size": 7, "hidden_size": 11, "num_layers": 1, "bidirectional": False,
            "bias": True}
    gates = 2 * 3 * 4 * 11 * (7 + 11) * 5
    assert physics.flops("lstm", lstm) == gates
    assert physics.flops("lstm", lstm, include_elementwise=True) == gates + 12 * 3 * 11 * 5
    w = physics.work("conv2d", conv)
    assert (w.g, w.m, w.n, w.k, w.steps) == (2, 2 * 10 * 10, 4, 2 * 9, 1)
    assert physics.tiles(w, 128) == 2 * 2 * 1 and physics.waves(4, 132) == 1


def test_winograd_cuts_the_bound_of_3x3_stride_1_convolutions_off_the_tensor_cores():
    """A 3x3 stride-1 undilated conv2d may take a quarter of its GEMM FLOPs (fp32 rows ran down to 0.38x the GEMM
    bound); any other kernel, stride or dilation, and every Tensor-Core row, keeps the full count."""
    base = {"batch": 64, "in_channels": 256, "out_channels": 256, "height": 56, "width": 56, "kernel_h": 3,
            "kernel_w": 3, "stride_h": 1, "stride_w": 1, "pad_h": 1, "pad_w": 1, "dilation_h": 1, "dilation_w": 1,
            "groups": 1, "bias": False}
    others = [{"kernel_h": 5, "kernel_w": 5, "pad_h": 2, "pad_w": 2}, {"stride_h": 2, "stride_w": 2},
              {"dilation_h": 2, "dilation_w": 2, "pad_h": 2, "pad_w": 2}, {"kernel_w": 1, "pad_w": 0}]
    frame = pd.DataFrame([base] + [{**base, **o} for o in others])
    cols = {c: frame[c].to_numpy(float) for c in frame}
    np.testing.assert_array_equal(physics.fast_algorithm_saving("conv2d", cols, np.zeros(5)), [4, 1, 1, 1, 1])
    np.testing.assert_array_equal(physics.fast_algorithm_saving("conv2d", cols, np.ones(5)), np.ones(5))
    lin = {"batch": np.array([8.0]), "in_features": np.array([9.0]), "out_features": np.array([3.0])}
    np.testing.assert_array_equal(physics.fast_algorithm_saving("linear", lin, np.zeros(1)), [1])
    many = {"batch": np.arange(1.0, 4.0), "in_features": np.full(3, 9.0), "out_features": np.full(3, 3.0)}
    assert physics.fast_algorithm_saving("linear", many, 0.0).shape == (3,)  # one per row, as for conv2d
    assert physics.fast_algorithm_saving("conv2d", cols, 0.0).shape == (5,)
    spec = gpus.gpu_spec("h200")
    fp32 = F.prepare("conv2d", frame, spec, "fp32", "forward")
    gemm_s = physics.flops("conv2d", cols) / (physics.peak_tflops(spec, "fp32") * 1e12)
    saving = physics.fast_algorithm_saving("conv2d", cols, np.zeros(5), fp32.device, fp32.element_bytes)
    assert saving[0] >= 4 and saving[1] > 1            # with the device's numbers FFT counts too (its own test)
    np.testing.assert_array_equal(saving[2:4], [1, 1])  # stride 2, dilation 2: neither Winograd nor FFT
    assert fp32.bound_s[0] == max(fp32.wave_s[0], gemm_s[0] / saving[0], fp32.memory_l2_s[0])
    assert gemm_s[0] / saving[0] <= fp32.bound_s[0] < gemm_s[0] / 3.9  # compute bound, below a quarter
    assert np.all(fp32.bound_s[2:4] >= gemm_s[2:4] * (1 - 1e-12))
    bf16 = F.prepare("conv2d", frame, spec, "bf16", "forward")  # Tensor Cores: implicit GEMM, full FLOPs
    assert bf16.bound_s[0] >= physics.flops("conv2d", cols)[0] / (physics.peak_tflops(spec, "bf16") * 1e12)
    p100 = F.prepare("conv2d", frame, gpus.gpu_spec("p100"), "fp16", "forward")  # fp16 on P100: no Tensor Cores
    assert p100.device["tensor"][0] == 0
    assert p100.compute_s[0] / p100.bound_s[0] == pytest.approx(4.0, rel=0.03)


def _conv(**kw):
    base = {"batch": 1, "in_channels": 1, "out_channels": 1, "height": 25, "width": 25, "kernel_h": 8,
            "kernel_w": 8, "stride_h": 1, "stride_w": 1, "pad_h": 0, "pad_w": 0, "dilation_h": 1, "dilation_w": 1,
            "groups": 1, "bias": False}
    return {k: np.array([float(v)]) for k, v in {**base, **kw}.items()}


def test_fft_bound_is_the_best_of_the_whole_and_the_tiled_transform():
    """An 8x8 kernel over 25x25 pixels (18x18 outputs): the whole transform has 25 x 13 frequencies; a 16-tile
    yields 9x9 outputs (4 tiles of 16 x 9 frequencies), a 32-tile all 18x18 (one tile of 32 x 17), a 64-tile
    one of 64 x 33. At one FLOP/s and unbounded bandwidth the seconds are 8 x frequencies."""
    one = physics.fft_seconds(_conv(), fp32_flops=1.0, bandwidth=np.inf, element_bytes=4)
    assert one[0] == 8 * min(25 * 13, 4 * 16 * 9, 32 * 17, 64 * 33) == 8 * 325
    many = physics.fft_seconds(_conv(batch=4, in_channels=6, out_channels=10, groups=2), 1.0, np.inf, 4)
    assert many[0] == 8 * 4 * 10 * 3 * 325                     # batch x out x in/groups products per frequency
    memory = physics.fft_seconds(_conv(batch=2, in_channels=3, out_channels=5), np.inf, 1.0, 2)
    assert memory[0] == min(2 * 2 * (2 * (3 + 5) * f + 15 * g)   # complex input, output and filters, once
                            for f, g in ((325, 325), (4 * 144, 144), (544, 544), (2112, 2112)))
    for blocked in ({"stride_h": 2}, {"stride_w": 2}, {"dilation_h": 2}, {"dilation_w": 2}):
        assert physics.fft_seconds(_conv(**blocked), 1.0, 1.0, 4)[0] == np.inf


def test_fft_cuts_the_bound_of_large_kernels_over_small_inputs_and_spares_the_tensor_cores():
    """The H200's fp32 10x10 convolution over 21 x 21 pixels that ran at 0.09x the direct bound
    (reports/gpu_checks/conv_algorithms.md) may run 10x under it by FFT; in bf16 the FFT still runs on the FMA
    units, so against the Tensor Cores' direct rate it saves a fifteenth as much (never below 1)."""
    cfg = _conv(batch=206, in_channels=298, out_channels=317, height=21, width=21, kernel_h=10, kernel_w=10)
    frame = pd.DataFrame(cfg)
    fp32 = F.prepare("conv2d", frame, "h200", "fp32", "forward")
    saving = physics.fast_algorithm_saving("conv2d", cfg, fp32.device["tensor"], fp32.device, fp32.element_bytes)
    assert saving[0] > 10
    assert fp32.bound_s[0] == pytest.approx(max(fp32.memory_l2_s[0], fp32.compute_s[0] / saving[0],
                                                fp32.wave_s[0]), rel=1e-12)
    bf16 = F.prepare("conv2d", frame, "h200", "bf16", "forward")
    tensor_saving = physics.fast_algorithm_saving("conv2d", cfg, bf16.device["tensor"], bf16.device, 2)[0]
    assert 1 <= tensor_saving < saving[0] / 10
    small = {**cfg, "kernel_h": np.array([1.0]), "kernel_w": np.array([1.0])}   # a 1x1 kernel: nothing to save
    assert physics.fast_algorithm_saving("conv2d", small, 0.0, fp32.device, 4)[0] == 1
    assert physics.fast_algorithm_saving("conv2d", cfg, 0.0)[0] == 1     # without the device: Winograd only


def test_a_kernel_smaller_than_its_stride_reads_only_the_pixels_its_outputs_need():
    """A 1x1 kernel at stride 3 over 9 x 9 pixels reads 3 of 9 rows and 3 of 9 columns; its backward still writes
    the whole input gradient."""
    cfg = {k: v[0] for k, v in _conv(in_channels=4, out_channels=2, height=9, width=9, kernel_h=1, kernel_w=1,
                                     stride_h=3, stride_w=3).items()}
    w = physics.work("conv2d", cfg)
    x, weights, y = 4 * 81, 2 * 4, 2 * 9
    assert w.forward_elements == x / 9 + weights + y
    assert w.backward_elements == y + x / 9 + x + 2 * weights
    dense = physics.work("conv2d", {**cfg, "kernel_h": 3, "kernel_w": 3})  # 3x3 at stride 3: every pixel
    assert dense.forward_elements == x + 4 * 2 * 9 + y


def test_an_lstm_bound_runs_each_layers_input_projection_as_one_gemm():
    """cuDNN projects a layer's whole input sequence in one GEMM and runs only the recurrent GEMM per step (and
    backward, the weight gradients over all steps): the GEMMs add up to the op's FLOPs and weights, and a small
    hidden size over a long sequence gets a bound well below the one that repeats the per-step view (an H200
    fp32 LSTM of hidden 7 over 244 steps ran under that one)."""
    cfg = {"batch": 64, "seq_len": 244, "input_size": 900, "hidden_size": 7, "num_layers": 2, "bidirectional": 1,
           "bias": 1}
    op_work = physics.work("lstm", cfg)
    for backward in (False, True):
        gemms = physics.lstm_gemms(cfg, backward)
        assert sum(g.gemm_flops for g in gemms) == pytest.approx(op_work.gemm_flops * (2 if backward else 1))
        assert sum(g.weight_elements for g in gemms) == pytest.approx(op_work.weight_elements)
    first, later, recurrent = physics.lstm_gemms(cfg)
    assert (first.m, first.k, first.steps) == (244 * 64, 900, 1) and (later.k, later.steps) == (14, 1)
    assert (recurrent.m, recurrent.k, recurrent.steps) == (64, 7, 488) and first.g == 2 and first.n == 28
    dw_hh = physics.lstm_gemms(cfg, True)[-1]
    assert (dw_hh.m, dw_hh.n, dw_hh.k, dw_hh.steps) == (28, 7, 244 * 64, 2)   # once per layer, over all steps
    one_layer = physics.lstm_gemms({**cfg, "num_layers": 1})
    assert one_layer[1].gemm_flops == 0 and one_layer[1].weight_elements == 0
    frame = {k: [v, v, v] for k, v in cfg.items()}
    rows = F.prepare("lstm", frame, "h200", ["fp32", "bf16", "fp32"], ["forward", "forward", "backward"])
    per_step = rows.finest.seconds(rows.work, rows.device["peak"] / rows.device["sm"])
    assert rows.wave_s[0] < 0.5 * per_step[0]
    assert np.all(rows.wave_s >= rows.flops / rows.device["peak"])
    alone = F.prepare("lstm", {k: [v] for k, v in cfg.items()}, "h200", "bf16", "forward")
    assert rows.wave_s[1] == pytest.approx(alone.wave_s[0])   # each row on its own precision's tiles
    assert rows.wave_s[0] != pytest.approx(rows.wave_s[1])


@pytest.mark.parametrize("op", OPS)
def test_phases_and_precisions(op):
    c = _columns(random_configs(op, 50))
    np.testing.assert_array_equal(physics.flops(op, c, "backward"), 2 * physics.flops(op, c, "forward"))
    assert np.all(physics.bytes_moved(op, c, "fp32", "backward") > physics.bytes_moved(op, c, "fp32", "forward"))
    np.testing.assert_array_equal(physics.bytes_moved(op, c, "bf16") * 2, physics.bytes_moved(op, c, "fp32"))
    np.testing.assert_array_equal(physics.footprint_elements(op, c), 2 * physics.work(op, c).forward_elements)
    # per-row phases and precisions give the same numbers as one at a time
    phase = np.where(np.arange(50) % 2 == 0, "forward", "backward")
    np.testing.assert_array_equal(physics.flops(op, c, phase)[1::2], physics.flops(op, c, "backward")[1::2])
    prec = np.where(np.arange(50) % 2 == 0, "fp16", "tf32")
    np.testing.assert_array_equal(physics.bytes_moved(op, c, prec)[::2], physics.bytes_moved(op, c, "fp16")[::2])


def test_conv_output_size_is_pytorchs():
    torch = pytest.importorskip("torch")
    for cfg in random_configs("conv2d", 100, seed=3):
        x = torch.empty(1, cfg["in_channels"], cfg["height"], cfg["width"], device="meta")
        w = torch.empty(cfg["out_channels"], cfg["in_channels"] // cfg["groups"], cfg["kernel_h"], cfg["kernel_w"],
                        device="meta")
        y = torch.nn.functional.conv2d(x, w, None, (cfg["stride_h"], cfg["stride_w"]), (cfg["pad_h"], cfg["pad_w"]),
                                       (cfg["dilation_h"], cfg["dilation_w"]), cfg["groups"])
        assert tuple(y.shape[2:]) == physics.conv_output_hw(cfg)


def test_peak_rates_have_one_fallback_and_the_api_refuses_what_a_gpu_cannot_run():
    for name in gpus.known_gpus():
        spec = gpus.gpu_spec(name)
        for p in PRECISIONS:
            rate = physics.peak_tflops(spec, p)
            if gpus.supports_precision(spec, p):
                assert rate == spec[f"{p}_tflops"] == gpus.peak_tflops(spec, p)
            else:  # no fast path: the fp32 rate, and the registry refuses it
                assert rate == spec["fp32_tflops"] and not physics.has_fast_path(spec, p)
                with pytest.raises(ValueError, match=f"no {p} path"):
                    gpus.peak_tflops(spec, p)
            assert physics.compute_tflops(spec, p, tensor_core=False) == spec["fp32_tflops"]
    with pytest.raises(ValueError, match="precision: unknown precision 'fp8'"):
        physics.peak_tflops(gpus.gpu_spec("h100"), "fp8")


# --------------------------------------------------------------------------- every caller agrees with physics

@pytest.mark.parametrize("op", OPS)
def test_op_modules_agree_with_physics(op):
    cfgs = random_configs(op)
    spec = get_op(op)
    scalar = np.array([spec.flops(cfg) for cfg in cfgs])
    np.testing.assert_array_equal(scalar, physics.flops(op, _columns(cfgs)))      # scalar == vectorised
    np.testing.assert_array_equal([spec.memory_elems(cfg) for cfg in cfgs],
                                  physics.footprint_elements(op, _columns(cfgs)))


@pytest.mark.parametrize("op", OPS)
def test_features_agree_with_physics(op):
    cfgs = random_configs(op)
    c, names = _columns(cfgs), F.feature_names(op)
    frame = pd.DataFrame(cfgs)
    w = physics.work(op, c)
    for gpu in ("h200", "v100", "m40"):
        spec = gpus.gpu_spec(gpu)
        for precision in PRECISIONS:
            for phase in PHASES:
                x = F.build_features(op, frame, spec, precision, phase)
                col = functools.partial(_feature, x, names)
                fl = physics.flops(op, c, phase)
                np.testing.assert_allclose(col("log_flops"), np.maximum(fl, 1.0), rtol=1e-12)
                # bytes: each tensor once, plus a linear bias's traffic
                extra = physics.bias_elements(op, c, phase == "backward") * physics.element_bytes(precision)
                np.testing.assert_allclose(col("log_bytes"), physics.bytes_moved(op, c, precision, phase) + extra,
                                           rtol=1e-12)
                lib = physics.library_schedule(w, spec["sm_count"], physics.gemm_tile_set(spec, precision))
                np.testing.assert_allclose(col("log_tiles_per_sm"), lib.tiles / spec["sm_count"], rtol=1e-12)
                np.testing.assert_allclose(col("log_peak_over_fp32"),
                                           physics.peak_tflops(spec, precision) / spec["fp32_tflops"], rtol=1e-12)
        np.testing.assert_allclose(np.exp(x[:, names.index("log_gemm_k")]), w.k * np.ones(len(cfgs)), rtol=1e-12)
    if op == "bmm":  # the features' FLOPs are the op modules' FLOPs exactly
        x = F.build_features(op, frame, "h200", "fp32", "forward")
        np.testing.assert_allclose(np.exp(x[:, names.index("log_flops")]), [get_op(op).flops(cfg) for cfg in cfgs],
                                   rtol=1e-12)


def _aten_args(op: str, cfg: dict, phase: str, torch):
    """(ATen op name, arguments) of the kernel a traced step runs for ``cfg`` in ``phase``; meta tensors."""
    t = lambda *shape: torch.empty(*shape, device="meta")  # noqa: E731
    if op == "linear":
        x, w = t(cfg["batch"], cfg["in_features"]), t(cfg["in_features"], cfg["out_features"])
        return ("addmm", {"self": t(cfg["out_features"]), "mat1": x, "mat2": w}) if cfg["bias"] else \
            ("mm", {"self": x, "mat2": w})
    if op == "bmm":
        return "bmm", {"self": t(cfg["batch"], cfg["m"], cfg["k"]), "mat2": t(cfg["batch"], cfg["k"], cfg["n"])}
    if op == "conv2d":
        args = {"input": t(cfg["batch"], cfg["in_channels"], cfg["height"], cfg["width"]),
                "weight": t(cfg["out_channels"], cfg["in_channels"] // cfg["groups"], cfg["kernel_h"], cfg["kernel_w"]),
                "stride": [cfg["stride_h"], cfg["stride_w"]], "padding": [cfg["pad_h"], cfg["pad_w"]],
                "dilation": [cfg["dilation_h"], cfg["dilation_w"]], "transposed": False, "groups": cfg["groups"]}
        if phase == "forward":
            return "convolution", {**args, "bias": t(cfg["out_channels"]) if cfg["bias"] else None}
        return "convolution_backward", {**args, "bias_sizes": [cfg["out_channels"]] if cfg["bias"] else None,
                                        "output_mask": [True, True, cfg["bias"]]}
    dirs, h = 2 if cfg["bidirectional"] else 1, cfg["hidden_size"]
    weights = [t(4 * h, 1)] * (cfg["num_layers"] * dirs * (4 if cfg["bias"] else 2))
    return ("_cudnn_rnn" if phase == "forward" else "_cudnn_rnn_backward",
            {"input": t(cfg["batch"], cfg["seq_len"], cfg["input_size"]), "weight": weights, "mode": 2,
             "hidden_size": h, "proj_size": 0, "num_layers": cfg["num_layers"], "batch_first": True,
             "bidirectional": cfg["bidirectional"], "batch_sizes": None})


@pytest.mark.parametrize("op", OPS)
def test_the_step_tracker_agrees_with_physics(op):
    torch = pytest.importorskip("torch")
    from pipeline.step.classify import _classify, gemm_blocks

    phases = PHASES if op in ("conv2d", "lstm") else ("forward",)  # GEMMs of a backward are forward-type GEMMs
    for cfg in random_configs(op, 150, seed=1):
        for phase in phases:
            kind, got, scaler_phase, flops, _ = _classify(*_aten_args(op, cfg, phase, torch))
            assert (kind, got, scaler_phase) == (op, cfg, phase)
            assert flops == physics.flops(op, cfg, phase) == (2 if phase == "backward" else 1) * get_op(op).flops(cfg)
        if op != "lstm":
            assert gemm_blocks(op, cfg) == physics.gemm_tiles(op, cfg, physics.BLOCK_TILE)


_Node = namedtuple("_Node", "op target fn in_shapes out_shape fw_latency bw_latency")


@pytest.mark.parametrize("op", ("linear", "bmm"))
def test_the_node_table_reader_agrees_with_physics(op):
    rows = []
    for cfg in random_configs(op, seed=2):
        if op == "linear":
            node = _Node("call_module", "fc", "Linear", [[cfg["batch"], cfg["in_features"]]],
                         [cfg["batch"], cfg["out_features"]], 1.0, 2.0)
            cfg = {**cfg, "bias": True}  # nn.Linear nodes carry no bias flag: counted with one
        else:
            node = _Node("call_function", "matmul", "matmul", [[cfg["batch"], cfg["m"], cfg["k"]],
                                                     [cfg["batch"], cfg["k"], cfg["n"]]],
                         [cfg["batch"], cfg["m"], cfg["n"]], 1.0, 2.0)
        kind, got = node_config(node)  # the one node-table parser, as labels uses it
        assert (kind, got) == (op, cfg)
        for row in labels._gemm_rows(node, {}, kind, got):
            rows.append((row["flops"], physics.flops(op, cfg, row["phase"]), row["bytes"],
                         physics.bytes_moved(op, cfg, "fp32", row["phase"]),
                         (2 if row["phase"] == "backward" else 1) * get_op(op).flops(cfg)))
    flops, expected, nbytes, expected_bytes, from_ops = np.array(rows).T
    np.testing.assert_array_equal(flops, expected)
    np.testing.assert_array_equal(flops, from_ops)
    np.testing.assert_array_equal(nbytes, expected_bytes)


def test_wave_scaling_uses_the_physics_rates():
    for origin, dest in (("v100", "h100"), ("t4", "a100"), ("m40", "l4")):
        o, d = gpus.gpu_spec(origin), gpus.gpu_spec(dest)
        for p in PRECISIONS:
            for tc in (False, True):
                ridge = physics.compute_tflops(d, p, tc) * 1e12 / (d["memory_bandwidth_gbps"] * 1e9)
                assert wave.ridge_point(d, p, tc) == pytest.approx(ridge, rel=1e-15)
                # compute-bound, far above the ridge: the peak ratio of the compute class, or refused
                pred, method = wave.scale_other(1.0, 1e18, 1.0, o, d, p, tensor_core=tc, mode="roofline")
                if gpus.supports_precision(o, p) and gpus.supports_precision(d, p):
                    assert method[0] == "wave-compute"
                    assert pred[0] == pytest.approx(physics.compute_tflops(o, p, tc) / physics.compute_tflops(d, p, tc))
                else:
                    assert method[0] == "unsupported" and np.isnan(pred[0])


def _feature(x, names, name):
    """A feature column of ``x`` back on its natural scale (the features hold logs)."""
    return np.exp(x[:, names.index(name)])


def test_alignment_is_the_rows_power_of_two_bytes_up_to_sixteen():
    dims = np.array([8, 4096, 4095, 6, 12, 1])
    assert physics.alignment_bytes(dims, 2.0).tolist() == [16, 16, 2, 4, 8, 2]
    assert physics.alignment_bytes(dims, 4.0).tolist() == [16, 16, 4, 8, 16, 4]
    conv = {"batch": 32, "in_channels": 3, "out_channels": 64, "height": 224, "width": 224, "kernel_h": 7,
            "kernel_w": 7, "stride_h": 2, "stride_w": 2, "pad_h": 3, "pad_w": 3, "dilation_h": 1, "dilation_w": 1,
            "groups": 1}
    assert physics.alignment_dims("conv2d", conv) == (64, 3)
    assert physics.alignment_dims("bmm", {"batch": 8, "m": 5, "n": 6, "k": 7}) == (6, 7)
    assert physics.alignment_dims("linear", {"batch": 5, "in_features": 7, "out_features": 6, "bias": 1}) == (6, 7)


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_an_odd_leading_dimension_shows_in_the_alignment_features_on_tensor_cores(precision):
    shapes = pd.DataFrame({"batch": [4095, 4095], "in_features": [4096, 4095], "out_features": [4096, 4096],
                           "bias": [1, 1]})
    x = F.build_features("linear", shapes, "h200", precision, "forward")
    names = F.feature_names("linear")
    k, n = x[:, names.index("log2_align_k")], x[:, names.index("log2_align_n")]
    assert n.tolist() == [0.0, 0.0]  # the batch (m) strides nothing: 4095 tokens are no misalignment
    # bf16 runs on Tensor Cores: 4095 elements of 2 bytes are 2-byte aligned, log2(2 / 16) = -3; fp32 does not
    assert k.tolist() == ([0.0, -3.0] if precision == "bf16" else [0.0, 0.0])


def test_fast_algorithm_saving_gives_the_same_factor_with_the_callers_work():
    """``prepare`` hands its ``work`` to the FFT/Winograd saving instead of having it computed again: the factor must
    not change, on FFT-eligible rows (large kernels, small inputs) and others alike."""
    rng = np.random.default_rng(3)
    n = 400
    k = rng.integers(1, 12, n).astype(float)
    cols = {"batch": rng.integers(1, 256, n).astype(float), "in_channels": rng.integers(1, 512, n).astype(float),
            "out_channels": rng.integers(1, 512, n).astype(float), "height": rng.integers(8, 120, n).astype(float),
            "width": rng.integers(8, 120, n).astype(float), "kernel_h": k, "kernel_w": k,
            "stride_h": rng.integers(1, 3, n).astype(float), "stride_w": rng.integers(1, 3, n).astype(float),
            "pad_h": k // 2, "pad_w": k // 2, "dilation_h": np.ones(n), "dilation_w": np.ones(n),
            "groups": np.ones(n), "bias": np.zeros(n)}
    dev = {"peak": np.full(n, 67e12), "fp32": 67e12, "bandwidth": 4.8e12}
    alone = physics.fast_algorithm_saving("conv2d", cols, np.zeros(n), dev, 4.0)
    given = physics.fast_algorithm_saving("conv2d", cols, np.zeros(n), dev, 4.0, physics.work("conv2d", cols))
    np.testing.assert_array_equal(alone, given)
    assert (alone > physics.WINOGRAD_SAVING).any()   # some rows take FFT's larger saving: the path is exercised
