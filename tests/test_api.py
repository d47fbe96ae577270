"""The prediction API: contract, input validation, checksum refusal, light imports, numerical agreement."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeline import api, gpus, schema, targets
from pipeline import checkpoint as ck
from pipeline import features as F
from pipeline.api import InputError, Scaler, load_scaler

REPO = Path(__file__).resolve().parent.parent

SAMPLES = {
    "bmm": [{"batch": 8, "m": 512, "k": 256, "n": 128}, {"batch": 1, "m": 64, "k": 64, "n": 64},
            {"batch": 32, "m": 128, "k": 1024, "n": 512}],
    "linear": [{"batch": 64, "in_features": 1024, "out_features": 4096}, {"batch": 1, "in_features": 16,
                                                                          "out_features": 16, "bias": False}],
    "conv2d": [{"batch": 32, "in_channels": 64, "out_channels": 64, "height": 56, "width": 56, "kernel_size": 3,
                "padding": 1}, {"batch": 8, "in_channels": 32, "out_channels": 64, "height": 28, "width": 28,
                                "kernel_h": 1, "kernel_w": 1, "stride_h": 2, "stride_w": 2, "groups": 2}],
    "lstm": [{"batch": 16, "seq_len": 32, "input_size": 256, "hidden_size": 256},
             {"batch": 4, "seq_len": 8, "input_size": 64, "hidden_size": 128, "num_layers": 2,
              "bidirectional": True}],
}
RANGE_GPUS = ("v100", "a100", "h100", "l4", "t4")
# An interval entry as a training run writes it (made-up quantiles: the API's arithmetic is under test).
TEST_INTERVAL = {"level": 0.8, "small_ms": 0.05,
                 "quantiles": {"seen/small": [-0.1, 0.3], "seen/large": [-0.05, 0.1], "unseen/small": [-0.4, 0.6],
                               "unseen/large": [-0.2, 0.4]}}


def random_mlp(n_in: int, hidden, seed: int, outputs: int = targets.HEAD_OUTPUTS[targets.TARGET_KIND]
               ) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    sizes = [n_in, *hidden, outputs]
    out = {}
    for i in range(len(sizes) - 1):
        out[f"layers.{i}.weight"] = (rng.normal(size=(sizes[i + 1], sizes[i])) / math.sqrt(sizes[i])).astype(
            np.float32)
        out[f"layers.{i}.bias"] = (0.1 * rng.normal(size=sizes[i + 1])).astype(np.float32)
    return out


def publish_test_checkpoint(root, op, hidden=(16,), activation="relu", seed=0, promote=True, ranges=True,
                            ratio_weight=None):
    """A small, untrained but valid checkpoint whose feature statistics and ranges come from SAMPLES (and, given
    ``ratio_weight``, a card ``transfer`` with it)."""
    frame = api.normalize_configs(op, SAMPLES[op])
    feats = np.concatenate([F.build_features(op, frame, gpus.gpu_spec(g), p, ph) for g in RANGE_GPUS
                            for p in ("fp32", "fp16", "bf16") for ph in ("forward", "backward")])
    names = F.feature_names(op)
    std = feats.std(axis=0)
    card = {"features": {"names": names, "mean": feats.mean(axis=0), "std": np.where(std > 1e-6, std, 1.0)},
            "target": targets.target_card(op), "architecture": {"hidden": list(hidden), "activation": activation},
            "training_data": {"rows": len(feats), "gpus": ["h100-sxm"]}, "metrics": {}, "git_commit": None,
            "mlflow_run_id": None, "interval": TEST_INTERVAL, "launch_floor_ms": {"forward": {"ms": 0.02},
                                                                                 "backward": {"ms": 0.1}},
            "ranges": ({n: [float(feats[:, j].min()), float(feats[:, j].max())] for j, n in enumerate(names)}
                       if ranges else {})}
    if ratio_weight is not None:
        card["transfer"] = {"ratio_weight": ratio_weight}
    weights = random_mlp(len(names), hidden, seed)
    version = ck.publish(root, op, weights, card)
    if promote:
        ck.promote(root, op, version, "test")
    return version, weights


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    for op in schema.OPS:
        publish_test_checkpoint(root, op)
    publish_test_checkpoint(root, "bmm", hidden=(8, 8), seed=1, promote=False)  # bmm v2, not the champion
    return root


@pytest.fixture(scope="module")
def scalers(root):
    return {op: load_scaler(op, root=root) for op in schema.OPS}


def test_phases_are_the_schema_phases_and_total():
    assert (*schema.PHASES, "total") == api.PREDICT_PHASES


def test_precision_in_any_case_or_alias(scalers):
    s = scalers["bmm"]
    want = s.predict(SAMPLES["bmm"], "h100", "bf16")
    for given in ("BF16", "Bf16", " bfloat16 "):
        np.testing.assert_array_equal(s.predict(SAMPLES["bmm"], "h100", given), want)
    np.testing.assert_array_equal(s.predict(SAMPLES["bmm"], "h100", "half"), s.predict(SAMPLES["bmm"], "h100", "fp16"))
    assert api.resolve_precision("FP32") == "fp32"
    with pytest.raises(api.InputError, match=r"precision: unknown precision 'fp8'; allowed: fp32, tf32, fp16, bf16"):
        s.predict(SAMPLES["bmm"], "h100", "fp8")
    with pytest.raises(api.InputError, match=r"precision: .*V100.*cannot run bf16"):
        s.predict(SAMPLES["bmm"], "v100", "BFLOAT16")


def test_attributes_and_versions(root, scalers):
    s = scalers["bmm"]
    assert (s.op, s.version) == ("bmm", 1) and s.card["op"] == "bmm" and s.card["version"] == 1
    s2 = load_scaler("bmm", version=2, root=root)
    assert s2.version == 2 and s2.card["architecture"]["hidden"] == [8, 8]
    import pipeline

    assert pipeline.load_scaler is load_scaler and pipeline.Scaler is api.Scaler


def test_a_checkpoint_loads_only_under_its_ops_features_version(root, scalers):
    """Feature versions are per op: conv2d's moved to version 8 (the FFT bound) and lstm's to 7 (the
    input-projection bound), and their older cards are refused, while linear's version-5 cards still load."""
    assert F.FEATURES_VERSIONS == {"conv2d": 8, "linear": 5, "bmm": 5, "lstm": 7}
    for op in ("conv2d", "linear", "lstm"):
        card, weights = ck.load(root, op, scalers[op].version)
        assert card["target"]["features_version"] == F.features_version(op)
        old = {**card, "target": {**card["target"], "features_version": 5}}
        if op == "linear":
            assert api.Scaler(op, 1, old, weights).version == 1
        else:
            with pytest.raises(InputError, match=f"features_version 5, but pipeline.features builds version "
                                                 f"{F.features_version(op)}"):
                api.Scaler(op, 1, old, weights)
    with pytest.raises(ValueError, match="unknown op"):
        F.features_version("conv3d")


