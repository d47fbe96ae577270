"""NeuSight's single-op tables: ``neusight/train/{bmm,linear,conv}/<Device>.csv`` (source ``neusight``).

S. Lee, A. Phanishayee, D. Mahajan, ASPLOS'25 artifact. PyTorch 2.1 ops under ``torch.no_grad()``, fp32 with
TF32 off, ``cudnn.benchmark=True``: forward only. ``Latency`` is the mean of the 5 fastest of 25 calls, each
timed with CUDA events around a single call (so ``reps = 5``, and tiny ops show the launch floor). The GPU
comes from the ``Device`` column (the conv "A100" file is an A100 80GB PCIe).

- bmm ``B,M,N,K`` = ``torch.bmm(x[B,M,N], y[B,N,K])`` -> batch=B, m=M, k=N (the inner dim), n=K.
- linear ``B,M,N,K`` = ``nn.Linear(N, K)`` on ``[B,M,N]`` -> batch=B*M, in_features=N, out_features=K, bias.
- conv -> conv2d batch=B, in/out_channels, kernel_h=kernel_w=Kernel_Szie, height=width=Input_Size, stride,
  padding, dilation 1, groups 1, no bias.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from pipeline.ingest.common import (
    META_LIBRARY_PREFIX,
    META_PREFIX,
    Options,
    Report,
    Source,
    Task,
    need_dir,
    require_columns,
)

NEUSIGHT_CITATION = ("Seonho Lee, Amar Phanishayee, Divya Mahajan. Forecasting GPU Performance for Deep Learning "
                     "Training and Inference. ASPLOS 2025. Artifact data (MIT license).")
NEUSIGHT_LICENSE = "MIT (neusight/LICENSE in the extdata folder)"
NEUSIGHT_LIBRARIES = "not in the CSV; the NeuSight artifact used PyTorch 2.1.0, CUDA 12.1, cuDNN 8.9.2"
OPS = {"bmm": "bmm", "linear": "linear", "conv": "conv2d"}  # folder -> op
DIMS = {"bmm": ["B", "M", "N", "K"], "linear": ["B", "M", "N", "K"],
        "conv2d": ["B", "Input_Channel", "Output_Channel", "Kernel_Szie", "Input_Size", "Stride", "Padding"]}
_VERSION_COLUMNS = {"torch": "Torch Version", "cudnn": "CUDNN Version", "cuda": "CUDA Version"}


def read_train_table(task: Task) -> pd.DataFrame:
    """One ``train/<op>/<Device>.csv`` -> forward fp32 rows (``gpu`` holds the raw Device name)."""
    op = OPS[task.path.parent.name]
    dims = DIMS[op]
    wanted = ["Latency", "Device", *_VERSION_COLUMNS.values(), *dims]
    raw = pd.read_csv(task.path, usecols=lambda c: c in wanted,
                      dtype=dict.fromkeys(["Device", *_VERSION_COLUMNS.values()], str))
    require_columns(raw, wanted, task.rel)
    frame = pd.DataFrame(_config(op, {c: pd.to_numeric(raw[c], errors="coerce") for c in dims}), index=raw.index)
    frame["op"] = op
    frame["gpu"] = raw["Device"].str.strip()
    frame["precision"] = "fp32"
    frame["phase"] = "forward"
    frame["time_ms"] = pd.to_numeric(raw["Latency"], errors="coerce")
    frame[META_PREFIX + "files"] = task.rel
    for name, parse in (("torch", torch_version), ("cudnn", cudnn_version), ("cuda", cuda_version)):
        frame[META_LIBRARY_PREFIX + name] = raw[_VERSION_COLUMNS[name]].map(parse)
    return frame


def _config(op: str, d: dict) -> dict:
    if op == "bmm":
        return {"batch": d["B"], "m": d["M"], "k": d["N"], "n": d["K"]}  # N is the inner (contracted) dim
    if op == "linear":
        return {"batch": d["B"] * d["M"], "in_features": d["N"], "out_features": d["K"], "bias": True}
    return {"batch": d["B"], "in_channels": d["Input_Channel"], "out_channels": d["Output_Channel"],
            "kernel_h": d["Kernel_Szie"], "kernel_w": d["Kernel_Szie"], "height": d["Input_Size"],
            "width": d["Input_Size"], "stride_h": d["Stride"], "stride_w": d["Stride"], "pad_h": d["Padding"],
            "pad_w": d["Padding"], "dilation_h": 1, "dilation_w": 1, "groups": 1, "bias": False}


def torch_version(value) -> str:
    """``"p2.1.0"`` (as NeuSight writes it) -> ``"2.1.0"``."""
    text = str(value).strip()
    return text[1:] if re.match(r"^p\d", text) else text


def cudnn_version(value) -> str:
    """``8902`` (cudnnGetVersion: major*1000 + minor*100 + patch) -> ``"8.9.2"``."""
    text = str(value).strip()
    if re.fullmatch(r"\d{4,5}", text):
        n = int(text)
        return f"{n // 1000}.{n % 1000 // 100}.{n % 100}"
    return text


def cuda_version(value) -> str:
    """``"cu121"`` -> ``"12.1"``."""
    text = str(value).strip()
    match = re.fullmatch(r"cu(\d+)(\d)", text)
    return f"{match.group(1)}.{match.group(2)}" if match else text


def tasks(extdata: Path, options: Options, report: Report) -> list[Task]:
    root = need_dir(extdata / "neusight" / "train", SOURCE.name)
    found = []
    for sub in sorted(OPS):
        for path in sorted((root / sub).glob("*.csv")) if (root / sub).is_dir() else []:
            found.append(Task(SOURCE.name, path, read_train_table, path.relative_to(extdata).as_posix()))
    return found


SOURCE = Source(
    name="neusight",
    license=NEUSIGHT_LICENSE,
    citation=NEUSIGHT_CITATION,
    timing_method="Host-timed: PyTorch 2.1 op under torch.no_grad(), fp32 with TF32 disabled, "
                  "cudnn.benchmark=True; Latency = mean of the 5 fastest of 25 calls, each timed with CUDA "
                  "events around a single call (includes launch overhead, floor about 0.03 ms). No spread "
                  "published: time_p20_ms = time_p80_ms = time_ms.",
    reps=5,
    mappings={
        "bmm": "bmm B,M,N,K = torch.bmm(x[B,M,N], y[B,N,K]) -> batch=B, m=M, k=N, n=K",
        "linear": "linear B,M,N,K = nn.Linear(N, K, bias=True) on [B,M,N] -> batch=B*M, in_features=N, "
                  "out_features=K, bias=True",
        "conv2d": "conv -> conv2d batch=B, in_channels=Input_Channel, out_channels=Output_Channel, "
                  "kernel_h=kernel_w=Kernel_Szie, height=width=Input_Size, stride_h=stride_w=Stride, "
                  "pad_h=pad_w=Padding, dilation 1, groups 1, bias=False",
    },
    library_versions=NEUSIGHT_LIBRARIES,
    gpu_time=False,
    tasks=tasks,
)
