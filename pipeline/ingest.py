"""``make import``: convert public measured op timings into the dataset schema (``pipeline.schema``).

Reads the read-only ``extdata`` folder (config key ``extdata``, default ``../shared/extdata``; see its
README.md) and writes ``<out>/gpu=<label>/op=<op>/<source>.parquet`` (default ``out=datasets/external``),
one file per (GPU, op, source), each with the source's license, citation, original files, library
versions and timing method in its Parquet metadata. Re-running gives the same rows; files are replaced
atomically and files of a source that a run no longer produces are removed.

Sources and mappings (``time_p20_ms = time_p80_ms = time_ms`` everywhere: none of them publishes a spread):

``neusight`` — NeuSight ``train/{bmm,linear,conv}/<Device>.csv`` (fp32, TF32 off, forward only,
    ``Latency`` = mean of the 5 fastest of 25 CUDA-event timed calls, so ``reps = 5``). GPU from the
    ``Device`` column (the conv "A100" file is an A100 80GB PCIe).
    bmm ``B,M,N,K`` = ``torch.bmm(x[B,M,N], y[B,N,K])`` -> batch=B, m=M, k=N (inner dim), n=K.
    linear ``B,M,N,K`` = ``nn.Linear(N, K)`` on ``[B,M,N]`` -> batch=B*M, in_features=N, out_features=K, bias.
    conv -> conv2d batch=B, in/out_channels, kernel_h=kernel_w=Kernel_Szie, height=width=Input_Size,
    stride, padding, dilation 1, groups 1, no bias.

``neusight-label`` — NeuSight ``label/<GPU>/<model>-<train|inf>-*.csv`` torch.fx node tables of BERT-Large
    and GPT-2-Large (fp32; AMD GPUs skipped). ``call_module`` nodes whose module class is ``nn.Linear`` or
    HF ``Conv1D`` -> linear (batch = product of the input's leading dims, in = its last dim, out = the
    output's last dim; bias except GPT-2's ``lm_head``, which HF builds with ``bias=False``);
    ``addmm(bias, x[rows,in], w[in,out])`` calls (GPT-2's traced Conv1D) -> linear with bias;
    ``torch.nn.functional.linear`` calls -> linear; ``matmul``/``bmm`` calls whose two inputs are both >= 3-D
    -> bmm (batch = product of the output's leading dims, m, k, n). ``fw_latency`` -> forward row,
    ``bw_latency`` -> backward row (train tables only; inference tables have no backward). ``reps = 1``:
    the tables give one number per node and do not record how many runs it aggregates.

``deepbench`` — Baidu DeepBench training results (vendor libraries called directly; ``Float`` -> fp32,
    every "16 bit inputs, ..." mode -> fp16, P100's "pseudo fp16" included; ``reps = 1``: one published
    number per kernel, the repetition count is not in the results).
    gemm ``M,N,K,transA,transB`` (cuBLAS, column-major C[MxN] = op(A)[MxK] op(B)[KxN]; N is the
    minibatch/time dimension, M and K are layer sizes). Read with PyTorch's call conventions, since the
    project's ops are PyTorch ops: ``nn.Linear(in=K, out=M)`` on N rows launches exactly the ``T,N`` GEMM
    (M, N, K); its backward launches ``N,N`` (K, N, M) for the input gradient and ``N,T`` (K, M, N) for
    the weight gradient; ``torch.bmm(a[1,m,k], b[1,k,n])`` of contiguous tensors launches ``N,N`` (n, m, k).
    So ``T,N`` rows -> linear forward (batch=N, in_features=K, out_features=M, bias=False); ``N,N`` rows ->
    bmm forward (batch=1, m=N, k=K, n=M); a linear backward row (= data + weight gradient GEMM) is written
    only where both of those GEMMs were measured on the same GPU and precision (none are in the current
    results: DeepBench never benchmarks the weight-gradient shape); ``N,T`` rows are otherwise unused.
    conv -> conv2d: batch=N, in_channels=C, out_channels=K, height=H, width=W, kernel_h=R_filter_h,
    kernel_w=S_filter_w, pad_h/pad_w, stride_h/stride_w, dilation 1, groups 1, no bias; forward=fwd_ms,
    backward=bwd_data_ms+bwd_weight_ms when both are numbers (``N/A*``/empty cells give no backward).
    lstm -> lstm: batch=N, seq_len=timesteps, input_size=hidden_size=hidden, 1 layer, unidirectional, bias;
    forward=fwd_ms, backward=bwd_ms, else bwd_data_ms+bwd_weight_ms.

Rows on GPUs the registry (``pipeline.gpus``) does not know are skipped with a warning, rows with a missing or
non-positive time are dropped with a counted warning, and repeated configs of one (GPU, source, precision,
phase) are merged into their median time, so (config_id, gpu, source, precision, phase) is unique.
"""

from __future__ import annotations

import ast
import logging
import math
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import hydra
import numpy as np
import pandas as pd
from hydra.utils import to_absolute_path
from omegaconf import DictConfig

from pipeline import gpus, schema

log = logging.getLogger(__name__)