@pytest.mark.parametrize("op", schema.OPS)
def test_predict_shapes_and_input_forms(scalers, op):
    s = scalers[op]
    configs = SAMPLES[op]
    ms = s.predict(configs, "h100")
    assert ms.dtype == np.float64 and ms.shape == (len(configs),) and np.all(np.isfinite(ms)) and np.all(ms > 0)
    np.testing.assert_allclose(s.predict(configs[0], "h100"), ms[:1])
    frame = api.normalize_configs(op, configs)
    np.testing.assert_allclose(s.predict(frame, "h100"), ms)
    assert s.predict([], "h100").shape == (0,)


def test_gpu_names_aliases_and_spec_dicts(scalers):
    s = scalers["bmm"]
    cfg = SAMPLES["bmm"]
    by_name = s.predict(cfg, "h100")
    np.testing.assert_allclose(s.predict(cfg, "NVIDIA H100 80GB HBM3"), by_name)
    spec = gpus.gpu_spec("h100")
    np.testing.assert_allclose(s.predict(cfg, spec), by_name)
    custom = {k: v for k, v in spec.items() if k != "label"}
    custom["name"] = "My H100 variant"
    np.testing.assert_allclose(s.predict(cfg, custom), by_name)


def test_total_is_forward_plus_backward(scalers):
    for op, s in scalers.items():
        for precision in ("fp32", "bf16"):
            fwd = s.predict(SAMPLES[op], "a100", precision, "forward")
            bwd = s.predict(SAMPLES[op], "a100", precision, "backward")
            np.testing.assert_allclose(s.predict(SAMPLES[op], "a100", precision, "total"), fwd + bwd, rtol=1e-12)


