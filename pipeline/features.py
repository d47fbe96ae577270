"""Model inputs and targets of the per-op scalers: op config + physics + GPU specs, vectorised.

numpy/pandas only: the light prediction API imports this module. The contract with the API:

    x  = build_features(op, configs, gpu, precision, phase)      # (n, F) float64, columns feature_names(op)
    z  = (x - card.features.mean) / card.features.std
    y  = MLP(z)
    ms = target_to_ms(op, card.target.kind, y, configs, gpu, precision, phase)

Target (``TARGET_KIND = "log_roofline_ratio"``): ``y = ln(time_ms / roofline_ms)``, the log of how far the
op stays from its roofline bound ``max(flops / peak_flops, bytes / bandwidth)`` on *that* GPU at *that*
precision. An MLP predicting an efficiency generalises to GPUs it never saw far better than one predicting
absolute ms (NeuSight, ASPLOS'25): the roofline carries the device's scale, the MLP only its shortfall.
``log_baseline_ratio`` (config ``target``) divides by roofline + a fixed launch floor (``FLOOR_MS``) instead;
it keeps launch-bound ops in one target range on a much faster GPU, but in leave-GPU-out tests it was not
better than the plain roofline ratio (the measured floors differ by source: 10-200 us), so it is optional.
``log_ms`` (absolute, Habitat-style) exists for comparison.

Features are device-normalised (tiles per SM, wave quantisation, per-tile time at the
per-SM peak, bytes relative to L2, intensity relative to the ridge point, roofline relative to the floor), plus
``log_roofline_ms`` itself so that the model can learn the launch-overhead regime of tiny ops.

Physics: FLOPs, bytes, element sizes, the GEMM view, tiles and waves and the peak rate per precision all come
from ``pipeline.physics`` (its docstring states the conventions). One choice is the features' own: their FLOPs
include the bias and LSTM cell work (``include_elementwise=True``), as features version 3 -- the version the
published scalers were trained on -- did; every other physics number is the module's default. Where a GPU has no
fast path for the row's precision, the peak rate is the fp32 rate (``physics.peak_tflops``) and the
``no_fast_path`` feature is 1.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from pipeline import physics
from pipeline.physics import BYTES_PER_ELEMENT, TILE_SIZES
from pipeline.schema import OP_CONFIG_COLUMNS, PHASES, PRECISIONS

TARGET_KIND = "log_roofline_ratio"
TARGET_KINDS = ("log_roofline_ratio", "log_baseline_ratio", "log_ms")
FEATURES_VERSION = 3
# Predictions are never below this (ms): no measured PyTorch op on any GPU takes less (1st percentiles of the
# datasets are 8-30 us); it guards against a model extrapolating the target far below what it has seen.
MIN_PREDICTED_MS = 0.005
# Launch/framework floor of the baseline (ms): measured PyTorch ops never take less than ~10-20 us forward and
# ~20-90 us backward (autograd.grad launches several kernels); an lstm adds a small cost per sequential step.
FLOOR_MS = {"forward": 0.010, "backward": 0.020}
LSTM_STEP_FLOOR_MS = 0.002

# Columns an op config may leave out (the PyTorch defaults); all others are required.
CONFIG_DEFAULTS: dict[str, dict[str, float]] = {
    "conv2d": {"stride_h": 1, "stride_w": 1, "pad_h": 0, "pad_w": 0, "dilation_h": 1, "dilation_w": 1,
               "groups": 1, "bias": 1},
    "linear": {"bias": 1},
    "bmm": {},
    "lstm": {"num_layers": 1, "bidirectional": 0, "bias": 1},
}

_CONFIG_FEATURES: dict[str, tuple[str, ...]] = {
    "conv2d": ("log_batch", "log_in_channels", "log_out_channels", "log_height", "log_width", "log_kernel_h",
               "log_kernel_w", "log_stride_h", "log_stride_w", "log1p_pad_h", "log1p_pad_w", "log_dilation_h",
               "log_dilation_w", "log_groups", "bias", "log_out_height", "log_out_width"),
    "linear": ("log_batch", "log_in_features", "log_out_features", "bias"),
    "bmm": ("log_batch", "log_m", "log_k", "log_n"),
    "lstm": ("log_batch", "log_seq_len", "log_input_size", "log_hidden_size", "log_num_layers", "bidirectional",
             "bias"),
}
_PHYSICS_FEATURES = (
    "log_flops", "log_bytes", "log_intensity", "log_intensity_over_ridge",
    "log_gemm_batch", "log_gemm_m", "log_gemm_n", "log_gemm_k", "log_steps",
    "log_tiles128_per_sm", "log_waves128", "wave_eff128", "log_tile128_us",
    "log_tiles64_per_sm", "log_waves64", "wave_eff64", "log_tile64_us",
    "log_compute_ms", "log_memory_ms", "log_roofline_ms", "log_roofline_over_floor", "log_wave_compute_ms",
    "log_step_roofline_us",
    "log_bytes_over_l2", "log_weight_bytes_over_l2",
)
_DEVICE_FEATURES = (
    "log_peak_over_fp32", "log_flop_per_sm_clock", "log_bandwidth_per_sm", "log_ridge", "tensor_core",
    "no_fast_path",
)
_ONE_HOT = tuple(f"precision_{p}" for p in PRECISIONS) + tuple(f"phase_{p}" for p in PHASES)


def feature_names(op: str) -> list[str]:
    """Column names of ``build_features(op, ...)``, in order."""
    _check_op(op)
    return list(_CONFIG_FEATURES[op] + _PHYSICS_FEATURES + _DEVICE_FEATURES + _ONE_HOT)


# ------------------------------------------------------------------------------------------------ inputs

def _check_op(op: str) -> None:
    if op not in OP_CONFIG_COLUMNS:
        raise ValueError(f"op: unknown op {op!r}; allowed: {', '.join(OP_CONFIG_COLUMNS)}")


def _columns(op: str, configs) -> dict[str, np.ndarray]:
    """The op's config columns as float64 arrays (missing optional columns take the PyTorch default)."""
    if isinstance(configs, pd.DataFrame):
        frame = configs
    elif isinstance(configs, Mapping):
        frame = pd.DataFrame({k: np.atleast_1d(v) for k, v in configs.items()})
    else:
        frame = pd.DataFrame(list(configs))
    n = len(frame)
    out = {}
    for col in OP_CONFIG_COLUMNS[op]:
        if col in frame.columns:
            values = frame[col]
            if values.isna().any():
                raise ValueError(f"{op} config column {col!r} has missing values")
            out[col] = values.to_numpy(dtype=np.float64)
        elif col in CONFIG_DEFAULTS[op]:
            out[col] = np.full(n, float(CONFIG_DEFAULTS[op][col]))
        else:
            raise ValueError(f"{op} configs lack column {col!r}; required: {list(OP_CONFIG_COLUMNS[op])}")
    return out


