"""The measured-op dataset schema: the one place that defines, writes, reads and validates op timings.

Layout: ``<root>/gpu=<label>/op=<op>/<name>.parquet`` (zstd), hive-partitioned so that
``pandas.read_parquet(root)`` and ``pyarrow.dataset`` read everything in one call. Every file carries the
union of all ops' config columns (nulls where a column is not the op's), so one schema fits all files.
Files are written under a hidden temp name and renamed: readers never see a partial file.

Times (``time_ms``, ``time_p20_ms``, ``time_p80_ms``) are the op's GPU execution time per call: the median
and 20th/80th percentiles over repetitions. ``host_ms`` is the host's time per call to enqueue the op (what
bounds an eager loop of a small op: its time is about ``max(time_ms, host_ms)``); null where a source does
not publish it. ``launch_bound`` is True where the recorded time is set by a host's launch rate rather than
by the GPU (imported sources whose timing includes launch overhead, near their floor; our own rows where
``host_ms >= time_ms``); null where unknown. ``first_call_ms`` is the wall time of the measurement's first call
(cuDNN's autotuning, lazy initialisation): an autotuned conv2d's is many times ``time_ms``, and one near it says
the call reused an algorithm picked before; null where unknown (imported rows, files written before the column).
How each source timed is in its files' metadata.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.atomic import atomic_write_with, fsync_dir  # noqa: F401  (fsync_dir: re-exported for callers)

OP_CONFIG_COLUMNS: dict[str, tuple[str, ...]] = {
    "conv2d": ("batch", "in_channels", "out_channels", "height", "width", "kernel_h", "kernel_w",
               "stride_h", "stride_w", "pad_h", "pad_w", "dilation_h", "dilation_w", "groups", "bias"),
    "linear": ("batch", "in_features", "out_features", "bias"),
    "bmm": ("batch", "m", "k", "n"),
    "lstm": ("batch", "seq_len", "input_size", "hidden_size", "num_layers", "bidirectional", "bias"),
}
OPS = tuple(OP_CONFIG_COLUMNS)
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
"""Precisions: fp32 (TF32 off), tf32 (fp32 tensors, TF32 on), fp16, bf16. The only definition."""
PRECISION_ALIASES = {"fp32": "fp32", "float32": "fp32", "float": "fp32", "tf32": "tf32", "fp16": "fp16",
                     "float16": "fp16", "half": "fp16", "bf16": "bf16", "bfloat16": "bf16"}
PHASES = ("forward", "backward")
"""Phases a measured row has. The prediction API adds "total" (forward + backward); a traced training step
adds "optimizer"."""
STATUSES = ("ok", "oom", "error", "timeout", "host_paced", "over_budget")
BOOL_COLUMNS = ("bias", "bidirectional")
_BOOL_MEASUREMENTS = ("launch_bound",)

CONFIG_COLUMNS: tuple[str, ...] = tuple(dict.fromkeys(c for cols in OP_CONFIG_COLUMNS.values() for c in cols))
MEASUREMENT_COLUMNS = ("precision", "phase", "time_ms", "time_p20_ms", "time_p80_ms", "host_ms", "first_call_ms",
                       "launch_bound", "reps", "status", "error")
ID_COLUMNS = ("config_id", "op", "gpu", "source")
COLUMNS = ID_COLUMNS + MEASUREMENT_COLUMNS + CONFIG_COLUMNS
PARTITION_COLUMNS = ("gpu", "op")
METADATA_KEY = b"pipeline"

_STRING = ("config_id", "op", "gpu", "source", "precision", "phase", "status", "error")
_FLOAT = ("time_ms", "time_p20_ms", "time_p80_ms", "host_ms", "first_call_ms")
_TIMES = ("time_ms", "time_p20_ms", "time_p80_ms")
ARROW_SCHEMA = pa.schema(
    [pa.field(c, pa.string()) for c in ("config_id", "source")]
    + [pa.field(c, pa.string()) for c in ("precision", "phase")]
    + [pa.field(c, pa.float64()) for c in _FLOAT] + [pa.field("launch_bound", pa.bool_())]
    + [pa.field("reps", pa.int64()), pa.field("status", pa.string()), pa.field("error", pa.string())]
    + [pa.field(c, pa.bool_() if c in BOOL_COLUMNS else pa.int64()) for c in CONFIG_COLUMNS]
)
"""What a file stores: everything but the partition columns ``gpu`` and ``op``, which live in its path."""


OPTIONAL_COLUMNS = ("host_ms", "launch_bound", "first_call_ms")
"""Columns added after the first files were written: a file without them reads them as nulls."""


class SchemaError(ValueError):
    """A dataset file or frame breaks the schema; the message names the file, the row and the field."""


def normalize_precision(value, field: str = "precision") -> str:
    """The canonical name of a precision given in any case or by a common alias ("BF16", "bfloat16", "half")."""
    name = PRECISION_ALIASES.get(str(value).strip().lower()) if isinstance(value, str) else None
    if name is None:
        raise ValueError(f"{field}: unknown precision {value!r}; allowed: {', '.join(PRECISIONS)} "
                         f"(or {', '.join(a for a in PRECISION_ALIASES if a not in PRECISIONS)})")
    return name


def config_id(op: str, config: Mapping) -> str:
    """Stable id of an op config: the same config has the same id on every GPU, in every run."""
    if op not in OP_CONFIG_COLUMNS:
        raise SchemaError(f"op: unknown op {op!r}; allowed: {', '.join(OPS)}")
    try:
        canon = {c: _canonical(config[c]) for c in OP_CONFIG_COLUMNS[op]}
    except KeyError as exc:
        raise SchemaError(f"{op} config: missing field {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise SchemaError(f"{op} config: not an integer/bool value ({exc})") from None
    text = json.dumps({"op": op, **canon}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _canonical(value):
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    return int(value)


def config_ids(op: str, frame: pd.DataFrame) -> pd.Series:
    """Vectorised-enough ``config_id`` over a frame of one op's configs."""
    cols = OP_CONFIG_COLUMNS[op]
    return pd.Series([config_id(op, dict(zip(cols, row))) for row in frame[list(cols)].itertuples(index=False)],
                     index=frame.index, dtype=object)


