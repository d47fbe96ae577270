"""Collector on the CPU: seeded sampling, resume after kill -9, watchdog, OOM/crash rows, schema."""

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import numpy as np
import pandas as pd
import pytest
from conftest import ROOT, compose_app, config_group

from pipeline import schema
from pipeline.collect import Sweep, plan, run_sweep
from pipeline.gpus import gpu_spec
from pipeline.ops import get_op
from pipeline.ops.base import estimate_ms, sample_configs
from pipeline.timing import TimingSettings

SPACES = config_group("space")
CATALOGS = config_group("catalog")
FAST = TimingSettings(warmup_ms=0.5, min_time_ms=1.0, min_reps=3, max_reps=10)


def _sweep(tmp_path, **kw):
    base = dict(gpu="cpu-test", device="cpu", n=3, out=str(tmp_path / "ds"), spaces=SPACES, catalogs=CATALOGS,
                timing=FAST,
                progress=False, shard_rows=8, shard_seconds=60)
    base.update(kw)
    return Sweep(**base)


def test_choice_draws_what_numpys_choice_draws():
    """The committed configs were drawn with ``rng.choice(len, p=...)``; the faster lookup must draw the same
    option and leave the generator in the same state, or a resumed sweep would plan other configs."""
    from pipeline.ops.base import choice

    menus = [([1, 3, 5, 7, 11, 2, 4, 6, 8, 9, 10], [30, 40, 8, 6, 2, 2, 2, 1, 1, 1, 1]),
             ([1, 2, 3, 4], [60, 30, 5, 5]), ([(1, 3), (3, 1), (1, 7), (7, 1), (5, 20)], None), ([2, 3, 4], None)]
    for seed in range(500):
        ours, numpys = np.random.default_rng(seed), np.random.default_rng(seed)
        for options, weights in menus * 3:
            p = None if weights is None else np.asarray(weights, float) / float(np.sum(weights))
            assert choice(ours, options, weights) == options[int(numpys.choice(len(options), p=p))]
        assert ours.random() == numpys.random()
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="weights: 2 weights for 3 options"):
        choice(rng, [1, 2, 3], [5, 7])
    with pytest.raises(ValueError, match="weights: .* non-negative"):
        choice(rng, [1, 2], [-1, 2])


@pytest.mark.parametrize("op", schema.OPS)
def test_sampling_is_seeded_prefix_stable_and_valid(op):
    spec = get_op(op)
    for kind in ("gpu", "cpu"):
        space = SPACES[op][kind]
        a = sample_configs(spec, space, 60, 7, "bf16", CATALOGS[op])
        assert a == sample_configs(spec, space, 60, 7, "bf16", CATALOGS[op])
        assert a[:20] == sample_configs(spec, space, 20, 7, "bf16", CATALOGS[op])
        assert a != sample_configs(spec, space, 60, 8, "bf16", CATALOGS[op])
        assert a != sample_configs(spec, space, 60, 7, "fp32", CATALOGS[op])  # one stream per precision
        ids = [schema.config_id(op, c) for c in a]
        assert len(set(ids)) == len(ids)
        for cfg in a:
            assert set(cfg) == set(schema.OP_CONFIG_COLUMNS[op])
            assert spec.valid(cfg) and spec.flops(cfg) <= float(space.get("max_flops") or math.inf)


@pytest.mark.parametrize("op,precision", [("linear", "bf16"), ("bmm", "fp32"), ("conv2d", "bf16"),
                                          ("lstm", "fp32")])
def test_gpu_sampling_has_equal_counts_per_band_of_estimated_time(op, precision):
    spec, space = get_op(op), SPACES[op]["gpu"]
    configs = sample_configs(spec, space, 200, 0, precision, CATALOGS[op])
    reference = gpu_spec(space["reference_gpu"])
    times = [estimate_ms(spec, c, precision, reference) for c in configs]
    counts, _ = np.histogram(times, space["strata_ms"])
    assert list(counts) == [50, 50, 50, 50]
    assert max(times) < space["strata_ms"][-1]
    assert sum(spec.memory_elems(c) * 2 for c in configs) / len(configs) < space["max_memory_gb"] * 1e9


