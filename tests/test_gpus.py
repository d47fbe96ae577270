"""Tests of the GPU registry (conf/gpus.yaml through pipeline.gpus)."""

from __future__ import annotations

import pytest
import yaml

from pipeline.gpus import (
    REGISTRY_PATH,
    SPEC_FIELDS,
    gpu_label,
    gpu_spec,
    known_gpus,
    peak_tflops,
    supports_precision,
)

# Every name a user, torch, DeepBench or NeuSight may give, and the label it must reach.
EXPECTED_ALIASES = {
    # short names
    "h100": "h100-sxm",
    "h200": "h200",
    "l4": "l4",
    "a100": "a100-sxm4-40gb",
    "a100-80gb": "a100-sxm4-80gb",
    "a100-pcie-40gb": "a100-pcie-40gb",
    "a100-80gb-pcie": "a100-pcie-80gb",
    "v100": "v100-sxm2-32gb",
    "v100-pcie": "v100-pcie-32gb",
    "h100-pcie": "h100-pcie",
    "t4": "t4",
    "p100": "p100",
    "p4": "p4",
    "m40": "m40",
    "titanx": "titanx-maxwell",
    "1080ti": "1080ti",
    "titanxp": "titanxp",
    "3090": "rtx3090",
    "4090": "rtx4090",
    "a6000": "rtx-a6000",
    "l40s": "l40s",
    "a10": "a10",
    "a10g": "a10g",
    "a40": "a40",
    "b200": "b200",
    # torch.cuda.get_device_name()
    "NVIDIA H200": "h200",
    "NVIDIA H100 80GB HBM3": "h100-sxm",
    "NVIDIA H100 PCIe": "h100-pcie",
    "NVIDIA A100-PCIE-40GB": "a100-pcie-40gb",
    "NVIDIA A100-SXM4-40GB": "a100-sxm4-40gb",
    "NVIDIA A100 80GB PCIe": "a100-pcie-80gb",
    "NVIDIA A100-SXM4-80GB": "a100-sxm4-80gb",
    "Tesla V100-PCIE-32GB": "v100-pcie-32gb",
    "Tesla V100-SXM2-32GB": "v100-sxm2-32gb",
    "Tesla V100-SXM2-16GB": "v100-sxm2-32gb",
    "Tesla V100-PCIE-16GB": "v100-pcie-32gb",
    "Tesla T4": "t4",
    "Tesla P4": "p4",
    "Tesla P100-PCIE-16GB": "p100",
    "NVIDIA L4": "l4",
    "NVIDIA A10": "a10",
    "NVIDIA A10G": "a10g",
    "NVIDIA A40": "a40",
    "NVIDIA L40S": "l40s",
    "NVIDIA GeForce RTX 3090": "rtx3090",
    "NVIDIA GeForce RTX 4090": "rtx4090",
    "NVIDIA RTX A6000": "rtx-a6000",
    "NVIDIA B200": "b200",
    "Tesla M40 24GB": "m40",
    "NVIDIA GeForce GTX TITAN X": "titanx-maxwell",
    "NVIDIA GeForce GTX 1080 Ti": "1080ti",
    "NVIDIA TITAN X (Pascal)": "titanx-pascal",
    "NVIDIA TITAN Xp": "titanxp",
    # DeepBench
    "NV_M40": "m40",
    "NV_TitanX": "titanx-maxwell",
    "NV_1080Ti": "1080ti",
    "NV_TitanX_Pascal": "titanx-pascal",
    "NV_TitanXp": "titanxp",
    "NV_P100": "p100",
    "NV_T4": "t4",
    # NeuSight label folders
    "NVIDIA_A100-PCIE-40GB": "a100-pcie-40gb",
    "NVIDIA_A100-SXM4-40GB": "a100-sxm4-40gb",
    "NVIDIA_A100_80GB_PCIe": "a100-pcie-80gb",
    "NVIDIA_H100_80GB_HBM3": "h100-sxm",
    "NVIDIA_L4": "l4",
    "Tesla_P100-PCIE-16GB": "p100",
    "Tesla_P4": "p4",
    "Tesla_T4": "t4",
    "Tesla_V100-PCIE-32GB": "v100-pcie-32gb",
}

REQUIRED_LABELS = {
    "m40", "titanx-maxwell", "1080ti", "titanx-pascal", "titanxp", "p4", "p100",
    "v100-pcie-32gb", "v100-sxm2-32gb", "t4", "a100-pcie-40gb", "a100-sxm4-40gb",
    "a100-pcie-80gb", "a100-sxm4-80gb", "a10", "a10g", "a40", "l4", "l40s",
    "rtx3090", "rtx4090", "rtx-a6000", "h100-pcie", "h100-sxm", "h200", "b200",
}