def make_rows(records: Iterable[Mapping]) -> pd.DataFrame:
    """Build a frame with every schema column (missing ones null) in schema order from dict records."""
    frame = pd.DataFrame(list(records))
    return conform(frame)


def conform(frame: pd.DataFrame) -> pd.DataFrame:
    """Add missing schema columns as nulls, order them, and cast to the schema's pandas dtypes."""
    frame = frame.copy()
    for col in COLUMNS:
        if col not in frame:
            frame[col] = None
    out = frame[list(COLUMNS)]
    for col in _STRING:
        out[col] = out[col].astype(object).where(out[col].notna(), None)
    for col in _FLOAT:
        out[col] = pd.to_numeric(out[col], errors="coerce").astype(float)
    for col in ("reps",) + tuple(c for c in CONFIG_COLUMNS if c not in BOOL_COLUMNS):
        out[col] = _to_nullable(out[col], "Int64")
    for col in BOOL_COLUMNS + _BOOL_MEASUREMENTS:
        out[col] = _to_nullable(out[col], "boolean")
    return out.reset_index(drop=True)


def _to_nullable(series: pd.Series, dtype: str) -> pd.Series:
    try:
        return series.astype(dtype)
    except (TypeError, ValueError):
        return series  # left as is; validate() names the offending row


def validate(frame: pd.DataFrame, where: str = "<frame>") -> None:
    """Raise SchemaError naming ``where``, the row and the field for the first violation found."""
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise SchemaError(f"{where}: missing columns {missing}")
    if frame.empty:
        return
    for col, allowed in (("op", OPS), ("precision", PRECISIONS), ("phase", PHASES), ("status", STATUSES)):
        bad = ~frame[col].isin(allowed)
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            raise SchemaError(f"{where}: row {row} field {col!r}: {frame[col].iloc[row]!r} is not one of {allowed}")
    for col in ("config_id", "gpu", "source"):
        bad = ~frame[col].map(lambda v: isinstance(v, str) and v != "")
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            raise SchemaError(f"{where}: row {row} field {col!r}: must be a non-empty string, "
                              f"got {frame[col].iloc[row]!r}")
    for op, cols in OP_CONFIG_COLUMNS.items():
        rows = frame.index[frame["op"].to_numpy() == op]
        if len(rows) == 0:
            continue
        sub = frame.loc[rows]
        for col in cols:
            _check_config_column(sub[col], col, op, where, frame.index.get_indexer(rows))
    ok = frame["status"].to_numpy() == "ok"
    for col in _TIMES:
        values = pd.to_numeric(frame[col], errors="coerce").to_numpy(dtype=float)
        bad = ok & ~(np.isfinite(values) & (values > 0))
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise SchemaError(f"{where}: row {row} field {col!r}: ok rows need a finite time > 0, "
                              f"got {frame[col].iloc[row]!r}")
    reps = pd.to_numeric(frame["reps"], errors="coerce").to_numpy(dtype=float)
    bad = ok & ~(np.isfinite(reps) & (reps >= 1))
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise SchemaError(f"{where}: row {row} field 'reps': ok rows need reps >= 1, got {frame['reps'].iloc[row]!r}")
    _check_percentiles(frame, ok, where)
    for col in ("host_ms", "first_call_ms"):
        values = pd.to_numeric(frame[col], errors="coerce").to_numpy(dtype=float)
        bad = frame[col].notna().to_numpy() & ~(np.isfinite(values) & (values > 0))
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise SchemaError(f"{where}: row {row} field {col!r}: must be null or a finite time > 0, "
                              f"got {frame[col].iloc[row]!r}")
    _check_config_ids(frame, where)


