"""The collective table (schema), the collective model and its fit (pipeline.collectives)."""

import numpy as np
import pandas as pd
import pytest
import yaml

from pipeline.collectives import model as cm
from pipeline.collectives import schema as cs
from pipeline.collectives.cli import main as collectives_main
from pipeline.collectives.fit import ape, fit_model, fit_params, load_rows, predict_rows
from pipeline.gpus import gpu_spec
from pipeline.schema import dataset_files, read_dataset

TRUE = cm.LinkParams((cm.Protocol(5.0, 1.0, 0.7),), crowding=0.0)


def _row(**over):
    row = {"gpu": "h100-sxm", "source": "test", "collective": "all_reduce", "n_gpus": 2, "nodes": 1,
           "bytes": 1 << 20, "dtype": "fp32", "interconnect": "nvlink", "time_ms": 0.02, "time_p20_ms": 0.019,
           "time_p80_ms": 0.021, "reps": 10, "status": "ok", "error": None}
    row.update(over)
    return row


# ------------------------------------------------------------------------------------------------ schema

def test_rows_round_trip_with_metadata_and_the_op_readers_skip_them(tmp_path):
    root = tmp_path / "collectives"
    paths = cs.write_table(cs.make_rows([_row(), _row(bytes=4096, collective="all_gather")]), root, "run-1",
                           {"topology": "GPU0 X NV18"})
    assert paths == [root / "gpu=h100-sxm" / "run-1.parquet"]
    back = cs.read_collectives(root)
    assert len(back) == 2 and set(back["collective"]) == {"all_reduce", "all_gather"}
    assert back["config_id"].nunique() == 2 and (back["config_id"] == back.apply(cs.config_id, axis=1)).all()
    assert cs.file_metadata(paths[0])["topology"] == "GPU0 X NV18"
    assert dataset_files(tmp_path) == [] and read_dataset(tmp_path).empty  # ops readers never see them


@pytest.mark.parametrize("field, value, needle", [
    ("collective", "broadcast", "'collective'"), ("dtype", "fp8", "'dtype'"), ("interconnect", "ib", "'interconnect'"),
    ("n_gpus", 0, "'n_gpus'"), ("bytes", 3, "'bytes'"), ("nodes", 4, "'nodes'"), ("time_ms", -1.0, "'time_ms'"),
    ("time_p20_ms", 0.5, "time_p20_ms"), ("reps", 0, "'reps'"), ("gpu", "", "'gpu'")])
def test_bad_rows_name_the_field(field, value, needle):
    frame = cs.make_rows([_row(), _row(**{field: value})])
    with pytest.raises(cs.SchemaError, match=needle):
        cs.validate(frame, where="x.parquet")


def test_a_changed_config_breaks_its_id():
    frame = cs.make_rows([_row()])
    frame.loc[0, "bytes"] = 2048
    with pytest.raises(cs.SchemaError, match="config_id"):
        cs.validate(frame)


# ------------------------------------------------------------------------------------------------- model

def test_ring_factors_and_steps():
    assert cm.algorithm_factor("all_reduce", 2) == pytest.approx(1.0)
    assert cm.algorithm_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    assert cm.algorithm_factor("all_gather", 4) == pytest.approx(3 / 4)
    assert list(cm.algorithm_steps(np.array(["all_reduce", "reduce_scatter"]), [4, 4])) == [6.0, 3.0]
    with pytest.raises(ValueError, match="collective"):
        cm.algorithm_factor("broadcast", 2)


def test_link_bandwidth_comes_from_the_registry_fields():
    assert cm.link_gbps(gpu_spec("h100"), "nvlink") == 450
    assert cm.link_gbps(gpu_spec("l40s"), "pcie") == pytest.approx(16 * 16 * 128 / 130 / 8)  # PCIe 4.0 x16: 31.5 GB/s
    assert cm.link_gbps(gpu_spec("h200"), "host") == pytest.approx(16 * cm.PCIE_LANE_GBPS[5])
    with pytest.raises(ValueError, match="no NVLink"):
        cm.link_gbps(gpu_spec("l4"), "nvlink")


