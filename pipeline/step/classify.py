"""Which ATen op is which kind, its canonical config, and the trace row of one executed op.

- **Op kinds** (``Trace.ops["op"]``): ``aten.convolution`` (2-D, not transposed) and ``convolution_backward``
  -> ``conv2d``; ``mm``/``addmm``/``linear`` -> ``linear`` (batch = rows, in_features = k, out_features = n,
  the backward's GEMMs too); ``bmm``/``baddbmm`` -> ``bmm``; ``_cudnn_rnn``/``mkldnn_rnn_layer`` in LSTM mode
  and their backward -> ``lstm``; everything else ``other``.
- **Counters**: FLOPs, bytes and thread blocks of conv2d/linear/bmm/lstm rows come from ``pipeline.physics``
  (the op's canonical config; ``scaler_phase`` says which phase). Fused attention has the physics' attention
  FLOPs. Every other op: bytes of the tensors it reads and writes, ~1 FLOP per element touched.
- **Precision**: an op on bf16/fp16 tensors is bf16/fp16 (autocast included: it inserts the casts, and the
  matmuls then run on 16-bit tensors); an fp32 conv/rnn is ``tf32`` when cuDNN may use TF32
  (``torch.backends.cudnn.allow_tf32``) and an fp32 matmul when cuBLAS may
  (``torch.get_float32_matmul_precision() != "highest"``); everything else is ``fp32``. The flags decide, not
  the device, so a CPU demo run with TF32 allowed is treated as the GPU would run it.

The table helpers (``conform``, ``fill_blocks``) are numpy/pandas only; torch is imported where an op is read.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from pipeline import physics
from pipeline.schema import BOOL_COLUMNS, CONFIG_COLUMNS, PHASES

__all__ = ["OP_KINDS", "SCALED_KINDS", "STEP_PHASES", "TRACE_COLUMNS", "NO_KERNEL", "describe", "gemm_blocks",
           "fill_blocks", "conform"]

SCALED_KINDS = ("conv2d", "linear", "bmm", "lstm")
"""Op kinds a per-op scaler covers."""
OP_KINDS = SCALED_KINDS + ("other",)
STEP_PHASES = PHASES + ("optimizer",)
"""Phases of a traced training step: the measured phases and the optimizer's update."""
TRACE_COLUMNS = (("seq", "name", "op", "phase", "scaler_phase", "precision", "dtype", "time_ms", "flops", "bytes",
                  "elements", "blocks", "tensor_core", "input_shapes") + CONFIG_COLUMNS)

NO_KERNEL = frozenset({"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "lift_fresh",
                       "_record_function_enter", "_record_function_enter_new", "_record_function_exit"})
"""ATen ops that launch no kernel: not timed."""
_CONV = frozenset({"convolution", "_convolution", "cudnn_convolution", "mkldnn_convolution",
                   "convolution_overrideable"})
_SDPA = frozenset({"_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                   "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
                   "_flash_attention_forward", "_efficient_attention_forward"})
_TC_OTHER = frozenset({"mv", "addmv", "dot", "vdot", "addbmm", "_int_mm", "_scaled_mm", "cudnn_convolution_transpose",
                       "convolution_transpose"})  # matmul-like ops that run on Tensor Cores, scaled as "other"
_WHOLE_BACKWARD = frozenset({"convolution_backward", "_cudnn_rnn_backward", "mkldnn_rnn_layer_backward"})
"""Ops that are a whole backward of their op kind (scaler phase ``backward``)."""


# ---------------------------------------------------------------------------------------------- op analysis

class _Op:
    """One ATen call: its name and arguments by schema name."""

    def __init__(self, name: str, args: dict):
        self.name, self.args = name, args

    def tensor(self, *keys):
        """The first of ``keys`` that holds a tensor, or None."""
        import torch
        for k in keys:
            v = self.args.get(k)
            if isinstance(v, torch.Tensor):
                return v
        return None