def test_gpu_space_covers_the_wide_ranges_and_real_layers():
    convs = sample_configs(get_op("conv2d"), SPACES["conv2d"]["gpu"], 1500, 0, "fp32", CATALOGS["conv2d"])
    assert max(c["in_channels"] for c in convs) >= 1024
    assert {c["stride_h"] for c in convs} >= {1, 2, 3, 4}
    assert any(c["groups"] == c["in_channels"] > 1 for c in convs)  # depthwise
    assert any(c["dilation_h"] > 1 for c in convs) and any(c["height"] != c["width"] for c in convs)
    assert max(c["kernel_h"] for c in convs) >= 9
    real = {schema.config_id("conv2d", c) for c in get_op("conv2d").real_shapes(CATALOGS["conv2d"],
                                                                                SPACES["conv2d"]["gpu"])}
    assert sum(schema.config_id("conv2d", c) in real for c in convs) >= 0.9 * len(real)  # the whole catalog
    lstms = sample_configs(get_op("lstm"), SPACES["lstm"]["gpu"], 500, 0, "fp32", CATALOGS["lstm"])
    assert {c["num_layers"] for c in lstms} >= set(range(1, 7)) and any(c["bidirectional"] for c in lstms)
    linears = sample_configs(get_op("linear"), SPACES["linear"]["gpu"], 500, 0, "bf16", CATALOGS["linear"])
    assert max(c["out_features"] for c in linears) >= 16384


def test_catalog_holds_llm_projections_attention_and_cnn_layers():
    linear = get_op("linear").real_shapes(CATALOGS["linear"], SPACES["linear"]["gpu"])
    # Llama-3-70B at tensor-parallel 8: fused QKV (64 + 2 x 8 heads of 128) / 8, MLP down 28672 / 8 -> 8192
    assert {"batch": 4096, "in_features": 8192, "out_features": 1280, "bias": False} in linear
    assert {"batch": 4096, "in_features": 3584, "out_features": 8192, "bias": False} in linear
    assert {"batch": 16384, "in_features": 8192, "out_features": 7168, "bias": False} in linear
    bmm = get_op("bmm").real_shapes(CATALOGS["bmm"], SPACES["bmm"]["gpu"])
    assert max(c["batch"] for c in bmm) >= 4096 and max(c["m"] for c in bmm) == 8192
    conv = get_op("conv2d").real_shapes(CATALOGS["conv2d"], SPACES["conv2d"]["gpu"])
    assert {c["batch"] for c in conv} == {32, 64, 128, 256}
    lstm = get_op("lstm").real_shapes(CATALOGS["lstm"], SPACES["lstm"]["gpu"])
    assert any(c["hidden_size"] == 800 and c["num_layers"] == 5 and c["bidirectional"] for c in lstm)


def test_sampling_a_space_too_small_for_n_is_a_clear_error_not_a_hang():
    tiny = {"max_batch": 1, "max_dim": 2}
    assert len(sample_configs(get_op("bmm"), tiny, 8, 0)) == 8  # [1, m, k] @ [1, k, n]: 2 x 2 x 2 configs
    started = time.monotonic()
    with pytest.raises(ValueError, match=r"space: the bmm space yields only 8 distinct valid configs"):
        sample_configs(get_op("bmm"), tiny, 9, 0)
    assert time.monotonic() - started < 10
    assert sample_configs(get_op("bmm"), tiny, 12, 0, partial=True) == sample_configs(get_op("bmm"), tiny, 8, 0)


def test_partition_sweeps_skip_lstm_and_cap_estimated_time(tmp_path):
    full = plan(_sweep(tmp_path, n=40, precisions=("fp32",)), "cpu", 1e12)
    part = plan(_sweep(tmp_path, n=40, precisions=("fp32",), sm_partition=4), "cpu", 1e12)
    assert {t.op for t in full} == set(schema.OPS) and {t.op for t in part} == {"conv2d", "linear", "bmm"}
    gpu_spaces = {op: {"gpu": SPACES[op]["gpu"], "cpu": SPACES[op]["gpu"]} for op in schema.OPS}
    uncapped = plan(_sweep(tmp_path, n=40, ops=("linear",), spaces=gpu_spaces), "cpu", 1e15)
    capped = plan(_sweep(tmp_path, n=40, ops=("linear",), spaces=gpu_spaces, sm_partition=33,
                         max_estimated_ms=5.0), "cpu", 1e15)
    reference = gpu_spec("h200")
    assert len(capped) < len(uncapped)
    assert all(estimate_ms(get_op("linear"), t.config, "fp32", reference) * 132 / 33 <= 5.0 for t in capped)
    assert {t.config_id for t in capped} <= {t.config_id for t in uncapped}  # the same configs, paired


def test_tasks_interleave_ops_and_precisions_by_config_index(tmp_path):
    tasks = plan(_sweep(tmp_path, n={"fp32": 4, "bf16": 2}, precisions=("fp32", "bf16")), "cpu", 1e12)
    assert [(t.op, t.precision) for t in tasks[:8]] == [(op, p) for op in schema.OPS for p in ("fp32", "bf16")]
    assert len(tasks) == 4 * (4 + 2) and {t.precision for t in tasks[-8:]} == {"fp32"}


