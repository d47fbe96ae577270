"""Model inputs of the per-op scalers: op config + physics + GPU specs, vectorised; and the physical bounds.

numpy/pandas only: the light prediction API imports this module. The contract with the API:

    rows = prepare(op, configs, gpu, precision, phase)     # per-row physics and device numbers, computed once
    x    = matrix(rows)                                    # (n, F) float64, columns feature_names(op)
    outs = [MLP_j((x - card.features.mean) / card.features.std) for each member j]   # one, or an ensemble
    ms   = pipeline.targets.members_to_ms(card.target.kind, outs, rows)

``build_features`` is ``matrix(prepare(...))``. What the model predicts, and how its output becomes a time
bounded below by physics, is ``pipeline.targets``.

Physics (``pipeline.physics``, conventions there): FLOPs count GEMM work; bytes are each tensor once; the lower
bound of an op is ``max(finest wave schedule, FLOPs / peak, L2-aware memory time)`` (``bound_ms``; the middle term
binds only for a stacked LSTM, whose GEMM view has the first layer's depth), never below FLOPs / peak at the
row's precision, the FLOPs of a convolution Winograd or FFT can run cut by its saving
(``physics.fast_algorithm_saving``);
the waves of the schedule a library picks (``physics.library_schedule``) are explicit features. ``roofline_ms``
is the plain roofline ``max(FLOPs / peak, bytes / DRAM bandwidth)`` (FLOPs with the bias and LSTM cell work, as
the public-data import's launch-bound rule and the "roofline alone" baseline use it).

Features are device-normalised so that a GPU the data lacks lands inside the training ranges: the device enters
through the bound and through quantities relative to it (waves and tiles per SM, intensity over the ridge point,
bytes over L2, the share of memory time the L2 saves), and through four device features whose range every class
of GPU spans: peak over the fp32 rate, FLOPs per SM per clock, the Tensor Core and no-fast-path flags. Raw specs
and further device ratios (DRAM bytes and L2 per SM, L2 over DRAM bandwidth, the ridge point) were tried and
left out: with a dozen training GPUs they act as GPU identifiers, and a memory-starved GPU such as the L4 lies
far outside their range (its bmm layers were predicted 2-4x too slow with them). ``device_feature_values`` gives
them for one GPU and precision (the evaluation reports where each GPU sits against the training range). A
linear's bias enters as the traffic it adds (``physics.bias_elements``) and as the backward's extra kernel, not as
a flag a model could key on. On Tensor-Core rows the alignment of the two dimensions that
set the operands' row strides is explicit (``physics.alignment_dims``: log2 of a row's byte alignment over the 16
bytes those kernels need; 0 on other rows): a bf16 GEMM with an odd leading dimension runs several times slower
than its aligned neighbours.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from pipeline import physics
from pipeline.physics import BYTES_PER_ELEMENT
from pipeline.schema import OP_CONFIG_COLUMNS, PHASES, PRECISIONS

FEATURES_VERSIONS = {"conv2d": 8, "linear": 5, "bmm": 5, "lstm": 7}
"""What ``prepare`` and ``matrix`` compute, versioned per op: a checkpoint loads only under its op's version
(conv2d 6: the bound allows for Winograd, ``physics.fast_algorithm_saving``; 7: ``cudnn_heuristic``; 8: the bound
allows for FFT, and a strided convolution's bytes count only the input pixels its outputs read; lstm 6: the wave
bound schedules each layer's input projection as one GEMM over all steps, ``physics.lstm_gemms``; 7: and the
backward's weight gradients, the recurrent data gradient alone step by step)."""

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
               "log_dilation_w", "log_groups", "log_out_height", "log_out_width"),
    "linear": ("log_batch", "log_in_features", "log_out_features"),
    "bmm": ("log_batch", "log_m", "log_k", "log_n"),
    "lstm": ("log_batch", "log_seq_len", "log_input_size", "log_hidden_size", "log_num_layers", "bidirectional"),
}
_PHYSICS_FEATURES = (
    "log_flops", "log_bytes", "log_intensity_over_ridge",
    "log_gemm_batch", "log_gemm_m", "log_gemm_n", "log_gemm_k", "log_steps",
    "log_tiles_per_sm", "log_waves", "wave_efficiency", "log_tile_m", "log_tile_n", "log_tile_us",
    "log_finest_waves", "finest_efficiency",
    "log_bound_ms", "log_compute_over_memory", "log_l2_memory_over_dram", "log_step_bound_us",
    "log_bytes_over_l2", "log_weight_bytes_over_l2",
    "log2_align_n", "log2_align_k",
)
_DEVICE_FEATURES = ("log_peak_over_fp32", "log_flop_per_sm_clock", "tensor_core", "no_fast_path")
_ONE_HOT = tuple(f"precision_{p}" for p in PRECISIONS) + tuple(f"phase_{p}" for p in PHASES)
# How the row's algorithm was chosen, for the ops whose library picks one per shape: 1 where it was cuDNN's
# heuristic pick (PyTorch's ``cudnn.benchmark`` off), 0 where it was autotuned (the data's method, and what every
# prediction asks for). Rows timed the other way can then teach the shapes without their algorithms passing for
# autotuned ones (reports/model_experiments.md, section 21).
HEURISTIC_FEATURE = "cudnn_heuristic"
_ALGORITHM_FEATURES: dict[str, tuple[str, ...]] = {"conv2d": (HEURISTIC_FEATURE,)}