# (kind, canonical config or None, scaler phase, FLOPs if known, runs on Tensor Cores)
_Kind = tuple[str, "dict | None", str, "float | None", bool]
_OTHER: _Kind = ("other", None, "forward", None, False)
_OTHER_TC: _Kind = ("other", None, "forward", None, True)


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _conv(op: _Op) -> _Kind:
    inp, weight = op.tensor("input", "self"), op.tensor("weight")
    if inp is None or weight is None:
        return _OTHER
    if inp.dim() != 4 or weight.dim() != 4 or bool(op.args.get("transposed", False)):
        return _OTHER_TC  # 1-D/3-D or transposed: scaled as "other", on Tensor Cores
    a = op.args
    stride, padding, dilation = a.get("stride", (1, 1)), a.get("padding", (0, 0)), a.get("dilation", (1, 1))
    n, c, h, w = (int(x) for x in inp.shape)
    cfg = {"batch": n, "in_channels": c, "out_channels": int(weight.shape[0]), "height": h, "width": w,
           "kernel_h": int(weight.shape[2]), "kernel_w": int(weight.shape[3]),
           "stride_h": int(stride[0]), "stride_w": int(stride[-1]), "pad_h": int(padding[0]),
           "pad_w": int(padding[-1]), "dilation_h": int(dilation[0]), "dilation_w": int(dilation[-1]),
           "groups": int(a.get("groups", 1))}
    if op.name == "convolution_backward":
        cfg["bias"] = a.get("bias_sizes") is not None
        mask = a.get("output_mask") or (True, True, True)
        grads = int(bool(mask[0])) + int(bool(mask[1]))  # input and weight gradients computed
        return "conv2d", cfg, "backward", physics.flops("conv2d", cfg, "backward", gradients=grads), True
    cfg["bias"] = op.tensor("bias") is not None
    return "conv2d", cfg, "forward", physics.flops("conv2d", cfg, "forward"), True


def _gemm_2d(op: _Op) -> _Kind:
    m1, m2 = (op.tensor("self"), op.tensor("mat2")) if op.name == "mm" else (op.tensor("mat1"), op.tensor("mat2"))
    if m1 is None or m2 is None or m1.dim() != 2 or m2.dim() != 2:
        return _OTHER_TC
    cfg = {"batch": int(m1.shape[0]), "in_features": int(m1.shape[1]), "out_features": int(m2.shape[1]),
           "bias": op.name != "mm"}
    return "linear", cfg, "forward", physics.flops("linear", cfg), True


def _linear(op: _Op) -> _Kind:
    x, w = op.tensor("input"), op.tensor("weight")
    if x is None or w is None or x.dim() < 1 or w.dim() != 2:
        return _OTHER_TC
    cfg = {"batch": _numel(x.shape[:-1]) if x.dim() > 1 else 1, "in_features": int(w.shape[1]),
           "out_features": int(w.shape[0]), "bias": op.tensor("bias") is not None}
    return "linear", cfg, "forward", physics.flops("linear", cfg), True


def _bmm(op: _Op) -> _Kind:
    b1, b2 = (op.tensor("self"), op.tensor("mat2")) if op.name == "bmm" else (op.tensor("batch1"), op.tensor("batch2"))
    if b1 is None or b2 is None or b1.dim() != 3 or b2.dim() != 3:
        return _OTHER_TC
    cfg = {"batch": int(b1.shape[0]), "m": int(b1.shape[1]), "k": int(b1.shape[2]), "n": int(b2.shape[2])}
    return "bmm", cfg, "forward", physics.flops("bmm", cfg), True


def _rnn_layout(inp, batch_first: bool, batch_sizes) -> tuple[int, int, int]:
    """(batch, seq_len, input_size) of an rnn input, packed or padded."""
    if batch_sizes is not None and len(batch_sizes) > 0:
        return int(batch_sizes[0]), len(batch_sizes), int(inp.shape[-1])
    if inp.dim() == 2:  # unbatched
        return 1, int(inp.shape[0]), int(inp.shape[1])
    if batch_first:
        return int(inp.shape[0]), int(inp.shape[1]), int(inp.shape[2])
    return int(inp.shape[1]), int(inp.shape[0]), int(inp.shape[2])


def _lstm_kind(op: _Op, cfg: dict) -> _Kind:
    phase = "backward" if op.name in _WHOLE_BACKWARD else "forward"
    return "lstm", cfg, phase, physics.flops("lstm", cfg, phase), True