def test_scale(scalers):
    s = scalers["conv2d"]
    cfg = SAMPLES["conv2d"]
    np.testing.assert_array_equal(s.scale(cfg, [1.5, 2.5], "v100", "v100"), [1.5, 2.5])
    np.testing.assert_array_equal(s.scale(cfg, 3.0, "h100", "NVIDIA H100 80GB HBM3"), [3.0, 3.0])
    for phase in ("forward", "total"):
        ratio = s.predict(cfg, "h100", "fp16", phase) / s.predict(cfg, "v100", "fp16", phase)
        np.testing.assert_allclose(s.scale(cfg, [2.0, 4.0], "v100", "h100", "fp16", phase), [2.0, 4.0] * ratio)
        np.testing.assert_allclose(s.scale(cfg, 2.0, "v100", "h100", "fp16", phase), 2.0 * ratio)
    assert s.scale(cfg, np.array([1.0, 2.0], dtype=np.float32), "t4", "l4").dtype == np.float64


def _with_weight(root, op: str, weight) -> api.Scaler:
    card, weights = ck.load(root, op, None)
    card = {**card, "transfer": {"ratio_weight": weight}} if weight is not None else card
    return api.Scaler(op, card["version"], card, weights)


def test_transfer_keeps_the_calibrated_share_of_the_measurement(root):
    cfg = SAMPLES["conv2d"]
    plain = _with_weight(root, "conv2d", None)
    assert plain.ratio_weight is None
    with pytest.raises(InputError, match=r"transfer: conv2d v1 has no calibrated ratio weight in its card"):
        plain.transfer(cfg, 2.0, "v100", "h100")
    dest, origin = plain.predict(cfg, "h100", "fp16"), plain.predict(cfg, "v100", "fp16")
    for weight in (0.0, 0.5, 1.0):
        s = _with_weight(root, "conv2d", weight)
        assert s.ratio_weight == weight
        np.testing.assert_allclose(s.transfer(cfg, [2.0, 4.0], "v100", "h100", "fp16"),
                                   dest * (np.array([2.0, 4.0]) / origin) ** weight)
        np.testing.assert_array_equal(s.transfer(cfg, [1.5, 2.5], "v100", "v100"), [1.5, 2.5])  # the origin itself
    np.testing.assert_allclose(_with_weight(root, "conv2d", 0.0).transfer(cfg, 9.0, "v100", "h100", "fp16"), dest)
    np.testing.assert_allclose(_with_weight(root, "conv2d", 1.0).transfer(cfg, 2.0, "v100", "h100", "fp16"),
                               plain.scale(cfg, 2.0, "v100", "h100", "fp16"))
    with pytest.raises(InputError, match="measured"):
        _with_weight(root, "conv2d", 0.5).transfer(cfg, -1.0, "v100", "h100")


