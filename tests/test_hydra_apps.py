"""The data-side Hydra apps (collect, ingest) compose with every option of their groups, turn into their plain
settings, and the cluster launcher runs a sharded sweep through submitit (local executor: the jobs are local
processes), including a job killed mid-sweep and resumed by re-running the same command."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import CONF_DIR, ROOT, compose_app, run_module
from hydra.utils import instantiate

from pipeline import schema
from pipeline.collect import plan, sweep_from_config

LAUNCHERS = sorted(p.stem for p in (CONF_DIR / "hydra" / "launcher").glob("*.yaml"))


@pytest.mark.parametrize("op", schema.OPS)
def test_collect_composes_every_space_and_catalog_option(op):
    options = sorted(p.stem for p in (CONF_DIR / "space").glob("*.yaml"))
    for option in options:
        sweep = sweep_from_config(compose_app("collect", ["gpu=t4", f"space@space.{op}={option}",
                                                          f"catalog@catalog.{op}={option}"]))
        assert sweep.spaces[op] == compose_app("collect", ["gpu=t4"]).space[option]
        assert sweep.catalogs[op] and set(sweep.spaces[op]) == {"gpu", "cpu"}


def test_ingest_composes_and_names_its_sources():
    from pipeline.ingest import LaunchRule
    from pipeline.ingest.importer import check_settings

    cfg = compose_app("ingest", ["extdata=/nonexistent"])
    sources, _options = check_settings(cfg.sources, cfg.label_kinds)
    assert set(sources) == {"neusight", "neusight-label", "deepbench", "vidur", "aiconfigurator"}
    assert LaunchRule.from_config(cfg.launch_bound).factor == cfg.launch_bound.factor
    with pytest.raises(ValueError, match="sources"):
        check_settings(["neusight", "mlperf"], cfg.label_kinds)


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_every_launcher_config_instantiates(launcher):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        cfg = compose("collect", overrides=["gpu=t4", f"hydra/launcher={launcher}"], return_hydra_config=True)
    launcher_obj = instantiate(cfg.hydra.launcher)
    assert type(launcher_obj).__name__ == {"slurm": "SlurmLauncher", "local": "LocalLauncher"}[launcher]


SWEEP = ["pipeline.collect", "-m", "hydra/launcher=local", "gpu=cpu-test", "device=cpu", "n=4", "num_shards=2",
         "shard=0,1", "progress=false", "shard_rows=2", "timing.warmup_ms=0.5", "timing.min_time_ms=1",
         "timing.min_reps=3"]


def _sweep_args(tmp_path, out):
    return SWEEP + [f"out={out}", f"hydra.sweep.dir={tmp_path}/multirun-{out.name}"]


def _keys(frame):
    return sorted(zip(frame["config_id"], frame["precision"], frame["phase"]))


@pytest.mark.slow
def test_sharded_sweep_through_the_launcher_killed_and_resumed(tmp_path):
    expected = 2 * len(plan(sweep_from_config(compose_app("collect", ["gpu=cpu-test", "device=cpu", "n=4"])),
                            "cpu", 1e12))
    clean = tmp_path / "clean"
    run_module(_sweep_args(tmp_path, clean), check=True, capture_output=True, timeout=600)
    uninterrupted = schema.read_dataset(clean)
    assert len(uninterrupted) == expected and (uninterrupted["status"] == "ok").all()
    shards = {f.name.split("-")[2] for f in schema.dataset_files(clean)}  # part-<run id>-...: one run id per job
    assert len(shards) == 2

    crashed = tmp_path / "crashed"
    proc = subprocess.Popen([sys.executable, "-m", *_sweep_args(tmp_path, crashed)],
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not schema.dataset_files(crashed) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the launcher and its jobs, mid-sweep
    proc.wait()
    partial = schema.read_dataset(crashed)
    assert 0 < len(partial) < expected
    run_module(_sweep_args(tmp_path, crashed), check=True, capture_output=True, timeout=600)
    resumed = schema.read_dataset(crashed)
    assert _keys(resumed) == _keys(uninterrupted)
