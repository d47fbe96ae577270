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


def _lstm_rows():
    return pd.DataFrame({"precision": "bf16", "phase": ["forward"] * 5,
                         "new_ms": [1.1, 2.2, 0.06, 3.0, 9.0], "old_ms": [3.0, 6.0, 0.06, 3.0, 9.0],
                         "kernel_ms": [1.0, 2.0, 0.02, 1.0, 2.0], "host_ms": [3.0, 6.0, 0.8, 3.1, 9.0],
                         "graph_ms": [1.05, float("nan"), 0.03, 0.9, 2.0], "kernels": [40, 80, 10, 200, 6000],
                         "status": ["ok", "ok", "ok", "ok", "host_paced"]})


def test_lstm_timing_summary_ratios_of_the_ok_rows():
    row = lstm_timing_check.summary(_lstm_rows()).loc[("bf16", "forward")]
    assert row["rows"] == 5 and row["ok_rows"] == 4 and row["host_paced"] == 1 and row["kernels_max"] == 6000
    assert row["new_over_kernel"] == pytest.approx(2.05)        # median of 1.1, 1.1, 3, 3
    assert row["new_over_graph"] == pytest.approx(2.0)           # median of 1.1/1.05, 0.06/0.03, 3.0/0.9 (NaN left out)
    assert row["following_host"] == pytest.approx(0.25)       # only the 3.0 ms row: 3x its kernels, near the host
    assert row["paced_over_gpu"] == pytest.approx(4.5)        # the host_paced row: 9 ms against 2 ms of GPU work


def test_lstm_rows_follow_the_host_only_when_slow_against_the_gpu_and_near_the_host():
    frame = _lstm_rows()
    following = lstm_timing_check.following_host(frame, 1.5).tolist()
    # a tiny LSTM 3x its kernel sum but far below the host's 0.8 ms is GPU time (gaps between dependent kernels)
    assert following == [False, False, False, True, True]


def test_lstm_timing_check_times_one_wait_for_all_calls_as_the_old_rule(monkeypatch):
    seen = []

    def fake_run_task(task, device, settings, faults):
        seen.append(settings)
        return {"forward": ("host_paced", lstm_timing_check.timing.Timing(1.0, 0.9, 1.1, 5, 2.0), "")}, False

    monkeypatch.setattr(lstm_timing_check, "run_task", fake_run_task)
    task = lstm_timing_check.Task("lstm", {}, "x", "fp32")
    assert lstm_timing_check.timed(task, lstm_timing_check.OLD_RULE) == {"forward": (1.0, 2.0, "host_paced")}
    assert seen[0].chain_busy_wait is False                     # one busy-wait for all calls...
    assert dataclasses.replace(seen[0], chain_busy_wait=True) == lstm_timing_check.SETTINGS  # ...nothing else


def test_lstm_timing_gate_fails_when_ok_rows_follow_the_host():
    frame = _lstm_rows()
    assert not lstm_timing_check.within(frame, 1.5)              # one of four ok rows follows the host
    assert lstm_timing_check.within(frame.drop(index=3), 1.5)    # the host_paced row does not count
    assert not lstm_timing_check.within(frame.assign(status="host_paced"), 1.5)   # no ok row: no evidence
    mostly_paced = frame.drop(index=3).assign(status=["ok", "host_paced", "host_paced", "host_paced"])
    assert not lstm_timing_check.within(mostly_paced, 1.5)       # 3 of 4 rows discarded: proves nothing


def test_lstm_timing_check_rejects_an_unknown_precision(capsys):
    with pytest.raises(SystemExit):
        lstm_timing_check.main(["--precisions", "fp8"])
    assert "--precisions" in capsys.readouterr().err


conv_first_call = _load("conv_first_call")