def test_carry_agrees_with_scale_and_transfer_and_runs_the_model_once_per_gpu(root, monkeypatch):
    cfgs = SAMPLES["conv2d"]
    s = _with_weight(root, "conv2d", 0.5)
    measured = np.linspace(2.0, 3.0, len(cfgs))
    v100, h100, a100 = (api.resolve_gpu(g, "gpu") for g in ("v100", "h100", "a100"))
    calls = []
    model = api.Scaler._model
    monkeypatch.setattr(api.Scaler, "_model", lambda self, frame, spec, *a, **k: calls.append(spec["name"])
                        or model(self, frame, spec, *a, **k))
    out = s.carry(cfgs, measured, "v100", ["h100", "v100", "a100", "h100"], "fp16", weights=[1.0, 0.5])
    assert sorted(calls) == sorted({v100["name"], h100["name"], a100["name"]})  # the repeated h100 runs once
    monkeypatch.setattr(api.Scaler, "_model", model)
    at_origin, flags_origin = s.predict(cfgs, "v100", "fp16", return_flags=True)
    for (times, flags), dest in zip(out, ["h100", "v100", "a100", "h100"]):
        if dest == "v100":  # the origin itself: the measurement
            np.testing.assert_array_equal(times[0], measured)
            np.testing.assert_array_equal(times[1], measured)
            np.testing.assert_array_equal(flags, flags_origin)
            continue
        at_dest, flags_dest = s.predict(cfgs, dest, "fp16", return_flags=True)
        np.testing.assert_allclose(times[0], measured * at_dest / at_origin, rtol=1e-12)
        np.testing.assert_allclose(times[1], at_dest * (measured / at_origin) ** 0.5, rtol=1e-12)
        np.testing.assert_array_equal(flags, flags_origin | flags_dest)


def test_carry_refuses_bad_destinations_weights_and_precisions(root):
    s = _with_weight(root, "conv2d", 0.5)
    cfg = SAMPLES["conv2d"][:2]
    for kwargs, field in (({"dests": "h100"}, "dests"), ({"dests": []}, "dests"), ({"dests": ["h100", "zz9"]}, "dests"),
                          ({"dests": ["h100"], "weights": [1.5]}, "weights"),
                          ({"dests": ["h100"], "weights": [float("nan")]}, "weights"),
                          ({"dests": ["h100"], "weights": [True]}, "weights"),
                          ({"dests": ["h100"], "weights": []}, "weights"),
                          ({"dests": ["h100"], "weights": 0.5}, "weights"),
                          ({"dests": ["h100"], "weights": np.array(0.5)}, "weights"),
                          ({"dests": ["h100"], "weights": {1.0: "scale"}}, "weights"),
                          ({"dests": ["h100", "p100"], "precision": "bf16"}, "precision"),
                          ({"dests": ["h100"], "phase": "both"}, "phase")):
        with pytest.raises(InputError, match=f"^{field}:"):
            s.carry(cfg, [1.0, 2.0], "v100", **kwargs)
    with pytest.raises(InputError, match="measured"):
        s.carry(cfg, [1.0], "v100", ["h100"])
    [(times, flags)] = s.carry([], [], "v100", ["h100"], weights=[1.0, 0.0])
    assert times.shape == (2, 0) and flags.shape == (0,)
    [(times, _)] = s.carry(cfg, [1.0, 2.0], "v100", ["h100"], weights=[0.0])  # weight 0: the model alone
    np.testing.assert_allclose(times[0], s.predict(cfg, "h100"), rtol=1e-12)


def test_carry_flags_a_row_out_of_range_on_either_gpu(root, monkeypatch):
    s = _with_weight(root, "conv2d", 0.5)
    frame = api.normalize_configs("conv2d", SAMPLES["conv2d"])
    n = len(frame)
    own = {"v100": np.arange(n) == 0, "h100": np.arange(n) == n - 1, "a100": np.zeros(n, bool)}  # per GPU
    monkeypatch.setattr(api.Scaler, "_model", lambda self, frame, spec, *a, **k: (
        np.ones(len(frame)), None, None, own[next(g for g in own if api.resolve_gpu(g, "gpu") == spec)]))
    out = s.carry(frame, np.full(n, 2.0), "v100", ["h100", "a100", "v100"], "fp16")
    np.testing.assert_array_equal(out[0][1], own["v100"] | own["h100"])
    np.testing.assert_array_equal(out[1][1], own["v100"])
    np.testing.assert_array_equal(out[2][1], own["v100"])
    out[2][1][:] = True  # each destination's flags are its own array
    np.testing.assert_array_equal(out[1][1], own["v100"])