def _cudnn_rnn(op: _Op) -> _Kind:
    a, inp = op.args, op.tensor("input")
    layers, bidir = int(a.get("num_layers", 1)), bool(a.get("bidirectional", False))
    if inp is None or int(a.get("mode", -1)) != 2 or int(a.get("proj_size", 0) or 0) != 0:
        return _OTHER_TC  # not an LSTM, or one with projections
    batch, seq, isz = _rnn_layout(inp, bool(a.get("batch_first", False)), a.get("batch_sizes"))
    per = len(a.get("weight") or []) // max(layers * (2 if bidir else 1), 1)
    return _lstm_kind(op, {"batch": batch, "seq_len": seq, "input_size": isz, "hidden_size": int(a["hidden_size"]),
                           "num_layers": layers, "bidirectional": bidir, "bias": per >= 4})


def _mkldnn_rnn(op: _Op) -> _Kind:
    a, inp, w_ih = op.args, op.tensor("input"), op.tensor("weight0", "weight1")
    hidden = int(a.get("hidden_size", 0))
    if inp is None or w_ih is None or hidden <= 0 or int(w_ih.shape[0]) != 4 * hidden:
        return _OTHER
    # at::lstm hands mkldnn a time-major input whatever its batch_first flag says
    batch, seq, isz = _rnn_layout(inp, False, a.get("batch_sizes"))
    return _lstm_kind(op, {"batch": batch, "seq_len": seq, "input_size": isz, "hidden_size": hidden,
                           "num_layers": 1, "bidirectional": False, "bias": bool(a.get("has_biases", True))})


def _attention(op: _Op, backward: bool) -> _Kind:
    q, k = op.tensor("query", "q"), op.tensor("key", "k")
    if q is None or k is None or q.dim() < 3:
        return _OTHER_TC
    fl = physics.attention_flops(_numel(q.shape[:-2]), int(q.shape[-2]), int(k.shape[-2]), int(q.shape[-1]),
                                 "backward" if backward else "forward")
    return "other", None, "forward", float(fl), True


_BY_NAME = {**dict.fromkeys(_CONV | {"convolution_backward"}, _conv),
            **dict.fromkeys(("mm", "addmm", "_addmm_activation"), _gemm_2d), "linear": _linear,
            "bmm": _bmm, "baddbmm": _bmm, "_cudnn_rnn": _cudnn_rnn, "_cudnn_rnn_backward": _cudnn_rnn,
            "mkldnn_rnn_layer": _mkldnn_rnn, "mkldnn_rnn_layer_backward": _mkldnn_rnn}


def _classify(name: str, args: dict) -> _Kind:
    """(op kind, canonical config or None, scaler phase, FLOPs if known specially, runs on Tensor Cores)."""
    if name in _BY_NAME:
        return _BY_NAME[name](_Op(name, args))
    base = name[:-len("_backward")] if name.endswith("_backward") else name
    if base in _SDPA:
        return _attention(_Op(name, args), backward=base != name)
    return "other", None, "forward", None, name in _TC_OTHER


# ---------------------------------------------------------------------------------------------- trace rows

def _leaves(x):
    import torch
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for v in x:
            yield from _leaves(v)
    elif isinstance(x, dict):
        for v in x.values():
            yield from _leaves(v)


def _tensor_bytes(t) -> int:
    n = t.numel() * t.element_size()
    try:  # broadcast (expanded) tensors read their storage, not numel elements
        return min(n, t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):  # sparse, meta or wrapper tensors have no plain storage
        return n


def _precision_of(kind: str, tensor_core: bool, dtypes) -> str:
    import torch
    if torch.bfloat16 in dtypes:
        return "bf16"
    if torch.float16 in dtypes:
        return "fp16"
    if not tensor_core or torch.float32 not in dtypes:
        return "fp32"
    if kind in ("conv2d", "lstm"):
        tf32_ok = bool(torch._C._get_cudnn_allow_tf32())
    else:  # linear, bmm and matmul-like "other" ops run on cuBLAS
        tf32_ok = torch.get_float32_matmul_precision() != "highest"
    return "tf32" if tf32_ok else "fp32"


def _counters(ins, outs, args, kwargs) -> tuple[float, float]:
    """(bytes of the distinct tensors read and written, largest element count of one argument or output)."""
    seen, nbytes = set(), 0
    for x in ins + outs:
        if id(x) not in seen:
            seen.add(id(x))
            nbytes += _tensor_bytes(x)
    sizes = [sum(int(v.numel()) for v in _leaves(arg)) for arg in list(args) + list(kwargs.values())]
    sizes += [int(x.numel()) for x in outs]
    return float(nbytes), float(max(sizes, default=0))