def _per_row(value, n: int, allowed: Sequence[str], what: str) -> np.ndarray:
    """A scalar or per-row string argument as n integer codes (index into ``allowed``), validated."""
    if isinstance(value, str):
        if value not in allowed:
            raise ValueError(f"{what}: {value!r} is not one of {list(allowed)}")
        return np.full(n, allowed.index(value), dtype=np.int8)
    values = np.asarray(value, dtype=object).reshape(-1)
    if len(values) != n:
        raise ValueError(f"{what}: got {len(values)} values for {n} configs")
    codes = pd.Index(list(allowed)).get_indexer(values)
    if (codes < 0).any():
        raise ValueError(f"{what}: {values[codes < 0][0]!r} is not one of {list(allowed)}")
    return codes.astype(np.int8)


def _spec(gpu) -> Mapping:
    if isinstance(gpu, Mapping):
        return gpu
    from pipeline.gpus import gpu_spec  # light (PyYAML, numpy level)

    return gpu_spec(gpu)


def _device(spec: Mapping, precision: np.ndarray) -> dict[str, np.ndarray]:
    """Per-row device numbers: peak FLOP/s at the row's precision (``physics.peak_tflops``: the fp32 rate where
    the GPU has no fast path, flagged ``fallback``), bandwidth, SMs, ..."""
    peak = np.array([physics.peak_tflops(spec, p) for p in PRECISIONS])[precision]
    fallback = np.array([0.0 if physics.has_fast_path(spec, p) else 1.0 for p in PRECISIONS])[precision]
    fp32 = physics.peak_tflops(spec, "fp32")
    cc = float(spec["compute_capability"])
    tensor = ((precision != PRECISIONS.index("fp32")) & (fallback == 0) & (cc >= 7.0)).astype(np.float64)
    return {"peak_flops": peak * 1e12, "fp32_flops": fp32 * 1e12, "fallback": fallback, "tensor": tensor,
            "bandwidth": float(spec["memory_bandwidth_gbps"]) * 1e9, "sm": float(spec["sm_count"]),
            "clock_mhz": float(spec["boost_clock_mhz"]), "l2_bytes": float(spec["l2_cache_mb"]) * 2.0 ** 20,
            "memory_gb": float(spec["memory_gb"]), "cc": cc, "peak_tflops": peak}


# ------------------------------------------------------------------------------------------------ physics

