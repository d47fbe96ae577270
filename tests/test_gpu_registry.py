"""The registry's content: datasheet sanity (ranges, rates against cores x clock, Tensor Core ratios, ridge
points, known values) and the measured SM partitions of the H200."""

from __future__ import annotations

import math

import pytest

from pipeline.gpus import SPEC_FIELDS, gpu_spec, known_gpus

ALL = [gpu_spec(n) for n in known_gpus()]
IDS = [s["label"] for s in ALL]


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