def test_plan_filters_configs_that_do_not_fit(tmp_path):
    sweep = _sweep(tmp_path, n=50, precisions=("fp32",))
    everything = plan(sweep, "cpu", 1e12)
    small = plan(sweep, "cpu", 2e4)
    assert len(small) < len(everything)
    assert all(get_op(t.op).memory_elems(t.config) * 4 * 1.5 <= 0.5 * 2e4 for t in small)
    with pytest.raises(ValueError, match="n: no count for precision 'fp32'"):
        plan(_sweep(tmp_path, n={"bf16": 3}), "cpu", 1e12)
    with pytest.raises(ValueError, match="precisions"):
        plan(_sweep(tmp_path, precisions=("fp64",)), "cpu", 1e12)


def _keys(frame):
    return sorted(zip(frame["config_id"], frame["precision"], frame["phase"]))


def test_sweep_writes_valid_rows_and_resume_adds_only_missing(tmp_path):
    summary = run_sweep(_sweep(tmp_path, n=2))
    assert summary["status"] == {"ok": 16} and summary["complete"] is True
    # each flush left the summary so far beside the rows (a sweep killed later keeps its throughput)
    (sidecar,) = (tmp_path / "ds" / "gpu=cpu-test").glob("_run-*.json")
    partial = json.loads(sidecar.read_text())
    assert partial["complete"] is False and partial["run_id"] == summary["run_id"]
    assert sum(partial["op_tasks"].values()) == 8 and partial["configs_per_s"]
    first = schema.read_dataset(tmp_path / "ds")
    assert len(first) == 16 and (first["status"] == "ok").all() and (first["time_ms"] > 0).all()
    assert (first["time_p20_ms"] <= first["time_ms"]).all() and (first["time_ms"] <= first["time_p80_ms"]).all()
    again = run_sweep(_sweep(tmp_path, n=3))
    assert again["skipped_done"] == 8 and sum(again["status"].values()) == 8
    both = schema.read_dataset(tmp_path / "ds")
    assert len(both) == 24 and len(set(_keys(both))) == 24


def test_one_worker_per_device_measures_every_task_once(tmp_path, monkeypatch):
    """A host of several GPUs runs one worker per GPU from one queue (two CPU workers stand in for them)."""
    from pipeline.collect import scheduler

    monkeypatch.setattr(scheduler, "resolve_devices", lambda device: ["cpu", "cpu"])
    senders, send = Counter(), scheduler.Worker.send

    def counted_send(worker, task):
        senders[id(worker)] += 1
        send(worker, task)

    monkeypatch.setattr(scheduler.Worker, "send", counted_send)
    # tasks of about 0.1 s, so that the queue outlasts the few seconds a worker may take to start after the other
    slower = TimingSettings(warmup_ms=5.0, min_time_ms=40.0, min_reps=3, max_reps=10)
    summary = run_sweep(_sweep(tmp_path, n=3, timing=slower))
    assert summary["devices"] == ["cpu", "cpu"] and summary["status"] == {"ok": 24}
    assert len(senders) == 2 and sum(senders.values()) == 12   # both workers measured, each task sent once
    rows = schema.read_dataset(tmp_path / "ds")
    assert len(rows) == 24 and len(set(_keys(rows))) == 24
    assert run_sweep(_sweep(tmp_path, n=3))["skipped_done"] == 12


def test_watchdog_oom_and_crash_become_rows(tmp_path):
    tasks = plan(_sweep(tmp_path, n=3, ops=("linear",)), "cpu", 1e12)
    hang, oom, crash = (t.config_id for t in tasks)
    sweep = _sweep(tmp_path, n=3, ops=("linear",), timeout_s=4,
                   fault_injection={"hang": [hang], "oom": [oom], "crash": [crash]})
    started = time.monotonic()
    summary = run_sweep(sweep)
    assert time.monotonic() - started < 60
    rows = schema.read_dataset(tmp_path / "ds")
    status = dict(zip(rows["config_id"], rows["status"]))
    assert status == {hang: "timeout", oom: "oom", crash: "error"}
    crash_error = rows.loc[rows["config_id"] == crash, "error"].iloc[0]
    assert "worker process died" in crash_error
    assert summary["status"] == {"timeout": 2, "oom": 2, "error": 2}


