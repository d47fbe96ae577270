"""The collective-timing table: the one place that defines, writes, reads and validates collective rows.

In the style of the op dataset (``pipeline.schema``) but a table of its own: ``<root>/gpu=<label>/<name>.parquet``
(zstd), one row per (collective, GPU count, nodes, message size, dtype, interconnect), under
``datasets/collectives/`` (our own measurements) and ``datasets/external/collectives/`` (imports), which the op
readers skip. Config columns: ``collective`` (``all_reduce``, ``reduce_scatter``, ``all_gather``,
``all_to_all``), ``n_gpus``, ``nodes`` (1 = one host), ``bytes``, ``dtype`` (``fp32, bf16, fp16, int8``) and
``interconnect`` (the path inside a node: ``nvlink``; ``pcie``, peer to peer over PCIe; ``host``, through host
memory, as NCCL runs with peer-to-peer disabled). ``bytes`` follows nccl-tests: the buffer each rank reduces
(all_reduce), the whole gathered output (all_gather), the whole input scattered (reduce_scatter), the buffer each
rank sends (all_to_all). Times are GPU time per call (median, p20, p80 over repetitions, ms). The topology
(``nvidia-smi topo -m``, NCCL version and settings, or the source's system description) is in the file metadata.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.schema import METADATA_KEY, STATUSES, SchemaError, _check_percentiles, file_metadata, write_file

__all__ = ["COLLECTIVES", "DTYPES", "DTYPE_BYTES", "INTERCONNECTS", "CONFIG_COLUMNS", "COLUMNS", "config_id",
           "make_rows", "validate", "write_table", "read_file", "read_collectives", "read_collectives_and_metadata",
           "collective_files", "file_metadata", "SchemaError"]

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "all_to_all")
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "int8": 1}
DTYPES = tuple(DTYPE_BYTES)
INTERCONNECTS = ("nvlink", "pcie", "host")
"""Paths between the GPUs of one node. Across nodes, ``nodes > 1`` rows add the network in the metadata."""

ID_COLUMNS = ("config_id", "gpu", "source")
CONFIG_COLUMNS = ("collective", "n_gpus", "nodes", "bytes", "dtype", "interconnect")
MEASUREMENT_COLUMNS = ("time_ms", "time_p20_ms", "time_p80_ms", "reps", "status", "error")
COLUMNS = ID_COLUMNS + CONFIG_COLUMNS + MEASUREMENT_COLUMNS
_INTS = ("n_gpus", "nodes", "bytes", "reps")
_FLOATS = ("time_ms", "time_p20_ms", "time_p80_ms")
_STRINGS = ("config_id", "gpu", "source", "collective", "dtype", "interconnect", "status", "error")
ARROW_SCHEMA = pa.schema([pa.field(c, pa.int64() if c in _INTS else pa.float64() if c in _FLOATS else pa.string())
                          for c in COLUMNS if c != "gpu"])
"""What a file stores: every column but ``gpu``, which lives in its path."""


def config_id(row: Mapping) -> str:
    """Stable id of a collective config: the same config has the same id on every GPU."""
    canon = {c: (int(row[c]) if c in _INTS else str(row[c])) for c in CONFIG_COLUMNS}
    text = json.dumps(canon, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def make_rows(records: Iterable[Mapping] | pd.DataFrame) -> pd.DataFrame:
    """A frame with every column (missing ones null; ``config_id`` computed where missing), in order."""
    frame = records.copy() if isinstance(records, pd.DataFrame) else pd.DataFrame(list(records))
    for col in COLUMNS:
        if col not in frame:
            frame[col] = None
    frame = frame[list(COLUMNS)].reset_index(drop=True)
    for col in _INTS:
        numbers = pd.to_numeric(frame[col], errors="coerce")
        whole = numbers.isna() | (numbers == np.round(numbers))
        frame[col] = numbers.astype("Int64") if whole.all() else numbers
    for col in _FLOATS:
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype(float)
    for col in _STRINGS:
        frame[col] = frame[col].astype(object).where(frame[col].notna(), None)
    missing = frame["config_id"].isna()
    if missing.any():
        frame.loc[missing, "config_id"] = [_id_or_none(r) for r in frame[missing].to_dict("records")]
    return frame


def _id_or_none(row: Mapping) -> str | None:
    try:
        return config_id(row)
    except (TypeError, ValueError):
        return None  # validate() names the bad field


def _first(bad: np.ndarray) -> int:
    return int(np.flatnonzero(bad)[0])


def _rules(frame: pd.DataFrame) -> list[tuple[str, np.ndarray, str]]:
    """(field, rows that pass, what it must be) for every per-row rule but the ids and percentiles."""
    rules = [(col, frame[col].isin(allowed).to_numpy(), f"one of {allowed}")
             for col, allowed in (("collective", COLLECTIVES), ("dtype", DTYPES), ("interconnect", INTERCONNECTS),
                                  ("status", STATUSES))]
    rules += [(col, frame[col].map(lambda v: isinstance(v, str) and v != "").to_numpy(dtype=bool),
               "a non-empty string") for col in ("gpu", "source")]
    for col in ("n_gpus", "nodes", "bytes"):
        v = pd.to_numeric(frame[col], errors="coerce").to_numpy(dtype=float)
        rules.append((col, np.isfinite(v) & (v >= 1) & (v == np.round(v)), "an integer >= 1"))
    n, nodes = (pd.to_numeric(frame[c], errors="coerce").to_numpy(dtype=float) for c in ("n_gpus", "nodes"))
    rules.append(("nodes", ~(nodes > n), "at most n_gpus"))
    size = frame["dtype"].map(DTYPE_BYTES).to_numpy(dtype=float)
    rules.append(("bytes", pd.to_numeric(frame["bytes"], errors="coerce").to_numpy(dtype=float) % size == 0,
                  "a whole number of elements of its dtype"))
    ok = (frame["status"] == "ok").to_numpy()
    for col in _FLOATS:
        v = frame[col].to_numpy(dtype=float)
        rules.append((col, ~ok | (np.isfinite(v) & (v > 0)), "a finite time > 0 on ok rows"))
    reps = pd.to_numeric(frame["reps"], errors="coerce").to_numpy(dtype=float)
    rules.append(("reps", ~ok | (np.isfinite(reps) & (reps >= 1)), ">= 1 on ok rows"))
    return rules


def validate(frame: pd.DataFrame, where: str = "<frame>") -> None:
    """Raise SchemaError naming ``where``, the row and the field of the first violation (an empty frame with every
    column passes)."""
    absent = sorted(set(COLUMNS) - set(frame.columns))
    if absent or frame.empty:
        if absent:
            raise SchemaError(f"{where}: missing columns {absent}")
        return
    for col, passed, must in _rules(frame):
        if not passed.all():
            row = _first(~passed)
            raise SchemaError(f"{where}: row {row} field {col!r}: must be {must}, got {frame[col].iloc[row]!r}")
    _check_percentiles(frame, (frame["status"] == "ok").to_numpy(), where)
    expected = np.array([config_id(r) for r in frame[list(CONFIG_COLUMNS)].to_dict("records")], dtype=object)
    bad = expected != frame["config_id"].to_numpy(dtype=object)
    if bad.any():
        row = _first(bad)
        raise SchemaError(f"{where}: row {row} field 'config_id': {frame['config_id'].iloc[row]!r} is not the id "
                          f"of its config (expected {expected[row]!r})")


def write_table(frame: pd.DataFrame, root: str | os.PathLike, name: str,
                metadata: Mapping | None = None) -> list[Path]:
    """Validate and write rows into ``root/gpu=<g>/<name>.parquet``, one file per GPU, atomically; ``metadata``
    (topology, NCCL settings, source, timing method...) goes into every file as JSON."""
    frame = make_rows(frame)
    validate(frame, where=f"collective rows for {name!r}")
    return [write_file(part, Path(root) / f"gpu={gpu}" / f"{name}.parquet", metadata, ARROW_SCHEMA)
            for gpu, part in frame.groupby("gpu", sort=True)]


def read_file(path: str | os.PathLike) -> pd.DataFrame:
    """Read and validate one file; ``gpu`` comes from its ``gpu=`` folder."""
    return _read_file(path)[0]


def _read_file(path: str | os.PathLike) -> tuple[pd.DataFrame, dict]:
    """One file's validated rows and its metadata, from one read of it (the footer is parsed once)."""
    path = Path(path)
    gpu = next((seg[len("gpu="):] for seg in reversed(path.parent.parts) if seg.startswith("gpu=")), None)
    if not gpu:
        raise SchemaError(f"{path}: not inside a gpu=<label> folder")
    try:  # a torn or foreign file, or one without the table's columns: name it
        table = pq.read_table(path, columns=[f.name for f in ARROW_SCHEMA])
    except Exception as exc:
        raise SchemaError(f"{path}: not a readable collective table ({type(exc).__name__}: {exc})") from exc
    frame = make_rows(table.to_pandas().assign(gpu=gpu))
    validate(frame, where=str(path))
    raw = (table.schema.metadata or {}).get(METADATA_KEY)
    return frame, json.loads(raw) if raw else {}