def describe(func, args, kwargs, out, phase: str) -> dict:
    """The trace row (without its time) of one executed op."""
    name = func._opname
    arg_names = [arg.name for arg in func._schema.arguments]
    kind, cfg, scaler_phase, flops, tensor_core = _classify(name, {**dict(zip(arg_names, args)), **kwargs})
    ins = list(_leaves(list(args) + list(kwargs.values())))
    outs = list(_leaves(out))
    precision = _precision_of(kind, tensor_core, {x.dtype for x in ins + outs if x.is_floating_point()})
    if func.is_view:
        nbytes, elements, flops = 0.0, 0.0, 0.0
    elif cfg:
        _, elements = _counters(ins, outs, args, kwargs)
        nbytes = physics.bytes_moved(kind, cfg, precision, scaler_phase)
    else:
        nbytes, elements = _counters(ins, outs, args, kwargs)
        if flops is None:
            flops = elements if (outs or ins) else 0.0  # ~1 FLOP per element touched: elementwise/reduction
    first = next((x for x in ins if x.is_floating_point()), ins[0] if ins else (outs[0] if outs else None))
    overload = "" if func._overloadname == "default" else f".{func._overloadname}"
    row = {"name": f"{func.namespace}.{name}{overload}", "op": kind, "phase": phase, "scaler_phase": scaler_phase,
           "precision": precision, "dtype": str(first.dtype).replace("torch.", "") if first is not None else "",
           "flops": float(flops), "bytes": float(nbytes), "elements": elements,
           "tensor_core": bool(tensor_core and precision != "fp32"),
           "input_shapes": json.dumps([list(x.shape) for x in ins])}
    if cfg:
        row.update(cfg)
        row["blocks"] = gemm_blocks(kind, cfg)
    return row


def unknown_row(func, phase: str, exc: Exception) -> dict:
    """The row of an op whose description failed: kept (its time counts), scaled as an "other" op."""
    return {"name": str(func), "op": "other", "phase": phase, "scaler_phase": "forward", "precision": "fp32",
            "dtype": "", "flops": math.nan, "bytes": math.nan, "elements": math.nan, "tensor_core": False,
            "input_shapes": f"<{type(exc).__name__}>"}


# ---------------------------------------------------------------------------------------------- the table

def gemm_blocks(kind: str, cfg: dict) -> float:
    """Thread blocks (output tiles, ``physics.gemm_tiles``) of a conv2d/linear/bmm kernel; NaN for lstm, whose
    sequential steps the one-wave rule does not describe."""
    return math.nan if kind == "lstm" else float(physics.gemm_tiles(kind, cfg))


def fill_blocks(ops: pd.DataFrame) -> np.ndarray:
    """The ``blocks`` column, estimated from ``elements`` for "other" rows that have none."""
    n = len(ops)
    blocks = (pd.to_numeric(ops["blocks"], errors="coerce").to_numpy(dtype=float).copy() if "blocks" in ops
              else np.full(n, np.nan))
    elements = (pd.to_numeric(ops["elements"], errors="coerce").to_numpy(dtype=float) if "elements" in ops
                else np.full(n, np.nan))
    fill = np.isnan(blocks) & (ops["op"].astype(str).to_numpy() == "other")
    blocks[fill] = physics.elementwise_blocks(elements[fill])
    return blocks


def conform(ops: pd.DataFrame) -> pd.DataFrame:
    """All TRACE_COLUMNS, in order, with nullable integer/bool config columns."""
    ops = ops.copy()
    for col in TRACE_COLUMNS:
        if col not in ops:
            ops[col] = None
    extra = [c for c in ops.columns if c not in TRACE_COLUMNS]
    ops = ops[list(TRACE_COLUMNS) + extra]
    for col in ("time_ms", "flops", "bytes", "elements"):
        ops[col] = pd.to_numeric(ops[col], errors="coerce").astype(float)
    ops["blocks"] = fill_blocks(ops)
    ops["tensor_core"] = ops["tensor_core"].fillna(False).astype(bool)
    for col in CONFIG_COLUMNS:
        ops[col] = ops[col].astype("boolean" if col in BOOL_COLUMNS else "Int64")
    return ops.reset_index(drop=True)