def feature_names(op: str) -> list[str]:
    """Column names of ``build_features(op, ...)``, in order."""
    _check_op(op)
    return list(_CONFIG_FEATURES[op] + _PHYSICS_FEATURES + _DEVICE_FEATURES + _ONE_HOT
                + _ALGORITHM_FEATURES.get(op, ()))


def features_version(op: str) -> int:
    """``FEATURES_VERSIONS[op]``."""
    _check_op(op)
    return FEATURES_VERSIONS[op]


def device_features() -> list[str]:
    """The features that describe the GPU (constant for one GPU and precision)."""
    return list(_DEVICE_FEATURES)


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


# ------------------------------------------------------------------------------------------------ physics

@dataclass
class Rows:
    """Per-row physics of configs on one GPU (``prepare``): what the features and the targets are made of."""

    op: str
    n: int
    columns: dict            # config columns (float64)
    precision: np.ndarray    # codes into PRECISIONS
    phase: np.ndarray        # codes into PHASES
    device: dict             # per-row device numbers (``_device``)
    work: physics.Work
    flops: np.ndarray        # GEMM FLOPs of the phase
    bytes: np.ndarray        # bytes of the phase (each tensor once, plus a linear bias's traffic)
    element_bytes: np.ndarray
    library: physics.TileSchedule
    finest: physics.TileSchedule
    compute_s: np.ndarray    # flops / peak (GEMM FLOPs, no fast-algorithm saving)
    memory_s: np.ndarray     # bytes / DRAM bandwidth
    memory_l2_s: np.ndarray  # physics.memory_seconds (L2-aware)
    wave_s: np.ndarray       # the finest schedule's time (both GEMMs of a backward) over the fast-algorithm saving
    bound_s: np.ndarray      # max(wave_s, compute_s / saving, memory_l2_s): the lower bound
    tile_s: np.ndarray       # one block of the library schedule at the per-SM peak and per-SM bandwidth
    kernels: np.ndarray      # GEMM kernels run one after another (steps; x 2 backward; + a linear's bias gradient)
    roofline_s: np.ndarray   # max(flops with bias/cell work / peak, memory_s): the plain roofline
    heuristic: np.ndarray | None = None   # 1 where the algorithm was a heuristic pick (None: all autotuned)

    @property
    def backward(self) -> np.ndarray:
        return self.phase == PHASES.index("backward")


def _device(spec: Mapping, precision: np.ndarray) -> dict:
    """Per-row device numbers: the peak at the row's precision (``physics.peak_tflops``: the fp32 rate where the
    GPU has no fast path, flagged ``fallback``), the Tensor Core flag and the GPU's scalars."""
    peak = np.array([physics.peak_tflops(spec, p) for p in PRECISIONS])[precision] * 1e12
    fallback = np.array([0.0 if physics.has_fast_path(spec, p) else 1.0 for p in PRECISIONS])[precision]
    cc = float(spec["compute_capability"])
    tensor = ((precision != PRECISIONS.index("fp32")) & (fallback == 0) & (cc >= 7.0)).astype(np.float64)
    return {"peak": peak, "fp32": physics.peak_tflops(spec, "fp32") * 1e12, "fallback": fallback,
            "tensor": tensor, "bandwidth": float(spec["memory_bandwidth_gbps"]) * 1e9, "sm": float(spec["sm_count"]),
            "clock": float(spec["boost_clock_mhz"]) * 1e6, "l2": float(spec["l2_cache_mb"]) * 2.0 ** 20,
            "l2_bandwidth": physics.l2_bandwidth(spec)}


