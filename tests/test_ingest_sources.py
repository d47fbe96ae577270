"""Each import source's reader and config mapping, on tiny files written by the tests."""

from __future__ import annotations

from pathlib import Path

import ingest_fixtures as fx
import pandas as pd
import pytest

from pipeline import gpus, ingest, schema
from pipeline.ingest import aiconfigurator, deepbench, neusight, vidur
from pipeline.ingest.common import Options, Report, Task


def _tasks(module, root: Path, report: Report | None = None) -> list[Task]:
    return module.SOURCE.tasks(root, Options(), report or Report())


def _read(module, root: Path, report: Report | None = None) -> pd.DataFrame:
    report = report or Report()
    frames = [t.reader(t) for t in _tasks(module, root, report)]
    return ingest.finalize(pd.concat(frames, ignore_index=True), module.SOURCE, report)


def _row(frame: pd.DataFrame, op: str, **config) -> pd.DataFrame:
    return frame[frame["config_id"] == schema.config_id(op, config)]


def test_neusight_bmm_linear_conv_mapping(tmp_path):
    fx.write_neusight(tmp_path)
    rows = _read(neusight, tmp_path)
    t4 = rows[rows["gpu"] == "t4"]
    first = fx.neusight_bmm_rows()[0]
    bmm = _row(t4, "bmm", batch=first["B"], m=first["M"], k=first["N"], n=first["K"])  # N is the inner dim
    assert len(bmm) == 1 and bmm.iloc[0]["time_ms"] == pytest.approx(first["Latency"])
    assert tuple(bmm.iloc[0][["precision", "phase", "reps"]]) == ("fp32", "forward", 5)
    lin = _row(t4, "linear", batch=3, in_features=5, out_features=7, bias=True)
    assert len(lin) == 1
    conv = rows[rows["op"] == "conv2d"]
    assert set(conv["gpu"]) == {"a100-pcie-80gb"}  # the GPU comes from the Device column
    r = conv[conv["batch"] == 2].iloc[0]
    assert (r["in_channels"], r["out_channels"], r["kernel_h"], r["kernel_w"], r["height"], r["width"]) == \
        (16, 32, 3, 3, 28, 28)
    assert (r["stride_h"], r["pad_w"], r["dilation_h"], r["groups"], bool(r["bias"])) == (1, 1, 1, 1, False)


def test_neusight_version_strings():
    assert neusight.torch_version("p2.1.0") == "2.1.0"
    assert neusight.cudnn_version("8902") == "8.9.2"
    assert neusight.cuda_version("cu121") == "12.1"


def test_deepbench_layouts_and_backward(tmp_path):
    fx.write_deepbench(tmp_path)
    report = Report()
    rows = _read(deepbench, tmp_path, report)
    # T,N (M=1760, N=16, K=1760) -> nn.Linear(in=K, out=M) on N rows
    lin = _row(rows, "linear", batch=16, in_features=1760, out_features=1760, bias=False)
    assert len(lin) == 1 and lin.iloc[0]["time_ms"] == pytest.approx(0.058)
    # N,N (M=1760, N=32, K=1760) -> bmm batch 1, m=N, k=K, n=M
    assert len(_row(rows, "bmm", batch=1, m=32, k=1760, n=1760)) == 1
    t4 = rows[rows["gpu"] == "t4"]
    assert set(t4["precision"]) == {"fp16"}  # the "16 bit inputs" mode; "Odd mode" is skipped
    conv = rows[rows["op"] == "conv2d"].set_index(["gpu", "phase"])["time_ms"]
    assert conv[("1080ti", "backward")] == pytest.approx(0.47 + 0.25)
    assert ("m40", "backward") not in conv.index and ("m40", "forward") in conv.index  # N/A* cell
    assert report.bad_times[("deepbench", "m40", "conv2d", "backward")] == 1
    lstm = rows[rows["op"] == "lstm"].set_index("phase")["time_ms"]
    assert lstm["backward"] == pytest.approx(1.447 + 0.174)
    assert report.bad_times[("deepbench", "t4", "lstm", "forward")] == 1


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
    rows = deepbench.gemm_rows(raw, Task("deepbench", Path("gemm.csv"), deepbench.read_gemm, "deepbench/gemm.csv"))
    lin = rows[rows["op"] == "linear"]
    bwd = lin[lin["phase"] == "backward"]
    assert len(bwd) == 1
    assert (bwd.iloc[0]["batch"], bwd.iloc[0]["in_features"], bwd.iloc[0]["out_features"]) == (8, 32, 64)
    assert bwd.iloc[0]["time_ms"] == pytest.approx(5.0)
    assert len(lin[lin["phase"] == "forward"]) == 2
    assert len(rows[rows["op"] == "bmm"]) == 2  # the N,N GEMMs are also contiguous bmm forwards (batch 1)