SOURCES = ("neusight", "neusight-label", "deepbench")
LABEL_KINDS = ("train", "inf")
META_PREFIX = "_meta_"
"""Columns named ``_meta_<key>`` carry provenance; their distinct values per file go into its metadata."""

NEUSIGHT_CITATION = ("Seonho Lee, Amar Phanishayee, Divya Mahajan. Forecasting GPU Performance for Deep Learning "
                     "Training and Inference. ASPLOS 2025. Artifact data (MIT license).")
DEEPBENCH_CITATION = "Baidu Research. DeepBench: benchmarking deep learning operations on different hardware. " \
                     "https://github.com/baidu-research/DeepBench (Apache-2.0)."
SOURCE_INFO = {
    "neusight": {
        "license": "MIT (neusight/LICENSE in the extdata folder)",
        "citation": NEUSIGHT_CITATION,
        "timing_method": "PyTorch 2.1 op under torch.no_grad(), fp32 with TF32 disabled, cudnn.benchmark=True; "
                         "Latency = mean of the 5 fastest of 25 calls, each timed with CUDA events around a single "
                         "call (includes launch overhead, floor about 0.03 ms). No spread published: "
                         "time_p20_ms = time_p80_ms = time_ms.",
        "reps": 5,
    },
    "neusight-label": {
        "license": "MIT (neusight/LICENSE in the extdata folder)",
        "citation": NEUSIGHT_CITATION,
        "timing_method": "Per-node fw_latency/bw_latency (ms) of a torch.fx node table of BERT-Large / GPT-2-Large "
                         "(one transformer layer plus the layers outside the repeated block), PyTorch fp32. The number "
                         "of runs behind each value is not recorded (reps = 1). No spread published: "
                         "time_p20_ms = time_p80_ms = time_ms.",
        "reps": 1,
    },
    "deepbench": {
        "license": "Apache-2.0 (deepbench/LICENSE in the extdata folder)",
        "citation": DEEPBENCH_CITATION,
        "timing_method": "DeepBench training benchmarks calling cuBLAS/cuDNN directly (CUDA 7.5-10.1, cuDNN 5-7.6); "
                         "one published time per kernel, averaged over repeated launches whose count is not in the "
                         "results (reps = 1). No spread published: time_p20_ms = time_p80_ms = time_ms. "
                         "fp16 = '16 bit inputs' modes (P100: 'pseudo fp16', fp32 math on fp16 storage).",
        "reps": 1,
    },
}
MAPPINGS = {
    ("neusight", "bmm"): "bmm B,M,N,K = torch.bmm(x[B,M,N], y[B,N,K]) -> batch=B, m=M, k=N, n=K",
    ("neusight", "linear"): "linear B,M,N,K = nn.Linear(N, K, bias=True) on [B,M,N] -> batch=B*M, in_features=N, "
                            "out_features=K, bias=True",
    ("neusight", "conv2d"): "conv -> conv2d batch=B, in_channels=Input_Channel, out_channels=Output_Channel, "
                            "kernel_h=kernel_w=Kernel_Szie, height=width=Input_Size, stride_h=stride_w=Stride, "
                            "pad_h=pad_w=Padding, dilation 1, groups 1, bias=False",
    ("neusight-label", "linear"): "call_module nn.Linear / HF Conv1D, addmm(bias, x, w) and F.linear nodes -> "
                                  "batch = product of the input's leading dims, in_features = its last dim, "
                                  "out_features = the output's last dim; bias=True except GPT-2 lm_head",
    ("neusight-label", "bmm"): "matmul/bmm nodes with both inputs >= 3-D -> batch = product of the output's leading "
                               "dims, m = a[-2], k = a[-1], n = b[-1] (operands may be non-contiguous views)",
    ("deepbench", "linear"): "cuBLAS GEMM transA=T, transB=N (M,N,K) = nn.Linear(in=K, out=M) forward on N rows -> "
                             "batch=N, in_features=K, out_features=M, bias=False; backward = GEMM N,N (K,N,M) + "
                             "GEMM N,T (K,M,N) where both were measured",
    ("deepbench", "bmm"): "cuBLAS GEMM transA=N, transB=N (M,N,K) = torch.bmm(a[1,N,K], b[1,K,M]) -> batch=1, m=N, "
                          "k=K, n=M",
    ("deepbench", "conv2d"): "batch=N, in_channels=C, out_channels=K, height=H, width=W, kernel_h=R_filter_h, "
                             "kernel_w=S_filter_w, pad/stride as given, dilation 1, groups 1, bias=False; "
                             "backward = bwd_data_ms + bwd_weight_ms",
    ("deepbench", "lstm"): "batch=N, seq_len=timesteps, input_size=hidden_size=hidden, num_layers=1, "
                           "bidirectional=False, bias=True; backward = bwd_ms or bwd_data_ms + bwd_weight_ms",
}
NEUSIGHT_OPS = {"bmm": "bmm", "linear": "linear", "conv": "conv2d"}
GEMM_FP16_PREFIX = "16 bit inputs"


class IngestError(RuntimeError):
    """Bad configuration or input layout; the message names the config key or the file."""