def _schedules(w: physics.Work, spec: Mapping, precision: np.ndarray, sm: float):
    """(library, finest) schedules per row, each row on the tile menu of its precision's compute class."""
    codes = np.unique(precision)
    parts = {int(c): (physics.library_schedule(w, sm, physics.gemm_tile_set(spec, PRECISIONS[c])),
                      physics.finest_schedule(w, sm, physics.gemm_tile_set(spec, PRECISIONS[c]))) for c in codes}
    if len(parts) == 1:
        return next(iter(parts.values()))

    def pick(which: int) -> physics.TileSchedule:
        fields = [np.zeros(len(precision)) for _ in range(6)]
        for c, both in parts.items():
            sel = precision == c
            for f, v in zip(fields, (both[which].tiles, both[which].waves, both[which].tile_m, both[which].tile_n,
                                     both[which].tile_k, both[which].efficiency)):
                f[sel] = np.broadcast_to(v, sel.shape)[sel]
        return physics.TileSchedule(*fields)

    return pick(0), pick(1)


def _finest_seconds(view: physics.Work, spec: Mapping, precision: np.ndarray, sm: float, per_sm_flops) -> np.ndarray:
    """``view``'s finest-schedule time per row, each row on the tile menu of its precision's compute class."""
    out = np.zeros(len(precision))
    for code in np.unique(precision):
        sel = precision == code
        seconds = physics.finest_schedule(view, sm, physics.gemm_tile_set(spec, PRECISIONS[code])).seconds(
            view, per_sm_flops)
        out[sel] = np.broadcast_to(seconds, sel.shape)[sel]
    return out


def prepare(op: str, configs, gpu, precision, phase) -> Rows:
    """The per-row physics of ``configs`` (a DataFrame or mapping of the op's config columns) on ``gpu`` (a spec
    dict or a name) at ``precision`` and ``phase`` (one value or one per row)."""
    _check_op(op)
    c = _columns(op, configs)
    n = len(next(iter(c.values())))
    prec = _per_row(precision, n, PRECISIONS, "precision")
    ph = _per_row(phase, n, PHASES, "phase")
    spec = _spec(gpu)
    dev = _device(spec, prec)
    backward = ph == PHASES.index("backward")
    w = physics.work(op, c)
    grads = np.where(backward, 2.0, 1.0)  # the backward runs two GEMMs of the forward's size
    flops = w.flops(backward)
    elem = np.array([BYTES_PER_ELEMENT[p] for p in PRECISIONS])[prec]
    nbytes = (w.elements(backward) + physics.bias_elements(op, c, backward)) * elem
    library, finest = _schedules(w, spec, prec, dev["sm"])
    per_sm_flops = dev["peak"] / dev["sm"]
    memory_l2 = physics.memory_seconds(nbytes, dev["bandwidth"], dev["l2"], dev["l2_bandwidth"])
    lib = library
    tile_bytes = grads * elem * (lib.tile_m * lib.tile_k + lib.tile_k * lib.tile_n + lib.tile_m * lib.tile_n)
    tile_s = np.maximum(grads * 2.0 * lib.tile_m * lib.tile_n * lib.tile_k / per_sm_flops,
                        tile_bytes / (dev["bandwidth"] / dev["sm"]))
    memory_s = nbytes / dev["bandwidth"]
    saving = physics.fast_algorithm_saving(op, c, dev["tensor"], dev, elem, w)  # Winograd, FFT: below the GEMM FLOPs
    if op == "lstm":   # the GEMMs cuDNN runs in the row's phase, each on its finest schedule
        wave_s = np.zeros(n)
        for phase_rows, views in ((~backward, physics.lstm_gemms(c)), (backward, physics.lstm_gemms(c, True))):
            if phase_rows.any():
                total = sum(_finest_seconds(v, spec, prec, dev["sm"], per_sm_flops) for v in views)
                wave_s[phase_rows] = total[phase_rows]
    else:
        wave_s = grads * finest.seconds(w, per_sm_flops) / saving
    roof_flops = w.flops(backward, include_elementwise=True)
    kernels = w.steps * grads + (backward * c["bias"] if op == "linear" else 0.0)
    return Rows(op=op, n=n, columns=c, precision=prec, phase=ph, device=dev, work=w, flops=flops, bytes=nbytes,
                element_bytes=elem, library=library, finest=finest, compute_s=flops / dev["peak"],
                memory_s=memory_s, memory_l2_s=memory_l2, wave_s=wave_s,
                bound_s=np.maximum(np.maximum(wave_s, flops / saving / dev["peak"]), memory_l2),
                tile_s=tile_s, kernels=np.broadcast_to(kernels, (n,)).astype(np.float64),
                roofline_s=np.maximum(roof_flops / dev["peak"], memory_s))


