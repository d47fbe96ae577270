"""The summaries of two GPU check scripts, on frames written here: benchmarks/clock_check.py (rate per time window
since the first call) and benchmarks/kernel_profile.py (TFLOP/s over a phase's GEMM kernels)."""

from __future__ import annotations

import dataclasses
import importlib.util

import pandas as pd
import pytest
from conftest import ROOT


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


clock_check = _load("clock_check")
kernel_profile = _load("kernel_profile")


def test_clock_windows_and_the_sustained_over_burst_ratio():
    # 800 TFLOP/s for the first 25 ms, then 700, then 680 from 2 s on
    start = [1.0, 10.0, 24.0, 30.0, 90.0, 400.0, 2500.0, 2900.0]
    tflops = [800, 800, 800, 700, 700, 700, 680, 680]
    trace = pd.DataFrame({"precision": "bf16", "start_ms": start, "call_ms": 1.0, "tflops": tflops})
    out = clock_check.summarize(trace)["bf16"]
    assert out["tflops_by_window"]["0-25 ms"] == 800
    assert out["tflops_by_window"]["25-100 ms"] == 700
    assert out["tflops_by_window"][">= 2000 ms"] == 680
    assert "500-1000 ms" not in out["tflops_by_window"]      # no call started in that window
    assert out["last_over_first"] == pytest.approx(0.85)
    assert out["calls"] == 8


def test_clock_check_rejects_an_unknown_precision(capsys):
    with pytest.raises(SystemExit):
        clock_check.main(["--out", "unused", "--precisions", "bf16,int8"])
    assert "--precisions" in capsys.readouterr().err


def test_kernel_rates_count_gemm_kernels_only_and_backward_twice_the_flops():
    kernels = pd.DataFrame([
        {"m": 1024, "n": 1024, "k": 1024, "precision": "tf32", "phase": "forward", "kernel": "sm90_xmma_gemm_tn",
         "calls": 1, "mean_us": 10.0},
        {"m": 1024, "n": 1024, "k": 1024, "precision": "tf32", "phase": "forward", "kernel": "Memset (Device)",
         "calls": 1, "mean_us": 5.0},
        {"m": 1024, "n": 1024, "k": 1024, "precision": "tf32", "phase": "backward", "kernel": "sm90_xmma_gemm_nt",
         "calls": 1, "mean_us": 15.0},
        {"m": 1024, "n": 1024, "k": 1024, "precision": "tf32", "phase": "backward", "kernel": "sm90_xmma_gemm_nn",
         "calls": 1, "mean_us": 5.0},
    ])
    out = kernel_profile.rates(kernels).set_index("phase")
    assert out.loc["forward", "us"] == 10.0                   # the memset is not a GEMM
    assert out.loc["backward", "us"] == 20.0
    flops = 2 * 1024 ** 3
    assert out.loc["forward", "tflops"] == pytest.approx(flops / 10e-6 / 1e12)
    assert out.loc["backward", "tflops"] == pytest.approx(2 * flops / 20e-6 / 1e12)


def test_kernel_profile_rejects_a_malformed_shape(capsys):
    with pytest.raises(SystemExit):
        kernel_profile.main(["--out", "unused", "--shapes", "8192x8192"])
    assert "--shapes" in capsys.readouterr().err


lstm_timing_check = _load("lstm_timing_check")


def test_lstm_timing_summary_ratios_to_the_kernel_sum():
    frame = pd.DataFrame({"precision": "bf16", "phase": ["forward"] * 4,
                          "new_ms": [1.1, 2.2, 1.1, 1.1], "old_ms": [3.0, 6.0, 3.0, 3.0],
                          "kernel_ms": [1.0, 2.0, 1.0, 1.0], "host_ms": [3.0, 6.0, 0.5, 0.5],
                          "graph_ms": [1.05, 2.1, float("nan"), 1.05], "kernels": [40, 80, 40, 1200]})
    row = lstm_timing_check.summary(frame).loc[("bf16", "forward")]
    assert row["rows"] == 4
    assert row["new_over_kernel"] == pytest.approx(1.1)
    assert row["old_over_kernel"] == pytest.approx(3.0)
    assert row["host_bound_share"] == pytest.approx(0.5)     # two of four rows: host over 1.5x the kernels
    assert row["graph_over_kernel"] == pytest.approx(1.05)   # a failed capture (NaN) is left out
    assert row["kernels_max"] == 1200


def test_lstm_timing_check_times_the_old_rule_through_the_settings(monkeypatch):
    seen = []

    def fake_run_task(task, device, settings, faults):
        seen.append(settings)
        return {"forward": ("ok", lstm_timing_check.timing.Timing(1.0, 0.9, 1.1, 5, 2.0), "")}, False

    monkeypatch.setattr(lstm_timing_check, "run_task", fake_run_task)
    task = lstm_timing_check.Task("lstm", {}, "x", "fp32")
    assert lstm_timing_check.timed(task, lstm_timing_check.OLD_RULE) == {"forward": (1.0, 2.0)}
    assert seen[0].host_margin == 1.0                          # the rule before the fix...
    assert dataclasses.replace(seen[0], host_margin=2.0) == lstm_timing_check.SETTINGS  # ...and nothing else changed


def test_lstm_timing_gate_needs_every_cell_within_the_ratio():
    table = pd.DataFrame({"new_over_kernel": [1.1, 1.4]})
    assert lstm_timing_check.within(table, 1.5)
    assert not lstm_timing_check.within(table.assign(new_over_kernel=[1.1, 1.6]), 1.5)
    assert not lstm_timing_check.within(table.iloc[:0], 1.5)     # no rows: the check did not run


def test_lstm_timing_check_rejects_an_unknown_precision(capsys):
    with pytest.raises(SystemExit):
        lstm_timing_check.main(["--precisions", "fp8"])
    assert "--precisions" in capsys.readouterr().err
