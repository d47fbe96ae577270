"""The physically bounded model: no prediction under the bound or the roofline's compute time at the precision
(random configs, GPUs and weights), physics invariances of the shipped scalers, and the interval API with its bad
inputs. Configs are random test inputs; weights are random where the guarantee must hold for any weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from test_api import SAMPLES, publish_test_checkpoint
from test_physics import random_configs

from pipeline import api, gpus, physics, schema, targets
from pipeline import features as F
from pipeline.ops import get_op
from pipeline.schema import OPS, PRECISIONS

ROOT = Path(__file__).resolve().parents[1]

GPUS = ("m40", "p4", "p100", "v100", "t4", "a100", "a10", "l4", "l40s", "rtx4090", "h100", "h200", "b200",
        "h200-sm16")


@pytest.fixture(scope="module")
def random_scalers(tmp_path_factory):
    """Checkpoints with random weights (three seeds, large output scale): the bound must hold for any weights."""
    root = tmp_path_factory.mktemp("random")
    out = {}
    for op in OPS:
        for seed in range(3):
            version, weights = publish_test_checkpoint(root, op, hidden=(8,), seed=seed, promote=False)
            out[(op, seed)] = api.load_scaler(op, version=version, root=root)
    return out


@pytest.mark.parametrize("op", OPS)
def test_never_under_the_bound_or_the_compute_roofline(random_scalers, op):
    frame = pd.DataFrame(random_configs(op, 120, seed=11))
    rng = np.random.default_rng(OPS.index(op))
    for seed in range(3):
        s = random_scalers[(op, seed)]
        for gpu in rng.choice(GPUS, 5, replace=False):
            spec = gpus.gpu_spec(str(gpu))
            for precision in [p for p in PRECISIONS if gpus.supports_precision(spec, p)]:
                for phase in ("forward", "backward"):
                    ms, low, high = s.predict(frame, spec, precision, phase, return_interval=True,
                                              return_flags=True)[:3]
                    bound = F.bound_ms(op, frame, spec, precision, phase)
                    cols = {c: frame[c].to_numpy(float) for c in frame}
                    rows = F.prepare(op, frame, spec, precision, phase)
                    saving = physics.fast_algorithm_saving(op, cols, rows.device["tensor"], rows.device,
                                                           rows.element_bytes)
                    compute = physics.flops(op, cols, phase) / saving / (
                        physics.peak_tflops(spec, precision) * 1e12) * 1e3
                    assert np.all(ms >= bound) and np.all(bound >= compute * (1 - 1e-12))
                    assert np.all(low >= bound) and np.all(low <= ms) and np.all(high >= ms)


def test_the_head_reaches_neither_below_the_bound_nor_past_its_ceiling():
    rows = F.prepare("bmm", pd.DataFrame({"batch": [1, 64], "m": [1, 4096], "k": [1, 4096], "n": [1, 4096]}),
                     "h200", "bf16", "forward")
    for z in (-1e3, -30.0, 0.0, 30.0, 1e3):
        ms = targets.to_ms("bounded_utilisation", np.full((2, 2), z), rows)
        ceiling = rows.bound_s * 1e3 / targets.U_MIN + rows.kernels * targets.KERNEL_LATENCY_MAX_S * 1e3
        assert np.all(ms >= rows.bound_s * 1e3) and np.all(ms <= ceiling * (1 + 1e-9))
    for kind in ("neusight_utilisation", "log_roofline_ratio"):  # the other kinds are clamped at the bound
        ms = targets.to_ms(kind, np.full((2, targets.HEAD_OUTPUTS[kind]), 50.0), rows)
        assert np.all(ms >= rows.bound_s * 1e3)


@pytest.mark.parametrize("kind", targets.TARGET_KINDS)
def test_torch_head_is_the_numpy_head(kind):
    from pipeline.training.model import head

    rows = F.prepare("linear", pd.DataFrame(random_configs("linear", 50, seed=3)), "a100", "tf32", "backward")
    out = np.random.default_rng(0).normal(0, 3, (rows.n, targets.HEAD_OUTPUTS[kind]))
    extra = targets.aux(kind, rows)
    want = targets.output_to_target(kind, out, extra)
    got = head(kind, torch.from_numpy(out), torch.from_numpy(extra)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


# ------------------------------------------------------------------------- the shipped scalers obey physics

def _champions():
    return [op for op in OPS if (api.DEFAULT_ROOT / op / "champion.json").exists()]


@pytest.mark.parametrize("gpu,precision", [("h200", "bf16"), ("h100", "fp16"), ("a100", "fp32"), ("l4", "bf16")])
def test_bias_or_no_bias_is_within_a_few_percent(gpu, precision):
    if "linear" not in _champions():
        pytest.skip("no published linear champion")
    s = api.load_scaler("linear")
    shapes = pd.DataFrame({"batch": [4096, 8192, 2048, 16384], "in_features": [4096, 8192, 4096, 4096],
                           "out_features": [4096, 8192, 11008, 1024]})
    # forward: the bias is an epilogue read; backward: its gradient is one more kernel reading dY again (real work,
    # up to a few percent of a large GEMM's time)
    for phase, tolerance in (("forward", 0.03), ("backward", 0.08)):
        with_bias = s.predict(shapes.assign(bias=True), gpu, precision, phase, return_flags=True)[0]
        without = s.predict(shapes.assign(bias=False), gpu, precision, phase, return_flags=True)[0]
        np.testing.assert_allclose(with_bias, without, rtol=tolerance)


@pytest.mark.parametrize("op", ["bmm", "linear", "conv2d", "lstm"])
def test_more_work_is_never_predicted_much_faster(op):
    """Tripling the batch (three times the work of the same shape) never cuts the predicted time by more than 1.5x.
    Three, not two: doubling a dimension can make it 16-byte aligned, and an aligned GEMM may truly run on a
    kernel several times faster (``physics.ALIGN_BYTES``); an odd factor keeps every dimension's alignment."""
    if op not in _champions():
        pytest.skip(f"no published {op} champion")
    s = api.load_scaler(op)
    frame = pd.DataFrame(random_configs(op, 150, seed=21))
    tripled = frame.assign(batch=frame["batch"] * 3)
    for gpu, precision in (("h200", "bf16"), ("t4", "fp32"), ("a100", "tf32")):
        for phase in ("forward", "backward"):
            base = s.predict(frame, gpu, precision, phase, return_flags=True)[0]
            more = s.predict(tripled, gpu, precision, phase, return_flags=True)[0]
            assert np.all(more >= base / 1.5), np.min(more / base)