@dataclass
class Task:
    """One input file and how to read it."""

    source: str
    path: Path
    reader: Callable[["Task"], pd.DataFrame]
    rel: str  # path relative to the extdata folder, for messages and metadata
    kind: str = ""  # label tables: train | inf


@dataclass
class Report:
    """Counts of what was skipped, for the log and the caller."""

    unknown_gpus: Counter = field(default_factory=Counter)  # raw GPU name -> rows skipped
    bad_times: Counter = field(default_factory=Counter)  # (source, gpu, op, phase) -> rows dropped
    duplicates: Counter = field(default_factory=Counter)  # (source, gpu, op) -> rows merged away
    skipped_gpu_folders: list = field(default_factory=list)
    removed_files: list = field(default_factory=list)


# ----------------------------------------------------------------------------------------------- GPU labels

_LABEL_CACHE: dict[str, str | None] = {}


def gpu_label_or_none(name: str) -> str | None:
    """Registry label of a GPU name, or None for a GPU the registry does not know (e.g. AMD)."""
    if name not in _LABEL_CACHE:
        try:
            _LABEL_CACHE[name] = gpus.gpu_label(str(name))
        except (ValueError, KeyError, LookupError):
            _LABEL_CACHE[name] = None
    return _LABEL_CACHE[name]


# ------------------------------------------------------------------------------------------ file discovery

def check_extdata(extdata: str | Path) -> Path:
    path = Path(extdata)
    if not path.is_dir():
        raise IngestError(f"extdata folder not found: {path} (config key `extdata`; "
                          f"run `make import EXTDATA=<dir>` or `python -m pipeline.ingest extdata=<dir>`)")
    return path


def discover(extdata: Path, sources: Sequence[str], label_kinds: Sequence[str] = LABEL_KINDS) -> list[Task]:
    """The files to read for ``sources``, in a fixed order."""
    tasks: list[Task] = []

    def need_dir(path: Path, source: str) -> Path:
        if not path.is_dir():
            raise IngestError(f"source {source!r}: folder {path} not found under extdata (config key `extdata`, "
                              f"or drop {source!r} from `sources`)")
        return path

    for source in sources:
        if source == "neusight":
            root = need_dir(extdata / "neusight" / "train", source)
            for sub in sorted(NEUSIGHT_OPS):
                for path in sorted((root / sub).glob("*.csv")) if (root / sub).is_dir() else []:
                    tasks.append(Task(source, path, read_neusight_train, path.relative_to(extdata).as_posix()))
        elif source == "neusight-label":
            root = need_dir(extdata / "neusight" / "label", source)
            for folder in sorted(p for p in root.iterdir() if p.is_dir()):
                for path in sorted(folder.glob("*.csv")):
                    kind = _label_kind(path.name)
                    if kind in label_kinds:
                        tasks.append(Task(source, path, read_neusight_label, path.relative_to(extdata).as_posix(),
                                          kind=kind))
        elif source == "deepbench":
            root = need_dir(extdata / "deepbench", source)
            for name, reader in (("conv.csv", read_deepbench_conv), ("gemm.csv", read_deepbench_gemm),
                                 ("lstm.csv", read_deepbench_lstm)):
                if (root / name).is_file():
                    tasks.append(Task(source, root / name, reader, (root / name).relative_to(extdata).as_posix()))
        else:
            raise IngestError(f"config key `sources`: unknown source {source!r}; allowed: {', '.join(SOURCES)}")
        if not any(t.source == source for t in tasks):
            raise IngestError(f"source {source!r}: no input files found under {extdata} (config key `extdata`)")
    return tasks


def _label_kind(filename: str) -> str:
    match = re.match(r"^[^-]+-(train|inf)-\d+-\d+\.csv$", filename)
    return match.group(1) if match else ""


# --------------------------------------------------------------------------------------------- NeuSight

