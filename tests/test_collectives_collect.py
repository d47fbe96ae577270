"""The collective collector (pipeline.collectives.collect), run on the CPU with gloo and two processes."""

import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT

from pipeline.collectives import schema as cs
from pipeline.collectives.collect import DEFAULT_SIZES, detect_default_path, gpu_counts, parse_size, run_sweep
from pipeline.distributed import NCCL_ENV, path_env, spread

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.distributed.is_gloo_available(), reason="needs torch.distributed gloo")

TOPO_NVLINK = ("\x1b[4mGPU0\tGPU1\tCPU Affinity\x1b[0m\nGPU0\t X \tNV18\t0-15\nGPU1\tNV18\t X \t0-15\n")
TOPO_PCIE = "\tGPU0\tGPU1\nGPU0\t X \tPHB\nGPU1\tPHB\t X \n"


def test_sizes_counts_and_path_labels():
    assert parse_size("4K") == 4096 and parse_size("2GiB") == 2 * 2 ** 30 and parse_size("512") == 512
    with pytest.raises(ValueError, match="sizes"):
        parse_size("lots")
    assert DEFAULT_SIZES[0] == 4096 and DEFAULT_SIZES[-1] == 2 * 2 ** 30
    assert gpu_counts(2) == [2] and gpu_counts(8) == [2, 4, 8] and gpu_counts(6) == [2, 4, 6] and gpu_counts(1) == []
    assert detect_default_path(TOPO_NVLINK) == "nvlink"
    assert detect_default_path(TOPO_PCIE) == "pcie" and detect_default_path("") == "pcie"


def test_shared_settings_and_spread_and_no_torch_on_import():
    assert path_env("host") == {**NCCL_ENV, "NCCL_P2P_DISABLE": "1"} and path_env("nvlink") == NCCL_ENV
    assert NCCL_ENV["NCCL_NVLS_ENABLE"] == "0"
    assert spread(np.arange(11.0)) == (5.0, 2.0, 8.0)
    code = ("import sys, pipeline.distributed, pipeline.collectives.collect, pipeline.step.ddp; "
            "print('torch' in sys.modules)")  # the benchmark applies NCCL_ENV before torch loads
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.strip() == "False"


def test_gloo_sweep_writes_valid_rows_with_their_metadata(tmp_path):
    files = run_sweep(tmp_path, "cpu-demo", paths=["host"], counts=[2], sizes=[4096, 65536], dtypes=["fp32", "bf16"],
                      backend="gloo", device="cpu", time_limit_s=60, target_ms=5, name="test", log=lambda _: None)
    assert files == [tmp_path / "gpu=cpu-demo" / "test-host-n2.parquet"]
    rows = cs.read_collectives(tmp_path, status=None)
    assert len(rows) == 2 * 3 * 2 and (rows["status"] == "ok").all()
    assert set(rows["collective"]) == {"all_reduce", "reduce_scatter", "all_gather"}
    assert (rows["n_gpus"] == 2).all() and (rows["interconnect"] == "host").all()
    assert (rows["time_p20_ms"] <= rows["time_ms"]).all() and (rows["time_ms"] <= rows["time_p80_ms"]).all()
    assert (rows["reps"] >= 5).all()
    meta = cs.file_metadata(files[0])
    assert meta["backend"] == "gloo" and meta["env"]["NCCL_NVLS_ENABLE"] == "0" and meta["env"]["NCCL_P2P_DISABLE"]
    assert meta["measured"] == meta["planned"] == 12 and "slowest rank" in meta["timing_method"]


def test_past_the_deadline_nothing_is_measured_and_bad_paths_are_refused(tmp_path):
    assert run_sweep(tmp_path, "cpu-demo", paths=["host"], counts=[2], sizes=[4096], backend="gloo", device="cpu",
                     time_limit_s=0, log=lambda _: None) == []
    with pytest.raises(ValueError, match="paths"):
        run_sweep(tmp_path, "cpu-demo", paths=["ethernet"], counts=[2], backend="gloo", device="cpu")
    with pytest.raises(ValueError, match="counts"):
        run_sweep(tmp_path, "cpu-demo", paths=["host"], counts=[1], backend="gloo", device="cpu")