def _check_percentiles(frame: pd.DataFrame, ok: np.ndarray, where: str) -> None:
    p20, p50, p80 = (pd.to_numeric(frame[c], errors="coerce").to_numpy(dtype=float)
                     for c in ("time_p20_ms", "time_ms", "time_p80_ms"))
    tol = 1e-9 * np.maximum(p50, 1e-12)
    bad = ok & ~((p20 <= p50 + tol) & (p50 <= p80 + tol))
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise SchemaError(f"{where}: row {row} fields 'time_p20_ms' <= 'time_ms' <= 'time_p80_ms' must hold, got "
                          f"{p20[row]!r}, {p50[row]!r}, {p80[row]!r}")


def _check_config_ids(frame: pd.DataFrame, where: str) -> None:
    """Every row's config_id must be the id of its config: resume and the train/test split rely on it."""
    for op, cols in OP_CONFIG_COLUMNS.items():
        rows = np.flatnonzero(frame["op"].to_numpy() == op)
        if len(rows) == 0:
            continue
        sub = frame.iloc[rows]
        unique = sub.drop_duplicates(subset=["config_id", *cols])
        expected = config_ids(op, unique)
        bad = np.flatnonzero(expected.to_numpy() != unique["config_id"].to_numpy())
        if len(bad):
            first = unique.index[bad[0]]
            row = int(frame.index.get_loc(first))
            raise SchemaError(f"{where}: row {row} field 'config_id': {frame['config_id'].iloc[row]!r} is not the id "
                              f"of its {op} config (expected {expected.iloc[bad[0]]!r})")


def _check_config_column(col: pd.Series, name: str, op: str, where: str, positions: np.ndarray) -> None:
    values = col.to_numpy(dtype=object)
    for pos, value in zip(positions, values):
        if name in BOOL_COLUMNS:
            good = isinstance(value, (bool, np.bool_))
        else:
            integral = (isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))) or (
                isinstance(value, (float, np.floating)) and math.isfinite(value) and float(value).is_integer())
            good = integral and (value >= 0 if name.startswith("pad_") else value >= 1)
        if not good:
            kind = "a bool" if name in BOOL_COLUMNS else ("an integer >= 0" if name.startswith("pad_")
                                                          else "an integer >= 1")
            raise SchemaError(f"{where}: row {int(pos)} field {name!r} ({op}): must be {kind}, got {value!r}")


def write_partition(frame: pd.DataFrame, root: str | os.PathLike, name: str,
                    metadata: Mapping | None = None) -> list[Path]:
    """Validate and write rows into ``root/gpu=<g>/op=<o>/<name>.parquet``, one file per (gpu, op), atomically.

    ``metadata`` (GPU, environment, flags, timing method, seed...) is stored as JSON in the Parquet
    key-value metadata of every file. An existing file of the same name is replaced as a whole.
    """
    frame = conform(frame)
    validate(frame, where=f"rows for {name!r}")
    written = []
    for (gpu, op), part in frame.groupby(["gpu", "op"], sort=True):
        directory = Path(root) / f"gpu={gpu}" / f"op={op}"
        written.append(write_file(part, directory / f"{name}.parquet", metadata))
    return written