def read_neusight_train(task: Task) -> pd.DataFrame:
    """One NeuSight ``train/<op>/<Device>.csv`` -> forward fp32 rows (gpu column holds the raw Device name)."""
    sub = task.path.parent.name
    op = NEUSIGHT_OPS[sub]
    dims = {"bmm": ["B", "M", "N", "K"], "linear": ["B", "M", "N", "K"],
            "conv2d": ["B", "Input_Channel", "Output_Channel", "Kernel_Szie", "Input_Size", "Stride", "Padding"]}[op]
    meta_cols = ["Torch Version", "CUDNN Version", "CUDA Version"]
    wanted = ["Latency", "Device", *meta_cols, *dims]
    raw = pd.read_csv(task.path, usecols=lambda c: c in wanted, dtype={c: str for c in ["Device", *meta_cols]})
    missing = [c for c in wanted if c not in raw.columns]
    if missing:
        raise IngestError(f"{task.rel}: missing columns {missing}")
    d = {c: pd.to_numeric(raw[c], errors="coerce") for c in dims}
    if op == "bmm":
        cfg = {"batch": d["B"], "m": d["M"], "k": d["N"], "n": d["K"]}  # N is the inner (contracted) dim
    elif op == "linear":
        cfg = {"batch": d["B"] * d["M"], "in_features": d["N"], "out_features": d["K"], "bias": True}
    else:
        cfg = {"batch": d["B"], "in_channels": d["Input_Channel"], "out_channels": d["Output_Channel"],
               "kernel_h": d["Kernel_Szie"], "kernel_w": d["Kernel_Szie"], "height": d["Input_Size"],
               "width": d["Input_Size"], "stride_h": d["Stride"], "stride_w": d["Stride"], "pad_h": d["Padding"],
               "pad_w": d["Padding"], "dilation_h": 1, "dilation_w": 1, "groups": 1, "bias": False}
    frame = pd.DataFrame(cfg, index=raw.index)
    frame["op"] = op
    frame["gpu"] = raw["Device"].str.strip()
    frame["precision"] = "fp32"
    frame["phase"] = "forward"
    # Latency is the mean of the 5 fastest of 25 runs; no spread is published, so p20 = p80 = the mean.
    frame["time_ms"] = pd.to_numeric(raw["Latency"], errors="coerce")
    frame[META_PREFIX + "files"] = task.rel
    frame[META_PREFIX + "torch"] = raw["Torch Version"].map(_torch_version)
    frame[META_PREFIX + "cudnn"] = raw["CUDNN Version"].map(_cudnn_version)
    frame[META_PREFIX + "cuda"] = raw["CUDA Version"].map(_cuda_version)
    return frame


def _torch_version(value) -> str:
    text = str(value).strip()
    return text[1:] if re.match(r"^p\d", text) else text  # "p2.1.0" -> "2.1.0"


def _cudnn_version(value) -> str:
    text = str(value).strip()
    if re.fullmatch(r"\d{4,5}", text):  # 8902 -> 8.9.2 (cudnnGetVersion: major*1000 + minor*100 + patch)
        n = int(text)
        return f"{n // 1000}.{n % 1000 // 100}.{n % 100}"
    return text


def _cuda_version(value) -> str:
    text = str(value).strip()
    match = re.fullmatch(r"cu(\d+)(\d)", text)  # "cu121" -> "12.1"
    return f"{match.group(1)}.{match.group(2)}" if match else text


_CLASS_RE = re.compile(r"<class '([^']+)'>")
# HF modules built without a bias: GPT-2's lm_head is nn.Linear(n_embd, vocab_size, bias=False).
_BIAS_FREE_MODULES = ("lm_head",)


def read_neusight_label(task: Task) -> pd.DataFrame:
    """One NeuSight label node table -> linear/bmm rows (forward; backward from train tables)."""
    folder = task.path.parent.name
    raw = pd.read_csv(task.path, dtype=str, keep_default_na=False)
    missing = [c for c in ("op", "target", "meta", "input_shapes", "output_shape", "fw_latency", "bw_latency")
               if c not in raw.columns]
    if missing:
        raise IngestError(f"{task.rel}: missing columns {missing}")
    names = raw["Name"] if "Name" in raw.columns else pd.Series([""] * len(raw), index=raw.index)
    records = []
    for row, fx_name in zip(raw.itertuples(index=False), names):
        cfg = label_node_config(row.op, row.target, row.meta, row.input_shapes, row.output_shape)
        if cfg is None:
            continue
        op, config = cfg
        node = row.target if row.op == "call_module" else (fx_name or row.target.split(" at ")[0])
        phases = [("forward", row.fw_latency)]
        if task.kind == "train":
            phases.append(("backward", row.bw_latency))
        for phase, value in phases:
            records.append({**config, "op": op, "phase": phase, "time_ms": pd.to_numeric(value, errors="coerce"),
                            META_PREFIX + "nodes": f"{Path(task.rel).stem}:{node}"})
    frame = pd.DataFrame.from_records(records) if records else pd.DataFrame(columns=["op", "phase", "time_ms"])
    frame["gpu"] = folder
    frame["precision"] = "fp32"
    frame[META_PREFIX + "files"] = task.rel
    return frame