@pytest.mark.filterwarnings("ignore:.*training ranges:UserWarning")
def test_conv2d_shorthands_and_defaults(scalers):
    s = scalers["conv2d"]
    base = {"batch": 8, "in_channels": 16, "out_channels": 32, "height": 32, "width": 32}
    short = s.predict({**base, "kernel_size": 3, "stride": 2, "padding": 1, "dilation": 1}, "l4")
    explicit = {**base, "kernel_h": 3, "kernel_w": 3, "stride_h": 2, "stride_w": 2, "pad_h": 1, "pad_w": 1,
                "dilation_h": 1, "dilation_w": 1, "groups": 1, "bias": True}
    np.testing.assert_array_equal(short, s.predict(explicit, "l4"))
    same = s.predict({**base, "kernel_size": 3, "kernel_h": 3, "stride": 2, "padding": 1}, "l4")  # agreeing: fine
    np.testing.assert_array_equal(short, same)
    frame = api.normalize_configs("conv2d", {**base, "kernel_size": 3})
    assert frame.iloc[0].to_dict() == {**base, "kernel_h": 3, "kernel_w": 3, "stride_h": 1, "stride_w": 1,
                                       "pad_h": 0, "pad_w": 0, "dilation_h": 1, "dilation_w": 1, "groups": 1,
                                       "bias": True}
    # mixed rows: one uses the shorthand, the other the explicit columns
    mixed = api.normalize_configs("conv2d", [{**base, "kernel_size": 5}, {**base, "kernel_h": 1, "kernel_w": 3}])
    assert mixed[["kernel_h", "kernel_w"]].to_numpy().tolist() == [[5, 5], [1, 3]]
    lin = api.normalize_configs("linear", {"batch": 2, "in_features": 3, "out_features": 4})
    assert bool(lin["bias"].iloc[0]) is True
    lstm = api.normalize_configs("lstm", {"batch": 2, "seq_len": 3, "input_size": 4, "hidden_size": 5})
    assert lstm.iloc[0][["num_layers", "bidirectional", "bias"]].tolist() == [1, False, True]
    # integral floats (as from JSON / a float column) are accepted
    assert api.normalize_configs("bmm", {"batch": 2.0, "m": 3, "k": 4, "n": 5})["batch"].dtype == np.int64


BMM = {"batch": 8, "m": 64, "k": 64, "n": 64}
CONV = {"batch": 8, "in_channels": 16, "out_channels": 32, "height": 32, "width": 32, "kernel_size": 3}
BAD_CONFIGS = [
    ("bmm", {"batch": 8, "m": 64, "k": 64}, r"missing field 'n'"),
    ("bmm", {**BMM, "colour": 3}, r"unknown field.*colour.*allowed: batch, m, k, n"),
    ("bmm", {**BMM, "m": 3.5}, r"'m'.*integer >= 1.*3\.5"),
    ("bmm", {**BMM, "m": 0}, r"'m'.*integer >= 1.*got 0"),
    ("bmm", {**BMM, "k": -4}, r"'k'.*integer >= 1.*got -4"),
    ("bmm", {**BMM, "n": float("nan")}, r"'n'.*NaN"),
    ("bmm", {**BMM, "n": True}, r"'n'.*not a bool"),
    ("bmm", {**BMM, "batch": "8"}, r"'batch'.*not a str"),
    ("bmm", {**BMM, "batch": None}, r"'batch'.*not null"),
    ("bmm", {**BMM, "batch": 2**40}, r"'batch'.*<= 2147483647"),
    ("bmm", [BMM, "oops"], r"item 1 must be a dict"),
    ("bmm", 42, r"configs: must be a dict, a list of dicts or a pandas DataFrame"),
    ("bmm", pd.DataFrame({"batch": [1, 2], "m": [3, 4], "k": [5, 6], "n": [7.0, np.nan]}), r"config 1 field 'n'"),
    ("bmm", pd.DataFrame({"batch": [True], "m": [3], "k": [5], "n": [7]}), r"'batch'.*not a bool"),
    ("linear", {"batch": 1, "in_features": 2, "out_features": 3, "bias": "yes"}, r"'bias'.*must be a bool"),
    ("conv2d", {**CONV, "groups": 3}, r"'groups'.*must divide in_channels"),
    ("conv2d", {**CONV, "in_channels": 32, "out_channels": 24, "groups": 16}, r"'groups'.*must divide out_channels"),
    ("conv2d", {**CONV, "padding": -1}, r"'padding'.*integer >= 0"),
    ("conv2d", {**CONV, "pad_h": -1}, r"'pad_h'.*integer >= 0"),
    ("conv2d", {**CONV, "kernel_h": 5}, r"'kernel_h'.*conflicting values 5 and 3"),
    ("conv2d", {**CONV, "kernel_size": 64}, r"'kernel_h'.*must fit the padded input"),
    ("conv2d", {k: v for k, v in CONV.items() if k != "kernel_size"}, r"missing field 'kernel_h' \(or 'kernel_size'\)"),
]


