"""NVIDIA AIConfigurator's NCCL tables: ``aiconfigurator/<system>/nccl_perf.parquet`` (source ``aiconfigurator-nccl``).

nccl-tests (``all_reduce_perf`` etc.) on A100 SXM4 80GB, H100 SXM, B200 and GB200 NVLink systems and an L40S PCIe
system: ``op_name`` (all_reduce, all_gather, reduce_scatter, alltoall -> all_to_all), ``nccl_dtype`` (half ->
fp16, int8), ``num_gpus`` (2, 4, 8; GB200 2 and 4), ``message_size`` in ELEMENTS (bytes = elements x element
size; nccl-tests' size convention: all_gather's whole output, reduce_scatter's whole input), ``latency`` (ms,
nccl-tests' out-of-place time per call). One node per row. The path comes from the system's own ``system.yaml``:
``intra_node_bw`` equal to its ``pcie_bw`` means PCIe (``pcie``), larger means NVLink (``nvlink``); its node
section and the NCCL version (``nccl_collection_meta.yaml``) go into the file metadata as the topology.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import yaml

from pipeline.collectives.schema import DTYPE_BYTES
from pipeline.ingest.common import IngestError, Report, need_dir

__all__ = ["SOURCE_NAME", "COLUMNS", "read_system", "tables"]

SOURCE_NAME = "aiconfigurator-nccl"
NCCL_FILE = "nccl_perf.parquet"
COLUMNS = ("framework", "version", "device", "op_name", "nccl_dtype", "num_gpus", "message_size", "latency")
_OPS = {"all_reduce": "all_reduce", "all_gather": "all_gather", "reduce_scatter": "reduce_scatter",
        "alltoall": "all_to_all"}
_DTYPES = {"half": "fp16", "float16": "fp16", "bfloat16": "bf16", "float": "fp32", "float32": "fp32",
           "int8": "int8"}


def _system_path(system_yaml: Path) -> tuple[str, dict]:
    """(interconnect, node description) from a system.yaml."""
    node = (yaml.safe_load(system_yaml.read_text()) or {}).get("node") or {}
    if "intra_node_bw" not in node or "pcie_bw" not in node:
        raise IngestError(f"{system_yaml}: node.intra_node_bw and node.pcie_bw are needed to tell NVLink from PCIe")
    path = "pcie" if float(node["intra_node_bw"]) <= float(node["pcie_bw"]) else "nvlink"
    return path, dict(node.items())


def read_system(folder: Path, extdata: Path, report: Report) -> tuple[pd.DataFrame, dict]:
    """One system folder -> raw collective rows (``gpu`` as the table names it) and its topology metadata."""
    table = folder / NCCL_FILE
    rel = table.relative_to(extdata).as_posix()
    missing = [c for c in COLUMNS if c not in pq.read_schema(table).names]
    if missing:
        raise IngestError(f"{rel}: missing columns {missing}")
    raw = pd.read_parquet(table, columns=list(COLUMNS))
    known = raw["op_name"].isin(list(_OPS)) & raw["nccl_dtype"].isin(list(_DTYPES))
    for (op, dtype), count in raw[~known].groupby(["op_name", "nccl_dtype"]).size().items():
        report.skipped_rows[(SOURCE_NAME, f"{folder.name}: {op} {dtype}")] += int(count)
    raw = raw[known]
    interconnect, node = _system_path(folder / "system.yaml")
    dtype = raw["nccl_dtype"].map(_DTYPES)
    frame = pd.DataFrame({"gpu": raw["device"].astype(str).str.strip(), "collective": raw["op_name"].map(_OPS),
                          "n_gpus": raw["num_gpus"].astype(int), "nodes": 1,
                          "bytes": raw["message_size"].astype("int64") * dtype.map(DTYPE_BYTES),
                          "dtype": dtype, "interconnect": interconnect, "time_ms": raw["latency"]})
    meta_file = folder / "nccl_collection_meta.yaml"
    runtime = (yaml.safe_load(meta_file.read_text()) or {}).get("runtime", {}) if meta_file.exists() else {}
    topology = {"system": folder.name, "interconnect": interconnect, "node": node,
                "nccl_version": runtime.get("version") or sorted(raw["version"].astype(str).unique()),
                "collector": sorted(raw["framework"].astype(str).unique()),
                "original_files": [rel, (folder / "system.yaml").relative_to(extdata).as_posix()]}
    return frame.reset_index(drop=True), topology


def tables(extdata: Path, report: Report) -> list[tuple[pd.DataFrame, dict]]:
    """Every system folder holding an NCCL table, in a fixed order."""
    root = need_dir(extdata / "aiconfigurator", SOURCE_NAME)
    return [read_system(p.parent, extdata, report) for p in sorted(root.glob(f"*/{NCCL_FILE}"))]


LICENSE = "Apache-2.0 (aiconfigurator/LICENSE in the extdata folder)"
CITATION = ("NVIDIA. AIConfigurator: measured op tables for LLM-serving configuration search. "
            "https://github.com/ai-dynamo/aiconfigurator (commit 095f58a, Apache-2.0).")
TIMING = ("GPU time: nccl-tests out-of-place time per call (ms), as AIConfigurator's collector records it; no "
          "spread or repetition count published: time_p20_ms = time_p80_ms = time_ms, reps = 1. NCCL's defaults "
          "of the collecting system (whether NVLink SHARP was on is not recorded).")
MAPPING = ("op_name all_reduce/all_gather/reduce_scatter/alltoall -> collective (alltoall -> all_to_all); "
           "nccl_dtype half -> fp16, int8 -> int8; bytes = message_size (elements) x element size; n_gpus = "
           "num_gpus, nodes = 1; interconnect from system.yaml (intra_node_bw > pcie_bw: nvlink, else pcie)")
