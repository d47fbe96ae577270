"""NVIDIA AIConfigurator's GEMM tables: ``aiconfigurator/<system>/gemm_perf.parquet`` (source ``aiconfigurator``).

Collected with vLLM on A100 SXM4 80GB, H100 SXM, B200, GB200 and L40S systems. ``gemm_dtype == "bfloat16"``
rows of ``kernel_source == "torch.nn.functional.linear"`` (the A100 table names the same call
``vllm_default``) are ``F.linear(x[m, k], W[n, k])`` without bias in bf16 -> linear batch=m, in_features=k,
out_features=n, bias=False, precision bf16, phase forward. Timing: warm-up, then CUDA-graph replay of six
copies of the layer run in turn (each its own weights), the time divided by six: GPU time, no launch overhead.
``latency`` is ms per GEMM; no spread or replay count is published (``time_p20_ms = time_p80_ms = time_ms``,
``reps = 1``). The fp8/fp8_block/nvfp4 rows (quantised kernels without a PyTorch op of this project) and any
other kernel are skipped and counted per GPU. The GPU comes from the ``device`` column. The
``nccl_perf.parquet`` tables are not read here.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from pipeline.ingest.common import (
    META_LIBRARY_PREFIX,
    META_PREFIX,
    IngestError,
    Options,
    Report,
    Source,
    Task,
    need_dir,
)

log = logging.getLogger(__name__)

GEMM_FILE = "gemm_perf.parquet"
COLUMNS = ("framework", "version", "device", "gemm_dtype", "kernel_source", "m", "n", "k", "latency")
BF16 = "bfloat16"
LINEAR_KERNELS = ("torch.nn.functional.linear", "vllm_default")
"""Kernel sources that are PyTorch's bf16 ``F.linear`` (``vllm_default`` is the A100 table's name for it)."""


def read_gemm_table(task: Task, report: Report) -> pd.DataFrame:
    """One ``gemm_perf.parquet`` -> bf16 forward linear rows; other rows counted in ``report.skipped_rows``."""
    present = pq.read_schema(task.path).names
    missing = [c for c in COLUMNS if c not in present]
    if missing:
        raise IngestError(f"{task.rel}: missing columns {missing}")
    raw = pd.read_parquet(task.path, columns=list(COLUMNS))
    keep = (raw["gemm_dtype"] == BF16) & raw["kernel_source"].isin(LINEAR_KERNELS)
    skipped = raw[~keep]
    for (device, dtype, kernel), count in skipped.groupby(["device", "gemm_dtype", "kernel_source"]).size().items():
        report.skipped_rows[(SOURCE.name, f"{device}: {dtype} {kernel}")] += int(count)
    if len(skipped):
        log.info("%s: skipped %d rows that are not bf16 F.linear (%s)", task.rel, len(skipped),
                 dict(skipped["gemm_dtype"].value_counts().sort_index()))
    raw = raw[keep]
    frame = pd.DataFrame({"batch": raw["m"], "in_features": raw["k"], "out_features": raw["n"], "bias": False,
                          "time_ms": raw["latency"]})
    frame["op"] = "linear"
    frame["gpu"] = raw["device"].astype(str).str.strip()
    frame["precision"] = "bf16"
    frame["phase"] = "forward"
    frame[META_PREFIX + "files"] = task.rel
    frame[META_PREFIX + "kernel_sources"] = raw["kernel_source"].astype(str)
    for framework, rows in raw.groupby(raw["framework"].astype(str).str.lower()).groups.items():
        frame.loc[rows, META_LIBRARY_PREFIX + framework] = raw.loc[rows, "version"].astype(str)
    return frame.reset_index(drop=True)


def tasks(extdata: Path, options: Options, report: Report) -> list[Task]:
    """One task per system folder holding a ``gemm_perf.parquet``."""
    root = need_dir(extdata / "aiconfigurator", SOURCE.name)

    def reader(task: Task) -> pd.DataFrame:
        return read_gemm_table(task, report)

    return [Task(SOURCE.name, path, reader, path.relative_to(extdata).as_posix())
            for path in sorted(root.glob(f"*/{GEMM_FILE}"))]


SOURCE = Source(
    name="aiconfigurator",
    license="Apache-2.0 (aiconfigurator/LICENSE in the extdata folder)",
    citation="NVIDIA. AIConfigurator: measured op tables for LLM-serving configuration search. "
             "https://github.com/ai-dynamo/aiconfigurator (commit 095f58a, Apache-2.0).",
    timing_method="GPU time: CUDA-graph replay (vLLM collector: warm-up, then graph replay of six copies of the "
                  "layer with their own weights, time / 6), bf16 F.linear without bias. No spread or replay count "
                  "published: time_p20_ms = time_p80_ms = time_ms, reps = 1.",
    reps=1,
    mappings={
        "linear": "gemm_perf bfloat16 torch.nn.functional.linear (A100: vllm_default) F.linear(x[m,k], W[n,k]) -> "
                  "batch=m, in_features=k, out_features=n, bias=False, bf16, forward; fp8/fp8_block/nvfp4 skipped",
    },
    library_versions="vLLM version per file in library_versions (from the table's framework/version columns)",
    gpu_time=True,
    tasks=tasks,
)