def label_node_config(op: str, target: str, meta: str, input_shapes: str, output_shape: str):
    """(op, config) of one fx node of a label table, or None for a node that is not a linear/bmm op."""
    op, target = str(op), str(target)
    if op not in ("call_module", "call_function"):
        return None
    try:
        shapes = ast.literal_eval(input_shapes) if input_shapes else []
        out = ast.literal_eval(output_shape) if output_shape else ()
    except (ValueError, SyntaxError):
        return None
    if not isinstance(shapes, (list, tuple)) or not isinstance(out, (list, tuple)):
        return None
    shapes = [list(s) for s in shapes if isinstance(s, (list, tuple))]
    out = list(out)

    def ok(*dims) -> bool:
        return all(isinstance(v, int) and v >= 1 for v in dims)

    if op == "call_module":
        classes = _CLASS_RE.findall(str(meta))
        module = classes[-1] if classes else ""
        if not (module.endswith(".Linear") or module.endswith(".Conv1D")) or not shapes or len(out) < 1:
            return None
        x = shapes[0]
        if len(x) < 1:
            return None
        batch, in_f, out_f = math.prod(x[:-1]), x[-1], out[-1]
        bias = not target.split(".")[-1] in _BIAS_FREE_MODULES
        return ("linear", {"batch": batch, "in_features": in_f, "out_features": out_f, "bias": bias}) \
            if ok(batch, in_f, out_f) else None
    fn = target.split(" at ")[0]
    if re.search(r"\baddmm\b", fn):
        # torch.addmm(bias[out], x[rows, in], w[in, out]): GPT-2's Conv1D traced through (y = x @ w + b).
        if len(shapes) == 3 and len(shapes[0]) == 1 and len(shapes[1]) == 2 and len(shapes[2]) == 2 \
                and shapes[1][1] == shapes[2][0] and shapes[0][0] == shapes[2][1]:
            rows, in_f, out_f = shapes[1][0], shapes[1][1], shapes[2][1]
            if ok(rows, in_f, out_f):
                return "linear", {"batch": rows, "in_features": in_f, "out_features": out_f, "bias": True}
        return None
    if re.search(r"function linear\b", fn):
        # F.linear(x[..., in], w[out, in], bias?)
        if len(shapes) >= 2 and len(shapes[1]) == 2 and shapes[0] and shapes[0][-1] == shapes[1][1]:
            batch, in_f, out_f = math.prod(shapes[0][:-1]), shapes[0][-1], shapes[1][0]
            if ok(batch, in_f, out_f):
                return "linear", {"batch": batch, "in_features": in_f, "out_features": out_f,
                                  "bias": len(shapes) >= 3}
        return None
    if re.search(r"\b(matmul|bmm)\b", fn):
        if len(shapes) != 2 or len(shapes[0]) < 3 or len(shapes[1]) < 3 or len(out) < 3:
            return None
        a, b = shapes
        if a[-1] != b[-2]:
            return None
        batch, m, k, n = math.prod(out[:-2]), a[-2], a[-1], b[-1]
        return ("bmm", {"batch": batch, "m": m, "k": k, "n": n}) if ok(batch, m, k, n) else None
    return None


# -------------------------------------------------------------------------------------------- DeepBench

def _deepbench_raw(task: Task, dims: Sequence[str]) -> pd.DataFrame:
    raw = pd.read_csv(task.path, dtype=str, keep_default_na=False)
    missing = [c for c in ("file", "device", "sheet", "precision", *dims) if c not in raw.columns]
    if missing:
        raise IngestError(f"{task.rel}: missing columns {missing}")
    raw["device"] = raw["device"].str.strip()
    raw["_precision"] = raw["precision"].map(_deepbench_precision)
    unknown = raw["_precision"].isna()
    if unknown.any():
        log.warning("%s: skipping %d rows with unknown precision modes %s", task.rel, int(unknown.sum()),
                    sorted(raw.loc[unknown, "precision"].unique()))
        raw = raw[~unknown].copy()
    return raw


def _deepbench_precision(text: str) -> str | None:
    text = str(text).strip()
    if text.lower() == "float":
        return "fp32"
    if text.lower().startswith(GEMM_FP16_PREFIX):
        return "fp16"
    return None


def _num(series: pd.Series) -> pd.Series:
    """Numbers from text cells; empty, ``N/A*`` and other non-numbers become NaN."""
    return pd.to_numeric(series, errors="coerce")


def _deepbench_frame(raw: pd.DataFrame, task: Task, op: str, cfg: dict, forward: pd.Series,
                     backward: pd.Series | None) -> pd.DataFrame:
    base = pd.DataFrame(cfg, index=raw.index)
    base["op"] = op
    base["gpu"] = raw["device"]
    base["precision"] = raw["_precision"]
    base[META_PREFIX + "files"] = task.rel
    base[META_PREFIX + "workbooks"] = raw["file"]
    base[META_PREFIX + "sheets"] = raw["sheet"]
    base[META_PREFIX + "precision_modes"] = raw["precision"]
    parts = [base.assign(phase="forward", time_ms=forward)]
    if backward is not None:
        parts.append(base.assign(phase="backward", time_ms=backward))
    return pd.concat(parts, ignore_index=True)


def read_deepbench_conv(task: Task) -> pd.DataFrame:
    dims = ["W", "H", "C", "N", "K", "S_filter_w", "R_filter_h", "pad_w", "pad_h", "stride_w", "stride_h",
            "fwd_ms", "bwd_data_ms", "bwd_weight_ms"]
    raw = _deepbench_raw(task, dims)
    cfg = {"batch": _num(raw["N"]), "in_channels": _num(raw["C"]), "out_channels": _num(raw["K"]),
           "height": _num(raw["H"]), "width": _num(raw["W"]), "kernel_h": _num(raw["R_filter_h"]),
           "kernel_w": _num(raw["S_filter_w"]), "stride_h": _num(raw["stride_h"]),
           "stride_w": _num(raw["stride_w"]), "pad_h": _num(raw["pad_h"]), "pad_w": _num(raw["pad_w"]),
           "dilation_h": 1, "dilation_w": 1, "groups": 1, "bias": False}
    # backward = data gradient + weight gradient; NaN (dropped, counted) where either cell is empty or N/A*.
    backward = _num(raw["bwd_data_ms"]) + _num(raw["bwd_weight_ms"])
    return _deepbench_frame(raw, task, "conv2d", cfg, _num(raw["fwd_ms"]), backward)


