"""`make import` (pipeline.ingest) end to end, on tiny files of every source written by the tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from ingest_fixtures import UNKNOWN_GPU, write_extdata

from pipeline import ingest, schema

REPO = Path(__file__).resolve().parents[1]
KEY = ["source", "gpu", "op", "precision", "phase", "config_id"]


@pytest.fixture(scope="module")
def extdata(tmp_path_factory) -> Path:
    return write_extdata(tmp_path_factory.mktemp("extdata"))


@pytest.fixture(scope="module")
def imported(extdata, tmp_path_factory):
    out = tmp_path_factory.mktemp("datasets") / "external"
    report = ingest.Report()
    frame = ingest.run(extdata, out, report=report)
    return frame, out, report


def test_every_source_is_imported_and_validates(imported):
    frame, out, _ = imported
    back = schema.read_dataset(out)
    assert len(back) == len(frame) > 0
    assert set(back["source"]) == set(ingest.SOURCES)
    assert not back.duplicated(["config_id", "gpu", "source", "precision", "phase"]).any()
    assert len(pd.read_parquet(out)) == len(frame)  # one call reads every file
    assert {"t4", "a100-pcie-80gb", "h100-sxm", "l4", "1080ti", "a100-sxm4-80gb", "gb200"} <= set(back["gpu"])
    assert back["launch_bound"].notna().all() and back["host_ms"].isna().all()
    assert "rows" in ingest.summary_table(frame)


def test_file_metadata_names_source_license_and_timing(imported):
    _, out, _ = imported
    meta = schema.file_metadata(out / "gpu=t4" / "op=bmm" / "neusight.parquet")
    assert meta["source"] == "neusight" and "MIT" in meta["license"] and "ASPLOS" in meta["citation"]
    assert meta["library_versions"] == {"cuda": ["12.1"], "cudnn": ["8.9.2"], "torch": ["2.1.0"]}
    assert meta["original_files"] == ["neusight/train/bmm/Tesla T4.csv"]
    assert "quantile" in meta["launch_bound_rule"] and meta["launch_floors"][0]["floor_ms"] > 0
    vidur = schema.file_metadata(out / "gpu=a100-sxm4-80gb" / "op=linear" / "vidur.parquet")
    assert vidur["timing_method"].startswith("GPU time: sum of kernel durations from the PyTorch profiler")
    assert "time_p20_ms = time_p80_ms = time_ms" in vidur["timing_method"]
    assert vidur["models"] == ["meta-llama/Tiny-Llama", "microsoft/tiny-phi"]
    aic = schema.file_metadata(out / "gpu=h100-sxm" / "op=linear" / "aiconfigurator.parquet")
    assert aic["timing_method"].startswith("GPU time: CUDA-graph replay") and "Apache-2.0" in aic["license"]
    assert aic["library_versions"] == {"vllm": ["0.24.0"]}
    assert aic["original_files"] == ["aiconfigurator/h100_sxm/gemm_perf.parquet"]
    assert "launch_bound = False" in aic["launch_bound_rule"]


def test_unknown_gpus_skipped(imported):
    frame, out, report = imported
    assert report.unknown_gpus[UNKNOWN_GPU] == 5
    assert "AMD_Instinct_MI100" in report.skipped_gpu_folders
    assert not any("imaginary" in g or "mi100" in g for g in frame["gpu"].unique())
    assert not list(out.glob("gpu=*imaginary*"))


def test_fp8_rows_skipped_and_counted(imported):
    frame, _, report = imported
    aic = frame[frame["source"] == "aiconfigurator"]
    assert set(aic["precision"]) == {"bf16"} and len(aic) == 3 * 3
    assert report.skipped_rows[("aiconfigurator", "NVIDIA GB200: fp8 CutlassFP8ScaledMMLinearKernel")] == 3
    assert report.skipped_rows[("aiconfigurator", "NVIDIA H100 80GB HBM3: nvfp4 FlashInferCuteDslNvFp4LinearKernel")] \
        == 3
    assert "fp8" in ingest.skipped_table(report)


def test_launch_bound_marked_only_in_host_timed_sources(imported):
    frame, _, report = imported
    t4 = frame[(frame["source"] == "neusight") & (frame["gpu"] == "t4") & (frame["op"] == "bmm")]
    assert t4["launch_bound"].sum() == 6  # the six tiny bmm on the 0.03 ms floor
    assert not frame.loc[frame["source"].isin(["vidur", "aiconfigurator"]), "launch_bound"].any()
    floors = {(r["source"], r["gpu"], r["op"]): r for r in report.launch_floors}
    assert floors[("neusight", "t4", "bmm")]["floor_ms"] == pytest.approx(0.03, rel=0.02)
    assert floors[("vidur", "a100-sxm4-80gb", "linear")]["floor_ms"] is None
    assert "GPU time" in ingest.floor_table(report)


def test_idempotent_and_removes_stale_files(extdata, tmp_path):
    out = tmp_path / "external"
    first = ingest.run(extdata, out)
    files = sorted(p.relative_to(out) for p in out.rglob("*.parquet"))
    before = schema.read_dataset(out)
    # a stale file of a source, and another writer's file that must survive
    stale = out / "gpu=p4" / "op=lstm" / "deepbench.parquet"
    stale.parent.mkdir(parents=True)
    stale.write_bytes((out / "gpu=1080ti" / "op=lstm" / "deepbench.parquet").read_bytes())
    other = out / "gpu=t4" / "op=bmm" / "collect.parquet"
    other.write_bytes((out / "gpu=t4" / "op=bmm" / "neusight.parquet").read_bytes())
    second = ingest.run(extdata, out)
    assert not stale.exists() and not stale.parent.exists()
    assert other.exists()
    other.unlink()
    assert sorted(p.relative_to(out) for p in out.rglob("*.parquet")) == files
    after = schema.read_dataset(out)
    pd.testing.assert_frame_equal(before.sort_values(KEY).reset_index(drop=True),
                                  after.sort_values(KEY).reset_index(drop=True))
    pd.testing.assert_frame_equal(first, second)
    # dropping a source from `sources` leaves its files alone
    ingest.run(extdata, out, sources=["deepbench"])
    assert (out / "gpu=t4" / "op=bmm" / "neusight.parquet").exists()


def test_missing_extdata_is_a_clear_error(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(ingest.IngestError, match=r"extdata.*nowhere|nowhere.*extdata"):
        ingest.run(missing, tmp_path / "out")
    with pytest.raises(ingest.IngestError, match="sources"):
        ingest.run(missing, tmp_path / "out", sources=["nope"])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ingest.IngestError, match=r"source 'vidur': folder .*vidur not found"):
        ingest.run(empty, tmp_path / "out", sources=["vidur"])
    proc = subprocess.run([sys.executable, "-m", "pipeline.ingest", f"extdata={missing}",
                           f"out={tmp_path / 'out'}", f"hydra.run.dir={tmp_path / 'hydra'}"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "extdata" in proc.stderr and "nowhere" in proc.stderr


def test_cli_imports_and_prints_the_report(extdata, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pipeline.ingest", f"extdata={extdata}", f"out={tmp_path / 'out'}",
                           "sources=[neusight,aiconfigurator]", "progress=false", "launch_bound.factor=2",
                           f"hydra.run.dir={tmp_path / 'hydra'}"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "launch floors" in proc.stdout and "GPU time" in proc.stdout and "verified:" in proc.stdout
    meta = schema.file_metadata(tmp_path / "out" / "gpu=t4" / "op=bmm" / "neusight.parquet")
    assert "2 x floor" in meta["launch_bound_rule"]
    bad = subprocess.run([sys.executable, "-m", "pipeline.ingest", f"extdata={extdata}", f"out={tmp_path / 'out'}",
                          "+launch_bound.slack=3", f"hydra.run.dir={tmp_path / 'hydra'}"], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "launch_bound" in bad.stderr and "slack" in bad.stderr


def test_repeated_configs_merge_into_their_median():
    rows = pd.DataFrame({"op": "bmm", "gpu": "Tesla T4", "precision": "fp32", "phase": "forward",
                         "batch": [2, 2, 2, 3], "m": 4, "k": 5, "n": 6, "time_ms": [1.0, 9.0, 2.0, 4.0],
                         ingest.META_PREFIX + "files": ["a.csv", "b.csv", "a.csv", "a.csv"]})
    report = ingest.Report()
    out = ingest.finalize(rows, ingest.REGISTRY["neusight"], report)
    assert len(out) == 2 and report.duplicates[("neusight", "t4", "bmm")] == 2
    merged = out[out["batch"] == 2].iloc[0]
    assert merged["time_ms"] == merged["time_p20_ms"] == merged["time_p80_ms"] == 2.0
    assert merged[ingest.META_PREFIX + "files"] == "a.csv\nb.csv"
    assert out[out["batch"] == 3].iloc[0]["time_ms"] == 4.0