def test_time_is_latency_plus_bytes_over_bus_bandwidth():
    t = cm.base_ms("all_reduce", [0, 1e9], 4, 100.0, TRUE)
    steps, bus = 6, 0.7 * 100.0
    assert t[0] == pytest.approx((5.0 + 1.0 * steps) / 1e3)
    assert t[1] == pytest.approx((5.0 + steps + 1.5 * 1e9 / (bus * 1e3)) / 1e3)
    assert cm.base_ms("all_reduce", [1e9], 1, 100.0, TRUE)[0] == 0.0  # one GPU: nothing to do


def test_the_fastest_protocol_wins_and_crowding_shrinks_bandwidth():
    two = cm.LinkParams((cm.Protocol(2.0, 0.0, 0.05), cm.Protocol(20.0, 0.0, 0.9)))
    small, large = cm.base_ms("all_reduce", [1e3, 1e9], 2, 100.0, two)
    assert small == pytest.approx((2.0 + 1e3 / (5.0 * 1e3)) / 1e3)  # low-latency protocol
    assert large == pytest.approx((20.0 + 1e9 / (90.0 * 1e3)) / 1e3)  # bandwidth protocol
    crowded = cm.LinkParams((cm.Protocol(0.0, 0.0, 1.0),), crowding=1.0)
    assert cm.base_ms("all_gather", [1e9], 8, 100.0, crowded)[0] == pytest.approx(7 / 8 * 1e9 / (25.0 * 1e3) / 1e3)


def test_interconnect_resolution_and_bad_inputs():
    assert cm.resolve_interconnect(gpu_spec("h100"), None, 8) == "nvlink"
    assert cm.resolve_interconnect(gpu_spec("l40s"), "auto", 8) == "pcie"
    assert cm.resolve_interconnect(gpu_spec("a100-pcie-40gb"), None, 2) == "nvlink"  # a bridge joins two
    assert cm.resolve_interconnect(gpu_spec("a100-pcie-40gb"), None, 4) == "pcie"
    assert cm.resolve_interconnect(gpu_spec("h100"), "host", 1) == "none"
    with pytest.raises(ValueError, match="interconnect: 'infiniband' is not one of auto, nvlink, pcie, host"):
        cm.resolve_interconnect(gpu_spec("h100"), "infiniband", 2)
    with pytest.raises(ValueError, match="n_gpus must be a whole number >= 1"):
        cm.resolve_interconnect(gpu_spec("h100"), None, 0)
    with pytest.raises(ValueError, match="l4 has no NVLink"):
        cm.resolve_interconnect(gpu_spec("l4"), "nvlink", 2)
    with pytest.raises(ValueError, match="joins 2 GPUs"):
        cm.resolve_interconnect(gpu_spec("h100-pcie"), "nvlink", 4)


def test_more_gpus_than_a_node_needs_the_network_bandwidth():
    model = cm.CollectiveModel({"nvlink": TRUE}, network=cm.LinkParams((cm.Protocol(10.0, 5.0, 0.8),)))
    with pytest.raises(ValueError, match=r"n_gpus=16: more GPUs than one h100-sxm node holds \(8\); give inter_node"):
        model.time_ms("all_reduce", [1e8], 16, "h100", None)
    one_node = model.time_ms("all_reduce", [1e9], 8, "h100", None)[0]
    two_nodes = model.time_ms("all_reduce", [1e9], 16, "h100", None, inter_node_gbps=50.0)[0]
    assert two_nodes > one_node  # 0.8 x 50 GB/s across nodes < 0.7 x 450 within
    assert two_nodes == pytest.approx(cm.base_ms("all_reduce", [1e9], 16, 450.0, TRUE, model.network, 2, 50.0)[0])


def test_a_class_without_data_falls_back_to_pcie_and_says_so():
    model = cm.CollectiveModel({"pcie": TRUE})
    assert model.params("h200", "host")[1] == "pcie class (no host-path data fitted)"
    with pytest.raises(ValueError, match="no fit for it"):
        model.params("h200", "nvlink")


# --------------------------------------------------------------------------------------------------- fit

