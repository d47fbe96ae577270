"""Vidur's LLM GEMM profiles: ``vidur/<gpu>/<org>/<model>/mlp.csv`` (source ``vidur``).

From microsoft/vidur: fp16 forward (inference, ``torch.no_grad``) on an A100 80GB SXM4 (folder ``a100``), each
module timed as the sum of its CUDA kernels' durations in a PyTorch profiler trace: GPU time, no launch
overhead. One CSV row per (model, ``num_tokens``, ``num_tensor_parallel_workers``) with the model's
``n_head, n_kv_head, n_embd, n_expanded_embd, use_gated_mlp`` and ``time_stats.<module>.{min,max,mean,median,
std}`` (ms). Its four GEMM modules become ``linear`` rows without bias (batch = num_tokens; hd = n_embd / n_head,
tp = num_tensor_parallel_workers, weights sharded by tp):

- ``attn_pre_proj`` (fused QKV): in_features = n_embd, out_features = (n_head + 2 n_kv_head) hd / tp
- ``attn_post_proj``: in_features = n_embd / tp, out_features = n_embd
- ``mlp_up_proj``: in_features = n_embd, out_features = (2 if use_gated_mlp else 1) n_expanded_embd / tp
- ``mlp_down_proj``: in_features = n_expanded_embd / tp, out_features = n_embd

``time_ms`` is the published median; Vidur publishes no percentiles (and not how many runs the statistics
cover), so ``time_p20_ms = time_p80_ms = time_ms`` and ``reps = 1``. A shape whose sharded size is not a whole
number is dropped with a logged count. The same GEMM profiled for several models, or a repeated row, merges
into the median.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.ingest.common import META_PREFIX, Options, Report, Source, Task, need_dir, numeric, require_columns

log = logging.getLogger(__name__)

GPU_FOLDERS = {"a100": "NVIDIA A100-SXM4-80GB"}
"""Vidur's profiling folder -> the GPU it was measured on (extdata README: A100 80GB SXM4)."""
MODULES = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
MODEL_COLUMNS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "use_gated_mlp", "num_tokens",
                 "num_tensor_parallel_workers")


def median_column(module: str) -> str:
    return f"time_stats.{module}.median"


def gemm_features(raw: pd.DataFrame) -> dict[str, tuple[pd.Series, pd.Series]]:
    """``{module: (in_features, out_features)}`` of each row's GEMMs (float; NaN where not a whole number)."""
    n_embd, heads, kv = (numeric(raw[c]).astype(float) for c in ("n_embd", "n_head", "n_kv_head"))
    expanded = numeric(raw["n_expanded_embd"]).astype(float)
    tp = numeric(raw["num_tensor_parallel_workers"]).astype(float)
    gated = raw["use_gated_mlp"].map(_truth)
    hd = n_embd / heads
    shapes = {
        "attn_pre_proj": (n_embd, (heads + 2 * kv) * hd / tp),
        "attn_post_proj": (n_embd / tp, n_embd),
        "mlp_up_proj": (n_embd, np.where(gated, 2.0, 1.0) * expanded / tp),
        "mlp_down_proj": (expanded / tp, n_embd),
    }
    whole = hd == np.round(hd)
    return {m: tuple(pd.Series(v, index=raw.index).where(whole & (v == np.round(v))) for v in pair)
            for m, pair in shapes.items()}


def _truth(value) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    text = str(value).strip().lower()
    if text in ("true", "1"):
        return True
    if text in ("false", "0"):
        return False
    raise ValueError(f"use_gated_mlp: {value!r} is not a boolean (True/False)")


def read_mlp_table(task: Task) -> pd.DataFrame:
    """One ``mlp.csv`` -> fp16 forward linear rows, four per CSV row (``gpu`` holds the GPU's name)."""
    raw = pd.read_csv(task.path)
    require_columns(raw, [*MODEL_COLUMNS, *(median_column(m) for m in MODULES)], task.rel)
    features = gemm_features(raw)
    model = "/".join(Path(task.rel).parts[-3:-1])
    frames = []
    for module in MODULES:
        in_features, out_features = features[module]
        fractional = in_features.isna() | out_features.isna()
        if fractional.any():
            log.warning("%s %s: %d rows whose sharded shapes are not whole numbers: dropped", task.rel, module,
                        int(fractional.sum()))
        frames.append(pd.DataFrame({
            "batch": numeric(raw["num_tokens"]), "in_features": in_features, "out_features": out_features,
            "bias": False, "time_ms": numeric(raw[median_column(module)]),
            META_PREFIX + "modules": module, META_PREFIX + "models": model,
        })[~fractional])
    frame = pd.concat(frames, ignore_index=True)
    frame["op"] = "linear"
    frame["gpu"] = GPU_FOLDERS[Path(task.rel).parts[1]]
    frame["precision"] = "fp16"
    frame["phase"] = "forward"
    frame[META_PREFIX + "files"] = task.rel
    return frame


def tasks(extdata: Path, options: Options, report: Report) -> list[Task]:
    """``mlp.csv`` files under the GPU folders in ``GPU_FOLDERS`` (other folders skipped with a warning)."""
    root = need_dir(extdata / "vidur", SOURCE.name)
    found = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        if folder.name not in GPU_FOLDERS:
            report.skipped_gpu_folders.append(f"vidur/{folder.name}")
            log.warning("%s: folder %r names no known GPU (known: %s): skipping it", SOURCE.name, folder.name,
                        ", ".join(GPU_FOLDERS))
            continue
        for path in sorted(folder.glob("*/*/mlp.csv")):
            found.append(Task(SOURCE.name, path, read_mlp_table, path.relative_to(extdata).as_posix()))
    return found


SOURCE = Source(
    name="vidur",
    license="MIT (vidur/LICENSE in the extdata folder)",
    citation="Amey Agrawal, Nitin Kedia, Jayashree Mohan, Ashish Panwar, Nipun Kwatra, Bhargav S. Gulavani, "
             "Ramachandran Ramjee, Alexey Tumanov. Vidur: A Large-Scale Simulation Framework for LLM Inference. "
             "MLSys 2024. Profiling data from https://github.com/microsoft/vidur (commit 7d47513, MIT license).",
    timing_method="GPU time: sum of kernel durations from the PyTorch profiler (no launch overhead), fp16 "
                  "forward under torch.no_grad on an A100 80GB SXM4. time_ms = the published median "
                  "(time_stats.<module>.median); no percentiles are published, so time_p20_ms = time_p80_ms = "
                  "time_ms; the run count is not published (reps = 1).",
    reps=1,
    mappings={
        "linear": "mlp.csv modules -> linear, bias=False, batch=num_tokens, hd=n_embd/n_head, "
                  "tp=num_tensor_parallel_workers: attn_pre_proj in=n_embd, out=(n_head+2*n_kv_head)*hd/tp; "
                  "attn_post_proj in=n_embd/tp, out=n_embd; mlp_up_proj in=n_embd, "
                  "out=(2 if use_gated_mlp else 1)*n_expanded_embd/tp; mlp_down_proj in=n_expanded_embd/tp, "
                  "out=n_embd",
    },
    library_versions="not in the CSV (Vidur's profiler: PyTorch with CUDA on an A100 80GB SXM4)",
    gpu_time=True,
    tasks=tasks,
)