def read_deepbench_lstm(task: Task) -> pd.DataFrame:
    dims = ["hidden", "N", "timesteps", "fwd_ms", "bwd_ms", "bwd_data_ms", "bwd_weight_ms"]
    raw = _deepbench_raw(task, dims)
    hidden = _num(raw["hidden"])
    cfg = {"batch": _num(raw["N"]), "seq_len": _num(raw["timesteps"]), "input_size": hidden,
           "hidden_size": hidden, "num_layers": 1, "bidirectional": False, "bias": True}
    backward = _num(raw["bwd_ms"]).fillna(_num(raw["bwd_data_ms"]) + _num(raw["bwd_weight_ms"]))
    return _deepbench_frame(raw, task, "lstm", cfg, _num(raw["fwd_ms"]), backward)


def read_deepbench_gemm(task: Task) -> pd.DataFrame:
    dims = ["M", "N", "K", "transA", "transB", "time_ms"]
    raw = _deepbench_raw(task, dims)
    return gemm_rows(raw, task)


def gemm_rows(raw: pd.DataFrame, task: Task) -> pd.DataFrame:
    """DeepBench GEMM rows -> linear forward (T,N), bmm forward (N,N) and linear backward (N,N + N,T) rows.

    See the module docstring for why: these are the cuBLAS calls PyTorch makes for nn.Linear (forward
    T,N (M,N,K); input gradient N,N (K,N,M); weight gradient N,T (K,M,N)) and for a contiguous torch.bmm (N,N).
    """
    g = raw.copy()
    for c in ("M", "N", "K"):
        g[c] = _num(g[c])
    g["time"] = _num(g["time_ms"])
    g["trans"] = g["transA"].str.strip().str.upper() + g["transB"].str.strip().str.upper()
    g = g.dropna(subset=["M", "N", "K"])
    # Lookup of measured GEMMs per (GPU, sheet, layout, M, N, K): median over repeats.
    keys = ["device", "sheet", "trans", "M", "N", "K"]
    times = g.groupby(keys)["time"].median()
    frames = []

    tn = g[g["trans"] == "TN"]
    if len(tn):
        cfg = {"batch": tn["N"], "in_features": tn["K"], "out_features": tn["M"], "bias": False}
        dgrad = times.reindex(pd.MultiIndex.from_arrays(
            [tn["device"], tn["sheet"], ["NN"] * len(tn), tn["K"], tn["N"], tn["M"]], names=keys)).to_numpy()
        wgrad = times.reindex(pd.MultiIndex.from_arrays(
            [tn["device"], tn["sheet"], ["NT"] * len(tn), tn["K"], tn["M"], tn["N"]], names=keys)).to_numpy()
        backward = pd.Series(dgrad + wgrad, index=tn.index)
        has_backward = backward.notna()
        fwd = _deepbench_frame(tn, task, "linear", cfg, tn["time"], None)
        bwd = _deepbench_frame(tn[has_backward], task, "linear",
                               {k: v[has_backward] if isinstance(v, pd.Series) else v for k, v in cfg.items()},
                               backward[has_backward], None).assign(phase="backward")
        frames += [fwd, bwd]
        log.info("deepbench gemm: %d T,N GEMMs -> linear forward; %d have both backward GEMMs measured "
                 "(N,N input gradient found for %d, N,T weight gradient for %d)", len(tn), int(has_backward.sum()),
                 int(np.isfinite(dgrad).sum()), int(np.isfinite(wgrad).sum()))
    nn_ = g[g["trans"] == "NN"]
    if len(nn_):
        cfg = {"batch": 1, "m": nn_["N"], "k": nn_["K"], "n": nn_["M"]}
        frames.append(_deepbench_frame(nn_, task, "bmm", cfg, nn_["time"], None))
    other = g[~g["trans"].isin(["TN", "NN"])]
    if len(other):
        log.info("deepbench gemm: %d GEMMs with layouts %s are no PyTorch forward op (used only as backward parts)",
                 len(other), sorted(other["trans"].unique()))
    if not frames:
        return pd.DataFrame(columns=["op", "gpu", "precision", "phase", "time_ms"])
    return pd.concat(frames, ignore_index=True)


# ------------------------------------------------------------------------------------------- assembling

