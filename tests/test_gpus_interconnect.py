"""The registry's interconnect fields (conf/gpus.yaml `interconnect`, pipeline.gpus.INTERCONNECT_FIELDS)."""

import re

import pytest
import yaml

from pipeline.gpus import INTERCONNECT_FIELDS, REGISTRY_PATH, gpu_spec, known_gpus

NVSWITCH_8 = {"nvlink_gen": 4, "nvlink_gbps": 450.0, "nvlink_gpus": 8, "nvswitch": True, "pcie_gen": 5,
              "pcie_lanes": 16, "gpus_per_node": 8}


def _dict(**interconnect):
    spec = {k: v for k, v in gpu_spec("h100").items() if k not in ("label", "interconnect")}
    spec["name"] = "My GPU"
    spec["interconnect"] = {**NVSWITCH_8, **interconnect}
    return spec


def test_every_registry_gpu_has_all_interconnect_fields():
    for name in known_gpus():
        ic = gpu_spec(name)["interconnect"]
        assert tuple(ic) == INTERCONNECT_FIELDS, name
        assert ic["pcie_gen"] in range(1, 7) and ic["pcie_lanes"] == 16 and ic["gpus_per_node"] >= 1, name
        if ic["nvlink_gen"] is None:
            assert ic["nvlink_gbps"] is None and ic["nvlink_gpus"] is None and not ic["nvswitch"], name
        else:
            assert ic["nvlink_gbps"] > 0 and 2 <= ic["nvlink_gpus"] <= ic["gpus_per_node"], name


def test_every_entry_cites_its_interconnect_source_at_its_end():
    text = REGISTRY_PATH.read_text()
    entries = re.split(r"\n  - name: ", text)[1:]
    raw = yaml.safe_load(text)["gpus"]
    assert len(entries) == len(raw)
    for chunk, entry in zip(entries, raw):
        if "partition_of" in entry:
            assert "interconnect:" not in chunk, entry["name"]  # partitions inherit
            continue
        lines = [ln for ln in chunk.rstrip().splitlines() if ln.startswith("    ")]  # the entry's own lines
        assert lines[-1].strip().startswith("interconnect: {"), entry["name"]  # the last field of the entry
        comment = [ln for ln in lines if ln.strip().startswith("# interconnect:")]
        assert comment and len(comment[0]) > 40, entry["name"]  # a source is named


@pytest.mark.parametrize("gpu, nvlink_gbps, nvswitch, pcie_gen, per_node", [
    ("h100", 450, True, 5, 8), ("h200", 450, True, 5, 8), ("a100", 300, True, 4, 8), ("b200", 900, True, 5, 8),
    ("gb200", 900, True, 5, 72), ("v100", 150, False, 3, 8), ("l40s", None, False, 4, 8), ("l4", None, False, 4, 8),
    ("t4", None, False, 3, 8), ("1080ti", None, False, 3, 10)])
def test_datasheet_values(gpu, nvlink_gbps, nvswitch, pcie_gen, per_node):
    ic = gpu_spec(gpu)["interconnect"]
    assert ic["nvlink_gbps"] == nvlink_gbps and ic["nvswitch"] is nvswitch
    assert ic["pcie_gen"] == pcie_gen and ic["gpus_per_node"] == per_node


def test_nvlink_bridges_join_two_pcie_cards():
    for gpu in ("a100-pcie-40gb", "a100-80gb-pcie", "h100-pcie", "a40", "rtx-a6000", "rtx3090"):
        ic = gpu_spec(gpu)["interconnect"]
        assert ic["nvlink_gpus"] == 2 and not ic["nvswitch"], gpu


def test_sm_partitions_inherit_their_gpus_interconnect():
    for part in ("h200-sm64", "h200-sm32", "h200-sm16"):
        assert gpu_spec(part)["interconnect"] == gpu_spec("h200")["interconnect"]


def test_a_spec_dict_may_carry_interconnect_fields():
    spec = gpu_spec(_dict())
    assert spec["interconnect"]["nvlink_gbps"] == 450.0
    assert gpu_spec(spec) == spec
    no_ic = {k: v for k, v in _dict().items() if k != "interconnect"}
    assert "interconnect" not in gpu_spec(no_ic)


@pytest.mark.parametrize("change, message", [
    ({"nvlink_gbps": None}, "all null"),
    ({"nvlink_gen": None, "nvlink_gbps": None, "nvlink_gpus": None}, "nvswitch is true but the GPU has no NVLink"),
    ({"nvlink_gpus": 16}, "exceeds gpus_per_node"),
    ({"pcie_lanes": 3}, "pcie_lanes"),
    ({"pcie_gen": 9}, "pcie_gen"),
    ({"gpus_per_node": 0}, "gpus_per_node"),
    ({"nvswitch": "yes"}, "nvswitch"),
    ({"nvlink_gbps": -1.0}, "nvlink_gbps"),
])
def test_bad_interconnect_fields_are_named(change, message):
    with pytest.raises(ValueError, match=message):
        gpu_spec(_dict(**change))


def test_missing_or_unknown_interconnect_keys():
    spec = _dict()
    del spec["interconnect"]["gpus_per_node"]
    with pytest.raises(ValueError, match=r"missing \['gpus_per_node'\]"):
        gpu_spec(spec)
    with pytest.raises(ValueError, match=r"unknown \['nics'\]"):
        gpu_spec(_dict(nics=8))
    with pytest.raises(ValueError, match="interconnect must be a mapping"):
        gpu_spec({**_dict(), "interconnect": "nvlink"})