# ------------------------------------------------------------------------------------------ the interval API

def test_interval_api_shapes_total_and_launch_floor(random_scalers):
    s = random_scalers[("bmm", 0)]
    cfg = SAMPLES["bmm"]
    ms, low, high = s.predict(cfg, "h100", "bf16", "forward", return_interval=True)
    assert ms.shape == low.shape == high.shape == (3,) and np.all((low <= ms) & (ms <= high))
    np.testing.assert_array_equal(ms, s.predict(cfg, "h100", "bf16", "forward"))
    ms4, low4, high4, flags = s.predict(cfg, "h100", "bf16", "forward", return_interval=True, return_flags=True)
    np.testing.assert_array_equal(ms4, ms) and flags.dtype == bool
    # seen GPU (h100-sxm is in the card's training GPUs) vs unseen: the unseen quantiles are wider in the card
    _, lo_u, hi_u = s.predict(cfg, "h200", "bf16", "forward", return_interval=True)
    ms_u = s.predict(cfg, "h200", "bf16", "forward")
    assert np.all(hi_u / ms_u > high / ms)
    tot, tlo, thi = s.predict(cfg, "h100", "bf16", "total", return_interval=True)
    fwd = s.predict(cfg, "h100", "bf16", "forward", return_interval=True)
    bwd = s.predict(cfg, "h100", "bf16", "backward", return_interval=True)
    np.testing.assert_allclose(tot, fwd[0] + bwd[0]) and np.testing.assert_allclose(thi, fwd[2] + bwd[2])
    floored = s.predict(cfg, "h100", "bf16", "forward", launch_floor=True)
    np.testing.assert_allclose(floored, np.maximum(ms, 0.02))


@pytest.mark.parametrize("kwargs,match", [
    ({"return_interval": "yes"}, r"return_interval: must be True or False"),
    ({"return_flags": 1}, r"return_flags: must be True or False"),
    ({"launch_floor": None}, r"launch_floor: must be True or False"),
    ({"precision": "int8", "return_interval": True}, r"precision: unknown precision 'int8'"),
    ({"phase": "sideways", "return_interval": True}, r"phase: unknown phase 'sideways'"),
])
def test_interval_bad_inputs(random_scalers, kwargs, match):
    with pytest.raises(api.InputError, match=match):
        random_scalers[("bmm", 0)].predict(SAMPLES["bmm"], "h100", **kwargs)


def test_a_card_without_interval_or_floor_says_so(tmp_path):
    from test_api import random_mlp

    version, _ = publish_test_checkpoint(tmp_path, "bmm")
    s = api.load_scaler("bmm", version=version, root=tmp_path)
    card = {k: v for k, v in s.card.items() if k not in ("interval", "launch_floor_ms")}
    bare = api.Scaler("bmm", version, card, random_mlp(len(card["features"]["names"]), (16,), 0))
    with pytest.raises(api.InputError, match=r"return_interval: bmm v1 has no calibrated interval"):
        bare.predict(SAMPLES["bmm"], "h100", return_interval=True)
    with pytest.raises(api.InputError, match=r"launch_floor: bmm v1 has no launch floor"):
        bare.predict(SAMPLES["bmm"], "h100", launch_floor=True)


@pytest.mark.parametrize("op,floor", [("conv2d", 1.0), ("linear", 1.0), ("bmm", 0.999), ("lstm", 1.0)])
def test_no_shipped_row_runs_below_its_bound(op, floor):
    """The bound is physics, so a measured GEMM or convolution under it means the physics is wrong: the H200's
    fp32 convolutions with 10x10 and 11x11 kernels ran FFT at 0.09-0.7x the direct bound, and strided 1x1 ones
    read a third of the input rows, until the bound allowed for both; 8 fp32 LSTMs of hidden 7-101 over 155-244
    steps ran at 0.63-0.99x until it took each layer's input projection as one GEMM over all steps (cuDNN's
    schedule). (bmm: one row sits at the bound.)"""
    rows = schema.read_dataset(ROOT / "datasets", ops=[op], status="ok")
    rows = rows[rows["source"] == "own"]
    assert len(rows) > 1000
    cols = list(get_op(op).columns)
    for (gpu, precision, phase), group in rows.groupby(["gpu", "precision", "phase"]):
        ratio = group["time_ms"].to_numpy() / F.bound_ms(op, group[cols], gpu, precision, phase)
        assert ratio.min() >= floor, (gpu, precision, phase, group.iloc[int(ratio.argmin())][cols].to_dict())