def _physics(op: str, c: dict[str, np.ndarray], precision: np.ndarray, phase: np.ndarray) -> dict:
    """FLOPs, bytes and the GEMM view (``work``) of each row, from ``pipeline.physics``."""
    elem = np.array([BYTES_PER_ELEMENT[p] for p in PRECISIONS])[precision]
    backward = phase == PHASES.index("backward")
    w = physics.work(op, c)
    return {"flops": w.flops(backward, include_elementwise=True), "bytes": w.elements(backward) * elem,
            "weight_bytes": w.weight_elements * elem, "work": w}


def roofline_ms(op: str, configs, gpu, precision, phase) -> np.ndarray:
    """Roofline lower bound in ms: ``max(flops / peak_flops(precision), bytes / bandwidth)`` on ``gpu``."""
    _check_op(op)
    c = _columns(op, configs)
    n = len(next(iter(c.values())))
    prec = _per_row(precision, n, PRECISIONS, "precision")
    ph = _per_row(phase, n, PHASES, "phase")
    phys = _physics(op, c, prec, ph)
    dev = _device(_spec(gpu), prec)
    return _roofline(phys, dev)


def _roofline(phys, dev) -> np.ndarray:
    return np.maximum(phys["flops"] / dev["peak_flops"], phys["bytes"] / dev["bandwidth"]) * 1e3


def _floor(op: str, c: dict[str, np.ndarray], phase: np.ndarray) -> np.ndarray:
    floor = np.array([FLOOR_MS[p] for p in PHASES])[phase]
    if op == "lstm":
        floor = floor + LSTM_STEP_FLOOR_MS * c["seq_len"] * c["num_layers"]
    return floor


def floor_ms(op: str, configs, phase) -> np.ndarray:
    """The launch/framework floor of the baseline in ms (GPU-independent): ``FLOOR_MS[phase]``, plus
    ``LSTM_STEP_FLOOR_MS`` per sequential step (seq_len x num_layers) for lstm."""
    _check_op(op)
    c = _columns(op, configs)
    n = len(next(iter(c.values())))
    return _floor(op, c, _per_row(phase, n, PHASES, "phase"))


def baseline_ms(op: str, configs, gpu, precision, phase) -> np.ndarray:
    """Roofline plus launch floor: ``roofline_ms + floor_ms`` (what the default target is relative to)."""
    return roofline_ms(op, configs, gpu, precision, phase) + floor_ms(op, configs, phase)


# ------------------------------------------------------------------------------------------------ features

def _physics_columns(op: str, c: dict[str, np.ndarray], ph: np.ndarray, phys: dict, dev: dict) -> list:
    """The ``_PHYSICS_FEATURES`` columns, in order."""
    log = np.log
    sm, peak, bw = dev["sm"], dev["peak_flops"], dev["bandwidth"]
    flops_, bytes_ = np.maximum(phys["flops"], 1.0), np.maximum(phys["bytes"], 1.0)
    compute_s = flops_ / peak
    memory_s = bytes_ / bw
    roof_s = np.maximum(compute_s, memory_s)
    w = phys["work"]
    steps = w.steps
    tile_cols = []
    wave_compute_s = None
    for t in TILE_SIZES:
        tiles = physics.tiles(w, t)
        waves = physics.waves(tiles, sm)
        eff = tiles / (waves * sm)
        # one tile's share of the work at the per-SM peak rate (a whole step for lstm)
        tile_s = np.maximum(flops_ / (tiles * steps), 1.0) / (peak / sm)
        tile_cols += [log(tiles / sm), log(waves), eff, log(tile_s * 1e6)]
        if wave_compute_s is None:
            wave_compute_s = waves * tile_s * steps
    return ([log(flops_), log(bytes_), log(flops_ / bytes_), log((flops_ / bytes_) / (peak / bw)),
             log(w.g), log(w.m), log(w.n), log(w.k), log(steps)]
            + tile_cols
            + [log(compute_s * 1e3), log(memory_s * 1e3), log(roof_s * 1e3),
               log(roof_s * 1e3 / _floor(op, c, ph)), log(wave_compute_s * 1e3),
               log(roof_s / steps * 1e6), log(bytes_ / dev["l2_bytes"]),
               log(np.maximum(phys["weight_bytes"], 1.0) / dev["l2_bytes"])])