def test_vidur_tensor_parallel_sharding():
    raw = pd.DataFrame([fx.vidur_row(64, 8, 8192, 28672, True, 32, 4), fx.vidur_row(32, 32, 2560, 10240, False, 5, 1)])
    shapes = vidur.gemm_features(raw)
    hd = 8192 // 64
    assert (shapes["attn_pre_proj"][0][0], shapes["attn_pre_proj"][1][0]) == (8192, (64 + 2 * 8) * hd / 4)
    assert (shapes["attn_post_proj"][0][0], shapes["attn_post_proj"][1][0]) == (8192 / 4, 8192)
    assert (shapes["mlp_up_proj"][0][0], shapes["mlp_up_proj"][1][0]) == (8192, 2 * 28672 / 4)
    assert (shapes["mlp_down_proj"][0][0], shapes["mlp_down_proj"][1][0]) == (28672 / 4, 8192)
    assert shapes["mlp_up_proj"][1][1] == 10240  # not gated: one up projection
    assert shapes["attn_pre_proj"][1][1] == 3 * 2560
    odd = vidur.gemm_features(pd.DataFrame([fx.vidur_row(32, 8, 4096, 14336, True, 8, 3)]))  # 14336 / 3
    assert pd.isna(odd["mlp_down_proj"][0][0]) and not pd.isna(odd["attn_post_proj"][1][0])


def test_vidur_reader_rows(tmp_path):
    fx.write_vidur(tmp_path)
    report = Report()
    rows = _read(vidur, tmp_path, report)
    assert set(rows["gpu"]) == {"a100-sxm4-80gb"} and set(rows["precision"]) == {"fp16"}
    assert not rows["bias"].any() and set(rows["phase"]) == {"forward"}
    assert len(rows) == 3 * 4  # 3 distinct (model, tokens, tp) rows x 4 GEMMs; the repeated row merged
    assert report.duplicates[("vidur", "a100-sxm4-80gb", "linear")] == 4
    # mlp_down_proj of the tp=2 row: in = 14336 / 2; its two medians (0.05 and 0.07 x 8) merge into 0.48
    down = _row(rows, "linear", batch=16, in_features=7168, out_features=4096, bias=False)
    assert down.iloc[0]["time_ms"] == pytest.approx(0.48)
    assert (down.iloc[0]["time_p20_ms"], down.iloc[0]["time_p80_ms"]) == (down.iloc[0]["time_ms"],) * 2


def test_vidur_unknown_gpu_folder_is_skipped(tmp_path):
    fx.write_vidur(tmp_path)
    (tmp_path / "vidur" / "tpu9").mkdir()
    report = Report()
    assert all("/a100/" in t.rel for t in _tasks(vidur, tmp_path, report))
    assert report.skipped_gpu_folders == ["vidur/tpu9"]


def test_aiconfigurator_linear_mapping_and_fp8_skipped(tmp_path):
    fx.write_aiconfigurator(tmp_path)
    report = Report()
    rows = _read(aiconfigurator, tmp_path, report)
    assert set(rows["gpu"]) == {"h100-sxm", "gb200", "a100-sxm4-80gb"}  # A100 via kernel_source vllm_default
    assert set(rows["precision"]) == {"bf16"} and not rows["bias"].any()
    # F.linear(x[m, k], W[n, k]) -> batch=m, in_features=k, out_features=n
    hit = _row(rows[rows["gpu"] == "gb200"], "linear", batch=16, in_features=4096, out_features=14336, bias=False)
    assert hit.iloc[0]["time_ms"] == pytest.approx(2.0 * 16 * 14336 * 4096 / 4e11 + 0.004)
    assert sum(n for (s, reason), n in report.skipped_rows.items() if "fp8" in reason) == 3 * 3
    assert sum(report.skipped_rows.values()) == 3 * 6


def test_aiconfigurator_missing_column_is_named(tmp_path):
    path = tmp_path / "aiconfigurator" / "l40s" / "gemm_perf.parquet"
    path.parent.mkdir(parents=True)
    fx.aiconfigurator_rows("NVIDIA L40S").drop(columns=["latency"]).to_parquet(path)
    task = _tasks(aiconfigurator, tmp_path)[0]
    with pytest.raises(ingest.IngestError, match=r"l40s/gemm_perf.parquet: missing columns \['latency'\]"):
        task.reader(task)


def test_gb200_registry_entry_and_source_gpu_names():
    spec = gpus.gpu_spec("NVIDIA GB200")
    assert spec["label"] == "gb200" and spec["compute_capability"] == "10.0"
    rates = (spec["bf16_tflops"], spec["fp16_tflops"], spec["tf32_tflops"], spec["fp32_tflops"])
    assert rates == (2500, 2500, 1250, 90)
    assert spec["memory_bandwidth_gbps"] == 8000 and spec["memory_gb"] == 186
    # the clock is derived from the FP32 rate: 2 FLOP x 128 lanes x SMs x clock
    assert spec["boost_clock_mhz"] == pytest.approx(90e12 / (2 * 128 * spec["sm_count"]) / 1e6, abs=1)
    names = ["NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA B200", "NVIDIA GB200", "NVIDIA L40S",
             vidur.GPU_FOLDERS["a100"]]
    assert [gpus.gpu_label(n) for n in names] == ["a100-sxm4-80gb", "h100-sxm", "b200", "gb200", "l40s",
                                                  "a100-sxm4-80gb"]
