"""The command line front end: tables, scaling, JSON output, and exit code 2 with a clear message."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_api import publish_test_checkpoint

from pipeline import predict

REPO = Path(__file__).resolve().parent.parent
CONV = "batch=32,in_channels=64,out_channels=64,height=56,width=56,kernel_size=3,padding=1"
BMM = "batch=8,m=512,k=256,n=128"


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli-checkpoints")
    publish_test_checkpoint(root, "conv2d")
    publish_test_checkpoint(root, "bmm")
    return root


def cli(root, *args):
    return predict.main([*args, "--root", str(root)])


def test_parse_config():
    assert predict.parse_config("batch=8, m=3,bias=true,x=false,y=3.5,z=abc") == {
        "batch": 8, "m": 3, "bias": True, "x": False, "y": 3.5, "z": "abc"}
    for bad in ("", "batch", "batch=", "batch=1,batch=2"):
        with pytest.raises(ValueError, match="--config"):
            predict.parse_config(bad)


def test_table_per_gpu_and_precision(root, capsys):
    assert cli(root, "conv2d", "--config", CONV, "--gpus", "h100,l4,t4", "--precisions", "fp32,bf16") == 0
    out = capsys.readouterr().out
    assert "conv2d v1" in out and "forward" in out and "backward" in out and "total" in out
    lines = [line for line in out.splitlines() if line.startswith(("H100", "L4", "Tesla T4"))]
    assert len(lines) == 6
    t4_bf16 = [line for line in lines if line.startswith("Tesla T4") and " bf16 " in line]
    assert t4_bf16 and "no bf16 path" in t4_bf16[0]


def test_json_output_matches_api(root, capsys):
    assert cli(root, "bmm", "--config", BMM, "--config", "batch=1,m=64,k=64,n=64", "--gpus", "a100",
               "--precisions", "fp16", "--json") == 0
    result = json.loads(capsys.readouterr().out)
    from pipeline.api import load_scaler

    s = load_scaler("bmm", root=root)
    assert len(result["rows"]) == 2
    for row in result["rows"]:
        cfg = result["configs"][row["config"]]
        for phase in ("forward", "backward", "total"):
            want = s.predict(cfg, "a100", "fp16", phase, return_flags=True)[0][0]
            assert row[f"{phase}_ms"] == pytest.approx(want, rel=1e-12)


def test_scale(root, capsys):
    assert cli(root, "bmm", "--config", BMM, "--scale", "0.5", "--origin", "v100", "--dest", "h100,v100",
               "--json") == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert rows[1]["dest"].startswith("Tesla V100") and rows[1]["scaled_ms"] == pytest.approx(0.5)
    from pipeline.api import load_scaler

    want = load_scaler("bmm", root=root).scale({"batch": 8, "m": 512, "k": 256, "n": 128}, 0.5, "v100", "h100",
                                               return_flags=True)[0][0]
    assert rows[0]["scaled_ms"] == pytest.approx(want, rel=1e-12)
    assert cli(root, "bmm", "--config", BMM, "--scale", "0.5", "--origin", "v100", "--dest", "h100") == 0
    assert "scaled" in capsys.readouterr().out
    # a precision one side cannot run is marked, not predicted
    assert cli(root, "bmm", "--config", BMM, "--scale", "1", "--origin", "h100", "--dest", "v100,h200",
               "--precisions", "bf16") == 0
    out = capsys.readouterr().out
    assert "no bf16 path on Tesla V100" in out and "H200" in out


def test_scale_shows_the_calibrated_transfer_where_the_card_has_one(tmp_path, capsys):
    publish_test_checkpoint(tmp_path, "bmm", ratio_weight=0.5)
    assert cli(tmp_path, "bmm", "--config", BMM, "--scale", "0.5", "--origin", "v100", "--dest", "h100",
               "--json") == 0
    row = json.loads(capsys.readouterr().out)["rows"][0]
    from pipeline.api import load_scaler

    s, cfg = load_scaler("bmm", root=tmp_path), {"batch": 8, "m": 512, "k": 256, "n": 128}
    dest, origin = (s.predict(cfg, g, return_flags=True)[0][0] for g in ("h100", "v100"))
    want = dest * (0.5 / origin) ** 0.5
    assert row["transfer_ms"] == pytest.approx(want, rel=1e-12)
    assert cli(tmp_path, "bmm", "--config", BMM, "--scale", "0.5", "--origin", "v100", "--dest", "h100") == 0
    out = capsys.readouterr().out
    assert "forward (calibrated, w=0.5)" in out and "** 0.5" in out


def test_scale_runs_the_model_once_per_gpu_and_precision(tmp_path, capsys, monkeypatch):
    publish_test_checkpoint(tmp_path, "bmm", ratio_weight=0.5)
    from pipeline import api

    calls = []
    model = api.Scaler._model
    monkeypatch.setattr(api.Scaler, "_model", lambda self, frame, spec, *a, **k: calls.append(spec["name"])
                        or model(self, frame, spec, *a, **k))
    assert cli(tmp_path, "bmm", "--config", BMM, "--scale", "0.5", "--origin", "v100", "--dest", "h100,a100,v100",
               "--json") == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert len(rows) == 3 and rows[2]["scaled_ms"] == rows[2]["transfer_ms"] == pytest.approx(0.5)
    assert sorted(calls) == sorted({r["origin"] for r in rows} | {r["dest"] for r in rows})


def test_precisions_in_any_case(root, capsys):
    assert cli(root, "bmm", "--config", BMM, "--gpus", "h100", "--precisions", "BF16,Float32", "--json") == 0
    upper = json.loads(capsys.readouterr().out)["rows"]
    assert cli(root, "bmm", "--config", BMM, "--gpus", "h100", "--precisions", "bf16,fp32", "--json") == 0
    assert json.loads(capsys.readouterr().out)["rows"] == upper
    assert [r["precision"] for r in upper] == ["bf16", "fp32"]


@pytest.mark.parametrize("args,match", [
    (["bmm", "--config", "batch=8,m=3.5,k=1,n=1"], "'m'.*integer"),
    (["bmm", "--config", BMM, "--gpus", "h900"], "--gpus: unknown GPU 'h900'"),
    (["bmm", "--config", BMM, "--precisions", "fp64"], "--precisions: unknown precision 'fp64'"),
    (["matmul", "--config", BMM], "op: unknown op 'matmul'"),
    (["bmm", "--config", BMM, "--version", "7"], "version: bmm has no version 7"),
    (["bmm", "--config", BMM, "--scale", "0.5", "--origin", "v100"], "--scale: needs --origin"),
    (["bmm", "--config", BMM, "--scale", "-1", "--origin", "v100", "--dest", "h100"], "--scale: .*> 0"),
    (["bmm", "--config", BMM, "--scale", "1,2", "--origin", "v100", "--dest", "h100"], "--scale: 2 measured"),
    (["bmm", "--config", BMM, "--scale", "1", "--origin", "v100", "--dest", "h100", "--phase", "all"],
     "phase: unknown phase 'all'"),
    (["bmm", "--config", BMM, "--scale", "1", "--origin", "h100", "--dest", "v100", "--precisions", "fp32,bf16"],
     "--precisions: give the one precision"),
    (["bmm", "--config", BMM, "--origin", "v100"], "--origin/--dest: only with --scale"),
])
def test_errors_exit_2_with_message(root, capsys, args, match):
    assert cli(root, *args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ")
    assert re.search(match, err), err


def test_module_entry_point(root):
    ok = subprocess.run([sys.executable, "-m", "pipeline.predict", "bmm", "--config", BMM, "--gpus", "h100",
                         "--root", str(root)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "H100" in ok.stdout, ok.stderr
    bad = subprocess.run([sys.executable, "-m", "pipeline.predict", "bmm", "--config", "batch=0,m=1,k=1,n=1",
                          "--root", str(root)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "'batch'" in bad.stderr and "Traceback" not in bad.stderr
    usage = subprocess.run([sys.executable, "-m", "pipeline.predict"], cwd=REPO, capture_output=True, text=True,
                           timeout=120)
    assert usage.returncode == 2 and "usage:" in usage.stderr
