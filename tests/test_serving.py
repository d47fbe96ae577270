"""MLflow python_function packaging: a registered version loads with ``mlflow.pyfunc.load_model`` and answers
like the numpy API, and ``mlflow models serve`` answers one REST request. The checkpoint has random weights (the
packaging is under test, not the model)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from test_api import SAMPLES, publish_test_checkpoint

from pipeline import api

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning",
                                        "ignore:.*noload.*", "ignore::UserWarning")
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def registered(tmp_path_factory):
    from pipeline.serving.__main__ import register

    tmp = tmp_path_factory.mktemp("serving")
    root = tmp / "checkpoints"
    publish_test_checkpoint(root, "bmm")
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    cwd = os.getcwd()
    os.chdir(tmp)  # artifacts under tmp/mlruns
    try:
        version = register("bmm", 1, root, uri)
    finally:
        os.chdir(cwd)
    return {"tmp": tmp, "root": root, "uri": uri, "version": version}


def test_pyfunc_loads_by_alias_and_answers_like_the_api(registered):
    import mlflow

    mlflow.set_tracking_uri(registered["uri"])
    model = mlflow.pyfunc.load_model("models:/pipeline-bmm@champion")
    frame = pd.DataFrame(SAMPLES["bmm"]).assign(gpu=["h100", "a100", "l4"], precision=["bf16", "fp32", "fp16"],
                                                phase=["forward", "total", "backward"])
    out = model.predict(frame)
    scaler = api.load_scaler("bmm", root=registered["root"])
    for i, row in frame.iterrows():
        cfg = {k: int(row[k]) for k in ("batch", "m", "k", "n")}
        ms, low, high = scaler.predict(cfg, row["gpu"], row["precision"], row["phase"], return_interval=True)
        np.testing.assert_allclose(out.loc[i, ["ms", "low_ms", "high_ms"]].to_numpy(float), [ms[0], low[0], high[0]])
    sig = model.metadata.signature
    assert [c.name for c in sig.outputs.inputs] == ["ms", "low_ms", "high_ms"] and "gpu" in sig.inputs.input_names()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_mlflow_models_serve_answers_a_request(registered):
    port = _free_port()
    env = {**os.environ, "MLFLOW_TRACKING_URI": registered["uri"], "PYTHONPATH": str(REPO),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    cmd = [str(Path(sys.executable).parent / "mlflow"), "models", "serve", "-m", "models:/pipeline-bmm@champion",
           "--env-manager", "local", "--host", "127.0.0.1", "-p", str(port)]
    proc = subprocess.Popen(cmd, env=env, cwd=registered["tmp"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        body = json.dumps({"dataframe_records": [{**SAMPLES["bmm"][0], "gpu": "h100", "precision": "bf16"}]}).encode()
        answer = None
        for _ in range(120):
            time.sleep(0.5)
            try:
                req = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", data=body,
                                             headers={"Content-Type": "application/json"})
                answer = json.loads(urllib.request.urlopen(req, timeout=10).read())
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        assert answer is not None, "the server did not answer within 60 s"
        want = api.load_scaler("bmm", root=registered["root"]).predict(SAMPLES["bmm"][0], "h100", "bf16")[0]
        assert answer["predictions"][0]["ms"] == pytest.approx(want, rel=1e-9)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and its uvicorn child: the process group started here
        proc.wait(timeout=30)


def test_a_version_without_a_calibrated_interval_serves_times_and_nan_intervals(registered):
    from pipeline.serving.model import ScalerModel

    model = ScalerModel()
    model.scaler = api.load_scaler("bmm", 1, root=registered["root"])
    model.scaler.card = {k: v for k, v in model.scaler.card.items() if k != "interval"}
    out = model.predict(None, pd.DataFrame([{**cfg, "gpu": "h100", "precision": "bf16"} for cfg in SAMPLES["bmm"]]))
    assert np.isfinite(out["ms"]).all() and (out["ms"] > 0).all()
    assert out["low_ms"].isna().all() and out["high_ms"].isna().all()
