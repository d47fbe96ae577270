"""Import of the public collective tables (AIConfigurator NCCL, DeepBench all-reduce) on tiny fixtures."""

import pandas as pd
import pytest
import yaml

from pipeline import schema
from pipeline.collectives import schema as cs
from pipeline.ingest import Report
from pipeline.ingest.collectives import import_collectives
from pipeline.ingest.common import IngestError


def _nccl(device: str, latency_scale: float) -> pd.DataFrame:
    rows = []
    for op in ("all_reduce", "all_gather", "alltoall", "broadcast"):
        for n in (2, 4):
            for elements in (256, 1 << 20):
                rows.append({"framework": "TRTLLM", "version": "2.27.3", "device": device, "op_name": op,
                             "kernel_source": "NCCL", "nccl_dtype": "half", "num_gpus": n, "message_size": elements,
                             "latency": latency_scale * (0.01 + elements * 2e-9 * n)})
    rows.append({**rows[0], "nccl_dtype": "int8", "message_size": 512})
    rows.append({**rows[0], "latency": float("nan"), "message_size": 4096})  # no time: dropped, counted
    return pd.DataFrame(rows)


def _write(root):
    systems = {"h100_sxm": ("NVIDIA H100 80GB HBM3", 450e9, 64e9, 1.0),
               "l40s": ("NVIDIA L40S", 32e9, 32e9, 5.0), "mi300": ("AMD Instinct MI300X", 448e9, 64e9, 1.0)}
    for folder, (device, intra, pcie, scale) in systems.items():
        d = root / "aiconfigurator" / folder
        d.mkdir(parents=True)
        _nccl(device, scale).to_parquet(d / "nccl_perf.parquet")
        (d / "system.yaml").write_text(yaml.safe_dump({"node": {"num_gpus_per_node": 8, "intra_node_bw": intra,
                                                                "pcie_bw": pcie}}))
        (d / "nccl_collection_meta.yaml").write_text(yaml.safe_dump({"runtime": {"version": "2.27.3"}}))
    rows = [{"file": "x.xlsx", "device": dev, "suite": "train", "sheet": "Results", "precision": "Float", "app": "",
             "size_floats": size, "n_devices": n, "time_ms": t}
            for dev in ("NV_P100", "NV_1080Ti", "IA_KNL7250") for n in (2, 8, 16) for size in (100000, 6553600)
            for t in [0.1 * n + size * 1e-6]]
    rows.append({**rows[0], "device": "NV_T4", "time_ms": None})
    (root / "deepbench").mkdir()
    pd.DataFrame(rows).to_csv(root / "deepbench" / "allreduce.csv", index=False)
    return root


@pytest.fixture
def extdata(tmp_path):
    return _write(tmp_path / "extdata")


def test_nccl_tables_map_to_collective_rows(extdata, tmp_path):
    out = tmp_path / "out" / "collectives"
    report = Report()
    frame = import_collectives(extdata, out, ["aiconfigurator-nccl"], report)
    assert set(frame["gpu"]) == {"h100-sxm", "l40s"}  # the AMD system is skipped and counted
    assert report.unknown_gpus["AMD Instinct MI300X"] == len(_nccl("x", 1)) - 2 * 2  # less its broadcast rows
    assert set(frame["collective"]) == {"all_reduce", "all_gather", "all_to_all"}  # broadcast: skipped
    assert any("broadcast" in reason for _, reason in report.skipped_rows)
    h100 = frame[frame["gpu"] == "h100-sxm"]
    assert set(h100["interconnect"]) == {"nvlink"} and set(frame.loc[frame["gpu"] == "l40s", "interconnect"]) == {
        "pcie"}
    half = h100[(h100["dtype"] == "fp16") & (h100["collective"] == "all_reduce") & (h100["n_gpus"] == 2)]
    assert sorted(half["bytes"]) == [512, 2 << 20]  # elements x 2 bytes
    assert set(h100.loc[h100["dtype"] == "int8", "bytes"]) == {512}
    assert sum(report.bad_times.values()) == 2  # the NaN rows of the two known systems
    meta = cs.file_metadata(out / "gpu=h100-sxm" / "aiconfigurator-nccl.parquet")
    assert meta["license"].startswith("Apache-2.0") and meta["topology"][0]["interconnect"] == "nvlink"
    assert meta["topology"][0]["nccl_version"] == "2.27.3"


def test_deepbench_allreduce_rows_know_their_nodes(extdata, tmp_path):
    out = tmp_path / "collectives"
    report = Report()
    frame = import_collectives(extdata, out, ["deepbench-allreduce"], report)
    assert set(frame["gpu"]) == {"p100", "1080ti"} and report.unknown_gpus["IA_KNL7250"] == 6
    assert report.bad_times[("deepbench-allreduce", "t4", "all_reduce", "-")] == 1
    nodes = frame.set_index(["gpu", "n_gpus"])["nodes"].groupby(level=[0, 1]).first()
    assert nodes[("p100", 8)] == 1 and nodes[("p100", 16)] == 2  # 8-GPU nodes
    assert nodes[("1080ti", 8)] == 1 and nodes[("1080ti", 16)] == 2  # 10-GPU nodes
    assert set(frame["bytes"]) == {400000, 6553600 * 4} and set(frame["dtype"]) == {"fp32"}
    meta = cs.file_metadata(out / "gpu=p100" / "deepbench-allreduce.parquet")
    assert meta["topology"][0]["network"]["inter_node_gbps"] == pytest.approx(6.788, abs=1e-3)


def test_reimport_is_identical_stale_files_go_and_op_readers_skip_the_folder(extdata, tmp_path):
    out = tmp_path / "external" / "collectives"
    import_collectives(extdata, out)
    first = cs.read_collectives(out).sort_values(["gpu", "config_id"]).reset_index(drop=True)
    (out / "gpu=t4").mkdir()
    pd.read_parquet(out / "gpu=p100" / "deepbench-allreduce.parquet")  # readable as plain parquet
    (out / "gpu=p100" / "deepbench-allreduce.parquet").rename(out / "gpu=t4" / "deepbench-allreduce.parquet")
    import_collectives(extdata, out)
    second = cs.read_collectives(out).sort_values(["gpu", "config_id"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(first, second)
    assert not (out / "gpu=t4").exists()
    assert schema.read_dataset(tmp_path / "external").empty


def test_absent_tables_are_skipped_and_unknown_sources_refused(tmp_path):
    (tmp_path / "aiconfigurator").mkdir()
    assert import_collectives(tmp_path, tmp_path / "out").empty
    with pytest.raises(IngestError, match="collective_sources"):
        import_collectives(tmp_path, tmp_path / "out", ["nccl-tests"])
