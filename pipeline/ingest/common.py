"""What every import source shares: the task and source records, GPU names, turning reader rows into schema
rows (``finalize``: registry labels, valid times, config ids, repeats merged) and writing one file per
(GPU, op, source) with its provenance (``write_source``).

Readers return raw rows: the op's config columns, ``op, gpu`` (the GPU name as the source writes it),
``precision, phase, time_ms``, and provenance columns named ``_meta_<key>`` whose distinct values go into the
written file's metadata (``_meta_files`` -> ``original_files``, ``_meta_lib_<name>`` -> ``library_versions``).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline import gpus, schema

log = logging.getLogger(__name__)

META_PREFIX = "_meta_"
"""Columns named ``_meta_<key>`` carry provenance; their distinct values per file go into its metadata."""
META_LIBRARY_PREFIX = META_PREFIX + "lib_"
"""``_meta_lib_<name>`` columns hold the version of library ``<name>`` a row was measured with."""
_META_NAMES = {"files": "original_files", "nodes": "label_nodes"}
LABEL_KINDS = ("train", "inf")
DUPLICATE_KEYS = ["config_id", "gpu", "source", "precision", "phase"]


class IngestError(ValueError):
    """Bad configuration or input layout; the message names the config key or the file."""


@dataclass
class Task:
    """One input file and how to read it."""

    source: str
    path: Path
    reader: Callable[[Task], pd.DataFrame]
    rel: str  # path relative to the extdata folder, for messages and metadata
    kind: str = ""  # NeuSight node tables: train | inf


@dataclass(frozen=True)
class Options:
    """Per-run settings a source's file discovery may need."""

    label_kinds: tuple[str, ...] = LABEL_KINDS


@dataclass(frozen=True)
class Source:
    """An import source: its provenance, how its rows were timed, and how to find its files."""

    name: str
    license: str
    citation: str
    timing_method: str
    reps: int  # the rows' ``reps``: how many calls one published number aggregates (1 where not published)
    mappings: Mapping[str, str]  # op -> how the source's columns become the op's config
    library_versions: str  # said in the metadata where the rows carry no ``_meta_lib_*`` columns
    gpu_time: bool  # True: the times exclude host launch overhead, so no row is launch-bound
    tasks: Callable[[Path, Options, Report], list[Task]]


@dataclass
class Report:
    """What an import did beyond writing rows: skipped and merged rows, launch floors, removed files."""

    unknown_gpus: Counter = field(default_factory=Counter)  # raw GPU name -> rows skipped
    bad_times: Counter = field(default_factory=Counter)  # (source, gpu, op, phase) -> rows dropped
    duplicates: Counter = field(default_factory=Counter)  # (source, gpu, op) -> rows merged away
    skipped_rows: Counter = field(default_factory=Counter)  # (source, reason) -> rows a reader left out
    skipped_gpu_folders: list = field(default_factory=list)
    removed_files: list = field(default_factory=list)
    launch_floors: list = field(default_factory=list)  # one dict per (source, gpu, op, precision, phase)


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


# ------------------------------------------------------------------------------------------ reader helpers

def need_dir(path: Path, source: str) -> Path:
    """``path`` if it is a folder, else an error naming the source and how to skip it."""
    if not path.is_dir():
        raise IngestError(f"source {source!r}: folder {path} not found under extdata (config key `extdata`, "
                          f"or drop {source!r} from `sources`)")
    return path


def require_columns(frame: pd.DataFrame, columns: Sequence[str], rel: str) -> None:
    """Raise naming the file and the columns it lacks."""
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise IngestError(f"{rel}: missing columns {missing}")


def numeric(series: pd.Series) -> pd.Series:
    """Numbers from text cells; empty, ``N/A*`` and other non-numbers become NaN."""
    return pd.to_numeric(series, errors="coerce")


def empty_rows() -> pd.DataFrame:
    return pd.DataFrame(columns=["op", "gpu", "precision", "phase", "time_ms"])


# --------------------------------------------------------------------------------------------- finalizing