def test_conv_first_call_bands_and_gpu_share():
    rows = pd.DataFrame({"phase": ["forward", "backward", "forward", "backward"],
                         "estimated_ms": [0.01, 0.01, 20.0, 20.0], "first_wall_s": [0.5, 1.0, 2.0, 4.0],
                         "first_gpu_s": [0.05, 0.1, 1.8, 3.6], "kernels": [30, 60, 30, 60],
                         "steady_ms": [0.01, 0.02, 20.0, 40.0]})
    table = conv_first_call.summary(rows).set_index(["estimated_ms band", "phase"])
    assert table.loc[("[0.0, 0.05)", "forward"), "gpu_share"] == pytest.approx(0.1)
    assert table.loc[("[5.0, 50.0)", "backward"), "gpu_share"] == pytest.approx(0.9)
    assert table.loc[("all", "backward"), "rows"] == 2
    assert table.loc[("all", "backward"), "gpu_share"] == pytest.approx(3.7 / 5.0)
    assert table.loc[("all", "backward"), "first_wall_s_sum"] == pytest.approx(5.0)


def test_conv_first_call_rejects_an_unknown_precision(capsys):
    with pytest.raises(SystemExit):
        conv_first_call.main(["--precisions", "fp32,int4"])
    assert "--precisions" in capsys.readouterr().err


lstm_graph_check = _load("lstm_graph_check")


def _lstm_tasks():
    rows = []
    for i, (status, layers, seq) in enumerate([("host_paced", 5, 200), ("ok", 1, 2), ("ok", 4, 100), ("ok", 2, 10)]):
        cfg = {"batch": 8, "seq_len": seq, "input_size": 16, "hidden_size": 32, "num_layers": layers,
               "bidirectional": True, "bias": True}
        for phase, ms in (("forward", 1.0 + i), ("backward", 2.0 + i)):
            rows.append({"config_id": f"c{i}", "precision": "bf16", "phase": phase, "time_ms": ms,
                         "status": status if phase == "backward" else "ok", **cfg})
    return pd.DataFrame(rows)


def test_lstm_graph_check_picks_paced_tasks_and_the_longest_ok_chains():
    picked = lstm_graph_check.tasks(_lstm_tasks(), n=2, seed=0).set_index("config_id")
    assert list(picked.index) == ["c0", "c2", "c3"]       # a task with one host_paced phase is host_paced
    assert picked.loc["c0", "status"] == "host_paced"
    assert picked.loc["c2", "steps"] == 4 * 100 * 2
    assert (picked.loc["c2", "forward_ms"], picked.loc["c2", "backward_ms"]) == (3.0, 4.0)


def test_lstm_graph_summary_skips_failed_captures():
    frame = pd.DataFrame({"status": ["ok", "ok", "host_paced"], "forward_ms": [1.0, 2.0, 10.0],
                          "backward_ms": [2.0, 4.0, 20.0], "forward_graph_ms": [0.9, float("nan"), 5.0],
                          "step_graph_ms": [2.7, 5.0, 15.0]})
    frame["backward_graph_ms"] = frame["step_graph_ms"] - frame["forward_graph_ms"]
    table = lstm_graph_check.summary(frame).set_index("status")
    assert table.loc["ok", "captured"] == 1 and table.loc["ok", "tasks"] == 2
    assert table.loc["ok", "forward_graph_over_recorded"] == pytest.approx(0.9)
    assert table.loc["ok", "backward_graph_over_recorded"] == pytest.approx(0.9)
    assert table.loc["host_paced", "backward_graph_over_recorded"] == pytest.approx(0.5)


def test_lstm_graph_check_needs_lstm_rows(tmp_path, capsys):
    with pytest.raises(SystemExit):
        lstm_graph_check.main(["--root", str(tmp_path), "--gpu", "h200"])
    assert "--root/--gpu" in capsys.readouterr().err


screen_check = _load("screen_check")


