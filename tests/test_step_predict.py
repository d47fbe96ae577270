"""predict_trace and the published scalers: a scaler that cannot be used stops the prediction unless the caller
opts into wave scaling (numpy/pandas only, no torch)."""

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pipeline import api
from pipeline.checkpoint import CheckpointError, ChecksumError
from pipeline.step import clear_scaler_cache, predict_trace

CHECKPOINTS = Path(__file__).resolve().parents[1] / "checkpoints"


def _ops() -> pd.DataFrame:
    """Two linear GEMMs and one elementwise op, as a trace would hold them (made-up times, not measurements)."""
    return pd.DataFrame({"op": ["linear", "linear", "other"], "phase": ["forward", "backward", "forward"],
                         "scaler_phase": ["forward", "forward", "forward"], "precision": "fp32",
                         "time_ms": [1.5, 1.6, 0.4], "flops": [2 * 4096 * 1024 * 4096.0] * 2 + [4e6],
                         "bytes": [4 * (4096 * 1024 + 1024 * 4096 + 4096 * 4096.0)] * 2 + [3.2e7],
                         "batch": [4096, 4096, None], "in_features": [1024, 4096, None],
                         "out_features": [4096, 1024, None], "bias": [True, False, None]})


@pytest.fixture()
def tampered_root(tmp_path) -> Path:
    """A copy of the published linear scaler whose weights fail their checksum."""
    shutil.copytree(CHECKPOINTS / "linear", tmp_path / "linear")
    champion = api.load_scaler("linear").version
    weights = tmp_path / "linear" / f"v{champion}" / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    clear_scaler_cache()
    yield tmp_path
    clear_scaler_cache()


def test_published_scalers_are_used_by_default():
    clear_scaler_cache()
    pred = predict_trace(_ops(), "a100", "h100")
    assert list(pred["method"][:2]) == ["scaler", "scaler"]


def test_a_scaler_failing_its_checksum_stops_the_prediction(tampered_root, monkeypatch):
    with pytest.raises(ChecksumError, match="weights.safetensors"):
        predict_trace(_ops(), "a100", "h100", scaler_root=tampered_root)
    monkeypatch.setattr(api, "DEFAULT_ROOT", tampered_root)  # the default root, as an install would have it
    with pytest.raises(ChecksumError) as info:
        predict_trace(_ops(), "a100", "h100")
    assert any("fallback='wave'" in note for note in info.value.__notes__)


def test_wave_fallback_is_an_explicit_choice_and_says_why(tampered_root):
    pred = predict_trace(_ops(), "a100", "h100", scaler_root=tampered_root, fallback="wave")
    assert list(pred["method"][:2]) == ["wave-gamma", "wave-gamma"]
    assert pred["note"][0].startswith("no usable published linear scaler (ChecksumError")
    assert np.isfinite(pred["pred_ms"]).all()


def test_predict_step_loads_the_scalers_from_scaler_root(tampered_root):
    from pipeline.step import Trace, predict_step

    trace = Trace(ops=_ops(), total_ms=3.5, origin="a100", meta={})
    with pytest.raises(ChecksumError, match="weights.safetensors"):
        predict_step(None, ["h100"], trace=trace, scaler_root=tampered_root)
    waved = predict_step(None, ["h100"], trace=trace, scaler_root=tampered_root, fallback="wave")
    assert list(waved.predictions["h100-sxm"].ops["method"][:2]) == ["wave-gamma", "wave-gamma"]
    clear_scaler_cache()
    published = predict_step(None, ["h100"], trace=trace)
    assert list(published.predictions["h100-sxm"].ops["method"][:2]) == ["scaler", "scaler"]


def test_a_missing_scaler_is_an_error_too(tmp_path):
    with pytest.raises(CheckpointError, match="no champion"):
        predict_trace(_ops(), "a100", "h100", scaler_root=tmp_path)
    pred = predict_trace(_ops(), "a100", "h100", scaler_root=tmp_path, fallback="wave")
    assert "CheckpointError" in pred["note"][0]
    # no scaler rows at all: nothing to load, nothing to refuse
    assert (predict_trace(_ops().iloc[2:], "a100", "h100", scaler_root=tmp_path)["method"] == "wave-gamma").all()


def test_bad_fallback_value_names_the_allowed_ones():
    with pytest.raises(ValueError, match="fallback: 'silent' is not one of error, wave"):
        predict_trace(_ops(), "a100", "h100", fallback="silent")


def _linear_rows(ops: pd.DataFrame) -> pd.DataFrame:
    return ops.loc[ops["op"] == "linear", ["batch", "in_features", "out_features", "bias"]].astype(
        {"batch": int, "in_features": int, "out_features": int, "bias": bool}).reset_index(drop=True)