def build_features(op: str, configs, gpu, precision, phase) -> np.ndarray:
    """(n, F) float64 features of ``configs`` (a DataFrame of the op's config columns) on ``gpu``.

    ``gpu`` is a spec dict (``pipeline.gpus.gpu_spec``) or a name; ``precision`` and ``phase`` are one value
    or one per row. Columns are ``feature_names(op)``.
    """
    _check_op(op)
    c = _columns(op, configs)
    n = len(next(iter(c.values())))
    prec = _per_row(precision, n, PRECISIONS, "precision")
    ph = _per_row(phase, n, PHASES, "phase")
    spec = _spec(gpu)
    dev = _device(spec, prec)
    phys = _physics(op, c, prec, ph)
    log = np.log
    cols: list = []

    for name in _CONFIG_FEATURES[op]:
        if name.startswith("log1p_"):
            cols.append(np.log1p(c[name[6:]]))
        elif name in ("log_out_height", "log_out_width"):
            cols.append(log(getattr(phys["work"], name[4:])))
        elif name.startswith("log_"):
            cols.append(log(np.maximum(c[name[4:]], 1.0)))
        else:
            cols.append(c[name].astype(np.float64))

    cols += _physics_columns(op, c, ph, phys, dev)

    # Device features are ratios only. Raw specs (SM count, clock, bandwidth, L2, peak, memory, compute
    # capability) are left out on purpose: with a dozen training GPUs they act as GPU identifiers, and a new
    # GPU outside their range (e.g. the P4's 192 GB/s in leave-GPU-out tests) was then predicted 2x off. The
    # device's scale enters through the physics features (roofline times, tiles per SM, bytes over L2).
    sm, peak, bw = dev["sm"], dev["peak_flops"], dev["bandwidth"]
    cols += [log(peak / dev["fp32_flops"]), log(peak / (sm * dev["clock_mhz"] * 1e6)), log(bw / 1e9 / sm),
             log(peak / bw), dev["tensor"], dev["fallback"]]
    cols += [prec == i for i in range(len(PRECISIONS))]
    cols += [ph == i for i in range(len(PHASES))]
    # Filled column by column into a (F, n) block: contiguous writes; scalars (device constants) broadcast.
    out = np.empty((len(cols), n), dtype=np.float64)
    for j, col in enumerate(cols):
        out[j] = col
    return out.T


# ------------------------------------------------------------------------------------------------ targets

def ms_to_target(op: str, kind: str, ms, configs, gpu, precision, phase) -> np.ndarray:
    """Measured times (ms) -> regression target of ``kind``."""
    ms = np.asarray(ms, dtype=np.float64).reshape(-1)
    if kind == "log_baseline_ratio":
        return np.log(ms) - np.log(baseline_ms(op, configs, gpu, precision, phase))
    if kind == "log_roofline_ratio":
        return np.log(ms) - np.log(roofline_ms(op, configs, gpu, precision, phase))
    if kind == "log_ms":
        return np.log(ms)
    raise ValueError(f"target kind {kind!r} is not one of {list(TARGET_KINDS)}")


def target_to_ms(op: str, kind: str, y, configs, gpu, precision, phase) -> np.ndarray:
    """Model outputs of ``kind`` -> predicted times in ms (the inverse of ``ms_to_target``), at least
    ``MIN_PREDICTED_MS``."""
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    if kind == "log_baseline_ratio":
        ms = baseline_ms(op, configs, gpu, precision, phase) * np.exp(y)
    elif kind == "log_roofline_ratio":
        ms = roofline_ms(op, configs, gpu, precision, phase) * np.exp(y)
    elif kind == "log_ms":
        ms = np.exp(y)
    else:
        raise ValueError(f"target kind {kind!r} is not one of {list(TARGET_KINDS)}")
    return np.maximum(ms, MIN_PREDICTED_MS)


def target_card(kind: str = TARGET_KIND) -> dict:
    """The ``target`` entry of a model card: the kind and what it means."""
    if kind == "log_baseline_ratio":
        return {"kind": kind, "features_version": FEATURES_VERSION,
                "definition": "y = ln(time_ms / (roofline_ms + floor_ms)); roofline_ms = 1e3 * max(flops / "
                              "peak_flops, bytes / bandwidth) on the target GPU at the row's precision; floor_ms = "
                              f"{FLOOR_MS['forward']} forward / {FLOOR_MS['backward']} backward (+ "
                              f"{LSTM_STEP_FLOOR_MS} per seq_len x num_layers step for lstm)",
                "inverse": "time_ms = (roofline_ms + floor_ms) * exp(y)", "floor_ms": dict(FLOOR_MS),
                "lstm_step_floor_ms": LSTM_STEP_FLOOR_MS, "module": "pipeline.features"}
    if kind == "log_roofline_ratio":
        return {"kind": kind, "features_version": FEATURES_VERSION,
                "definition": "y = ln(time_ms / roofline_ms); roofline_ms = 1e3 * max(flops / peak_flops, "
                              "bytes / bandwidth) on the target GPU at the row's precision",
                "inverse": "time_ms = roofline_ms * exp(y)", "module": "pipeline.features"}
    if kind == "log_ms":
        return {"kind": kind, "features_version": FEATURES_VERSION, "definition": "y = ln(time_ms)",
                "inverse": "time_ms = exp(y)", "module": "pipeline.features"}
    raise ValueError(f"target kind {kind!r} is not one of {list(TARGET_KINDS)}")
