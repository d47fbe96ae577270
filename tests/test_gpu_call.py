"""benchmarks/gpu_call.sh: without a GPU the LSTM timing check cannot pass, so lstm is dropped from the sweep and
nothing is collected; the call still leaves its (empty) archive and says why, and a failed conv2d first-call
profile, backward, screen or warm-up check does not stop it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from conftest import ROOT


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_a_failed_lstm_check_drops_lstm_and_collects_nothing(tmp_path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": "", "OPS": "lstm", "LSTM_CHECK": "1", "TOTAL_S": "200",
           "CONV_FIRST_CALL": "2", "BACKWARD_CHECK": "1", "SCREEN_CHECK": "1",
           "EXTRA": "timeout_s=30 screen_ms=250",
           "WARMUP_CHECK": "25", "WARMUP_OPS": "conv2d"}
    out = tmp_path / "out"
    subprocess.run(["bash", "benchmarks/gpu_call.sh", str(out)], cwd=ROOT, env=env, check=True,
                   capture_output=True, timeout=300)
    log = (out / "checks" / "lstm_check.log").read_text()
    assert "lstm dropped from OPS" in log
    conv = (out / "checks" / "conv_first_call.log").read_text()
    assert "needs a CUDA GPU" in conv and "did not finish" in conv   # the optional check fails alone
    assert "did not finish" in (out / "checks" / "backward_check.log").read_text()   # so does the backward check
    screen = (out / "checks" / "screen_check.log").read_text()   # and the screen one, which drops the screen
    assert 'screen_check did not finish or failed: screen_ms dropped (EXTRA="timeout_s=30")' in screen
    warm = (out / "checks" / "warmup_check.log").read_text()
    assert "is not visible (0 CUDA GPUs)" in warm and "warmup check did not finish" in warm   # and the warm-up one
    assert not (out / "collect.log").exists()                  # nothing left to sweep
    with tarfile.open(out / "data.tgz") as archive:
        assert archive.getnames() == []
    assert not (out / "live.tgz").exists() and not (out / "live.tgz.part").exists()   # a finished call: data.tgz only


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_a_call_cut_short_leaves_its_live_archive(tmp_path):
    """LIVE_S: while the call runs, the files written so far are packed into live.tgz, so a call killed before its
    end (its device time spent) still returns a readable archive."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": "", "OPS": "bmm", "TOTAL_S": "200", "LIVE_S": "1",
           "CONV_FIRST_CALL": "2", "BACKWARD_CHECK": "1"}
    out = tmp_path / "out"
    call = subprocess.Popen(["bash", "benchmarks/gpu_call.sh", str(out)], cwd=ROOT, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            if (out / "live.tgz").exists() or call.poll() is not None:
                break
            time.sleep(0.1)
        assert call.poll() is None, "the call ended before its first live archive"
    finally:
        os.killpg(call.pid, signal.SIGKILL)
        call.wait()
    with tarfile.open(out / "live.tgz") as archive:
        assert archive.getnames() == []   # no GPU: no rows, but the archive is whole
    assert not (out / "data.tgz").exists()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_partition_sweeps_run_one_per_partition_without_lstm(tmp_path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": "", "OPS": "bmm", "PARTS": "64 32",
           "PART_OPS": "lstm,conv2d", "TOTAL_S": "200"}
    out = tmp_path / "out"
    subprocess.run(["bash", "benchmarks/gpu_call.sh", str(out)], cwd=ROOT, env=env, check=True,
                   capture_output=True, timeout=300)
    assert "lstm is not swept in SM partitions" in (out / "parts.log").read_text()
    assert not (out / "collect.log").exists()        # with PARTS and MAIN_S=0 there is no full-GPU sweep
    for p in ("64", "32"):                            # each partition's sweep ran (and, without a GPU, refused)
        assert "is not visible (0 CUDA GPUs)" in (out / f"sm{p}.log").read_text()
    with tarfile.open(out / "data.tgz") as archive:
        assert archive.getnames() == []