def finalize(frame: pd.DataFrame, source: Source, report: Report) -> pd.DataFrame:
    """Raw reader rows (raw GPU names) -> schema rows: labels, valid times, config ids, duplicates merged."""
    if frame.empty:
        return frame
    frame = _known_gpus(frame, source.name, report)
    frame["source"] = source.name
    frame["status"] = "ok"
    frame["reps"] = source.reps
    frame["error"] = None
    time = pd.to_numeric(frame["time_ms"], errors="coerce").astype(float)
    bad = ~(np.isfinite(time.to_numpy()) & (time.to_numpy() > 0))
    if bad.any():
        for key, count in frame[bad].groupby(["gpu", "op", "phase"]).size().items():
            report.bad_times[(source.name, *key)] += int(count)
    frame = frame[~bad].copy()
    frame["time_ms"] = time[~bad]
    parts = [_with_config_ids(part, op, source.name) for op, part in frame.groupby("op", sort=True)]
    parts = [p for p in parts if len(p)]
    if not parts:
        return frame.iloc[0:0]
    return merge_duplicates(pd.concat(parts, ignore_index=True), source.name, report)


def _known_gpus(frame: pd.DataFrame, source: str, report: Report, logger: logging.Logger | None = None
                ) -> pd.DataFrame:
    """Rows on registry GPUs, ``gpu`` replaced by the registry label; others counted and dropped. An unknown GPU
    is logged once per report, or with ``logger`` on every call."""
    names = frame["gpu"].astype(str)
    labels = names.map({n: gpu_label_or_none(n) for n in names.unique()})
    unknown = labels.isna()
    for name, count in names[unknown].value_counts().sort_index().items():
        if logger is not None or name not in report.unknown_gpus:
            (logger or log).warning("%s: GPU %r is not in the GPU registry (conf/gpus.yaml): skipping its rows",
                                    source, name)
        report.unknown_gpus[name] += int(count)
    frame = frame[~unknown].copy()
    frame["gpu"] = labels[~unknown].astype(str)
    return frame


def _with_config_ids(part: pd.DataFrame, op: str, source: str) -> pd.DataFrame:
    """One op's rows with integer/bool config columns and their ``config_id``."""
    cols = list(schema.OP_CONFIG_COLUMNS[op])
    part = part.copy()
    bad_cfg = part[cols].isna().any(axis=1)
    if bad_cfg.any():
        log.warning("%s %s: dropping %d rows with missing config values", source, op, int(bad_cfg.sum()))
        part = part[~bad_cfg].copy()
    for c in cols:
        if c in schema.BOOL_COLUMNS:
            part[c] = part[c].astype(bool)
            continue
        values = part[c].astype(float)
        if not np.all(values == np.round(values)):
            raise IngestError(f"{source} {op}: non-integer values in config column {c!r}")
        part[c] = values.astype(np.int64)
    part["config_id"] = schema.config_ids(op, part) if len(part) else pd.Series(dtype=object)
    return part


def merge_duplicates(frame: pd.DataFrame, source: str, report: Report) -> pd.DataFrame:
    """One row per (config_id, gpu, source, precision, phase): the median time of repeats (counted, logged).

    No source publishes a spread, so ``time_p20_ms = time_p80_ms = time_ms``."""
    frame = frame.sort_values(DUPLICATE_KEYS + ["time_ms"], kind="stable").reset_index(drop=True)
    dup = frame.duplicated(DUPLICATE_KEYS, keep="first")
    if dup.any():
        for (gpu, op), count in frame[dup].groupby(["gpu", "op"]).size().items():
            report.duplicates[(source, gpu, op)] += int(count)
            log.info("%s %s %s: merged %d repeated config rows into their median time", source, gpu, op, count)
        repeated = frame.duplicated(DUPLICATE_KEYS, keep=False).to_numpy()
        frame.loc[repeated, "time_ms"] = frame[repeated].groupby(DUPLICATE_KEYS, sort=False)["time_ms"] \
            .transform("median")
        for col in [c for c in frame.columns if c.startswith(META_PREFIX)]:  # keep every merged row's provenance
            frame.loc[repeated, col] = _joined_per_group(frame.loc[repeated, DUPLICATE_KEYS + [col]], col)
        frame = frame[~dup].reset_index(drop=True)
    frame["time_p20_ms"] = frame["time_ms"]
    frame["time_p80_ms"] = frame["time_ms"]
    return frame