def roofline_ms(op: str, configs, gpu, precision, phase) -> np.ndarray:
    """The plain roofline in ms: ``max(flops / peak_flops(precision), bytes / DRAM bandwidth)`` on ``gpu``."""
    return prepare(op, configs, gpu, precision, phase).roofline_s * 1e3


def bound_ms(op: str, configs, gpu, precision, phase) -> np.ndarray:
    """The physical lower bound in ms: ``max(finest wave schedule, FLOPs / peak, L2-aware memory time)``, the
    first two over a convolution's Winograd or FFT saving (``physics.fast_algorithm_saving``)."""
    return prepare(op, configs, gpu, precision, phase).bound_s * 1e3


# ------------------------------------------------------------------------------------------------ features

def _physics_columns(r: Rows) -> list:
    """The ``_PHYSICS_FEATURES`` columns, in order."""
    log, dev, w = np.log, r.device, r.work
    flops, nbytes = np.maximum(r.flops, 1.0), np.maximum(r.bytes, 1.0)
    lib, fine = r.library, r.finest
    return [log(flops), log(nbytes), log((flops / nbytes) / (dev["peak"] / dev["bandwidth"])),
            log(w.g), log(w.m), log(w.n), log(w.k), log(w.steps),
            log(lib.tiles / dev["sm"]), log(lib.waves), lib.efficiency, log(lib.tile_m), log(lib.tile_n),
            log(r.tile_s * 1e6), log(fine.waves), fine.efficiency,
            log(r.bound_s * 1e3), log(r.wave_s / r.memory_l2_s), log(r.memory_l2_s / r.memory_s),
            log(r.bound_s / w.steps * 1e6), log(nbytes / dev["l2"]),
            log(np.maximum(w.weight_elements * r.element_bytes, 1.0) / dev["l2"])] + [
            dev["tensor"] * np.log2(physics.alignment_bytes(d, r.element_bytes) / physics.ALIGN_BYTES)
            for d in physics.alignment_dims(r.op, r.columns, w)]


def _device_columns(dev: dict) -> list:
    """The ``_DEVICE_FEATURES`` columns (per row; constant for one GPU and precision)."""
    return [np.log(dev["peak"] / dev["fp32"]), np.log(dev["peak"] / (dev["sm"] * dev["clock"])), dev["tensor"],
            dev["fallback"]]


def matrix(r: Rows) -> np.ndarray:
    """(n, F) float64 features of prepared rows; columns ``feature_names(op)``."""
    c, log = r.columns, np.log
    cols: list = []
    for name in _CONFIG_FEATURES[r.op]:
        if name.startswith("log1p_"):
            cols.append(np.log1p(c[name[6:]]))
        elif name in ("log_out_height", "log_out_width"):
            cols.append(log(getattr(r.work, name[4:])))
        elif name.startswith("log_"):
            cols.append(log(np.maximum(c[name[4:]], 1.0)))
        else:
            cols.append(c[name])
    cols += _physics_columns(r)
    cols += _device_columns(r.device)
    cols += [r.precision == i for i in range(len(PRECISIONS))]
    cols += [r.phase == i for i in range(len(PHASES))]
    if r.op in _ALGORITHM_FEATURES:
        cols.append(0.0 if r.heuristic is None else r.heuristic)
    # Filled column by column into a (F, n) block: contiguous writes; scalars (device constants) broadcast.
    out = np.empty((len(cols), r.n), dtype=np.float64)
    for j, col in enumerate(cols):
        out[j] = col
    return out.T


def build_features(op: str, configs, gpu, precision, phase) -> np.ndarray:
    """(n, F) float64 features of ``configs`` on ``gpu`` at ``precision`` and ``phase`` (one value or one per
    row); columns ``feature_names(op)``."""
    return matrix(prepare(op, configs, gpu, precision, phase))


def device_feature_values(gpu, precision: str) -> dict[str, float]:
    """The device features of ``gpu`` at ``precision`` (what places a GPU against the training range)."""
    dev = _device(_spec(gpu), np.array([PRECISIONS.index(precision)]))
    return {name: float(np.broadcast_to(v, (1,))[0]) for name, v in zip(_DEVICE_FEATURES, _device_columns(dev))}