@pytest.mark.parametrize("op,configs,match", BAD_CONFIGS, ids=[m for _, _, m in BAD_CONFIGS])
def test_bad_configs(scalers, op, configs, match):
    with pytest.raises(ValueError, match=match):
        scalers[op].predict(configs, "h100")


def test_bad_ops_versions_gpus_precisions_phases(root, scalers):
    s = scalers["bmm"]
    cases = [
        (lambda: load_scaler("matmul", root=root), r"op: unknown op 'matmul'; allowed: conv2d, linear, bmm, lstm"),
        (lambda: load_scaler("bmm", version=9, root=root), r"version: bmm has no version 9.*available: \[1, 2\]"),
        (lambda: load_scaler("bmm", version=0, root=root), r"version: must be an integer >= 1"),
        (lambda: load_scaler("bmm", version="1", root=root), r"version: must be an integer >= 1"),
        (lambda: load_scaler("bmm", root=root / "nowhere"), r"no champion"),
        (lambda: s.predict(BMM, "h9000"), r"gpu: unknown GPU 'h9000'"),
        (lambda: s.predict(BMM, 7), r"gpu: must be a GPU name or a spec dict"),
        (lambda: s.predict(BMM, {"name": "X", "sm_count": 10}), r"gpu: .*missing spec fields"),
        (lambda: s.predict(BMM, "h100", precision="fp64"), r"precision: unknown precision 'fp64'; allowed: fp32"),
        (lambda: s.predict(BMM, "h100", phase="both"),
         r"phase: unknown phase 'both'; allowed: forward, backward, total"),
        (lambda: s.predict(BMM, "v100", precision="bf16"), r"precision: .*V100.*cannot run bf16.*supports: fp32, fp16"),
        (lambda: s.predict(BMM, "t4", precision="tf32"), r"precision: .*T4.*cannot run tf32"),
        (lambda: s.scale(BMM, 1.0, "h100", "v100", precision="bf16"), r"precision: .*V100.*\(dest\) cannot run bf16"),
        (lambda: s.scale(BMM, 1.0, "nope", "h100"), r"origin: unknown GPU"),
        (lambda: s.scale(BMM, 1.0, "h100", "nope"), r"dest: unknown GPU"),
        (lambda: s.scale([BMM, BMM], [1.0, 2.0, 3.0], "h100", "a100"), r"measured_ms: has 3 values but configs has 2"),
        (lambda: s.scale(BMM, 0.0, "h100", "a100"), r"measured_ms: must be finite and > 0"),
        (lambda: s.scale(BMM, -1.0, "h100", "a100"), r"measured_ms: must be finite and > 0"),
        (lambda: s.scale([BMM, BMM], [1.0, np.nan], "h100", "a100"), r"measured_ms: must be finite and > 0.*index 1"),
        (lambda: s.scale(BMM, True, "h100", "a100"), r"measured_ms"),
        (lambda: s.scale(BMM, "3", "h100", "a100"), r"measured_ms"),
    ]
    for call, match in cases:
        with pytest.raises(ValueError, match=match):
            call()