def _joined_per_group(rows: pd.DataFrame, col: str) -> np.ndarray:
    """For each row, the sorted distinct ``col`` values of its duplicate group joined by newlines."""
    joined = (rows.dropna(subset=[col]).drop_duplicates().sort_values(col, kind="stable")
              .groupby(DUPLICATE_KEYS, sort=False)[col].agg("\n".join))
    return joined.reindex(pd.MultiIndex.from_frame(rows[DUPLICATE_KEYS])).to_numpy()


# ------------------------------------------------------------------------------------------------ writing

def file_metadata(source: Source, op: str, part: pd.DataFrame, launch: Mapping | None = None) -> dict:
    """Metadata stored with one (gpu, op, source) file: provenance, timing method, mapping, launch floors."""
    meta = {"source": source.name, "license": source.license, "citation": source.citation,
            "timing_method": source.timing_method, "mapping": source.mappings.get(op, ""),
            "importer": "pipeline.ingest", "rows": int(len(part))}
    for col in sorted(c for c in part.columns if c.startswith(META_PREFIX)):
        values = sorted({v for cell in part[col].dropna().astype(str) for v in cell.split("\n") if v})
        if col.startswith(META_LIBRARY_PREFIX):
            meta.setdefault("library_versions", {})[col[len(META_LIBRARY_PREFIX):]] = values
            continue
        key = col[len(META_PREFIX):]
        meta[_META_NAMES.get(key, key)] = values
    meta.setdefault("library_versions", source.library_versions)
    if launch:
        meta.update(launch)
    return meta


def write_source(frame: pd.DataFrame, out: Path, source: Source, report: Report,
                 launch_meta: Callable[[str, str], Mapping] | None = None) -> list[Path]:
    """Write one source's rows (one file per GPU and op) and remove its files that this run did not produce.

    ``launch_meta(gpu, op)`` gives the launch-floor metadata of a file."""
    written: list[Path] = []
    if not frame.empty:
        for (gpu, op), part in frame.groupby(["gpu", "op"], sort=True):
            part = part.sort_values(["precision", "phase", "config_id"], kind="stable").reset_index(drop=True)
            metadata = file_metadata(source, op, part, launch_meta(gpu, op) if launch_meta else None)
            written += schema.write_partition(schema.conform(part), out, name=source.name, metadata=metadata)
    _remove_stale(out, source.name, {p.resolve() for p in written}, report)
    return written


def _remove_stale(out: Path, source: str, keep: set, report: Report) -> None:
    """Remove ``source``'s files not in ``keep``, temp files of interrupted runs, and folders left empty."""
    _remove_stale_files(out, f"gpu=*/op=*/{source}.parquet", keep, report, log_as=source)
    for tmp in sorted(out.glob(f"gpu=*/op=*/.{source}.parquet.*.tmp")):
        tmp.unlink()
    _remove_empty_folders(out, ("gpu=*/op=*", "gpu=*"))


def _remove_stale_files(out: Path, pattern: str, keep: set, report: Report, log_as: str | None = None) -> None:
    """Remove the files under ``out`` matching ``pattern`` that are not in ``keep`` (resolved paths), each recorded
    in ``report`` (and logged, naming ``log_as``, where given)."""
    for path in sorted(out.glob(pattern)):
        if path.resolve() not in keep:
            path.unlink()
            report.removed_files.append(path.relative_to(out).as_posix())
            if log_as is not None:
                log.info("%s: removed stale %s", log_as, path.relative_to(out).as_posix())


def _remove_empty_folders(out: Path, patterns: Sequence[str]) -> None:
    """Remove the folders under ``out`` matching ``patterns`` (all listed first, in order) that are empty."""
    for directory in [d for pattern in patterns for d in sorted(out.glob(pattern))]:
        if directory.is_dir() and not any(directory.iterdir()):
            directory.rmdir()