def test_the_modes_predict_directly_keep_the_calibrated_share_or_scale_by_the_ratio():
    clear_scaler_cache()
    ops, s = _ops(), api.load_scaler("linear")
    cfg, measured = _linear_rows(ops), ops["time_ms"].to_numpy()[:2]
    dest, origin = s.predict(cfg, "h100", "fp32", "forward"), s.predict(cfg, "a100", "fp32", "forward")
    direct = predict_trace(ops, "a100", "h100", scaler_mode="direct")
    np.testing.assert_allclose(direct["pred_ms"][:2], dest)
    ratio = predict_trace(ops, "a100", "h100", scaler_mode="ratio")
    np.testing.assert_allclose(ratio["pred_ms"][:2], measured * dest / origin)
    calibrated = predict_trace(ops, "a100", "h100")                     # the default
    np.testing.assert_allclose(calibrated["pred_ms"][:2], dest * (measured / origin) ** s.ratio_weight)
    # the measurements move the ratio, not the direct prediction
    doubled = ops.assign(time_ms=ops["time_ms"] * 2)
    np.testing.assert_allclose(predict_trace(doubled, "a100", "h100", scaler_mode="direct")["pred_ms"][:2], dest)
    np.testing.assert_allclose(predict_trace(doubled, "a100", "h100", scaler_mode="ratio")["pred_ms"][:2],
                               2 * ratio["pred_ms"][:2])
    # non-scaler rows are wave-scaled alike in every mode
    assert direct["pred_ms"][2] == ratio["pred_ms"][2] == calibrated["pred_ms"][2]


@pytest.mark.parametrize("mode", ["calibrated", "direct", "ratio"])
def test_on_the_same_gpu_every_mode_gives_back_the_measurement(mode):
    ops = _ops()
    pred = predict_trace(ops, "a100", "a100", scaler_mode=mode)
    np.testing.assert_allclose(pred["pred_ms"][:2], ops["time_ms"][:2])
    assert list(pred["method"][:2]) == ["scaler", "scaler"]


class _ScaleOnly:
    """TEST DOUBLE, not a model: has Habitat's scale() but neither transfer() nor predict()."""

    def scale(self, configs, measured_ms, origin, dest, precision="fp32", phase="forward"):
        return np.asarray(measured_ms, dtype=float) * 0.5


@pytest.mark.parametrize("mode,method", [("calibrated", "transfer"), ("direct", "predict")])
def test_an_injected_scaler_needs_the_method_its_mode_uses(mode, method):
    with pytest.raises(TypeError, match=rf"linear scaler has no {method}\(\) method, which scaler_mode='{mode}' uses"):
        predict_trace(_ops(), "a100", "h100", scalers={"linear": _ScaleOnly()}, scaler_mode=mode)
    pred = predict_trace(_ops(), "a100", "h100", scalers={"linear": _ScaleOnly()}, scaler_mode="ratio")
    np.testing.assert_allclose(pred["pred_ms"][:2], _ops()["time_ms"][:2] * 0.5)


@pytest.mark.parametrize("mode", ["calibrated", "direct", "ratio"])
def test_an_injected_scaler_on_its_own_gpu_gives_back_the_measurement(mode):
    class _Halving(_ScaleOnly):
        """TEST DOUBLE, not a model: halves whatever it is asked."""

        def transfer(self, configs, measured_ms, origin, dest, precision="fp32", phase="forward"):
            return np.asarray(measured_ms, dtype=float) * 0.5

        def predict(self, configs, gpu, precision="fp32", phase="forward"):
            return np.full(len(configs), 0.5)

    pred = predict_trace(_ops(), "a100", "a100", scalers={"linear": _Halving()}, scaler_mode=mode)
    np.testing.assert_allclose(pred["pred_ms"][:2], _ops()["time_ms"][:2])


def test_calibrated_mode_needs_a_card_with_the_calibration(tmp_path):
    from test_api import publish_test_checkpoint

    publish_test_checkpoint(tmp_path, "linear")                       # a card without transfer
    clear_scaler_cache()
    with pytest.raises(api.InputError, match=r"no calibrated ratio weight.*scaler_mode='direct' or 'ratio'"):
        predict_trace(_ops(), "a100", "h100", scaler_root=tmp_path)
    for mode in ("direct", "ratio"):
        assert list(predict_trace(_ops(), "a100", "h100", scaler_root=tmp_path, scaler_mode=mode)["method"][:2]) == [
            "scaler", "scaler"]
    clear_scaler_cache()


def test_bad_scaler_mode_names_the_allowed_ones():
    with pytest.raises(ValueError, match="scaler_mode: 'habitat' is not one of calibrated, direct, ratio"):
        predict_trace(_ops(), "a100", "h100", scaler_mode="habitat")


def test_predicting_a_trace_imports_no_torch(tmp_path):
    _ops().to_csv(tmp_path / "ops.csv", index=False)
    code = ("import sys\nimport pandas as pd\nimport pipeline\n"
            f"pred = pipeline.predict_trace(pd.read_csv({str(tmp_path / 'ops.csv')!r}), 'a100', 'h100')\n"
            "assert (pred['method'][:2] == 'scaler').all()\n"
            "heavy = [m for m in ('torch', 'lightning', 'mlflow', 'hydra', 'matplotlib') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    res = subprocess.run([sys.executable, "-c", code], cwd=CHECKPOINTS.parent, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