def test_resumed_sweep_replaces_failed_tasks_with_the_next_seeded_configs(tmp_path):
    """A task that ended without a result keeps its rows, and a resume adds the next config in its place, so the
    sweep tops up to n measured configs; without replace_failed a resume has nothing left to do."""
    ids = [schema.config_id("linear", c) for c in sample_configs(get_op("linear"), SPACES["linear"]["cpu"], 6, 0,
                                                                  "fp32", CATALOGS["linear"])]
    assert [t.config_id for t in plan(_sweep(tmp_path, n=3, ops=("linear",)), "cpu", 1e12)] == ids[:3]
    failed = {("linear", ids[1], "fp32"), ("linear", ids[4], "fp32"), ("bmm", ids[0], "fp32")}
    assert [t.config_id for t in plan(_sweep(tmp_path, n=3, ops=("linear",)), "cpu", 1e12, failed)] == ids[:4]
    assert [t.config_id for t in plan(_sweep(tmp_path, n=3, ops=("linear",), replace_failed=False), "cpu", 1e12,
                                      failed)] == ids[:3]

    failed.add(("linear", ids[3], "fp32"))   # replacements that failed too (ids 3 and 4) add one more each
    assert [t.config_id for t in plan(_sweep(tmp_path, n=3, ops=("linear",)), "cpu", 1e12, failed)] == ids[:6]

    first = run_sweep(_sweep(tmp_path, n=3, ops=("linear",), fault_injection={"crash": [ids[1]]}))
    assert first["status"] == {"ok": 4, "error": 2} and first["replace_failed"] is True
    assert schema.file_metadata(schema.dataset_files(tmp_path / "ds")[0])["replace_failed"] is True
    assert run_sweep(_sweep(tmp_path, n=3, ops=("linear",), replace_failed=False))["skipped_done"] == 3
    assert len(schema.read_dataset(tmp_path / "ds")) == 6
    again = run_sweep(_sweep(tmp_path, n=3, ops=("linear",)))
    assert again["skipped_done"] == 3 and again["status"] == {"ok": 2}
    rows = schema.read_dataset(tmp_path / "ds")
    assert set(rows.loc[rows["status"] == "ok", "config_id"]) == {ids[0], ids[2], ids[3]}
    assert list(rows.loc[rows["config_id"] == ids[1], "status"]) == ["error", "error"]   # the failed rows stay
    assert run_sweep(_sweep(tmp_path, n=3, ops=("linear",)))["skipped_done"] == 4   # topped up: nothing to do


def test_replacements_are_the_next_configs_the_filters_and_the_shard_keep(tmp_path):
    """A failed task is replaced by the next config that the memory filter and the job's shard keep, so a filtered
    replacement never counts as measured; a failed config the filters drop is not planned and adds nothing."""
    spec, n = get_op("linear"), 10
    cfgs = sample_configs(spec, SPACES["linear"]["cpu"], 60, 0, "fp32", CATALOGS["linear"])
    ids = [schema.config_id("linear", c) for c in cfgs]
    need = np.array([spec.memory_elems(c) * 4 * 1.5 for c in cfgs])
    memory = 2 * float(np.median(need))            # memory_fraction 0.5: about half the configs fit
    fits = list(np.flatnonzero(need <= 0.5 * memory))
    first, later = [i for i in fits if i < n], [i for i in fits if i >= n]
    dropped = [i for i in range(n) if i not in fits]
    assert len(first) >= 2 and len(later) >= 3 and dropped   # the draw this test relies on

    def planned(failed, **kw):
        return [t.config_id for t in plan(_sweep(tmp_path, n=n, ops=("linear",), **kw), "cpu", memory, failed)]

    assert planned(()) == [ids[i] for i in first]
    failed = {("linear", ids[first[0]], "fp32"), ("linear", ids[later[0]], "fp32")}
    assert planned(failed) == [ids[i] for i in first + later[:2]]
    assert planned({("linear", ids[dropped[0]], "fp32")}) == [ids[i] for i in first]
    shard1 = [i for i in fits if i % 2 == 1]
    mine = [i for i in shard1 if i < n]
    assert mine and len(shard1) > len(mine)
    assert planned({("linear", ids[mine[0]], "fp32")}, num_shards=2, shard=1) == [
        ids[i] for i in mine + [j for j in shard1 if j >= n][:1]]


