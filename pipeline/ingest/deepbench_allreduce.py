"""Baidu DeepBench's all-reduce results: ``deepbench/allreduce.csv`` (source ``deepbench-allreduce``).

``device, precision, size_floats, n_devices, time_ms``: an all-reduce of ``size_floats`` fp32 values over
``n_devices`` GPUs (2-32), the fastest of NCCL (single node), NCCL+MPI, OSU and Baidu's allreduce. Topologies
(DeepBench README, as the extdata README quotes it): M40, TitanX (Maxwell), P100 in 8-GPU nodes, dual-socket, two
PLX switches per socket on 16 lanes of PCIe v3 each, sockets joined by QPI; TitanX Pascal and 1080Ti in 10-GPU
single-socket nodes with two PLX switches of 5 GPUs; InfiniBand FDR across nodes. So: interconnect ``pcie``
(peer to peer through the PLX switches), ``nodes = ceil(n_devices / GPUs per node)`` with the GPUs per node from
the registry (``interconnect.gpus_per_node``, set from the same README). Rows of devices the registry does not
know (IA_KNL7250, a Xeon Phi cluster) and rows without a time (most V100 and T4 rows) are skipped and counted.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from pipeline import gpus
from pipeline.ingest.common import Report, gpu_label_or_none, need_dir, numeric, require_columns

__all__ = ["SOURCE_NAME", "FDR_GBPS", "read_allreduce", "tables"]

SOURCE_NAME = "deepbench-allreduce"
COLUMNS = ("device", "precision", "size_floats", "n_devices", "time_ms")
FDR_GBPS = 56.0 * 64 / 66 / 8
"""InfiniBand FDR 4x per direction, GB/s: 56 Gb/s signalling x 64b/66b coding / 8 bits (6.8 GB/s)."""


def read_allreduce(path: Path, extdata: Path, report: Report) -> tuple[pd.DataFrame, dict]:
    """``allreduce.csv`` -> raw collective rows (``gpu`` as DeepBench names it) and the topology metadata."""
    rel = path.relative_to(extdata).as_posix()
    raw = pd.read_csv(path)
    require_columns(raw, COLUMNS, rel)
    fp32 = raw["precision"].astype(str).str.strip() == "Float"
    for prec, count in raw[~fp32]["precision"].value_counts().items():
        report.skipped_rows[(SOURCE_NAME, f"precision {prec}")] += int(count)
    raw = raw[fp32]
    per_node = {name: _gpus_per_node(name) for name in raw["device"].astype(str).unique()}
    n = numeric(raw["n_devices"]).astype(int)
    nodes = [math.ceil(k / per_node[d]) if per_node[d] else 1 for k, d in zip(n, raw["device"].astype(str))]
    frame = pd.DataFrame({"gpu": raw["device"].astype(str), "collective": "all_reduce", "n_gpus": n,
                          "nodes": nodes, "bytes": numeric(raw["size_floats"]).astype("int64") * 4, "dtype": "fp32",
                          "interconnect": "pcie", "time_ms": numeric(raw["time_ms"])})
    topology = {"interconnect": "pcie",
                "node": {"M40, TitanX (Maxwell), P100": "8 GPUs, dual-socket, two PLX switches per socket on 16 "
                                                        "lanes of PCIe v3 each, sockets joined by QPI",
                         "TitanX Pascal, 1080Ti": "10 GPUs, single socket, two PLX switches of 5 GPUs"},
                "gpus_per_node": {d: k for d, k in sorted(per_node.items()) if k},
                "network": {"fabric": "InfiniBand FDR", "inter_node_gbps": round(FDR_GBPS, 3),
                            "note": "one FDR 4x link per node assumed: the README does not give the link count"},
                "implementations": "fastest of NCCL (single node), NCCL+MPI, OSU, Baidu allreduce",
                "original_files": [rel]}
    return frame.reset_index(drop=True), topology


def _gpus_per_node(device: str) -> int | None:
    label = gpu_label_or_none(device)
    return None if label is None else int(gpus.gpu_spec(label)["interconnect"]["gpus_per_node"])


def tables(extdata: Path, report: Report) -> list[tuple[pd.DataFrame, dict]]:
    root = need_dir(extdata / "deepbench", SOURCE_NAME)
    path = root / "allreduce.csv"
    return [read_allreduce(path, extdata, report)] if path.exists() else []


LICENSE = "Apache-2.0 (deepbench/LICENSE in the extdata folder)"
CITATION = ("Baidu Research. DeepBench: benchmarking deep learning operations on different hardware. "
            "https://github.com/baidu-research/DeepBench (Apache-2.0).")
TIMING = ("Host-timed: DeepBench's all-reduce benchmark, the fastest of four implementations per size and GPU "
          "count; one published time, repetitions not recorded (reps = 1, time_p20_ms = time_p80_ms = time_ms).")
MAPPING = ("size_floats x 4 -> bytes (fp32), n_devices -> n_gpus, nodes = ceil(n_devices / gpus_per_node of the "
           "registry), collective all_reduce, interconnect pcie (PLX switches; InfiniBand FDR across nodes)")