def test_out_of_range_is_flagged(scalers):
    s = scalers["bmm"]
    cfg = [SAMPLES["bmm"][0], {"batch": 4096, "m": 8192, "k": 8192, "n": 8192}]
    ms, flags = s.predict(cfg, "h100", return_flags=True)
    assert flags.tolist() == [False, True] and np.all(ms > 0)
    with pytest.warns(UserWarning, match="1 of 2 configs.*outside the training ranges"):
        s.predict(cfg, "h100")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s.predict(SAMPLES["bmm"], "h100")  # in range: silent
    _, flags = s.scale(cfg, 1.0, "a100", "h100", return_flags=True)
    assert flags.tolist() == [False, True]


def test_tamper_refusal(tmp_path):
    publish_test_checkpoint(tmp_path, "linear")
    load_scaler("linear", root=tmp_path)
    w = tmp_path / "linear" / "v1" / "weights.safetensors"
    data = bytearray(w.read_bytes())
    data[-3] ^= 0x01
    w.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="weights.safetensors"):
        load_scaler("linear", root=tmp_path)
    publish_test_checkpoint(tmp_path, "linear")  # v2, promoted
    c = tmp_path / "linear" / "v2" / "card.json"
    card = json.loads(c.read_text())
    card["features"]["mean"][0] += 1.0
    c.write_text(json.dumps(card))
    with pytest.raises(ck.ChecksumError, match="card.json"):
        load_scaler("linear", root=tmp_path)


def test_feature_mismatch_is_refused(tmp_path):
    names = [f"x{i}" for i in range(3)]
    card = {"features": {"names": names, "mean": [0.0] * 3, "std": [1.0] * 3}, "target": {"kind": "log_ms"},
            "architecture": {"hidden": [4], "activation": "relu"}, "training_data": {}, "metrics": {}, "ranges": {}}
    ck.publish(tmp_path, "bmm", random_mlp(3, [4], 0), card)
    with pytest.raises(ValueError, match="features.names"):
        load_scaler("bmm", version=1, root=tmp_path)


@pytest.mark.parametrize("activation", ["relu", "gelu", "silu"])
def test_agrees_with_torch_mlp(tmp_path, activation):
    torch = pytest.importorskip("torch")
    op = "conv2d"
    version, weights = publish_test_checkpoint(tmp_path, op, hidden=(32, 16), activation=activation, seed=3)
    s = load_scaler(op, version=version, root=tmp_path)
    rng = np.random.default_rng(0)
    n = 300
    frame = pd.DataFrame({"batch": rng.integers(1, 65, n), "in_channels": 8 * rng.integers(1, 17, n),
                          "out_channels": 8 * rng.integers(1, 17, n), "height": rng.integers(7, 113, n),
                          "width": rng.integers(7, 113, n), "kernel_size": rng.choice([1, 3, 5], n),
                          "stride": rng.choice([1, 2], n), "padding": rng.integers(0, 3, n)})
    gpu = gpus.gpu_spec("a100")
    got = s.predict(frame, gpu, "fp16", "backward", return_flags=True)[0]

    act = {"relu": torch.nn.ReLU, "gelu": torch.nn.GELU, "silu": torch.nn.SiLU}[activation]
    n_layers = ck.layer_count(weights)
    modules = []
    for i in range(n_layers):
        w = weights[f"layers.{i}.weight"]
        lin = torch.nn.Linear(w.shape[1], w.shape[0])
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(w))
            lin.bias.copy_(torch.from_numpy(weights[f"layers.{i}.bias"]))
        modules += [lin] + ([act()] if i < n_layers - 1 else [])
    mlp = torch.nn.Sequential(*modules).eval()
    rows = F.prepare(op, api.normalize_configs(op, frame), gpu, "fp16", "backward")
    z = (F.matrix(rows) - np.asarray(s.card["features"]["mean"])) / np.asarray(s.card["features"]["std"])
    with torch.no_grad():
        out = mlp(torch.from_numpy(z.astype(np.float32))).numpy().astype(np.float64)
    want = targets.to_ms(s.card["target"]["kind"], out, rows)
    np.testing.assert_allclose(got, want, rtol=1e-5)