def write_file(part: pd.DataFrame, path: Path, metadata: Mapping | None,
               arrow_schema: pa.Schema = ARROW_SCHEMA) -> Path:
    """Write validated rows' ``arrow_schema`` columns (not the partition columns: the path holds them) to ``path``
    (zstd), ``metadata`` as JSON, atomically; the collective table (``pipeline.collectives.schema``) shares it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.Table.from_pandas(part[arrow_schema.names], schema=arrow_schema, preserve_index=False)
    meta = dict(table.schema.metadata or {})
    meta.pop(b"pandas", None)
    meta[METADATA_KEY] = json.dumps(dict(metadata or {}), sort_keys=True, default=str).encode()
    table = table.replace_schema_metadata(meta)
    atomic_write_with(path, lambda tmp: pq.write_table(table, tmp, compression="zstd"))
    return path


COLLECTIVES_FOLDER = "collectives"
"""Folders of that name hold collective timings (``pipeline.collectives``), a table of their own: op readers skip
them."""


def dataset_files(root: str | os.PathLike) -> list[Path]:
    """Visible op-dataset Parquet files under ``root``: hidden temp files (names starting with '.' or '_') and
    ``collectives`` folders (another table) are skipped."""
    root = Path(root)
    if not root.exists():
        return []
    files = []
    for path in sorted(root.rglob("*.parquet")):
        rel = path.relative_to(root).parts
        if any(part.startswith((".", "_")) or part == COLLECTIVES_FOLDER for part in rel):
            continue
        files.append(path)
    return files


def read_file(path: str | os.PathLike) -> pd.DataFrame:
    """Read and validate one file; ``gpu`` and ``op`` come from its ``gpu=``/``op=`` path segments."""
    path = Path(path)
    parts = dict(seg.split("=", 1) for seg in path.parent.parts if "=" in seg)
    missing = [k for k in PARTITION_COLUMNS if k not in parts]
    if missing:
        raise SchemaError(f"{path}: not inside gpu=<label>/op=<op> folders (missing {missing})")
    try:
        table = pq.read_table(path)
    except Exception as exc:  # a torn or foreign file: name it
        raise SchemaError(f"{path}: unreadable Parquet file ({exc})") from exc
    missing = [f.name for f in ARROW_SCHEMA if f.name not in table.column_names]
    if set(missing) - set(OPTIONAL_COLUMNS):
        raise SchemaError(f"{path}: missing columns {missing}")
    for name in missing:
        table = table.append_column(ARROW_SCHEMA.field(name), pa.nulls(len(table), ARROW_SCHEMA.field(name).type))
    for field in ARROW_SCHEMA:
        actual = table.schema.field(field.name).type
        if actual != field.type and not (pa.types.is_null(actual)):
            raise SchemaError(f"{path}: field {field.name!r} has type {actual}, expected {field.type}")
    frame = table.select([f.name for f in ARROW_SCHEMA]).cast(ARROW_SCHEMA).to_pandas(types_mapper=_nullable_types)
    frame["gpu"] = parts["gpu"]
    frame["op"] = parts["op"]
    frame = frame[list(COLUMNS)]
    validate(frame, where=str(path))
    return frame


def _nullable_types(arrow_type: pa.DataType):
    if pa.types.is_int64(arrow_type):
        return pd.Int64Dtype()
    if pa.types.is_boolean(arrow_type):
        return pd.BooleanDtype()
    return None


def file_metadata(path: str | os.PathLike) -> dict:
    """The dataset-level metadata stored with a file (empty if none)."""
    meta = pq.read_schema(path).metadata or {}
    raw = meta.get(METADATA_KEY)
    return json.loads(raw) if raw else {}


def read_dataset(root: str | os.PathLike, ops: Iterable[str] | None = None, gpus: Iterable[str] | None = None,
                 status: str | None = None) -> pd.DataFrame:
    """Read every validated file under ``root`` (optionally only some ops/GPU labels/status) into one frame."""
    ops = None if ops is None else set(ops)
    gpus = None if gpus is None else set(gpus)
    if ops is not None:
        unknown = ops - set(OPS)
        if unknown:
            raise SchemaError(f"ops: unknown {sorted(unknown)}; allowed: {', '.join(OPS)}")
    frames = []
    for path in dataset_files(root):
        parts = dict(seg.split("=", 1) for seg in path.parent.parts if "=" in seg)
        if ops is not None and parts.get("op") not in ops:
            continue
        if gpus is not None and parts.get("gpu") not in gpus:
            continue
        frame = read_file(path)
        if status is not None:
            frame = frame[frame["status"] == status]
        frames.append(frame)
    if not frames:
        return conform(pd.DataFrame(columns=list(COLUMNS)))
    return pd.concat(frames, ignore_index=True)


def op_frame(frame: pd.DataFrame, op: str) -> pd.DataFrame:
    """Rows of one op with only its own config columns, as plain int/bool dtypes."""
    if op not in OP_CONFIG_COLUMNS:
        raise SchemaError(f"op: unknown op {op!r}; allowed: {', '.join(OPS)}")
    cols = OP_CONFIG_COLUMNS[op]
    sub = frame[frame["op"] == op]
    sub = sub[list(ID_COLUMNS + MEASUREMENT_COLUMNS) + list(cols)].copy()
    for col in cols:
        sub[col] = sub[col].astype(bool if col in BOOL_COLUMNS else np.int64)
    return sub.reset_index(drop=True)
