"""`make import` (pipeline.ingest) on a tiny slice of the public data.

The public measurements are not committed: the slice is cut at test time from the extdata folder named in
conf/ingest.yaml (``../shared/extdata`` beside the clone); the tests skip when it is absent.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from pipeline import ingest, schema

REPO = Path(__file__).resolve().parents[1]
EXTDATA_SETTING = yaml.safe_load((REPO / "conf" / "ingest.yaml").read_text())["extdata"]
EXTDATA = (REPO / EXTDATA_SETTING).resolve()
UNKNOWN_GPU = "Imaginary GPU 9000"

pytestmark = pytest.mark.skipif(
    not (EXTDATA / "neusight").is_dir() or not (EXTDATA / "deepbench").is_dir(),
    reason=f"public extdata folder not found at <repo>/{EXTDATA_SETTING} (conf/ingest.yaml key `extdata`); "
           "these tests cut their data slice from it at test time",
)


def _read(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, dtype=str, keep_default_na=False)


def _slice_csv(src: Path, dst: Path, head: int, per_device: int = 0) -> pd.DataFrame:
    """The first ``head`` rows, plus the first ``per_device`` rows of every other (device, precision) sheet."""
    frame = _read(src)
    parts = [frame.head(head)]
    if per_device:
        keys = ["device", "precision"]
        seen = set(map(tuple, frame.head(head)[keys].to_numpy()))
        for key, group in frame.groupby(keys, sort=True):
            if key not in seen:
                parts.append(group.head(per_device))
    out = pd.concat(parts)
    dst.parent.mkdir(parents=True, exist_ok=True)
    out.to_csv(dst, index=False)
    return out


@pytest.fixture(scope="module")
def slice_dir(tmp_path_factory) -> Path:
    """A few rows of a few files of each source, in the extdata layout, plus an unknown-GPU file."""
    root = tmp_path_factory.mktemp("extdata_slice")
    (root / "README.md").write_text((EXTDATA / "README.md").read_text())
    train = EXTDATA / "neusight" / "train"
    for sub, name in [("bmm", "Tesla T4.csv"), ("bmm", "Tesla P4.csv"), ("linear", "Tesla T4.csv"),
                      ("conv", "NVIDIA A100 80GB PCIe.csv")]:
        _slice_csv(train / sub / name, root / "neusight" / "train" / sub / name, head=30)
    fake = _read(root / "neusight" / "train" / "bmm" / "Tesla T4.csv").head(5)
    fake["Device"] = UNKNOWN_GPU
    fake.to_csv(root / "neusight" / "train" / "bmm" / f"{UNKNOWN_GPU}.csv", index=False)
    label = EXTDATA / "neusight" / "label"
    for rel in ["NVIDIA_H100_80GB_HBM3/gpt2_large-train-1024-4.csv", "NVIDIA_L4/bert_large-inf-512-8.csv",
                "AMD_Instinct_MI100/bert_large-train-512-2.csv"]:
        dst = root / "neusight" / "label" / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes((label / rel).read_bytes())
    db = EXTDATA / "deepbench"
    _slice_csv(db / "gemm.csv", root / "deepbench" / "gemm.csv", head=40, per_device=3)
    _slice_csv(db / "conv.csv", root / "deepbench" / "conv.csv", head=30, per_device=4)
    _slice_csv(db / "lstm.csv", root / "deepbench" / "lstm.csv", head=30, per_device=3)
    return root


@pytest.fixture(scope="module")
def imported(slice_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("datasets") / "external"
    report = ingest.Report()
    frame = ingest.run(slice_dir, out, report=report)
    return frame, out, report


def _one(frame: pd.DataFrame, **where) -> pd.DataFrame:
    mask = np.ones(len(frame), dtype=bool)
    for key, value in where.items():
        mask &= (frame[key] == value).to_numpy()
    return frame[mask]


def test_neusight_bmm_and_linear_mapping(imported, slice_dir):
    frame, _, _ = imported
    raw = pd.read_csv(slice_dir / "neusight" / "train" / "bmm" / "Tesla T4.csv")
    for _, r in raw.head(5).iterrows():
        cid = schema.config_id("bmm", {"batch": r.B, "m": r.M, "k": r.N, "n": r.K})  # N is the inner dim
        row = _one(frame, config_id=cid, gpu="t4", source="neusight")
        assert len(row) == 1
        row = row.iloc[0]
        assert (row["batch"], row["m"], row["k"], row["n"]) == (r.B, r.M, r.N, r.K)
        assert row["time_ms"] == pytest.approx(r.Latency)
        assert row["time_p20_ms"] == row["time_p80_ms"] == row["time_ms"]
        assert (row["precision"], row["phase"], row["status"], row["reps"]) == ("fp32", "forward", "ok", 5)
    raw = pd.read_csv(slice_dir / "neusight" / "train" / "linear" / "Tesla T4.csv")
    lin = _one(frame, op="linear", gpu="t4", source="neusight")
    assert len(lin) == len(raw)
    r = raw.iloc[0]
    row = _one(lin, config_id=schema.config_id(
        "linear", {"batch": r.B * r.M, "in_features": r.N, "out_features": r.K, "bias": True})).iloc[0]
    assert row["batch"] == r.B * r.M and row["in_features"] == r.N and row["out_features"] == r.K
    assert bool(row["bias"]) is True


def test_neusight_conv_gpu_from_device_column(imported, slice_dir):
    frame, _, _ = imported
    raw = pd.read_csv(slice_dir / "neusight" / "train" / "conv" / "NVIDIA A100 80GB PCIe.csv")
    conv = _one(frame, op="conv2d", source="neusight")
    assert set(conv["gpu"]) == {"a100-pcie-80gb"}  # the "A100" conv file is an 80GB PCIe
    r = raw.iloc[0]
    row = conv[(conv["batch"] == r.B) & (conv["in_channels"] == r.Input_Channel)
               & (conv["out_channels"] == r.Output_Channel) & (conv["height"] == r.Input_Size)].iloc[0]
    assert (row["kernel_h"], row["kernel_w"], row["width"]) == (r.Kernel_Szie, r.Kernel_Szie, r.Input_Size)
    assert (row["stride_h"], row["pad_w"], row["dilation_h"], row["groups"]) == (r.Stride, r.Padding, 1, 1)
    assert bool(row["bias"]) is False


def test_deepbench_conv_backward_is_data_plus_weight(imported, slice_dir):
    frame, _, report = imported
    raw = pd.read_csv(slice_dir / "deepbench" / "conv.csv")
    r = raw.iloc[0]  # 1080Ti, Float
    cfg = {"batch": r.N, "in_channels": r.C, "out_channels": r.K, "height": r.H, "width": r.W,
           "kernel_h": r.R_filter_h, "kernel_w": r.S_filter_w, "stride_h": r.stride_h, "stride_w": r.stride_w,
           "pad_h": r.pad_h, "pad_w": r.pad_w, "dilation_h": 1, "dilation_w": 1, "groups": 1, "bias": False}
    rows = _one(frame, config_id=schema.config_id("conv2d", cfg), gpu="1080ti", source="deepbench",
                precision="fp32")
    by_phase = rows.set_index("phase")["time_ms"]
    assert by_phase["forward"] == pytest.approx(float(r.fwd_ms))
    assert by_phase["backward"] == pytest.approx(float(r.bwd_data_ms) + float(r.bwd_weight_ms))
    # M40's first rows have bwd_data_ms = "N/A*": forward kept, backward dropped and counted.
    assert report.bad_times[("deepbench", "m40", "conv2d", "backward")] >= 1
    m40 = _one(frame, gpu="m40", op="conv2d")
    assert (m40["phase"] == "forward").sum() > (m40["phase"] == "backward").sum()


def test_deepbench_gemm_layouts(imported, slice_dir):
    frame, _, _ = imported
    raw = pd.read_csv(slice_dir / "deepbench" / "gemm.csv")
    tn = raw[(raw.device == "NV_1080Ti") & (raw.transA == "T") & (raw.transB == "N")].iloc[0]
    row = _one(frame, config_id=schema.config_id(
        "linear", {"batch": tn.N, "in_features": tn.K, "out_features": tn.M, "bias": False}), gpu="1080ti")
    assert len(row) == 1 and row.iloc[0]["time_ms"] == pytest.approx(tn.time_ms)
    nn_ = raw[(raw.device == "NV_1080Ti") & (raw.transA == "N") & (raw.transB == "N")].iloc[0]
    row = _one(frame, config_id=schema.config_id("bmm", {"batch": 1, "m": nn_.N, "k": nn_.K, "n": nn_.M}),
               gpu="1080ti", source="deepbench")
    assert len(row) == 1 and row.iloc[0]["time_ms"] == pytest.approx(nn_.time_ms)
    # fp16 modes (T4 mixed, P100 pseudo fp16) -> fp16
    assert set(_one(frame, source="deepbench", gpu="t4")["precision"]) <= {"fp32", "fp16"}
    assert "fp16" in set(_one(frame, source="deepbench")["precision"])


def test_deepbench_gemm_backward_needs_both_gradient_gemms():
    """Linear(in=K, out=M) on N rows: backward = N,N (K,N,M) input grad + N,T (K,M,N) weight grad."""
    def gemm(m, n, k, ta, tb, t, device="NV_T4"):
        return {"file": "x.xlsx", "device": device, "sheet": "Results FP32", "precision": "Float", "M": str(m),
                "N": str(n), "K": str(k), "transA": ta, "transB": tb, "time_ms": str(t), "_precision": "fp32"}
    raw = pd.DataFrame([
        gemm(64, 8, 32, "T", "N", 1.0),   # forward of Linear(32 -> 64), 8 rows
        gemm(32, 8, 64, "N", "N", 2.0),   # its input gradient
        gemm(32, 64, 8, "N", "T", 3.0),   # its weight gradient
        gemm(128, 8, 32, "T", "N", 5.0),  # a forward whose weight-gradient GEMM was not measured
        gemm(32, 8, 128, "N", "N", 7.0),
    ])
    task = ingest.Task("deepbench", Path("gemm.csv"), ingest.read_deepbench_gemm, "deepbench/gemm.csv")
    rows = ingest.gemm_rows(raw, task)
    lin = rows[rows["op"] == "linear"]
    bwd = lin[lin["phase"] == "backward"]
    assert len(bwd) == 1
    assert (bwd.iloc[0]["batch"], bwd.iloc[0]["in_features"], bwd.iloc[0]["out_features"]) == (8, 32, 64)
    assert bwd.iloc[0]["time_ms"] == pytest.approx(5.0)
    assert len(lin[lin["phase"] == "forward"]) == 2
    assert len(rows[rows["op"] == "bmm"]) == 2  # the N,N GEMMs are also contiguous bmm forwards (batch 1)


def test_deepbench_lstm(imported, slice_dir):
    frame, _, report = imported
    raw = pd.read_csv(slice_dir / "deepbench" / "lstm.csv")
    r = raw.iloc[0]
    cfg = {"batch": r.N, "seq_len": r.timesteps, "input_size": r.hidden, "hidden_size": r.hidden,
           "num_layers": 1, "bidirectional": False, "bias": True}
    rows = _one(frame, config_id=schema.config_id("lstm", cfg), gpu="1080ti").set_index("phase")["time_ms"]
    assert rows["forward"] == pytest.approx(r.fwd_ms)
    assert rows["backward"] == pytest.approx(r.bwd_data_ms + r.bwd_weight_ms)
    # T4 has no LSTM results (empty cells): dropped and counted
    assert report.bad_times[("deepbench", "t4", "lstm", "forward")] >= 1
    assert _one(frame, gpu="t4", op="lstm").empty


def test_unknown_gpus_skipped(imported):
    frame, out, report = imported
    assert report.unknown_gpus[UNKNOWN_GPU] == 5
    assert "AMD_Instinct_MI100" in report.skipped_gpu_folders
    assert not any("imaginary" in g or "mi100" in g for g in frame["gpu"].unique())
    assert not list(out.glob("gpu=*imaginary*"))


def test_label_node_extraction(slice_dir):
    rel = "neusight/label/NVIDIA_H100_80GB_HBM3/gpt2_large-train-1024-4.csv"
    task = ingest.Task("neusight-label", slice_dir / rel, ingest.read_neusight_label, rel, kind="train")
    rows = ingest.read_neusight_label(task)
    lin = rows[rows["op"] == "linear"]
    # GPT-2's Conv1D traces to addmm(bias, x[4096, 1280], w[1280, 3840]) -> linear with bias
    qkv = lin[(lin["batch"] == 4096) & (lin["in_features"] == 1280) & (lin["out_features"] == 3840)]
    assert set(qkv["phase"]) == {"forward", "backward"} and qkv["bias"].all()
    # lm_head: nn.Linear(1280, 50257, bias=False) on [4, 1024, 1280]
    head = lin[lin["out_features"] == 50257]
    assert len(head) == 2 and not head["bias"].any() and set(head["batch"]) == {4096}
    # attention matmuls [4, 20, 1024, 64] @ [4, 20, 64, 1024] -> bmm batch 80
    bmm = rows[(rows["op"] == "bmm") & (rows["phase"] == "forward")]
    got = {(b, m, k, n) for b, m, k, n in bmm[["batch", "m", "k", "n"]].itertuples(index=False)}
    assert got == {(80, 1024, 64, 1024), (80, 1024, 1024, 64)}
    # inference tables give forward rows only
    rel = "neusight/label/NVIDIA_L4/bert_large-inf-512-8.csv"
    inf = ingest.read_neusight_label(ingest.Task("neusight-label", slice_dir / rel, ingest.read_neusight_label,
                                                 rel, kind="inf"))
    assert set(inf["phase"]) == {"forward"} and len(inf) > 0


def test_written_dataset_validates(imported):
    frame, out, _ = imported
    back = schema.read_dataset(out)
    assert len(back) == len(frame) > 0
    assert not back.duplicated(["config_id", "gpu", "source", "precision", "phase"]).any()
    assert len(pd.read_parquet(out)) == len(frame)  # one call reads every file
    assert {"neusight", "neusight-label", "deepbench"} == set(back["source"])
    assert {"h100-sxm", "l4"} <= set(back["gpu"])
    meta = schema.file_metadata(out / "gpu=t4" / "op=bmm" / "neusight.parquet")
    assert meta["source"] == "neusight" and "MIT" in meta["license"] and "ASPLOS" in meta["citation"]
    assert meta["library_versions"] == {"cuda": ["12.1"], "cudnn": ["8.9.2"], "torch": ["2.1.0"]}
    assert meta["original_files"] == ["neusight/train/bmm/Tesla T4.csv"]
    assert "Apache-2.0" in schema.file_metadata(out / "gpu=1080ti" / "op=lstm" / "deepbench.parquet")["license"]
    assert "rows" in ingest.summary_table(frame)


def test_idempotent_and_removes_stale_files(slice_dir, tmp_path):
    out = tmp_path / "external"
    first = ingest.run(slice_dir, out)
    files = sorted(p.relative_to(out) for p in out.rglob("*.parquet"))
    before = schema.read_dataset(out)
    # a stale file of a source, and another writer's file that must survive
    stale = out / "gpu=p4" / "op=lstm" / "deepbench.parquet"
    stale.parent.mkdir(parents=True)
    stale.write_bytes((out / "gpu=1080ti" / "op=lstm" / "deepbench.parquet").read_bytes())
    other = out / "gpu=t4" / "op=bmm" / "collect.parquet"
    other.write_bytes((out / "gpu=t4" / "op=bmm" / "neusight.parquet").read_bytes())
    second = ingest.run(slice_dir, out)
    assert not stale.exists() and not stale.parent.exists()
    assert other.exists()
    other.unlink()
    assert sorted(p.relative_to(out) for p in out.rglob("*.parquet")) == files
    after = schema.read_dataset(out)
    key = ["source", "gpu", "op", "precision", "phase", "config_id"]
    pd.testing.assert_frame_equal(before.sort_values(key).reset_index(drop=True),
                                  after.sort_values(key).reset_index(drop=True))
    pd.testing.assert_frame_equal(first, second)
    # dropping a source from `sources` leaves its files alone
    ingest.run(slice_dir, out, sources=["deepbench"])
    assert (out / "gpu=t4" / "op=bmm" / "neusight.parquet").exists()


def test_missing_extdata_is_a_clear_error(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(ingest.IngestError, match=r"extdata.*nowhere|nowhere.*extdata"):
        ingest.run(missing, tmp_path / "out")
    with pytest.raises(ingest.IngestError, match="sources"):
        ingest.run(missing, tmp_path / "out", sources=["nope"])
    proc = subprocess.run([sys.executable, "-m", "pipeline.ingest", f"extdata={missing}",
                           f"out={tmp_path / 'out'}", f"hydra.run.dir={tmp_path / 'hydra'}"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "extdata" in proc.stderr and "nowhere" in proc.stderr


def test_repeated_configs_merge_into_their_median():
    rows = pd.DataFrame({"op": "bmm", "gpu": "Tesla T4", "precision": "fp32", "phase": "forward",
                         "batch": [2, 2, 2, 3], "m": 4, "k": 5, "n": 6, "time_ms": [1.0, 9.0, 2.0, 4.0],
                         ingest.META_PREFIX + "files": ["a.csv", "b.csv", "a.csv", "a.csv"]})
    report = ingest.Report()
    out = ingest.finalize(rows, "neusight", report)
    assert len(out) == 2 and report.duplicates[("neusight", "t4", "bmm")] == 2
    merged = out[out["batch"] == 2].iloc[0]
    assert merged["time_ms"] == merged["time_p20_ms"] == merged["time_p80_ms"] == 2.0
    assert merged[ingest.META_PREFIX + "files"] == "a.csv\nb.csv"
    assert out[out["batch"] == 3].iloc[0]["time_ms"] == 4.0