ALL = [gpu_spec(n) for n in known_gpus()]
IDS = [s["label"] for s in ALL]


def _good_dict(**override):
    spec = {
        "name": "Imaginary GPU",
        "compute_capability": "8.6",
        "sm_count": 64,
        "boost_clock_mhz": 1800,
        "memory_gb": 24,
        "memory_bandwidth_gbps": 700,
        "l2_cache_mb": 8,
        "fp32_tflops": 29.5,
        "tf32_tflops": 59.0,
        "fp16_tflops": 118.0,
        "bf16_tflops": None,
    }
    spec.update(override)
    return spec


# ------------------------------------------------------------------ lookup


@pytest.mark.parametrize("alias,label", sorted(EXPECTED_ALIASES.items()))
def test_alias_resolves(alias, label):
    assert gpu_spec(alias)["label"] == label
    assert gpu_label(alias) == label


@pytest.mark.parametrize("alias", ["H100", "nvidia h200", "TESLA T4", "nv_titanx_pascal", "A100-SXM4-80GB"])
def test_case_insensitive(alias):
    assert gpu_spec(alias) == gpu_spec(alias.lower())


@pytest.mark.parametrize(
    "alias,label",
    [("a100_80gb", "a100-sxm4-80gb"), ("A100 80GB", "a100-sxm4-80gb"), ("h100 pcie", "h100-pcie"),
     ("nvidia-a100-pcie-40gb", "a100-pcie-40gb"), ("Tesla V100 PCIE 32GB", "v100-pcie-32gb"),
     ("NVIDIA T4", "t4"), ("GeForce RTX 4090", "rtx4090"), ("h200 sxm", "h200")],
)
def test_separators_and_vendor_words_ignored(alias, label):
    assert gpu_label(alias) == label


def test_name_and_label_resolve_to_themselves():
    for spec in ALL:
        assert gpu_spec(spec["name"]) == spec
        assert gpu_spec(spec["label"]) == spec


def test_at_least_26_distinct_gpus():
    names = known_gpus()
    assert len(names) >= 26
    assert len(set(names)) == len(names)
    assert set(IDS) >= REQUIRED_LABELS
    assert len(set(IDS)) == len(IDS)


def test_result_fields_and_copy():
    spec = gpu_spec("h100")
    assert tuple(spec) == (*SPEC_FIELDS, "interconnect", "label")
    spec["fp32_tflops"] = 1.0
    spec["interconnect"]["nvlink_gbps"] = 1.0
    assert gpu_spec("h100")["fp32_tflops"] == pytest.approx(66.9)
    assert gpu_spec("h100")["interconnect"]["nvlink_gbps"] == 450


def test_spec_fields_contract():
    assert SPEC_FIELDS == (
        "name", "compute_capability", "sm_count", "boost_clock_mhz", "memory_gb",
        "memory_bandwidth_gbps", "l2_cache_mb", "fp32_tflops", "tf32_tflops",
        "fp16_tflops", "bf16_tflops",
    )
    raw = yaml.safe_load(REGISTRY_PATH.read_text())["gpus"]
    for entry in raw:
        optional = {"partition_of", "measured"} if "partition_of" in entry else {"interconnect"}
        assert set(entry) == {*SPEC_FIELDS, "label", "aliases", *optional}, entry.get("name")
        assert isinstance(entry["compute_capability"], str), entry["name"]


@pytest.mark.parametrize("bad,expect", [("h10", "h100"), ("a100-90gb", "a100-80gb"), ("NVIDIA H300", "H200")])
def test_unknown_name_lists_close_matches(bad, expect):
    with pytest.raises(ValueError) as err:
        gpu_spec(bad)
    msg = str(err.value)
    assert repr(bad) in msg
    assert expect.lower() in msg.lower()
    assert "known_gpus()" in msg


@pytest.mark.parametrize("bad", [42, None, ["h100"], 3.5])
def test_wrong_type(bad):
    with pytest.raises((TypeError, ValueError), match="name_or_dict"):
        gpu_spec(bad)


def test_empty_name():
    with pytest.raises(ValueError):
        gpu_spec("")
    with pytest.raises(ValueError):
        gpu_spec(" - ")


# --------------------------------------------------------- dict validation


def test_good_dict():
    spec = gpu_spec(_good_dict())
    assert tuple(spec) == (*SPEC_FIELDS, "label")
    assert spec["label"] == "imaginary-gpu"
    assert spec["bf16_tflops"] is None
    assert gpu_label(_good_dict(label="my-gpu")) == "my-gpu"


def test_registry_spec_round_trips_as_dict():
    spec = gpu_spec("a10g")
    assert gpu_spec(spec) == spec


