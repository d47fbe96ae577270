"""Tests of the GPU registry (conf/gpus.yaml through pipeline.gpus)."""

from __future__ import annotations

import math

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


# ------------------------------------------------ datasheet sanity checks

# FP32 cores per SM by architecture (compute capability major.minor).
_FP32_CORES_PER_SM = {
    "5.2": 128, "6.0": 64, "6.1": 128, "7.0": 64, "7.5": 64,
    "8.0": 64, "8.6": 128, "8.9": 128, "9.0": 128, "10.0": 128,
}


@pytest.mark.parametrize("spec", ALL, ids=IDS)
def test_ranges(spec):
    assert 10 < spec["sm_count"] < 200
    assert 100 < spec["memory_bandwidth_gbps"] < 10000
    assert 500 < spec["boost_clock_mhz"] < 3000
    assert 4 <= spec["memory_gb"] <= 200
    assert 1 <= spec["l2_cache_mb"] <= 200
    assert 1 < spec["fp32_tflops"] < 150


@pytest.mark.parametrize("spec", ALL, ids=IDS)
def test_fp32_matches_cores_times_clock(spec):
    cores = _FP32_CORES_PER_SM[spec["compute_capability"]] * spec["sm_count"]
    derived = 2 * cores * spec["boost_clock_mhz"] * 1e6 / 1e12
    assert spec["fp32_tflops"] == pytest.approx(derived, rel=0.03)


@pytest.mark.parametrize("spec", [s for s in ALL if "measured" not in s],
                         ids=[i for s, i in zip(ALL, IDS) if "measured" not in s])
def test_tensor_rates_consistent(spec):
    """Datasheet structure (SM partitions carry measured shares instead, checked on their own)."""
    fp32, tf32, fp16, bf16 = (spec[f"{p}_tflops"] for p in ("fp32", "tf32", "fp16", "bf16"))
    for rate in (tf32, fp16, bf16):
        if rate is not None:
            assert rate >= fp32
    if bf16 is not None:
        assert fp16 is not None and bf16 == pytest.approx(fp16, rel=0.01)
    if tf32 is not None:
        assert tf32 == pytest.approx(fp16 / 2, rel=0.02)
    if fp16 is not None:
        # Tensor Cores: 4x..32x the FP32 rate (dense); P100's plain half2: 2x.
        assert 1.9 <= fp16 / fp32 <= 32


@pytest.mark.parametrize("spec", ALL, ids=IDS)
def test_ridge_points(spec):
    """FLOP per byte where a kernel turns compute-bound: plausible for any GPU."""
    bw = spec["memory_bandwidth_gbps"] * 1e9
    fp32_ridge = spec["fp32_tflops"] * 1e12 / bw
    assert 5 < fp32_ridge < 150
    if spec["fp16_tflops"] is not None and spec["fp16_tflops"] > 2.5 * spec["fp32_tflops"]:
        assert 50 < spec["fp16_tflops"] * 1e12 / bw < 500


def test_known_values():
    h100, h200 = gpu_spec("h100"), gpu_spec("h200")
    assert (h100["sm_count"], h100["boost_clock_mhz"], h100["memory_bandwidth_gbps"]) == (132, 1980, 3350)
    for f in ("sm_count", "boost_clock_mhz", "fp32_tflops", "tf32_tflops", "fp16_tflops", "bf16_tflops"):
        assert h200[f] == h100[f]
    assert (h200["memory_gb"], h200["memory_bandwidth_gbps"]) == (141, 4800)
    assert gpu_spec("p4")["sm_count"] == 20
    a = {n: gpu_spec(n)["memory_bandwidth_gbps"] for n in ("a100", "a100-pcie-40gb", "a100-80gb-pcie", "a100-80gb")}
    assert a == {"a100": 1555, "a100-pcie-40gb": 1555, "a100-80gb-pcie": 1935, "a100-80gb": 2039}
    assert gpu_spec("v100")["fp16_tflops"] == 125 and gpu_spec("v100-pcie")["fp16_tflops"] == 112
    assert gpu_spec("l4")["l2_cache_mb"] == 48
    assert gpu_spec("b200")["bf16_tflops"] == 2250
    assert gpu_spec("b200")["compute_capability"] == "10.0"


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


def test_numbers_are_finite():
    for spec in ALL:
        for f in SPEC_FIELDS[2:]:
            if spec[f] is not None:
                assert math.isfinite(spec[f])


@pytest.mark.parametrize("sms", [64, 32, 16])
def test_h200_sm_partitions_are_registered_with_their_measured_share(sms):
    full, part = gpu_spec("h200"), gpu_spec(f"h200-sm{sms}")
    assert part["label"] == f"h200-sm{sms}" and part["partition_of"] == "h200" and part["sm_count"] == sms
    assert (part["boost_clock_mhz"], part["l2_cache_mb"], part["memory_gb"]) == (
        full["boost_clock_mhz"], full["l2_cache_mb"], full["memory_gb"])
    measured, whole = part["measured"], part["measured"]["full_gpu"]
    for field, key in (("memory_bandwidth_gbps", "copy_bandwidth_gbps"), ("bf16_tflops", "matmul_bf16_tflops"),
                       ("fp32_tflops", "matmul_fp32_tflops")):
        assert part[field] == pytest.approx(full[field] * measured[key] / whole[key], rel=2e-3)
        assert part[field] < full[field]
    # fewer SMs cannot reach the whole memory bandwidth: the compute-to-bandwidth balance moves
    assert part["memory_bandwidth_gbps"] / full["memory_bandwidth_gbps"] > sms / full["sm_count"]


@pytest.mark.parametrize("extra,message", [({"partition_of": "H200 SXM"}, "partition_of must be the registry label"),
                                           ({"measured": {"copy_bandwidth_gbps": -1}}, "measured must map names"),
                                           ({"measured": [1, 2]}, "measured must map names")])
def test_partition_fields_are_validated(extra, message):
    spec = {k: v for k, v in gpu_spec("h200-sm32").items() if k not in ("measured", "partition_of")}
    with pytest.raises(ValueError, match=message):
        gpu_spec({**spec, **extra})