def test_ensemble_predicts_the_geometric_mean_of_its_members(tmp_path):
    op = "conv2d"
    singles = [publish_test_checkpoint(tmp_path, op, hidden=(16, 8), seed=seed, promote=False) for seed in (3, 4, 5)]
    card, _ = ck.load(tmp_path, op, singles[0][0])
    card["architecture"]["members"] = 3
    weights = ck.join_members([w for _, w in singles])
    both = load_scaler(op, version=ck.publish(tmp_path, op, weights, card), root=tmp_path)
    gpu, frame = gpus.gpu_spec("a100"), SAMPLES[op]
    alone = np.array([load_scaler(op, version=v, root=tmp_path).predict(frame, gpu, "bf16", "backward")
                      for v, _ in singles])
    got = both.predict(frame, gpu, "bf16", "backward")
    np.testing.assert_allclose(got, np.exp(np.log(alone).mean(axis=0)), rtol=1e-6)
    assert (alone.min(axis=0) < got).all() and (got < alone.max(axis=0)).all()
    first = load_scaler(op, version=both.version, root=tmp_path, members=1).predict(frame, gpu, "bf16", "backward")
    np.testing.assert_array_equal(first, alone[0])
    for bad, match in ((4, r"conv2d v4: members: the weights hold 3 member\(s\).*got 4"),
                       (0, "members: must be an integer >= 1"), (True, "members: must be an integer >= 1")):
        with pytest.raises(InputError, match=match):
            load_scaler(op, version=both.version, root=tmp_path, members=bad)
    loaded_card, loaded_weights = ck.load(tmp_path, op, both.version)
    for bad in (0, -1, 4, 1.5, True):  # the class itself checks too, not only load_scaler
        with pytest.raises(InputError, match=r"members: the weights hold 3 member\(s\), so an integer from 1 to 3"):
            Scaler(op, both.version, loaded_card, loaded_weights, members=bad)


def test_no_heavy_imports(root):
    code = (
        "import sys, warnings\n"
        "warnings.simplefilter('ignore')\n"
        "import pipeline\n"
        f"s = pipeline.load_scaler('conv2d', root={str(root)!r})\n"
        "s.predict({'batch': 8, 'in_channels': 16, 'out_channels': 16, 'height': 8, 'width': 8, 'kernel_size': 3},"
        " 'h100', 'bf16', 'total')\n"
        "s.scale({'batch': 8, 'in_channels': 16, 'out_channels': 16, 'height': 8, 'width': 8, 'kernel_size': 3},"
        " 1.0, 'v100', 'h100')\n"
        "heavy = [m for m in ('torch', 'lightning', 'pytorch_lightning', 'mlflow', 'hydra', 'omegaconf', "
        "'matplotlib', 'scipy', 'sklearn') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


def _published_ops():
    root = api.DEFAULT_ROOT
    return [op for op in schema.OPS if ck.champion_version(root, op) is not None] if root.exists() else []


@pytest.mark.parametrize("op", schema.OPS)
def test_published_champions_load_and_predict(op):
    if op not in _published_ops():
        pytest.skip(f"no published {op} champion under checkpoints/")
    s = load_scaler(op)
    ms, _ = s.predict(SAMPLES[op], "h100", "bf16", "total", return_flags=True)
    assert ms.shape == (len(SAMPLES[op]),) and np.all(np.isfinite(ms)) and np.all(ms > 0)
    weights = api.DEFAULT_ROOT / op / f"v{s.version}" / ck.WEIGHTS_FILE
    assert weights.stat().st_size <= 1 << 20