def finalize(frame: pd.DataFrame, source: str, report: Report) -> pd.DataFrame:
    """Raw reader rows (raw GPU names) -> schema rows: labels, valid times, config ids, duplicates merged."""
    if frame.empty:
        return frame
    frame = frame.copy()
    names = frame["gpu"].astype(str)
    labels = names.map({n: gpu_label_or_none(n) for n in names.unique()})
    unknown = labels.isna()
    if unknown.any():
        for name, count in names[unknown].value_counts().sort_index().items():
            if name not in report.unknown_gpus:
                log.warning("%s: GPU %r is not in the GPU registry (conf/gpus.yaml): skipping its rows", source, name)
            report.unknown_gpus[name] += int(count)
    frame = frame[~unknown].copy()
    frame["gpu"] = labels[~unknown].astype(str)
    frame["source"] = source
    frame["status"] = "ok"
    frame["reps"] = SOURCE_INFO[source]["reps"]
    frame["error"] = None
    time = pd.to_numeric(frame["time_ms"], errors="coerce").astype(float)
    bad = ~(np.isfinite(time.to_numpy()) & (time.to_numpy() > 0))
    if bad.any():
        for key, count in frame[bad].groupby(["gpu", "op", "phase"]).size().items():
            report.bad_times[(source, *key)] += int(count)
    frame = frame[~bad].copy()
    frame["time_ms"] = time[~bad]

    parts = []
    for op, part in frame.groupby("op", sort=True):
        cols = list(schema.OP_CONFIG_COLUMNS[op])
        part = part.copy()
        bad_cfg = part[cols].isna().any(axis=1)
        if bad_cfg.any():
            log.warning("%s %s: dropping %d rows with missing config values", source, op, int(bad_cfg.sum()))
            part = part[~bad_cfg].copy()
        for c in cols:
            if c not in schema.BOOL_COLUMNS:
                values = part[c].astype(float)
                if not np.all(values == np.round(values)):
                    raise IngestError(f"{source} {op}: non-integer values in config column {c!r}")
                part[c] = values.astype(np.int64)
            else:
                part[c] = part[c].astype(bool)
        part["config_id"] = schema.config_ids(op, part) if len(part) else pd.Series(dtype=object)
        parts.append(part)
    if not parts:
        return frame.iloc[0:0]
    frame = pd.concat(parts, ignore_index=True)
    return merge_duplicates(frame, source, report)


def merge_duplicates(frame: pd.DataFrame, source: str, report: Report) -> pd.DataFrame:
    """One row per (config_id, gpu, source, precision, phase): the median time of repeats (counted, logged)."""
    keys = ["config_id", "gpu", "source", "precision", "phase"]
    frame = frame.sort_values(keys + ["time_ms"], kind="stable").reset_index(drop=True)
    dup = frame.duplicated(keys, keep="first")
    if dup.any():
        for (gpu, op), count in frame[dup].groupby(["gpu", "op"]).size().items():
            report.duplicates[(source, gpu, op)] += int(count)
            log.info("%s %s %s: merged %d repeated config rows into their median time", source, gpu, op, count)
        repeated = frame.duplicated(keys, keep=False).to_numpy()
        groups = frame[repeated].groupby(keys, sort=False)
        frame.loc[repeated, "time_ms"] = groups["time_ms"].transform("median")
        meta_cols = [c for c in frame.columns if c.startswith(META_PREFIX)]
        if meta_cols:  # keep the provenance of every merged row
            frame.loc[repeated, meta_cols] = groups[meta_cols].transform(lambda s: "\n".join(sorted(set(s))))
        frame = frame[~dup].reset_index(drop=True)
    frame["time_p20_ms"] = frame["time_ms"]  # no spread published by any source
    frame["time_p80_ms"] = frame["time_ms"]
    return frame


def file_metadata(source: str, op: str, part: pd.DataFrame) -> dict:
    """Metadata stored with one (gpu, op, source) file."""
    info = SOURCE_INFO[source]
    meta = {"source": source, "license": info["license"], "citation": info["citation"],
            "timing_method": info["timing_method"], "mapping": MAPPINGS.get((source, op), ""),
            "importer": "pipeline.ingest", "rows": int(len(part))}
    for col in sorted(c for c in part.columns if c.startswith(META_PREFIX)):
        values = sorted({v for cell in part[col].dropna().astype(str) for v in cell.split("\n") if v})
        key = col[len(META_PREFIX):]
        if key in ("torch", "cudnn", "cuda"):
            meta.setdefault("library_versions", {})[key] = values
        elif key == "nodes":
            meta["label_nodes"] = values
        else:
            meta["original_files" if key == "files" else key] = values
    if "library_versions" not in meta:
        meta["library_versions"] = ("not in the CSV; DeepBench results used CUDA 7.5-10.1 and cuDNN 5-7.6"
                                    if source == "deepbench" else
                                    "not in the CSV; the NeuSight artifact used PyTorch 2.1.0, CUDA 12.1, cuDNN 8.9.2")
    return meta


