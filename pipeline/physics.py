"""The physics of an op, defined once: FLOPs, bytes, conv output sizes, GEMM views, tiles and waves, peak rates.

Every module that needs one of these numbers -- the op modules (sampling limits, memory filter), the features of
the per-op scalers, the whole-step tracker, the NeuSight node-table reader, wave scaling and the GPU registry --
calls this module. numpy level (numpy and ``pipeline.schema``): the light prediction API imports it. The op
functions take one config (a mapping of the op's canonical config columns to scalars; they return scalars) or
many (a mapping of columns to numpy arrays; they return arrays); GPU specs are plain dicts (``pipeline.gpus``).

Conventions
-----------
- **FLOPs count the GEMM work only**: a multiply-add is 2 FLOPs; bias adds and elementwise work (an LSTM's gate
  nonlinearities and cell update) are *not* counted unless ``include_elementwise=True``. Why: FLOPs are divided
  by a peak rate (a Tensor Core or FMA rate) to get a compute time, and that rate describes the GEMM only. The
  elementwise work runs on other units in an epilogue or a separate memory-bound kernel, so adding it to the
  GEMM FLOPs would misstate the compute bound; its cost is in the bytes it moves. PyTorch's
  ``torch.utils.flop_counter`` counts addmm and convolution the same way.
  ``include_elementwise=True`` adds 1 FLOP per output element for a bias (linear, conv2d) and 12 per hidden
  unit and step for an LSTM cell; the features of the published scalers (features version 3) were built that
  way and keep it.
- **Backward** computes one forward's FLOPs per gradient: data gradient + weight gradient = 2 x forward
  (``gradients=1`` when only one of them is computed).
- **Bytes** are a DRAM-traffic lower bound: forward reads every input and weight once (a convolution only the
  input rows and columns its outputs read: a 1x1 kernel at stride 3 skips 8 of 9 pixels) and writes every output
  once; backward reads the output gradient, inputs and weights and writes both gradients. An LSTM also keeps
  its gates and states (6 x hidden per step, layer and direction) for the backward, which reads and writes
  twice the forward's elements. Element size: ``BYTES_PER_ELEMENT``.
- **GEMM view** ``(g, m, n, k, steps)``: ``g`` independent ``[m, k] @ [k, n]`` GEMMs, repeated ``steps`` times
  one after another. linear (1, batch, out, in); bmm (batch, m, n, k); conv2d implicit GEMM per group
  (groups, batch x H_out x W_out, out/groups, in/groups x kh x kw); lstm one step of one layer, both directions
  (directions, batch, 4 x hidden, input + hidden), ``steps = seq_len x num_layers``; its wave bound takes the
  GEMMs cuDNN runs instead (``lstm_gemms``: one input projection per layer over all steps, the recurrent GEMM
  per step, and backward the weight gradients over all steps).
- **Conv output size** is PyTorch's: ``(size + 2 pad - dilation (k - 1) - 1) // stride + 1``; the GEMM view
  and the FLOPs use it at least 1 (a config with an empty output is invalid and never measured).
- **Tiles and waves**: a GEMM kernel runs ``g x ceil(m/T) x ceil(n/T)`` output tiles of edge ``T``
  (``TILE_SIZES``; ``BLOCK_TILE`` for thread-block counts), in ``ceil(tiles / SMs)`` waves.
- **Tile shapes** (``GEMM_TILES``): the output tiles of the GEMM kernels cuBLAS/cuDNN choose from, per compute class
  (Tensor Core or SIMT FMA) and architecture; a dimension smaller than a tile edge gets a tile cut to it (rounded
  up to ``TILE_GRANULE``: libraries carry thin and GEMV kernels for such shapes). Split-K (``SPLIT_K``) cuts the
  reduction into slices of at least ``SPLIT_K_MIN_SLICE``.
- **Schedules** (``TileSchedule``): ``tiles = g x ceil(m / tile_m) x ceil(n / tile_n) x split`` thread blocks run
  in ``waves = ceil(tiles / SMs)``, one block per SM at a time at the per-SM peak. ``library_schedule`` is the one
  a library heuristic picks (largest tile that fills the GPU); ``finest_schedule`` is the fastest any kernel of
  the menu can run (smallest tile, deepest split): waves x tile FLOPs / (peak / SMs), never below FLOPs / peak.
- **The bounds**: no GEMM runs faster than its finest schedule, except a convolution a fast algorithm runs with
  fewer FLOPs (``fast_algorithm_saving``: Winograd and FFT, whose bound is the schedule's time over the saving); no op
  moves its bytes faster than ``max(DRAM bytes / bandwidth, bytes / L2 bandwidth)`` (``memory_seconds``), where the
  bytes that fit in L2 (a warm cache between repeated calls, as in every benchmark loop) need not come from DRAM.
  L2 bandwidth is ``SMs x clock x L2_BYTES_PER_CLOCK_PER_SM`` (per architecture, from NVIDIA's whitepapers).
- **Peak rates** come from the registry's dense rate for the precision (``<precision>_tflops``). The one
  fallback rule: a precision a GPU has no fast path for (its rate is null, e.g. bf16 on a V100, fp16 on a
  Maxwell GPU) is taken to run at the GPU's fp32 rate (``has_fast_path`` says which): without a fast path the
  work goes through the fp32 units (upcast or emulated), so their rate is the best it can do. Whether such a
  precision may be predicted at all is not decided here: ``pipeline.gpus.supports_precision`` decides, and the
  prediction API refuses a precision a GPU cannot run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline.schema import PRECISIONS

__all__ = ["BYTES_PER_ELEMENT", "TILE_SIZES", "BLOCK_TILE", "ELEMENTS_PER_BLOCK", "Work", "work", "out_size",
           "conv_output_hw", "flops", "bytes_moved", "footprint_elements", "element_bytes", "is_backward",
           "bias_elements", "ALIGN_BYTES", "alignment_dims", "alignment_bytes", "attention_flops", "tiles", "waves",
           "gemm_tiles", "elementwise_blocks", "has_fast_path", "peak_tflops", "compute_tflops", "GEMM_TILES",
           "SPLIT_K", "TILE_GRANULE", "L2_BYTES_PER_CLOCK_PER_SM", "gemm_tile_set", "l2_bandwidth", "TileSchedule",
           "tile_schedule", "finest_schedule", "library_schedule", "memory_seconds", "WINOGRAD_SAVING",
           "fast_algorithm_saving", "FFT_TILE_EDGES", "fft_seconds", "lstm_gemms"]

BYTES_PER_ELEMENT = {"fp32": 4.0, "tf32": 4.0, "fp16": 2.0, "bf16": 2.0}
"""Bytes per element of each precision (tf32 computes on fp32 tensors)."""
TILE_SIZES = (128, 64)
"""Output tile edges of typical cuBLAS/cuDNN GEMM kernels (large and small tiles)."""
BLOCK_TILE = TILE_SIZES[0]
"""The tile edge used to count a GEMM kernel's thread blocks (the one-wave rule of wave scaling)."""
ELEMENTS_PER_BLOCK = 512
"""Thread blocks of an elementwise-style kernel without a profile: PyTorch's vectorised elementwise kernels run
128 threads x 4 elements per block."""
GEMM_TILES = {
    # SIMT (FMA) GEMM kernels: cuBLAS sgemm and CUTLASS SIMT tiles.
    "simt": ((128, 128), (128, 64), (64, 128), (64, 64), (32, 32)),
    # Tensor Core kernels (Volta and later; tf32 from Ampere): the CUTLASS/cuBLAS tiles; Hopper's warpgroup MMA
    # tiles are 64 rows deep at least, so 64 x 64 is the smallest full tile on every architecture.
    "tensor": ((256, 128), (128, 256), (128, 128), (128, 64), (64, 128), (64, 64)),
}
"""Output tile shapes (rows x columns) of the GEMM kernels the libraries pick from, per compute class."""
TILE_GRANULE = 8
"""A dimension below a tile edge is covered by a tile cut to it, rounded up to this many elements."""
SPLIT_K = (1, 2, 4, 8, 16, 32)
"""Split-K factors the schedules may use (cuBLAS's split-K and stream-K kernels cut the reduction)."""
SPLIT_K_MIN_SLICE = 64
"""No split-K slice is shallower than this (the K depth of one main-loop stage)."""
L2_BYTES_PER_CLOCK_PER_SM = ((8.0, 5120.0 / 108), (0.0, 2048.0 / 80))
"""(minimum compute capability, L2 read bytes per clock per SM): NVIDIA A100 Tensor Core GPU Architecture
whitepaper (2020): L2 read bandwidth 5120 bytes/clk on the A100 (108 SMs), 2048 bytes/clk on the V100 (80 SMs);
later architectures take the A100's per-SM figure, earlier ones the V100's (an upper bound for them)."""
LSTM_CELL_FLOPS = 12.0
"""Elementwise FLOPs per hidden unit and step of an LSTM cell (gate nonlinearities, cell and hidden update)."""
LSTM_SAVED_PER_HIDDEN = 6.0
"""Elements an LSTM keeps per hidden unit, step, layer and direction for its backward (4 gates, cell, hidden)."""

