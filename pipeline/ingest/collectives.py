"""Import public collective timings into the collective table (``pipeline.collectives.schema``).

Sources (config key ``collective_sources``): ``aiconfigurator-nccl`` (``aiconfigurator_nccl``: nccl-tests on
NVLink A100/H100/B200/GB200 and PCIe L40S systems) and ``deepbench-allreduce`` (``deepbench_allreduce``: PCIe v3
nodes of 8 and 10 GPUs, InfiniBand across nodes). Output: ``<out>/gpu=<label>/<source>.parquet`` (default
``datasets/external/collectives``), each file with the source's license, citation, timing method, mapping and
topology in its metadata. GPU names go through the registry (unknown ones skipped and counted), rows without a
positive time are dropped and counted, repeated configs merged into their median; a source's stale files are
removed. A source whose tables are absent from ``extdata`` is skipped with a warning (the op import may run on a
folder without them). Re-running gives the same rows.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline.collectives import schema as cschema
from pipeline.ingest import aiconfigurator_nccl, deepbench_allreduce
from pipeline.ingest.common import (
    IngestError,
    Report,
    _known_gpus,
    _remove_empty_folders,
    _remove_stale_files,
    gpu_label_or_none,
)

log = logging.getLogger(__name__)

__all__ = ["CollectiveSource", "COLLECTIVE_SOURCES", "import_collectives", "collective_summary"]


@dataclass(frozen=True)
class CollectiveSource:
    """A public source of collective timings: provenance and how to read its tables."""

    name: str
    license: str
    citation: str
    timing_method: str
    mapping: str
    tables: Callable[[Path, Report], list[tuple[pd.DataFrame, dict]]]


COLLECTIVE_SOURCES: dict[str, CollectiveSource] = {
    m.SOURCE_NAME: CollectiveSource(m.SOURCE_NAME, m.LICENSE, m.CITATION, m.TIMING, m.MAPPING, m.tables)
    for m in (aiconfigurator_nccl, deepbench_allreduce)}


def _finalize(frame: pd.DataFrame, source: str, report: Report) -> pd.DataFrame:
    """Registry labels, valid times, ids; repeated configs merged into their median."""
    frame = _known_gpus(frame, source, report, logger=log)  # every call logs its unknown GPUs
    time = pd.to_numeric(frame["time_ms"], errors="coerce").to_numpy(dtype=float)
    bad = ~(np.isfinite(time) & (time > 0))
    for (gpu, collective), count in frame[bad].groupby(["gpu", "collective"]).size().items():
        report.bad_times[(source, gpu, collective, "-")] += int(count)
    frame = frame[~bad].copy()
    frame["source"] = source
    frame = cschema.make_rows(frame)
    keys = ["config_id", "gpu"]
    merged = frame.groupby(keys, sort=True, as_index=False).agg(
        **{c: (c, "first") for c in cschema.COLUMNS if c not in keys + ["time_ms"]}, time_ms=("time_ms", "median"))
    for gpu, count in (frame.groupby("gpu").size() - merged.groupby("gpu").size()).items():
        if count:
            report.duplicates[(source, gpu, "collectives")] += int(count)
    merged["time_p20_ms"] = merged["time_ms"]
    merged["time_p80_ms"] = merged["time_ms"]
    merged["reps"], merged["status"], merged["error"] = 1, "ok", None
    return cschema.make_rows(merged)


def _metadata(source: CollectiveSource, topologies: list[dict], rows: int) -> dict:
    return {"source": source.name, "license": source.license, "citation": source.citation,
            "timing_method": source.timing_method, "mapping": source.mapping, "importer": "pipeline.ingest",
            "rows": rows, "topology": topologies}


def _write(frame: pd.DataFrame, out: Path, source: CollectiveSource, topologies: dict[str, list], report: Report
           ) -> list[Path]:
    written = []
    for gpu, part in frame.groupby("gpu", sort=True):
        part = part.sort_values(["interconnect", "collective", "dtype", "n_gpus", "bytes"]).reset_index(drop=True)
        written += cschema.write_table(part, out, source.name, _metadata(source, topologies.get(gpu, []),
                                                                         len(part)))
    _remove_stale_files(out, f"gpu=*/{source.name}.parquet", {p.resolve() for p in written}, report)
    _remove_empty_folders(out, ("gpu=*",))
    return written


def import_collectives(extdata: str | Path, out: str | Path, sources: Iterable[str] = tuple(COLLECTIVE_SOURCES),
                       report: Report | None = None) -> pd.DataFrame:
    """Import ``sources`` from ``extdata`` into ``out``; returns the rows written."""
    sources = list(dict.fromkeys(sources))
    unknown = [s for s in sources if s not in COLLECTIVE_SOURCES]
    if unknown:
        raise IngestError(f"config key `collective_sources`: unknown {unknown}; allowed: "
                          f"{', '.join(COLLECTIVE_SOURCES)}")
    extdata, out = Path(extdata), Path(out)
    report = report if report is not None else Report()
    results = []
    for name in sources:
        source = COLLECTIVE_SOURCES[name]
        try:
            found = source.tables(extdata, report)
        except IngestError as exc:  # the folder is missing: skipped, as an absent table is
            log.warning("%s", exc)
            found = []
        if not found:
            log.warning("collective source %r: no tables found under %s: skipped", name, extdata)
            continue
        topologies: dict[str, list] = {}
        for frame, topology in found:
            for raw_name in frame["gpu"].unique():
                label = gpu_label_or_none(raw_name)
                if label is not None:
                    topologies.setdefault(label, []).append(topology)
        frame = _finalize(pd.concat([f for f, _ in found], ignore_index=True), name, report)
        out.mkdir(parents=True, exist_ok=True)
        _write(frame, out, source, topologies, report)
        results.append(frame)
    return pd.concat(results, ignore_index=True) if results else cschema.make_rows([])


def collective_summary(frame: pd.DataFrame) -> str:
    """Rows per source, GPU and interconnect, with the GPU counts and size range."""
    if frame.empty:
        return "no collective rows"
    table = frame.groupby(["source", "gpu", "interconnect"]).agg(
        rows=("config_id", "size"), gpu_counts=("n_gpus", lambda s: ",".join(map(str, sorted(set(s))))),
        min_bytes=("bytes", "min"), max_bytes=("bytes", "max"))
    return f"{table.to_string()}\n{len(frame)} collective rows on {frame['gpu'].nunique()} GPU labels"
