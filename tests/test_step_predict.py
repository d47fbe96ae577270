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