def write_source(frame: pd.DataFrame, out: Path, source: str, report: Report) -> list[Path]:
    """Write one source's rows (one file per GPU and op) and remove its files that this run did not produce."""
    written: list[Path] = []
    if not frame.empty:
        for (gpu, op), part in frame.groupby(["gpu", "op"], sort=True):
            part = part.sort_values(["precision", "phase", "config_id"], kind="stable").reset_index(drop=True)
            metadata = file_metadata(source, op, part)
            rows = schema.conform(part)
            written += schema.write_partition(rows, out, name=source, metadata=metadata)
    keep = {p.resolve() for p in written}
    for path in sorted(out.glob(f"gpu=*/op=*/{source}.parquet")):
        if path.resolve() not in keep:
            path.unlink()
            report.removed_files.append(path.relative_to(out).as_posix())
            log.info("%s: removed stale %s", source, path.relative_to(out).as_posix())
    for tmp in sorted(out.glob(f"gpu=*/op=*/.{source}.parquet.*.tmp")):  # left by an interrupted run
        tmp.unlink()
    for directory in sorted(out.glob("gpu=*/op=*")) + sorted(out.glob("gpu=*")):
        if directory.is_dir() and not any(directory.iterdir()):
            directory.rmdir()
    return written


def run(extdata: str | Path, out: str | Path, sources: Iterable[str] = SOURCES,
        label_kinds: Iterable[str] = LABEL_KINDS, progress: bool = False,
        report: Report | None = None) -> pd.DataFrame:
    """Import ``sources`` from ``extdata`` into ``out``; returns the rows written (schema columns)."""
    sources = list(dict.fromkeys(sources))
    unknown = [s for s in sources if s not in SOURCES]
    if unknown:
        raise IngestError(f"config key `sources`: unknown {unknown}; allowed: {', '.join(SOURCES)}")
    if not sources:
        raise IngestError("config key `sources` is empty: nothing to import")
    label_kinds = list(label_kinds)
    bad_kinds = [k for k in label_kinds if k not in LABEL_KINDS]
    if bad_kinds:
        raise IngestError(f"config key `label_kinds`: unknown {bad_kinds}; allowed: {', '.join(LABEL_KINDS)}")
    extdata = check_extdata(extdata)
    out = Path(out)
    report = report if report is not None else Report()
    tasks = discover(extdata, sources, label_kinds)

    raw: dict[str, list[pd.DataFrame]] = {s: [] for s in sources}
    iterator = tasks
    if progress:
        from tqdm import tqdm
        iterator = tqdm(tasks, desc="import", unit="file", file=sys.stderr)
    for task in iterator:
        if task.source == "neusight-label":
            folder = task.path.parent.name
            if gpu_label_or_none(folder) is None:
                if folder not in report.skipped_gpu_folders:
                    report.skipped_gpu_folders.append(folder)
                    log.warning("neusight-label: GPU folder %r is not in the GPU registry (conf/gpus.yaml): "
                                "skipping it", folder)
                continue
        try:
            frame = task.reader(task)
        except IngestError:
            raise
        except Exception as exc:  # name the file
            raise IngestError(f"{task.rel}: cannot read ({type(exc).__name__}: {exc})") from exc
        raw[task.source].append(frame)

    out.mkdir(parents=True, exist_ok=True)
    results = []
    for source in sources:
        frames = [f for f in raw[source] if not f.empty]
        frame = finalize(pd.concat(frames, ignore_index=True), source, report) if frames else pd.DataFrame()
        write_source(frame, out, source, report)
        if not frame.empty:
            results.append(schema.conform(frame))
    for (source, gpu, op, phase), count in sorted(report.bad_times.items()):
        log.warning("%s %s %s %s: dropped %d rows with a missing or non-positive time", source, gpu, op, phase,
                    count)
    if report.unknown_gpus:
        log.warning("skipped %d rows on GPUs not in the registry: %s", sum(report.unknown_gpus.values()),
                    dict(sorted(report.unknown_gpus.items())))
    if not results:
        return schema.conform(pd.DataFrame(columns=list(schema.COLUMNS)))
    return pd.concat(results, ignore_index=True)


def summary_table(frame: pd.DataFrame) -> str:
    """Rows per source x GPU (one column per op) with totals."""
    if frame.empty:
        return "no rows"
    table = frame.groupby(["source", "gpu", "op"]).size().unstack("op", fill_value=0)
    table["total"] = table.sum(axis=1)
    table.loc[("all", ""), :] = table.sum(axis=0)
    table = table.astype(int)
    n_gpus = frame["gpu"].nunique()
    return f"{table.to_string()}\n{len(frame)} rows on {n_gpus} GPU labels"


# ------------------------------------------------------------------------------------------------ Hydra

@hydra.main(config_path="../conf", config_name="ingest", version_base=None)
def main(cfg: DictConfig) -> None:
    extdata = Path(to_absolute_path(str(cfg.extdata)))
    out = Path(to_absolute_path(str(cfg.out)))
    try:
        frame = run(extdata, out, sources=list(cfg.sources), label_kinds=list(cfg.get("label_kinds", LABEL_KINDS)),
                    progress=bool(cfg.get("progress", True)))
    except IngestError as exc:
        # A short message naming the config key; paths as given on the command line (relative stays relative).
        print(f"error: {str(exc).replace(str(extdata), str(cfg.extdata))}", file=sys.stderr)
        raise SystemExit(2) from None
    print(summary_table(frame))
    if cfg.get("verify", True):
        checked = schema.read_dataset(out)
        print(f"verified: {len(checked)} rows under {cfg.out} read back through pipeline.schema.read_dataset")


if __name__ == "__main__":
    main()