def test_screen_ms_skips_tasks_whose_untuned_call_is_over_budget(tmp_path, monkeypatch):
    """A task whose untuned call outlasts screen_ms in a phase gets over_budget rows, both phases, and no time;
    the others are measured as without the screen; a resume does not retry the skipped ones."""
    import torch

    from pipeline.collect.worker import untuned_call_ms

    fn = torch.nn.Linear(64, 64)
    x = torch.randn(32, 64, requires_grad=True)
    backwards = []

    def backward_of(out):
        backwards.append(out.shape)
        return lambda: torch.autograd.grad(out, [x, *fn.parameters()], torch.randn_like(out), retain_graph=True)

    flags = []

    def forward():  # the screen's calls run under cuDNN keys the task's own (autotuned) calls never use
        flags.append((torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic))
        return fn(x)

    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)   # as a sweep sets it
    monkeypatch.setattr(torch.backends.cudnn, "deterministic", False)
    ms = untuned_call_ms(torch, forward, backward_of, "cpu")
    assert set(ms) == {"forward", "backward"} and all(v > 0 for v in ms.values())
    assert flags == [(False, True)]
    assert backwards == [(32, 64)]  # the task's own backward, of the screened forward's output
    assert set(untuned_call_ms(torch, lambda: fn(x), None, "cpu")) == {"forward"}
    assert torch.backends.cudnn.benchmark is True and torch.backends.cudnn.deterministic is False  # restored
    calls = []

    def first_call_slow():  # a shape's first call pays one-time costs; the screen times such a call again
        calls.append(1)
        time.sleep(0.2 if len(calls) == 1 else 0.0)
        return fn(x)

    warm = untuned_call_ms(torch, first_call_slow, backward_of, "cpu", again_over_ms=100.0)
    assert len(calls) == 2 and warm["forward"] < 100.0
    calls.clear()
    assert untuned_call_ms(torch, first_call_slow, None, "cpu")["forward"] >= 200.0 and len(calls) == 1
    calls.clear()

    def always_slow():
        calls.append(1)
        time.sleep(0.12)
        return fn(x)

    assert untuned_call_ms(torch, always_slow, None, "cpu", again_over_ms=100.0)["forward"] >= 120.0
    assert len(calls) == 2

    summary = run_sweep(_sweep(tmp_path, n=2, ops=("linear",), screen_ms=1e-6))
    assert summary["status"] == {"over_budget": 4}
    rows = schema.read_dataset(tmp_path / "ds")
    assert (rows["status"] == "over_budget").all() and rows["time_ms"].isna().all()
    assert rows["error"].str.contains(r"untuned call forward [0-9.]+ ms, backward [0-9.]+ ms > screen_ms 1e-06").all()
    meta = schema.file_metadata(schema.dataset_files(tmp_path / "ds")[0])
    assert meta["screen_ms"] == 1e-6 and meta["screen_key"] == "cudnn.deterministic"   # not the first screen's
    assert run_sweep(_sweep(tmp_path, n=2, ops=("linear",)))["skipped_done"] == 2
    generous = run_sweep(_sweep(tmp_path / "b", n=2, ops=("linear",), screen_ms=1e6))
    assert generous["status"] == {"ok": 4}