def test_dict_compute_capability_as_number():
    assert gpu_spec(_good_dict(compute_capability=8.6))["compute_capability"] == "8.6"
    assert gpu_spec(_good_dict(compute_capability=9))["compute_capability"] == "9.0"
    with pytest.raises(ValueError, match="compute_capability"):
        gpu_spec(_good_dict(compute_capability="sm_86"))


def test_dict_missing_fields_named():
    spec = _good_dict()
    del spec["memory_bandwidth_gbps"]
    del spec["bf16_tflops"]
    with pytest.raises(ValueError, match="missing") as err:
        gpu_spec(spec)
    assert "memory_bandwidth_gbps" in str(err.value)
    assert "bf16_tflops" in str(err.value)


@pytest.mark.parametrize(
    "field,value",
    [("memory_bandwidth_gbps", -900), ("memory_bandwidth_gbps", 0), ("fp32_tflops", float("nan")),
     ("l2_cache_mb", float("inf")), ("sm_count", "80"), ("sm_count", 80.5), ("boost_clock_mhz", True),
     ("fp32_tflops", None), ("fp16_tflops", -1.0), ("tf32_tflops", float("nan"))],
)
def test_dict_bad_numbers(field, value):
    with pytest.raises(ValueError, match=field):
        gpu_spec(_good_dict(**{field: value}))


@pytest.mark.parametrize("value", ["", "   ", None, 5])
def test_dict_bad_name(value):
    with pytest.raises(ValueError, match="name"):
        gpu_spec(_good_dict(name=value))


def test_dict_extra_key_named():
    with pytest.raises(ValueError, match="tensor_cores"):
        gpu_spec(_good_dict(tensor_cores=512))


def test_dict_bad_label():
    with pytest.raises(ValueError, match="label"):
        gpu_spec(_good_dict(label="My GPU"))


def test_dict_cannot_take_a_registry_label_with_other_specs():
    spec = {**gpu_spec("h100"), "memory_bandwidth_gbps": 3000}
    with pytest.raises(ValueError, match="h100-sxm"):
        gpu_spec(spec)
    spec["label"] = "h100-what-if"
    assert gpu_label(spec) == "h100-what-if"


# ------------------------------------------------------------- precisions


def test_supports_precision():
    assert not supports_precision("v100", "bf16")
    assert not supports_precision("v100", "tf32")
    assert supports_precision("v100", "fp16")
    assert supports_precision("a100", "bf16")
    assert supports_precision("a100", "tf32")
    assert not supports_precision("t4", "tf32")
    assert not supports_precision("t4", "bf16")
    assert supports_precision("t4", "fp16")
    assert supports_precision("p100", "fp16")
    assert not supports_precision("1080ti", "fp16")
    for spec in ALL:
        assert supports_precision(spec, "fp32")
    assert supports_precision(gpu_spec("h100"), "bfloat16")


def test_tf32_and_bf16_exactly_from_ampere():
    for spec in ALL:
        ampere = float(spec["compute_capability"]) >= 8.0
        assert supports_precision(spec, "tf32") == ampere, spec["name"]
        assert supports_precision(spec, "bf16") == ampere, spec["name"]
        if float(spec["compute_capability"]) >= 7.0:
            assert supports_precision(spec, "fp16"), spec["name"]


def test_peak_tflops():
    assert peak_tflops("h100", "bf16") == pytest.approx(989.4)
    assert peak_tflops("h100", "tf32") == pytest.approx(494.7)
    assert peak_tflops("h100", "fp32") == pytest.approx(66.9)
    assert peak_tflops("a100", "fp16") == pytest.approx(312)
    assert peak_tflops("p100", "fp16") == pytest.approx(18.7)
    assert peak_tflops("t4", "fp16") == pytest.approx(65)
    assert isinstance(peak_tflops("v100", "fp16"), float)


def test_peak_tflops_unsupported_names_gpu_and_precision():
    with pytest.raises(ValueError) as err:
        peak_tflops("v100", "bf16")
    assert "V100" in str(err.value) and "bf16" in str(err.value)


def test_unknown_precision():
    with pytest.raises(ValueError, match="fp8"):
        peak_tflops("h100", "fp8")
    with pytest.raises(ValueError, match="int8"):
        supports_precision("h100", "int8")


def test_registry_is_cached():
    from pipeline import gpus

    assert gpus._registry() is gpus._registry()


def test_light_imports():
    """The registry is part of the light prediction API: no torch/hydra/omegaconf."""
    import subprocess
    import sys

    code = (
        "import sys, pipeline.gpus; "
        "bad = [m for m in ('torch', 'hydra', 'omegaconf') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REGISTRY_PATH.parent.parent)