Config = Mapping[str, Any]


@dataclass(frozen=True)
class Work:
    """What one op config computes and moves (scalars for one config, arrays for many)."""

    g: Any
    m: Any
    n: Any
    k: Any
    steps: Any
    gemm_flops: Any          # forward, multiply-add = 2
    elementwise_flops: Any   # forward bias / cell work (counted only on request)
    forward_elements: Any    # elements read + written by the forward
    backward_elements: Any   # elements read + written by the backward
    weight_elements: Any
    out_height: Any = None   # conv2d only (at least 1)
    out_width: Any = None

    def flops(self, backward=False, *, include_elementwise: bool = False, gradients: int = 2):
        """FLOPs of the forward, or of the backward where ``backward`` (a bool or a bool array) is true."""
        fwd = self.gemm_flops + self.elementwise_flops if include_elementwise else self.gemm_flops
        return _select(backward, gradients * fwd, fwd)

    def elements(self, backward=False):
        """Elements moved by the forward, or by the backward where ``backward`` is true."""
        return _select(backward, self.backward_elements, self.forward_elements)


def _select(condition, if_true, if_false):
    if isinstance(condition, (bool, np.bool_)):
        return if_true if condition else if_false
    return np.where(condition, if_true, if_false)


def out_size(size, kernel, stride, pad, dilation):
    """PyTorch's convolution output size along one side (may be < 1 for an invalid config)."""
    return (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1


def conv_output_hw(cfg: Config):
    """(H_out, W_out) of a conv2d config, as PyTorch computes them (not clipped)."""
    return (out_size(cfg["height"], cfg["kernel_h"], cfg["stride_h"], cfg["pad_h"], cfg["dilation_h"]),
            out_size(cfg["width"], cfg["kernel_w"], cfg["stride_w"], cfg["pad_w"], cfg["dilation_w"]))


def _gemm_elements(g, m, n, k, shared_weight: bool):
    """(forward, backward, weight) elements of ``g`` GEMMs ``Y[m, n] = X[m, k] W[k, n]``."""
    x, w, y = g * m * k, (1 if shared_weight else g) * k * n, g * m * n
    return x + w + y, y + 2.0 * x + 2.0 * w, w  # backward: read dY, X, W; write dX, dW


def _linear(c: Config) -> Work:
    m, n, k = c["batch"], c["out_features"], c["in_features"]
    fwd, bwd, w = _gemm_elements(1, m, n, k, shared_weight=True)
    return Work(g=1, m=m, n=n, k=k, steps=1, gemm_flops=2.0 * m * n * k, elementwise_flops=c["bias"] * m * n,
                forward_elements=fwd, backward_elements=bwd, weight_elements=w)


def _bmm(c: Config) -> Work:
    g, m, n, k = c["batch"], c["m"], c["n"], c["k"]
    fwd, bwd, w = _gemm_elements(g, m, n, k, shared_weight=False)
    return Work(g=g, m=m, n=n, k=k, steps=1, gemm_flops=2.0 * g * m * n * k, elementwise_flops=0.0 * m,
                forward_elements=fwd, backward_elements=bwd, weight_elements=w)


def _conv2d(c: Config) -> Work:
    ho, wo = (np.maximum(s, 1) for s in conv_output_hw(c))
    g = c["groups"]
    m = c["batch"] * ho * wo
    n = c["out_channels"] / g
    k = c["in_channels"] / g * c["kernel_h"] * c["kernel_w"]
    x = c["batch"] * c["in_channels"] * c["height"] * c["width"]
    # the input elements some output reads: a kernel smaller than its stride skips input rows and columns
    x_read = (c["batch"] * c["in_channels"] * np.minimum(c["height"], ho * c["kernel_h"])
              * np.minimum(c["width"], wo * c["kernel_w"]))
    w = c["out_channels"] * k
    y = c["batch"] * c["out_channels"] * ho * wo
    return Work(g=g, m=m, n=n, k=k, steps=1, gemm_flops=2.0 * g * m * n * k,
                elementwise_flops=c["bias"] * m * c["out_channels"], forward_elements=x_read + w + y,
                backward_elements=y + x_read + x + 2.0 * w, weight_elements=w, out_height=ho, out_width=wo)


def _lstm(c: Config) -> Work:
    dirs = 1.0 + c["bidirectional"]
    h, layers, seq, b = c["hidden_size"], c["num_layers"], c["seq_len"], c["batch"]
    k_first = c["input_size"] + h
    k_rest = dirs * h + h
    gate_flops = 2.0 * b * 4.0 * h  # per unit of K, per step and direction
    gemm = seq * dirs * gate_flops * (k_first + (layers - 1.0) * k_rest)
    w = dirs * 4.0 * h * (k_first + (layers - 1.0) * k_rest)
    x = b * seq * c["input_size"]
    saved = b * seq * dirs * h * layers * LSTM_SAVED_PER_HIDDEN
    fwd = x + w + saved
    return Work(g=dirs, m=b, n=4.0 * h, k=k_first, steps=seq * layers, gemm_flops=gemm,
                elementwise_flops=seq * dirs * layers * b * h * LSTM_CELL_FLOPS, forward_elements=fwd,
                backward_elements=2.0 * fwd, weight_elements=w)


def lstm_gemms(c: Config, backward: bool = False) -> tuple[Work, ...]:
    """The GEMMs an LSTM runs, as cuDNN schedules them (``[m, k] @ [k, n]`` per direction, ``g`` = directions;
    the later layers' input is the layer below, ``directions x hidden`` wide). Forward: each layer's input
    projection as one GEMM over all steps (``[seq x batch, input] @ [input, 4 hidden]``), and only the recurrent
    ``[batch, hidden] @ [hidden, 4 hidden]`` step by step. Backward: the projection's data and weight gradients,
    each one GEMM over all steps; the recurrent data gradient ``[batch, 4 hidden] @ [4 hidden, hidden]`` step by
    step; the recurrent weight gradient once per layer over all steps (``k = seq x batch``). Either phase's FLOPs
    add up to ``work("lstm", c)``'s (twice them backward) and its weights to the op's. Their waves bound the time
    where ``steps`` times the whole per-step view did not: it cut every input projection into ``batch``-row
    slices, which a GEMM of ``seq x batch`` rows fills far better (8 H200 LSTMs of small hidden size over long
    sequences ran below it)."""
    dirs = 1.0 + c["bidirectional"]
    h, layers, seq, b = c["hidden_size"], c["num_layers"], c["seq_len"], c["batch"]
    zero = 0.0 * h
    tokens = seq * b

    def gemm(m, n, k, steps, weights):
        return Work(g=dirs, m=m, n=n, k=k, steps=steps, gemm_flops=steps * dirs * 2.0 * m * n * k,
                    elementwise_flops=zero, forward_elements=zero, backward_elements=zero,
                    weight_elements=weights * dirs * 4.0 * h)

    first, later = c["input_size"] + zero, dirs * h
    one, rest = 1.0 + zero, layers - 1.0   # layers with the input / with the layer below as input
    if not backward:
        return (gemm(tokens, 4.0 * h, first, one, first), gemm(tokens, 4.0 * h, later, rest, rest * later),
                gemm(b, 4.0 * h, h, seq * layers, layers * h))
    return (gemm(tokens, first, 4.0 * h, one, first), gemm(tokens, later, 4.0 * h, rest, rest * later),  # dX
            gemm(4.0 * h, first, tokens, one, zero), gemm(4.0 * h, later, tokens, rest, zero),            # dW_ih
            gemm(b, h, 4.0 * h, seq * layers, layers * h),                                                # dh
            gemm(4.0 * h, h, tokens, layers, zero))                                                       # dW_hh


_WORK = {"linear": _linear, "bmm": _bmm, "conv2d": _conv2d, "lstm": _lstm}


def work(op: str, cfg: Config) -> Work:
    """The ``Work`` of ``op`` (conv2d, linear, bmm, lstm) for one config or, with array columns, many."""
    if op not in _WORK:
        raise ValueError(f"op: unknown op {op!r}; allowed: {', '.join(_WORK)}")
    return _WORK[op](cfg)


ALIGN_BYTES = 16
"""Row alignment Tensor-Core kernels need (16 bytes: 8 fp16/bf16 or 4 fp32/tf32 elements; cuBLAS, cuDNN, Hopper's
TMA); a less aligned dimension runs on slower fallback kernels."""


def alignment_dims(op: str, cfg: Config, view: Work | None = None) -> tuple:
    """The two dimensions that set the row strides (leading dimensions) of the kernel's operands: (n, k) of a linear
    or bmm (from ``view``, its ``work(op, cfg)`` if the caller has it), a convolution's output and input channels per
    group (NHWC rows), an LSTM's hidden and input size. The GEMM's m (tokens, batch) strides nothing."""
    if op == "conv2d":
        return cfg["out_channels"] // cfg["groups"], cfg["in_channels"] // cfg["groups"]
    if op == "lstm":
        return cfg["hidden_size"], cfg["input_size"]
    view = work(op, cfg) if view is None else view
    return view.n, view.k


def alignment_bytes(dim, element_bytes_):
    """The largest power-of-two byte alignment of a row of ``dim`` elements, at most ``ALIGN_BYTES``."""
    d = np.maximum(np.rint(np.asarray(dim, dtype=np.float64)), 1).astype(np.int64)
    return np.minimum((d & -d) * np.asarray(element_bytes_, dtype=np.float64), ALIGN_BYTES)


def is_backward(phase):
    """True where ``phase`` (a phase name or an array of them) is ``backward``."""
    if isinstance(phase, str):
        return phase == "backward"
    return np.asarray(phase) == "backward"


def element_bytes(precision):
    """Bytes per element of ``precision`` (a name, or an array of names)."""
    if isinstance(precision, str):
        return BYTES_PER_ELEMENT[precision]
    return np.array([BYTES_PER_ELEMENT[p] for p in np.asarray(precision).reshape(-1)])


def flops(op: str, cfg: Config, phase="forward", *, include_elementwise: bool = False, gradients: int = 2):
    """FLOPs of ``op`` in ``phase`` (see the module's conventions)."""
    return work(op, cfg).flops(is_backward(phase), include_elementwise=include_elementwise, gradients=gradients)


def bytes_moved(op: str, cfg: Config, precision="fp32", phase="forward"):
    """DRAM bytes of ``op`` in ``phase`` at ``precision`` (a lower bound: each tensor once)."""
    return work(op, cfg).elements(is_backward(phase)) * element_bytes(precision)


def bias_elements(op: str, cfg: Config, backward=False):
    """Elements a linear's bias adds to its traffic: the forward's epilogue reads the bias (out_features); the
    backward's bias gradient reads dY again (batch x out_features) in a reduction kernel of its own. Zero for the
    other ops and without a bias; not part of ``bytes_moved`` (each tensor once), an addition to it."""
    if op != "linear":
        return 0.0 * _select(backward, 1.0, 1.0)
    per_row = _select(backward, cfg["batch"] * cfg["out_features"], cfg["out_features"] * 1.0)
    return per_row * cfg["bias"]


def footprint_elements(op: str, cfg: Config):
    """Elements held while measuring a forward + backward: every forward tensor and its gradient."""
    return 2.0 * work(op, cfg).forward_elements


def attention_flops(lead, q_len, k_len, head_dim, phase="forward"):
    """FLOPs of fused scaled-dot-product attention over ``lead`` (batch x heads) problems: two GEMMs
    (``Q K^T`` and ``P V``) forward; the backward recomputes ``S`` and computes dQ, dK, dV and dP, 2.5 x."""
    fwd = 4.0 * lead * q_len * k_len * head_dim
    return _select(is_backward(phase), 2.5 * fwd, fwd)


def tiles(view: Work, tile: int = BLOCK_TILE):
    """Output tiles of edge ``tile`` of the GEMM view (per step): ``g x ceil(m/tile) x ceil(n/tile)``."""
    return view.g * np.ceil(view.m / tile) * np.ceil(view.n / tile)


def waves(n_tiles, sm_count):
    """Waves of ``n_tiles`` thread blocks on ``sm_count`` SMs (one block per SM at a time)."""
    return np.ceil(n_tiles / sm_count)


def gemm_tiles(op: str, cfg: Config, tile: int = BLOCK_TILE):
    """Thread blocks (output tiles) of one GEMM kernel of ``op`` (one step of an LSTM)."""
    return tiles(work(op, cfg), tile)


def elementwise_blocks(elements):
    """Thread blocks of an elementwise kernel touching ``elements`` elements (NaN stays NaN)."""
    e = np.asarray(elements, dtype=float)
    return np.where(np.isfinite(e), np.ceil(np.maximum(e, 0.0) / ELEMENTS_PER_BLOCK), np.nan)


def has_fast_path(spec: Mapping, precision: str) -> bool:
    """Whether the GPU has a rate of its own for ``precision`` (fp32 always does)."""
    return precision == "fp32" or spec.get(f"{precision}_tflops") is not None


def peak_tflops(spec: Mapping, precision: str) -> float:
    """Peak dense TFLOP/s of a GPU spec at ``precision``; the fp32 rate where it has no fast path for it."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision: unknown precision {precision!r}; allowed: {', '.join(PRECISIONS)}")
    key = f"{precision}_tflops" if has_fast_path(spec, precision) else "fp32_tflops"
    return float(spec[key])


def compute_tflops(spec: Mapping, precision: str = "fp32", tensor_core: bool = False) -> float:
    """Peak TFLOP/s of an op's compute class: its precision's rate for an op that runs on Tensor Cores (a
    GEMM-like kernel), the fp32 rate for everything else (elementwise work runs on the FP32 units)."""
    return peak_tflops(spec, precision if tensor_core else "fp32")


# ----------------------------------------------------------------------------------------- bounds on time

WINOGRAD_SAVING = 4.0
"""Multiplications Winograd's F(4x4, 3x3) saves on a 3x3 stride-1 convolution (36 for 16 outputs instead of 144;
Lavin & Gray, CVPR 2016). cuDNN runs it off the Tensor Cores, so such a convolution can finish in a quarter of
its GEMM FLOPs over the peak."""


FFT_TILE_EDGES = (16, 32, 64)
"""Tile edges of cuDNN's tiled FFT convolution (its ``fft2d_r2c_32x32``, ``fft2d_r2c_64x64`` and 16-point
kernels); its untiled FFT transforms the whole padded input. A tile of edge ``T`` yields ``T - k + 1`` outputs
per side."""


def _unit_stride(cfg: Config):
    return ((np.asarray(cfg["stride_h"]) == 1) & (np.asarray(cfg["stride_w"]) == 1)
            & (np.asarray(cfg["dilation_h"]) == 1) & (np.asarray(cfg["dilation_w"]) == 1))


def fft_seconds(cfg: Config, fp32_flops, bandwidth, element_bytes, view: Work | None = None) -> np.ndarray:
    """Per row, a lower bound on a conv2d forward run by FFT (cuDNN's FFT and FFT-tiling algorithms): its
    pointwise complex products, ``8 x batch x out x in/groups`` FLOPs per frequency, on the fp32 FMA units
    (``fp32_flops``, FLOP/s: cuDNN runs them as complex GEMMs, ``cgemm``), or the frequency-domain input, filter and
    output written once (2 reals per complex value of ``element_bytes``), whichever is slower; the best of the
    untiled transform (``H_pad x (W_pad // 2 + 1)`` frequencies) and each of ``FFT_TILE_EDGES``. The transforms
    themselves are not counted. ``inf`` where FFT cannot run (stride or dilation other than 1). A backward runs
    two such products (data and weight gradient). Measured on an H200: fp32 10x10 and 11x11 convolutions over
    20-26 pixel inputs ran at 0.09-0.7x their direct GEMM FLOPs over the peak, all on FFT kernels
    (``benchmarks/conv_algorithms.py``). ``view``: the config's ``work("conv2d", cfg)`` if the caller has it."""
    a = {k: np.asarray(cfg[k], dtype=np.float64) for k in ("batch", "in_channels", "out_channels", "groups",
                                                           "kernel_h", "kernel_w", "height", "width", "pad_h", "pad_w")}
    sides = conv_output_hw(cfg) if view is None else (view.out_height, view.out_width)
    ho, wo = (np.maximum(np.asarray(s, dtype=np.float64), 1.0) for s in sides)
    pairs = a["out_channels"] * a["in_channels"] / a["groups"]

    def seconds(data_freq, filter_freq):
        flops = 8.0 * a["batch"] * pairs * data_freq
        values = a["batch"] * (a["in_channels"] + a["out_channels"]) * data_freq + pairs * filter_freq
        return np.maximum(flops / fp32_flops, 2.0 * values * element_bytes / bandwidth)

    whole = (a["height"] + 2 * a["pad_h"]) * (np.floor((a["width"] + 2 * a["pad_w"]) / 2) + 1)
    best = seconds(whole, whole)
    for edge in FFT_TILE_EDGES:
        tiles = (np.ceil(ho / np.maximum(edge - a["kernel_h"] + 1, 1))
                 * np.ceil(wo / np.maximum(edge - a["kernel_w"] + 1, 1)))
        freq = edge * (edge // 2 + 1)
        fits = (a["kernel_h"] <= edge) & (a["kernel_w"] <= edge)
        best = np.minimum(best, np.where(fits, seconds(tiles * freq, freq), np.inf))
    return np.where(_unit_stride(cfg), best, np.inf)


def fast_algorithm_saving(op: str, cfg: Config, tensor, device: Mapping | None = None,
                          element_bytes=None, view: Work | None = None) -> np.ndarray:
    """Per row, the factor by which a fast algorithm can cut an op's GEMM time below its FLOPs over the row's peak:
    for a conv2d, ``WINOGRAD_SAVING`` with a 3x3 undilated stride-1 kernel on a row that does not run on Tensor
    Cores (``tensor`` 0) and, given the ``device`` numbers (``peak`` per row, ``fp32`` and ``bandwidth``, as
    ``pipeline.features`` prepares them) and ``element_bytes``, FFT's (``fft_seconds``) where it is larger;
    else 1. Forward and backward share the factor (both run twice the work in a backward). ``view``: the config's
    ``work(op, cfg)`` if the caller has it (saves computing it again)."""
    tensor = np.asarray(tensor, dtype=float)
    if op != "conv2d":
        return np.ones(np.broadcast(tensor, *(np.asarray(v) for v in cfg.values())).shape)
    three = (np.asarray(cfg["kernel_h"]) == 3) & (np.asarray(cfg["kernel_w"]) == 3) & _unit_stride(cfg)
    saving = np.where(three & (tensor == 0), WINOGRAD_SAVING, 1.0)
    if device is None:
        return saving
    view = work(op, cfg) if view is None else view
    direct = view.flops(False) / np.asarray(device["peak"], dtype=np.float64)
    fft = direct / fft_seconds(cfg, device["fp32"], device["bandwidth"], element_bytes, view)
    return np.maximum(saving, fft)


def gemm_tile_set(spec: Mapping, precision: str) -> tuple[tuple[int, int], ...]:
    """The ``GEMM_TILES`` class of ``precision`` on the GPU: Tensor Core tiles where it runs the precision on
    Tensor Cores (a fast path at compute capability >= 7.0, other than fp32), SIMT tiles otherwise."""
    cc = float(spec["compute_capability"])
    if precision == "fp32" or not has_fast_path(spec, precision) or cc < 7.0:
        return GEMM_TILES["simt"]
    return GEMM_TILES["tensor"]


def l2_bandwidth(spec: Mapping) -> float:
    """L2 bandwidth in bytes/s: SMs x boost clock x ``L2_BYTES_PER_CLOCK_PER_SM`` of the architecture."""
    cc = float(spec["compute_capability"])
    per_sm = next(b for c, b in L2_BYTES_PER_CLOCK_PER_SM if cc >= c)
    return float(spec["sm_count"]) * float(spec["boost_clock_mhz"]) * 1e6 * per_sm


def _covered(dim, edge):
    """Elements a tile of ``edge`` covers along ``dim`` (padding included); a thin dim gets a tile cut to it."""
    cut = np.ceil(dim / TILE_GRANULE) * TILE_GRANULE
    return np.where(dim < edge, cut, np.ceil(dim / edge) * edge)


@dataclass(frozen=True)
class TileSchedule:
    """A GEMM view on tiles of ``tile_m x tile_n`` (cut to thin dims) and ``split`` reduction slices, per row."""

    tiles: Any       # thread blocks of one step (all g GEMMs, split-K slices counted)
    waves: Any       # ceil(tiles / SMs)
    tile_m: Any
    tile_n: Any
    tile_k: Any      # reduction depth of one block (k / split, rounded up)
    efficiency: Any  # useful FLOPs / (waves x SMs x tile FLOPs): padding and the idle part of the last wave

    def seconds(self, view: Work, per_sm_flops):
        """Every step's waves at the per-SM peak: ``steps x waves x 2 tile_m tile_n tile_k / per_sm_flops``."""
        return view.steps * self.waves * 2.0 * self.tile_m * self.tile_n * self.tile_k / per_sm_flops


def tile_schedule(view: Work, sm_count, tile_m, tile_n, split=1) -> TileSchedule:
    """The schedule of ``view`` on one tile shape (scalars or per-row arrays) and split-K factor."""
    g, m, n, k = (np.asarray(v, dtype=np.float64) for v in (view.g, view.m, view.n, view.k))
    cm, cn = _covered(m, tile_m), _covered(n, tile_n)
    tm, tn = np.minimum(cm, tile_m), np.minimum(cn, tile_n)
    depth = np.ceil(k / split)
    tiles = g * (cm / tm) * (cn / tn) * split
    waves = np.ceil(tiles / sm_count)
    return TileSchedule(tiles, waves, tm, tn, depth, (g * m * n * k) / (waves * sm_count * tm * tn * depth))


def finest_schedule(view: Work, sm_count, tile_set) -> TileSchedule:
    """The finest schedule of the menu: its smallest tile and the deepest split-K allowed (``SPLIT_K``, slices of
    at least ``SPLIT_K_MIN_SLICE``). A finer grain never takes more waves x tile work, so up to rounding this is
    the fastest schedule any kernel of the menu can run: ``seconds`` is a lower bound, never below FLOPs / peak."""
    tm, tn = min(tile_set, key=lambda t: t[0] * t[1])
    k = np.asarray(view.k, dtype=np.float64)
    split = np.ones_like(k)
    for s in SPLIT_K[1:]:
        split = np.where(k >= s * SPLIT_K_MIN_SLICE, s, split)
    return tile_schedule(view, sm_count, tm, tn, split)


def library_schedule(view: Work, sm_count, tile_set) -> TileSchedule:
    """The schedule a library heuristic picks (no split-K): the largest tile of the menu that still fills every SM
    (tiles >= SMs), else the smallest. The waves a kernel really runs, for features and NeuSight's form."""
    ordered = sorted(tile_set, key=lambda t: -t[0] * t[1])
    chosen = tile_schedule(view, sm_count, *ordered[-1])
    for tm, tn in ordered[-2::-1]:
        cand = tile_schedule(view, sm_count, tm, tn)
        fills = cand.tiles >= sm_count
        chosen = TileSchedule(*(np.where(fills, a, b) for a, b in zip(
            (cand.tiles, cand.waves, cand.tile_m, cand.tile_n, cand.tile_k, cand.efficiency),
            (chosen.tiles, chosen.waves, chosen.tile_m, chosen.tile_n, chosen.tile_k, chosen.efficiency))))
    return chosen


def memory_seconds(nbytes, bandwidth, l2_bytes, l2_bandwidth_):
    """Lower bound on moving ``nbytes`` (each tensor once): ``max(DRAM bytes / bandwidth, bytes / L2 bandwidth)``
    with DRAM bytes = the part that does not fit in L2 (``max(nbytes - l2_bytes, 0)``)."""
    nbytes = np.asarray(nbytes, dtype=np.float64)
    return np.maximum(np.maximum(nbytes - l2_bytes, 0.0) / bandwidth, nbytes / l2_bandwidth_)