def _synthetic(tmp_path, gpus=("h100-sxm", "a100-sxm4-80gb", "b200"), params=TRUE, noise=0.0):
    rng = np.random.default_rng(0)
    rows = []
    for gpu in gpus:
        link = cm.link_gbps(gpu_spec(gpu), "nvlink")
        for collective in ("all_reduce", "all_gather"):
            for n in (2, 4, 8):
                sizes = 2 ** np.arange(10, 31, 2) * 8
                t = cm.base_ms(collective, sizes, n, link, params) * np.exp(noise * rng.standard_normal(len(sizes)))
                rows += [_row(gpu=gpu, collective=collective, n_gpus=n, bytes=int(s), time_ms=float(v),
                              time_p20_ms=float(v), time_p80_ms=float(v)) for s, v in zip(sizes, t)]
    frame = cs.make_rows(rows)
    for _gpu, part in frame.groupby("gpu"):
        cs.write_table(part, tmp_path, "synthetic")
    return tmp_path


def test_fit_recovers_the_parameters_and_predicts_held_out_systems(tmp_path):
    root = _synthetic(tmp_path, params=cm.LinkParams((cm.Protocol(5.0, 1.0, 0.7),), crowding=0.3))
    rows, _ = load_rows(root)
    p = fit_params(rows)
    assert p.protocols[0].efficiency == pytest.approx(0.7, rel=0.02) and p.crowding == pytest.approx(0.3, abs=0.03)
    assert ape(predict_rows(rows, p), rows["time_ms"]).max() < 2.0
    model, tables = fit_model([root])
    assert set(model.systems) == {"h100-sxm/nvlink", "a100-sxm4-80gb/nvlink", "b200/nvlink"}
    assert tables["held_out_systems"]["mean_ape"].max() < 2.0  # one law for all: unseen systems are predicted
    assert tables["held_out_sizes"]["mean_ape"].max() < 2.0
    assert model.meta["correction"]["kept"] is False  # nothing left for a correction to learn


def test_fit_cli_writes_a_model_that_loads_and_the_report(tmp_path):
    root = _synthetic(tmp_path / "data", noise=0.02)
    out = tmp_path / "model.yaml"
    assert collectives_main(["fit", "--data", str(root), "--model", str(out), "--report", str(tmp_path)]) == 0
    model = cm.CollectiveModel.load(out)
    assert yaml.safe_load(out.read_text())["meta"]["rows"] == 3 * 2 * 3 * 11
    assert model.classes["nvlink"].efficiency == pytest.approx(0.7, rel=0.05)
    t = model.time_ms("all_reduce", [1 << 26], 4, "h200", None)  # an unseen GPU: its class and its registry link
    factor = model.correction.factor("nvlink", [1 << 26])[0] if model.correction else 1.0
    assert t[0] == pytest.approx(factor * cm.base_ms("all_reduce", [1 << 26], 4, 450.0, model.classes["nvlink"])[0])
    report = (tmp_path / "collectives.md").read_text()
    assert "Held out" in report and (tmp_path / "collectives.png").stat().st_size > 1000
    with pytest.raises(FileNotFoundError, match="pipeline.collectives fit"):
        cm.CollectiveModel.load(tmp_path / "missing.yaml")


def test_the_shipped_model_loads_and_is_physical():
    model = cm.CollectiveModel.load()
    assert {"nvlink", "pcie"} <= set(model.classes)
    for params in [*model.classes.values(), *model.systems.values()]:
        assert all(0 < q.efficiency <= 1.0 + 1e-9 and q.latency_us >= 0 for q in params.protocols)
    sizes = np.array([1e4, 1e6, 1e8])
    nvlink = model.time_ms("all_reduce", sizes, 8, "h100", "nvlink")
    pcie = model.time_ms("all_reduce", sizes, 8, "l40s", "pcie")
    assert np.all(np.diff(nvlink) > 0) and nvlink[-1] < pcie[-1]  # NVLink beats PCIe on large messages
    assert pd.Series(model.meta["systems"]).sum() == model.meta["rows"]


def test_a_foreign_or_torn_file_is_named(tmp_path):
    folder = tmp_path / "gpu=h100-sxm"
    folder.mkdir()
    pd.DataFrame({"bytes": [1]}).to_parquet(folder / "foreign.parquet")
    with pytest.raises(cs.SchemaError, match="foreign.parquet: not a readable collective table"):
        cs.read_file(folder / "foreign.parquet")
    (folder / "foreign.parquet").write_bytes(b"torn")
    with pytest.raises(cs.SchemaError, match="not a readable"):
        cs.read_collectives(tmp_path)
    with pytest.raises(cs.SchemaError, match="gpu=<label>"):
        cs.read_file(tmp_path / "x.parquet")