def test_screen_check_compares_each_pass_with_the_unscreened_one():
    rows = []
    for mode, times, first in (("none", [1.0, 2.0], 3.0), ("none_again", [1.0, 2.1], 3.0),
                               ("heuristic_key", [2.0, 2.0], 0.1), ("screen", [1.0, 2.0], 2.5)):
        for (cid, phase), ms in zip((("a", "forward"), ("a", "backward")), times):
            rows.append({"mode": mode, "config_id": cid, "precision": "fp32", "phase": phase, "status": "ok",
                         "time_ms": ms, "first_call_s": first / 2})
    rows.append({"mode": "screen", "config_id": "b", "precision": "fp32", "phase": "forward",
                 "status": "over_budget", "time_ms": None, "first_call_s": None})
    table = screen_check.summarise(pd.DataFrame(rows)).set_index("mode")
    assert table.loc["none", "median_ratio"] == 1.0 and table.loc["none", "share_over_10pct"] == 0.0
    assert table.loc["heuristic_key", "max_ratio"] == 2.0 and table.loc["heuristic_key", "share_over_10pct"] == 0.5
    assert table.loc["heuristic_key", "first_call_s"] == pytest.approx(0.1)
    assert table.loc["none_again", "p90_abs_diff_pct"] == pytest.approx(4.5)
    assert (table.loc["screen", "rows"], table.loc["screen", "ok"]) == (3, 2)   # the skipped task is no ratio
    frame = pd.DataFrame(rows)
    assert screen_check.first_call_share(frame) == pytest.approx(2.5 / 3.0)          # autotuned: passes the gate
    slower_again = frame.assign(first_call_s=frame["first_call_s"].where(frame["mode"] != "none_again", 3.0))
    assert screen_check.first_call_share(slower_again) == pytest.approx(2.5 / 3.0)   # the faster unscreened pass
    assert screen_check.first_call_share(frame, "heuristic_key") < screen_check.MIN_FIRST_CALL_SHARE
    verdict, passed = screen_check.screen_verdict(frame)
    assert passed and "still autotunes" in verdict
    reused = frame.assign(first_call_s=frame["first_call_s"].where(frame["mode"] != "screen", 0.01))
    assert screen_check.screen_verdict(reused) == (
        "screen: first calls take 0.01x the unscreened ones' time: its pick was reused", False)
    slower = frame.assign(time_ms=frame["time_ms"].where(frame["mode"] != "screen", 1.5))
    verdict, passed = screen_check.screen_verdict(slower)
    assert not passed and "not the autotuned algorithms" in verdict
    dropped = frame.assign(status=frame["status"].where(
        ~((frame["mode"] == "screen") & (frame["phase"] == "backward")), "error"))
    verdict, passed = screen_check.screen_verdict(dropped)
    assert not passed and "1 fewer ok rows" in verdict
    nothing = frame[frame["mode"] != "screen"]
    assert screen_check.screen_verdict(nothing)[1] is False


def test_screen_check_rejects_no_configs(capsys):
    with pytest.raises(SystemExit):
        screen_check.main(["--n", "0"])
    assert "--n" in capsys.readouterr().err


collect_stats = _load("collect_stats")


def test_collect_stats_counts_a_runs_op_only_while_its_rows_are_in_the_dataset(tmp_path):
    import json

    label = tmp_path / "gpu=h200"
    label.mkdir()
    runs = (("20261201001836-0c33d9", {"conv2d": 10, "bmm": 20}), ("20261202071249-76851d", {"conv2d": 50}))
    for run_id, ops in runs:
        (label / f"_run-{run_id}.json").write_text(json.dumps({
            "run_id": run_id, "seconds": 100.0, "op_tasks": ops, "op_seconds": dict.fromkeys(ops, 40.0),
            "op_time_split": {op: {"first_call_s": 30.0, "timing_s": 4.0} for op in ops}}))
    for op in ("conv2d", "bmm"):   # the second run's conv2d rows were all retired: no file of it is left
        (label / f"op={op}").mkdir()
        (label / f"op={op}" / "part-20261201001836-0c33d9-00000.parquet").touch()
    runs, wall, tasks, seconds, split_seconds, first, no_result = collect_stats.throughput(label)
    assert (runs, wall) == (1, 100.0)
    assert tasks == {"conv2d": 10, "bmm": 20} and seconds["conv2d"] == 40.0 and first["bmm"] == 30.0
    assert no_result == {"conv2d": 6.0, "bmm": 6.0}   # 40 s less the 34 s the split accounts for
    (label / "_run-20261203000000-aaaaaa.json").write_text(json.dumps({   # every conv2d task of it timed out
        "run_id": "20261203000000-aaaaaa", "seconds": 50.0, "op_tasks": {"conv2d": 2},
        "op_seconds": {"conv2d": 45.0}, "op_time_split": {}}))
    (label / "op=conv2d" / "part-20261203000000-aaaaaa-00000.parquet").touch()
    (label / "_run-20261130000000-bbbbbb.json").write_text(json.dumps({   # before the split existed
        "run_id": "20261130000000-bbbbbb", "seconds": 30.0, "op_tasks": {"conv2d": 3}, "op_seconds": {"conv2d": 25.0}}))
    (label / "op=conv2d" / "part-20261130000000-bbbbbb-00000.parquet").touch()
    runs, wall, tasks, seconds, split_seconds, first, no_result = collect_stats.throughput(label)
    assert (runs, tasks["conv2d"], seconds["conv2d"]) == (3, 15, 110.0)
    assert (split_seconds["conv2d"], first["conv2d"], no_result["conv2d"]) == (85.0, 30.0, 51.0)