def collective_files(root: str | os.PathLike) -> list[Path]:
    """Visible Parquet files under ``root`` (names starting with '.' or '_' are skipped)."""
    root = Path(root)
    if not root.is_dir():
        return []
    return [p for p in sorted(root.rglob("*.parquet"))
            if not any(part.startswith((".", "_")) for part in p.relative_to(root).parts)]


def read_collectives(roots: Iterable[str | os.PathLike] | str | os.PathLike, status: str | None = "ok"
                     ) -> pd.DataFrame:
    """Every validated row under one or more roots (default: ``ok`` rows only); empty frame if none."""
    return read_collectives_and_metadata(roots, status)[0]


def read_collectives_and_metadata(roots: Iterable[str | os.PathLike] | str | os.PathLike, status: str | None = "ok"
                                  ) -> tuple[pd.DataFrame, list[tuple[Path, dict]]]:
    """``read_collectives`` and (path, metadata) of each file read, every file read once."""
    roots = [roots] if isinstance(roots, (str, os.PathLike)) else list(roots)
    paths = [p for root in roots for p in collective_files(root)]
    read = [_read_file(p) for p in paths]
    frame = pd.concat([f for f, _ in read], ignore_index=True) if read else make_rows([])
    frame = frame if status is None else frame[frame["status"] == status].reset_index(drop=True)
    return frame, [(p, meta) for p, (_, meta) in zip(paths, read)]