def test_kill_minus_9_then_resume_equals_an_uninterrupted_sweep(tmp_path):
    args = [sys.executable, "-m", "pipeline.collect", "gpu=cpu-test", "device=cpu", "n=6", "shard_rows=4",
            "progress=false", "timing.min_time_ms=1", "timing.warmup_ms=0.5", "timing.min_reps=3",
            f"hydra.run.dir={tmp_path}/hydra"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = tmp_path / "crashed"
    proc = subprocess.Popen(args + [f"out={out}"], cwd=ROOT, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    def flushed():  # two shard files, and the summary written after a flush (one flush may write a file per op)
        return len(schema.dataset_files(out)) >= 2 and any((out / "gpu=cpu-test").glob("_run-*.json"))

    while not flushed() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the parent and its worker, at once
    proc.wait()
    partial = schema.read_dataset(out)
    assert 0 < len(partial) < 48
    (sidecar,) = (out / "gpu=cpu-test").glob("_run-*.json")
    assert json.loads(sidecar.read_text())["complete"] is False
    subprocess.run(args + [f"out={out}"], cwd=ROOT, env=env, check=True, capture_output=True)
    resumed = schema.read_dataset(out)
    clean = tmp_path / "clean"
    subprocess.run(args + [f"out={clean}"], cwd=ROOT, env=env, check=True, capture_output=True)
    uninterrupted = schema.read_dataset(clean)
    assert len(resumed) == len(uninterrupted) == 48
    assert _keys(resumed) == _keys(uninterrupted)


def test_hydra_config_composes_with_overrides():
    from pipeline.collect import sweep_from_config

    sweep = sweep_from_config(compose_app("collect", ["gpu=h200", "n=10", "ops=[bmm,lstm]", "precisions=[bf16]"]))
    assert sweep.gpu == "h200" and sweep.n == 10 and sweep.ops == ("bmm", "lstm")
    assert sweep.precisions == ("bf16",) and set(sweep.spaces) == set(schema.OPS) == set(sweep.catalogs)
    default = sweep_from_config(compose_app("collect", ["gpu=h200-sm32", "sm_partition=32"]))
    assert default.n == {"fp32": 3000, "bf16": 3000, "tf32": 1500, "fp16": 1500} and default.sm_partition == 32
    assert sweep_from_config(compose_app("collect", ["gpu=t4", "cudnn_benchmark_limit=4"])).cudnn_benchmark_limit == 4
    assert sweep_from_config(compose_app("collect", ["gpu=t4", "screen_ms=250"])).screen_ms == 250.0
    assert sweep_from_config(compose_app("collect", ["gpu=t4"])).screen_ms is None
    assert sweep_from_config(compose_app("collect", ["gpu=t4", "max_estimated_ms=20"])).max_estimated_ms == 20.0
    assert default.replace_failed is True
    assert sweep_from_config(compose_app("collect", ["gpu=t4", "replace_failed=false"])).replace_failed is False
    for override, field in (("+n.fp64=3", "n"), ("sm_partition=0", "sm_partition"), ("ops=[conv3d]", "ops"),
                            ("cudnn_benchmark_limit=true", "cudnn_benchmark_limit"),
                            ("screen_ms=0", "screen_ms"), ("screen_ms=fast", "screen_ms"),
                            ("max_estimated_ms=-1", "max_estimated_ms"), ("time_limit_s=0", "time_limit_s"),
                            ("timeout_s=null", "timeout_s"), ("timeout_s=inf", "timeout_s"),
                            ("partition_backward=autograd", "partition_backward"),
                            ("replace_failed=yes", "replace_failed"), ("replace_failed=1", "replace_failed")):
        with pytest.raises(ValueError, match=f"^{field}:"):
            sweep_from_config(compose_app("collect", ["gpu=h200", override]))


def test_time_limit_counts_the_planning(tmp_path, monkeypatch):
    """Planning grows with the dataset; a time-boxed call must not run past its box by that much: a limit spent
    on planning starts no worker."""
    from pipeline.collect import scheduler

    def slow_plan(*args, **kwargs):
        time.sleep(0.5)
        return plan(*args, **kwargs)

    def no_worker(*args, **kwargs):
        raise AssertionError("a worker was started after the time limit")

    monkeypatch.setattr(scheduler, "plan", slow_plan)
    monkeypatch.setattr(scheduler, "Worker", no_worker)
    summary = run_sweep(_sweep(tmp_path, n=2, ops=("bmm",), time_limit_s=0.3))
    assert summary["left"] == summary["planned"] == 2 and not summary["status"]
    assert summary["planning_s"] >= 0.5 and summary["limit_reached_s"] >= 0.5
    assert not schema.dataset_files(tmp_path / "ds")


def test_a_label_of_another_gpu_is_refused():
    """Rows of an H100 filed under h200 would train the model on two GPUs as one: the label must be the measured
    GPU's registry label (with -sm<N> in a partition); a GPU the registry lacks may not take a registered label."""
    from pipeline.collect.plan import check_label

    check_label("h200", {"cuda:0": "NVIDIA H200"}, None)
    check_label("h100-sxm", {"cuda:0": "NVIDIA H100 80GB HBM3", "cuda:1": "NVIDIA H100 80GB HBM3"}, None)
    check_label("h200-sm32", {"cuda:0": "NVIDIA H200"}, 32)
    check_label("my-gpu", {"cuda:0": "Some Future GPU"}, None)
    check_label("h200", {}, None)                          # CPU sweeps: any label
    with pytest.raises(ValueError, match=r"^gpu: 'h200' is not the label of cuda:0 .*use gpu=h100-sxm$"):
        check_label("h200", {"cuda:0": "NVIDIA H100 80GB HBM3"}, None)
    with pytest.raises(ValueError, match=r"use gpu=h200-sm32$"):
        check_label("h200", {"cuda:0": "NVIDIA H200"}, 32)
    with pytest.raises(ValueError, match=r"cuda:1 .*use gpu=a100-sxm4-80gb$"):
        check_label("h100-sxm", {"cuda:0": "NVIDIA H100 80GB HBM3", "cuda:1": "NVIDIA A100-SXM4-80GB"}, None)
    with pytest.raises(ValueError, match=r"^gpu: 'h200' is the registry's label of 'H200 SXM 141GB'"):
        check_label("h200", {"cuda:0": "Some Future GPU"}, None)


def test_a_sweep_under_another_gpus_label_writes_nothing(tmp_path, monkeypatch):
    from pipeline.collect import scheduler

    monkeypatch.setattr(scheduler, "device_names", lambda devices: {"cuda:0": "NVIDIA H100 80GB HBM3"})
    with pytest.raises(ValueError, match="use gpu=h100-sxm"):
        run_sweep(_sweep(tmp_path, n=2, ops=("bmm",)))
    assert not (tmp_path / "ds").exists() or not schema.dataset_files(tmp_path / "ds")


def _sigint_at_default():
    """SIGINT's default disposition in a child about to start, as ``timeout -s INT`` gives its command. A suite run as
    a background job of a non-interactive shell has SIGINT ignored, and a Python started so keeps ignoring it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_sigint_to_the_whole_group_flushes_the_rows_measured_so_far(tmp_path):
    """What ``timeout -s INT`` does at a call's end (the signal to the collector and its worker), twice, while a
    task hangs: the rows measured before it reach the dataset, though the shard was neither full nor due."""
    hang = plan(_sweep(tmp_path, n=30, ops=("bmm",)), "cpu", 1e12)[20].config_id
    out = tmp_path / "ds"
    args = [sys.executable, "-m", "pipeline.collect", "gpu=cpu-test", "device=cpu", "n=30", "ops=[bmm]",
            "shard_rows=100000", "shard_seconds=3600", "timeout_s=600", f"fault_injection.hang=[{hang}]",
            "progress=false", "timing.min_time_ms=1", "timing.warmup_ms=0.5", "timing.min_reps=3", f"out={out}",
            f"hydra.run.dir={tmp_path}/hydra"]
    log = tmp_path / "collect.log"
    with log.open("w") as sink:   # PYTHONFAULTHANDLER: a SIGABRT makes every process print where it is
        proc = subprocess.Popen(args, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONFAULTHANDLER": "1"},
                                start_new_session=True, stdout=sink, stderr=subprocess.STDOUT,
                                preexec_fn=_sigint_at_default)
    time.sleep(10)   # the worker starts and measures the 20 tasks before the hung one
    started = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGABRT)
        proc.wait(timeout=30)
        pytest.fail("the collector outlived two SIGINTs by 60 s; its output and stacks:\n" + log.read_text()[-6000:])
    assert time.monotonic() - started < 30
    rows = schema.read_dataset(out)
    assert 0 < len(rows) <= 40 and (rows["status"] == "ok").all() and hang not in set(rows["config_id"])


def test_l2_flush_runs_before_every_timed_rep(tmp_path):
    from pipeline.timing import measure

    calls = []
    settings = TimingSettings(warmup_ms=0.1, min_time_ms=0.1, min_reps=4, max_reps=4, flush_l2=True)
    timing = measure(lambda: sum(range(100)), "cpu", settings, lambda: calls.append(1))
    assert timing.reps == 4 and len(calls) == 4
    summary = run_sweep(_sweep(tmp_path, n=1, ops=("bmm",), timing=settings))
    assert summary["status"] == {"ok": 2}
    meta = schema.file_metadata(schema.dataset_files(tmp_path / "ds")[0])
    assert "L2 flushed before each rep: True" in meta["timing_method"]


def test_partition_workers_measure_the_forward_only(tmp_path):
    from pipeline.collect.worker import run_task, task_phases, task_rows

    assert task_phases(None) == ("forward", "backward") and task_phases(32) == ("forward",)
    assert task_phases(32, "explicit") == ("forward", "backward")
    task = plan(_sweep(tmp_path, n=1, ops=("linear",)), "cpu", 1e12)[0]
    results, fatal = run_task(task, "cpu", FAST, {}, task_phases(32))
    rows = task_rows(task, "cpu-test", results)
    assert not fatal and [r["phase"] for r in rows] == ["forward"] and rows[0]["status"] == "ok"
    assert rows[0]["time_ms"] > 0 and rows[0]["host_ms"] > 0 and rows[0]["first_call_ms"] > 0


def test_shipped_partition_rows_pair_with_full_gpu_rows():
    """Every config measured on an H200 SM partition was measured on the whole H200 too (same op, precision), and
    all but a few have an ok row there: a partition times the forward alone, so a task whose backward ran past
    timeout_s or screen_ms on the whole GPU (3 of 979 conv2d config-precisions) is ok only in the partition."""
    rows = schema.read_dataset(ROOT / "datasets")
    key = ("op", "precision", "config_id")
    full = rows[rows["gpu"] == "h200"]
    tried, ok = (set(zip(*(f[c] for c in key))) for f in (full, full[full["status"] == "ok"]))
    partitions = sorted(g for g in set(rows["gpu"]) if g.startswith("h200-sm"))
    assert partitions, "no SM-partition rows shipped"
    for gpu in partitions:
        part = rows[(rows["gpu"] == gpu) & (rows["status"] == "ok")]
        assert set(part["phase"]) == {"forward"}
        measured = set(zip(*(part[c] for c in key)))
        assert measured <= tried, gpu
        assert len(measured - ok) <= 0.01 * len(measured), (gpu, sorted(measured - ok))


@pytest.mark.parametrize("op", ["linear", "bmm", "conv2d"])
def test_explicit_backward_computes_autograds_gradients_and_is_timed(op, tmp_path):
    import torch

    from pipeline.collect.worker import run_task, task_rows

    spec = get_op(op)
    for cfg in sample_configs(spec, SPACES[op]["cpu"], 4, 3, "fp32", CATALOGS[op]):
        fn, inputs, params = spec.build(cfg, "cpu", torch.float64)
        out = fn(*inputs)
        grad = torch.randn_like(out)
        expected = torch.autograd.grad(out, inputs + params, grad)
        got = [g for g in spec.explicit_backward(cfg, fn, inputs, grad)() if g is not None]
        if op == "linear":
            got[1] = got[1].t()  # x^T @ grad: autograd returns its transpose, a view
        assert len(got) == len(expected)
        assert all(torch.allclose(want, have) for want, have in zip(expected, got))
    task = plan(_sweep(tmp_path, n=1, ops=(op,)), "cpu", 1e12)[0]
    results, fatal = run_task(task, "cpu", FAST, {}, explicit_backward=True)
    assert not fatal and [r["status"] for r in task_rows(task, "cpu-test", results)] == ["ok", "ok"]


def test_the_busy_wait_covers_every_call_or_with_a_chain_of_kernels_every_group():
    from pipeline.timing import busy_wait_plan

    settings = TimingSettings()
    # a GEMM: 1 ms on the GPU, 20 us to enqueue -> it outruns the host after a few queued calls
    assert busy_wait_plan(1.0, 0.02, True, 120, 1, False, settings) == (4, False)
    assert busy_wait_plan(1.0, 0.02, True, 120, 1, True, settings) == (4, False)   # even as a chain of kernels
    # an LSTM: 3.0 ms to enqueue its per-layer kernels, 3.1 ms synced -> the GPU may be idle most of the call;
    # 120 queued calls of ~200 kernels would overflow the launch queue, so each group gets its own wait
    assert busy_wait_plan(3.1, 3.0, True, 120, 1, True, settings) == (1, True)
    assert busy_wait_plan(3.1, 3.0, True, 120, 1, False, settings) == (120, False)  # one kernel per call: one wait
    no_chain_rule = TimingSettings(chain_busy_wait=False)
    assert busy_wait_plan(3.1, 3.0, True, 120, 1, True, no_chain_rule) == (120, False)
    # a launch-scale op is always covered
    assert busy_wait_plan(0.05, 0.01, False, 120, 8, False, settings) == (120, False)
    assert busy_wait_plan(0.05, 0.01, False, 120, 8, True, settings) == (8, True)


def test_a_host_paced_measurement_becomes_a_host_paced_row_that_training_skips(tmp_path):
    from pipeline.collect.worker import _measured, task_rows
    from pipeline.timing import Timing

    task = plan(_sweep(tmp_path, n=1, ops=("lstm",)), "cpu", 1e12)[0]
    paced = Timing(5.0, 4.9, 5.1, 3, 5.0, host_paced=True)
    rows = task_rows(task, "cpu-test", {"forward": _measured(paced), "backward": _measured(Timing(1, 1, 1, 3, 0.5))})
    assert [r["status"] for r in rows] == ["host_paced", "ok"]
    assert "host-paced" in rows[0]["error"] and rows[0]["time_ms"] == 5.0
    frame = pd.DataFrame(rows)
    schema.validate(frame.reindex(columns=schema.COLUMNS), "rows")
    assert "host_paced" in schema.STATUSES
    from pipeline.training.data import OpTable
    table = OpTable.from_frame(frame.reindex(columns=schema.COLUMNS).assign(gpu="h200"), "lstm")
    assert table.frame["phase"].tolist() == ["backward"]        # the host_paced forward is not trained on