conv_algorithms = _load("conv_algorithms")


def _conv_rows(times_over_bound):
    """conv2d rows on the H200 whose times are the given multiples of their bound, per task and phase."""
    from pipeline import features

    base = {"batch": 8, "in_channels": 64, "out_channels": 64, "height": 32, "width": 32, "stride_h": 1,
            "stride_w": 1, "pad_h": 0, "pad_w": 0, "dilation_h": 1, "dilation_w": 1, "groups": 1, "bias": False}
    rows = []
    for i, (kernel, forward, backward) in enumerate(times_over_bound):
        cfg = {**base, "kernel_h": kernel, "kernel_w": kernel}
        for phase, ratio in (("forward", forward), ("backward", backward)):
            bound = features.bound_ms("conv2d", pd.DataFrame([cfg]), "h200", "fp32", phase)[0]
            rows.append({"config_id": f"c{i}", "precision": "fp32", "phase": phase, "time_ms": ratio * bound, **cfg})
    return pd.DataFrame(rows)


def test_conv_algorithms_picks_the_tasks_below_the_bound_then_the_closest_large_kernel_controls():
    rows = _conv_rows([(3, 2.0, 3.0), (10, 0.1, 1.2), (7, 1.5, 0.8), (5, 1.3, 2.0), (9, 4.0, 5.0), (3, 1.1, 1.2)])
    picked = conv_algorithms.select(rows, "h200", max_ratio=1.0, controls=2)
    assert list(picked["config_id"]) == ["c1", "c2", "c3", "c4"]    # lowest ratio first; the 3x3 c5 is no control
    assert list(picked["kind"]) == ["below", "below", "control", "control"]
    c1 = picked.set_index("config_id").loc["c1"]
    assert c1["forward_ratio"] == pytest.approx(0.1) and c1["backward_ratio"] == pytest.approx(1.2)
    assert c1["kernel_h"] == 10
    assert conv_algorithms.select(rows, "h200", max_ratio=0.5, controls=0)["config_id"].tolist() == ["c1"]


