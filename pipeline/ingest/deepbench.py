"""Baidu DeepBench training results: ``deepbench/{gemm,conv,lstm}.csv`` (source ``deepbench``).

Vendor libraries called directly (cuBLAS/cuDNN, CUDA 7.5-10.1, cuDNN 5-7.6). ``Float`` -> fp32; every
"16 bit inputs, ..." mode -> fp16, P100's "pseudo fp16" included. ``reps = 1``: one published number per
kernel, the repetition count is not in the results.

gemm ``M,N,K,transA,transB`` (cuBLAS, column-major C[MxN] = op(A)[MxK] op(B)[KxN]; N is the minibatch/time
dimension, M and K are layer sizes), read with PyTorch's call conventions, since the project's ops are
PyTorch ops: ``nn.Linear(in=K, out=M)`` on N rows launches exactly the ``T,N`` GEMM (M, N, K); its backward
launches ``N,N`` (K, N, M) for the input gradient and ``N,T`` (K, M, N) for the weight gradient;
``torch.bmm(a[1,m,k], b[1,k,n])`` of contiguous tensors launches ``N,N`` (n, m, k). So ``T,N`` rows -> linear
forward (batch=N, in_features=K, out_features=M, bias=False); ``N,N`` rows -> bmm forward (batch=1, m=N, k=K,
n=M); a linear backward row (= data + weight gradient GEMM) only where both of those GEMMs were measured on the
same GPU and precision (none are in the current results: DeepBench never benchmarks the weight-gradient
shape); ``N,T`` rows are otherwise unused.

conv -> conv2d: batch=N, in_channels=C, out_channels=K, height=H, width=W, kernel_h=R_filter_h,
kernel_w=S_filter_w, pad_h/pad_w, stride_h/stride_w, dilation 1, groups 1, no bias; forward=fwd_ms,
backward=bwd_data_ms+bwd_weight_ms when both are numbers (``N/A*``/empty cells give no backward).
lstm -> lstm: batch=N, seq_len=timesteps, input_size=hidden_size=hidden, 1 layer, unidirectional, bias;
forward=fwd_ms, backward=bwd_ms, else bwd_data_ms+bwd_weight_ms.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.ingest.common import (
    META_PREFIX,
    Options,
    Report,
    Source,
    Task,
    empty_rows,
    need_dir,
    numeric,
    require_columns,
)

log = logging.getLogger(__name__)

FP16_PREFIX = "16 bit inputs"
_GEMM_KEYS = ["device", "sheet", "trans", "M", "N", "K"]


def _raw(task: Task, dims: Sequence[str]) -> pd.DataFrame:
    """The CSV as text, with a ``_precision`` column; rows of unknown precision modes skipped (logged)."""
    raw = pd.read_csv(task.path, dtype=str, keep_default_na=False)
    require_columns(raw, ("file", "device", "sheet", "precision", *dims), task.rel)
    raw["device"] = raw["device"].str.strip()
    raw["_precision"] = raw["precision"].map(precision_of)
    unknown = raw["_precision"].isna()
    if unknown.any():
        log.warning("%s: skipping %d rows with unknown precision modes %s", task.rel, int(unknown.sum()),
                    sorted(raw.loc[unknown, "precision"].unique()))
        raw = raw[~unknown].copy()
    return raw


def precision_of(text: str) -> str | None:
    """``Float`` -> fp32, ``16 bit inputs, ...`` -> fp16, anything else None."""
    text = str(text).strip()
    if text.lower() == "float":
        return "fp32"
    if text.lower().startswith(FP16_PREFIX):
        return "fp16"
    return None


def _rows(raw: pd.DataFrame, task: Task, op: str, cfg: dict, forward: pd.Series,
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


def read_conv(task: Task) -> pd.DataFrame:
    dims = ["W", "H", "C", "N", "K", "S_filter_w", "R_filter_h", "pad_w", "pad_h", "stride_w", "stride_h",
            "fwd_ms", "bwd_data_ms", "bwd_weight_ms"]
    raw = _raw(task, dims)
    cfg = {"batch": numeric(raw["N"]), "in_channels": numeric(raw["C"]), "out_channels": numeric(raw["K"]),
           "height": numeric(raw["H"]), "width": numeric(raw["W"]), "kernel_h": numeric(raw["R_filter_h"]),
           "kernel_w": numeric(raw["S_filter_w"]), "stride_h": numeric(raw["stride_h"]),
           "stride_w": numeric(raw["stride_w"]), "pad_h": numeric(raw["pad_h"]), "pad_w": numeric(raw["pad_w"]),
           "dilation_h": 1, "dilation_w": 1, "groups": 1, "bias": False}
    # backward = data gradient + weight gradient; NaN (dropped, counted) where either cell is empty or N/A*.
    backward = numeric(raw["bwd_data_ms"]) + numeric(raw["bwd_weight_ms"])
    return _rows(raw, task, "conv2d", cfg, numeric(raw["fwd_ms"]), backward)


def read_lstm(task: Task) -> pd.DataFrame:
    dims = ["hidden", "N", "timesteps", "fwd_ms", "bwd_ms", "bwd_data_ms", "bwd_weight_ms"]
    raw = _raw(task, dims)
    hidden = numeric(raw["hidden"])
    cfg = {"batch": numeric(raw["N"]), "seq_len": numeric(raw["timesteps"]), "input_size": hidden,
           "hidden_size": hidden, "num_layers": 1, "bidirectional": False, "bias": True}
    backward = numeric(raw["bwd_ms"]).fillna(numeric(raw["bwd_data_ms"]) + numeric(raw["bwd_weight_ms"]))
    return _rows(raw, task, "lstm", cfg, numeric(raw["fwd_ms"]), backward)


def read_gemm(task: Task) -> pd.DataFrame:
    return gemm_rows(_raw(task, ["M", "N", "K", "transA", "transB", "time_ms"]), task)


def gemm_rows(raw: pd.DataFrame, task: Task) -> pd.DataFrame:
    """DeepBench GEMM rows -> linear forward (T,N), bmm forward (N,N) and linear backward (N,N + N,T) rows.

    See the module docstring for why: these are the cuBLAS calls PyTorch makes for nn.Linear (forward
    T,N (M,N,K); input gradient N,N (K,N,M); weight gradient N,T (K,M,N)) and for a contiguous torch.bmm (N,N).
    """
    g = raw.copy()
    for c in ("M", "N", "K"):
        g[c] = numeric(g[c])
    g["time"] = numeric(g["time_ms"])
    g["trans"] = g["transA"].str.strip().str.upper() + g["transB"].str.strip().str.upper()
    g = g.dropna(subset=["M", "N", "K"])
    frames = []
    tn = g[g["trans"] == "TN"]
    if len(tn):
        frames += _linear_rows(tn, g.groupby(_GEMM_KEYS)["time"].median(), task)
    nn_ = g[g["trans"] == "NN"]
    if len(nn_):
        cfg = {"batch": 1, "m": nn_["N"], "k": nn_["K"], "n": nn_["M"]}
        frames.append(_rows(nn_, task, "bmm", cfg, nn_["time"], None))
    other = g[~g["trans"].isin(["TN", "NN"])]
    if len(other):
        log.info("deepbench gemm: %d GEMMs with layouts %s are no PyTorch forward op (used only as backward parts)",
                 len(other), sorted(other["trans"].unique()))
    return pd.concat(frames, ignore_index=True) if frames else empty_rows()


def _linear_rows(tn: pd.DataFrame, times: pd.Series, task: Task) -> list[pd.DataFrame]:
    """Linear forward rows of the ``T,N`` GEMMs, and backward rows where both gradient GEMMs are in ``times``
    (median time per (GPU, sheet, layout, M, N, K))."""
    cfg = {"batch": tn["N"], "in_features": tn["K"], "out_features": tn["M"], "bias": False}
    dgrad = times.reindex(pd.MultiIndex.from_arrays(
        [tn["device"], tn["sheet"], ["NN"] * len(tn), tn["K"], tn["N"], tn["M"]], names=_GEMM_KEYS)).to_numpy()
    wgrad = times.reindex(pd.MultiIndex.from_arrays(
        [tn["device"], tn["sheet"], ["NT"] * len(tn), tn["K"], tn["M"], tn["N"]], names=_GEMM_KEYS)).to_numpy()
    backward = pd.Series(dgrad + wgrad, index=tn.index)
    has = backward.notna()
    log.info("deepbench gemm: %d T,N GEMMs -> linear forward; %d have both backward GEMMs measured "
             "(N,N input gradient found for %d, N,T weight gradient for %d)", len(tn), int(has.sum()),
             int(np.isfinite(dgrad).sum()), int(np.isfinite(wgrad).sum()))
    fwd = _rows(tn, task, "linear", cfg, tn["time"], None)
    bwd_cfg = {k: v[has] if isinstance(v, pd.Series) else v for k, v in cfg.items()}
    bwd = _rows(tn[has], task, "linear", bwd_cfg, backward[has], None).assign(phase="backward")
    return [fwd, bwd]


_READERS = (("conv.csv", read_conv), ("gemm.csv", read_gemm), ("lstm.csv", read_lstm))


def tasks(extdata: Path, options: Options, report: Report) -> list[Task]:
    root = need_dir(extdata / "deepbench", SOURCE.name)
    return [Task(SOURCE.name, root / name, reader, (root / name).relative_to(extdata).as_posix())
            for name, reader in _READERS if (root / name).is_file()]


SOURCE = Source(
    name="deepbench",
    license="Apache-2.0 (deepbench/LICENSE in the extdata folder)",
    citation="Baidu Research. DeepBench: benchmarking deep learning operations on different hardware. "
             "https://github.com/baidu-research/DeepBench (Apache-2.0).",
    timing_method="Host-timed: DeepBench training benchmarks calling cuBLAS/cuDNN directly (CUDA 7.5-10.1, cuDNN "
                  "5-7.6); one published time per kernel, averaged over repeated launches whose count is not in "
                  "the results (reps = 1). No spread published: time_p20_ms = time_p80_ms = time_ms. "
                  "fp16 = '16 bit inputs' modes (P100: 'pseudo fp16', fp32 math on fp16 storage).",
    reps=1,
    mappings={
        "linear": "cuBLAS GEMM transA=T, transB=N (M,N,K) = nn.Linear(in=K, out=M) forward on N rows -> batch=N, "
                  "in_features=K, out_features=M, bias=False; backward = GEMM N,N (K,N,M) + GEMM N,T (K,M,N) "
                  "where both were measured",
        "bmm": "cuBLAS GEMM transA=N, transB=N (M,N,K) = torch.bmm(a[1,N,K], b[1,K,M]) -> batch=1, m=N, k=K, n=M",
        "conv2d": "batch=N, in_channels=C, out_channels=K, height=H, width=W, kernel_h=R_filter_h, "
                  "kernel_w=S_filter_w, pad/stride as given, dilation 1, groups 1, bias=False; "
                  "backward = bwd_data_ms + bwd_weight_ms",
        "lstm": "batch=N, seq_len=timesteps, input_size=hidden_size=hidden, num_layers=1, bidirectional=False, "
                "bias=True; backward = bwd_ms or bwd_data_ms + bwd_weight_ms",
    },
    library_versions="not in the CSV; DeepBench results used CUDA 7.5-10.1 and cuDNN 5-7.6",
    gpu_time=False,
    tasks=tasks,
)