def test_conv_algorithms_names_the_family_of_a_kernel_and_the_one_holding_most_time():
    assert conv_algorithms.algorithm("void fft2d_r2c_32x32<float, false, 1u, true>(...)") == "fft"
    assert conv_algorithms.algorithm("sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32") == "gemm"
    assert conv_algorithms.algorithm("void cudnn::winograd_nonfused::winogradForwardData4x4") == "winograd"
    assert conv_algorithms.algorithm("void nchwToNhwcKernel<float>") == "other"
    assert conv_algorithms.algorithm("volta_cgemm_32x32_tn") == "fft"          # FFT's complex products
    assert conv_algorithms.algorithm("sm80_xmma_gemm_cf32cf32_f32f32_cf32_tn_n_tilesize64x64x8") == "fft"
    assert conv_algorithms.algorithm("void flip_filter<float, float>(...)") == "fft"
    assert conv_algorithms.algorithm("void cudnn::cnn::wgrad_alg0_engine<float, 128, 6>") == "direct"
    assert conv_algorithms.algorithm("ampere_scudnn_128x64_relu_interior_nn_v1") == "gemm"
    tasks = conv_algorithms.select(_conv_rows([(10, 0.1, 1.2)]), "h200", controls=0)
    kernels = pd.DataFrame([
        {"config_id": "c0", "precision": "fp32", "phase": "forward", "kernel": "fft2d_r2c", "us_per_op": 600.0},
        {"config_id": "c0", "precision": "fp32", "phase": "forward", "kernel": "fft2d_c2r", "us_per_op": 300.0},
        {"config_id": "c0", "precision": "fp32", "phase": "forward", "kernel": "sm90_xmma_gemm", "us_per_op": 400.0},
        {"config_id": "c0", "precision": "fp32", "phase": "backward", "kernel": "sm90_xmma_dgrad", "us_per_op": 5e3}])
    kernels["algorithm"] = kernels["kernel"].map(conv_algorithms.algorithm)
    table = conv_algorithms.summary(tasks, kernels).set_index("phase")
    assert table.loc["forward", "algorithm"] == "fft"
    assert table.loc["forward", "share"] == pytest.approx(900 / 1300, abs=1e-3)
    assert table.loc["forward", "profiled_ms"] == pytest.approx(1.3)
    assert table.loc["forward", "longest_kernel"] == "fft2d_r2c"
    assert table.loc["backward", "algorithm"] == "gemm" and table.loc["backward", "bound_ratio"] == pytest.approx(1.2)


def test_conv_algorithms_rejects_a_label_without_conv2d_rows(tmp_path, capsys):
    with pytest.raises(SystemExit):
        conv_algorithms.main(["--root", str(tmp_path), "--gpu", "h200"])
    assert "--root/--gpu" in capsys.readouterr().err


def test_conv_algorithms_writes_what_it_has_whole(tmp_path):
    tasks = conv_algorithms.select(_conv_rows([(10, 0.1, 1.2), (11, 0.4, 0.5)]), "h200", controls=0)
    kernels = pd.DataFrame([{"config_id": "c0", "precision": "fp32", "phase": "forward", "kernel": "fft2d_r2c",
                             "us_per_op": 600.0, "algorithm": "fft"}])
    text = conv_algorithms.write(tmp_path, tasks, kernels, "cmd", "a GPU")   # one of two tasks done
    assert "| fft |" in text and "`cmd`" in text
    assert pd.read_csv(tmp_path / "conv_algorithms.csv")["kernel"].tolist() == ["fft2d_r2c"]
    assert (tmp_path / "conv_algorithms.md").read_text() == text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conv_algorithms.csv", "conv_algorithms.md"]  # no temps
    assert "No task ran." in conv_algorithms.write(tmp_path, tasks, pd.DataFrame(), "cmd", "a GPU")


def test_conv_algorithms_summarize_names_the_kernels_again_without_a_gpu(tmp_path):
    tasks = conv_algorithms.select(_conv_rows([(10, 0.1, 1.2)]), "h200", controls=0)
    kernels = pd.DataFrame([
        {"config_id": "c0", "precision": "fp32", "phase": "forward", "kernel": "sm80_xmma_gemm_cf32cf32_tn",
         "calls_per_op": 1.0, "us_per_op": 900.0, "algorithm": "gemm"},      # as named before the cf32 rule
        {"config_id": "c0", "precision": "fp32", "phase": "forward", "kernel": "fft2d_r2c_32x32", "calls_per_op": 1.0,
         "us_per_op": 200.0, "algorithm": "fft"}])
    conv_algorithms.write(tmp_path, tasks, kernels, "cmd", "NVIDIA H200")
    text = conv_algorithms.summarize(tmp_path, tasks, "cmd")
    assert "on NVIDIA H200" in text.splitlines()[0]
    table = conv_algorithms.summary(tasks, pd.read_csv(tmp_path / "conv_algorithms.csv")).set_index("phase")
    assert table.loc["forward", "algorithm"] == "fft" and table.loc["forward", "share"] == pytest.approx(1.0)
    assert set(pd.read_csv(tmp_path / "conv_algorithms.csv")["algorithm"]) == {"fft"}
    with pytest.raises(SystemExit, match="needs"):
        conv_algorithms.summarize(tmp_path / "none", tasks, "cmd")
