"""Validation of the prediction API's inputs: op configs, GPUs, precisions, phases and measured times.

Every check raises InputError (a ValueError) naming the field, the row where there are several, and what is
allowed. numpy, pandas and the light registry/features modules only.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from pipeline import gpus, schema
from pipeline.features import CONFIG_DEFAULTS
from pipeline.schema import BOOL_COLUMNS, OP_CONFIG_COLUMNS, PRECISIONS

OP_COLUMNS = OP_CONFIG_COLUMNS
# The PyTorch defaults of optional config fields, as the features module fills them (bools as bools).
DEFAULTS: dict[str, dict[str, Any]] = {
    op: {col: bool(v) if col in BOOL_COLUMNS else int(v) for col, v in fields.items()}
    for op, fields in CONFIG_DEFAULTS.items()
}
SHORTHANDS: dict[str, dict[str, tuple[str, str]]] = {
    "conv2d": {"kernel_size": ("kernel_h", "kernel_w"), "stride": ("stride_h", "stride_w"),
               "padding": ("pad_h", "pad_w"), "dilation": ("dilation_h", "dilation_w")},
}
PREDICT_PHASES = schema.PHASES + ("total",)
"""Phases a prediction can be asked for: the measured phases, and their sum ("total")."""
MAX_DIM = 2**31 - 1
_MISSING = object()


class InputError(ValueError):
    """Bad input to the prediction API; the message names the field and what is allowed."""


# ---------------------------------------------------------------------------------------- config handling

def check_op(op) -> str:
    """``op`` if the API knows it."""
    if op not in OP_COLUMNS:
        raise InputError(f"op: unknown op {op!r}; allowed: {', '.join(OP_COLUMNS)}")
    return op


def _where(row: int, single: bool) -> str:
    return "config" if single else f"config {row}"


def _int_values(op: str, name: str, raw: np.ndarray, rows: np.ndarray, minimum: int, single: bool) -> np.ndarray:
    """Validate integer dims (vectorised for numeric arrays) and return them as int64."""
    def fail(i: int, value, why: str):
        raise InputError(f"{_where(int(rows[i]), single)} field {name!r} ({op}): must be an integer >= {minimum}"
                         f"{why}, got {value!r}")

    kind = raw.dtype.kind
    if kind == "b":
        fail(0, raw[0].item(), " (not a bool)")
    if kind in "iu":
        values = raw.astype(np.int64, copy=False)
    elif kind == "f":
        bad = ~np.isfinite(raw)
        if bad.any():
            fail(int(np.argmax(bad)), raw[np.argmax(bad)].item(), " (not NaN or inf)")
        bad = raw != np.floor(raw)
        if bad.any():
            fail(int(np.argmax(bad)), raw[np.argmax(bad)].item(), " (a whole number)")
        bad = np.abs(raw) > MAX_DIM
        if bad.any():
            fail(int(np.argmax(bad)), raw[np.argmax(bad)].item(), f" and <= {MAX_DIM}")
        values = raw.astype(np.int64)
    elif kind == "O":
        values = np.empty(len(raw), dtype=np.int64)
        for i, v in enumerate(raw):
            if isinstance(v, (bool, np.bool_)):
                fail(i, v, " (not a bool)")
            if isinstance(v, (int, np.integer)):
                if abs(int(v)) > MAX_DIM:
                    fail(i, v, f" and <= {MAX_DIM}")
                values[i] = int(v)
            elif isinstance(v, (float, np.floating)):
                if not math.isfinite(v):
                    fail(i, v, " (not NaN or inf)")
                if v != math.floor(v):
                    fail(i, v, " (a whole number)")
                if abs(v) > MAX_DIM:
                    fail(i, v, f" and <= {MAX_DIM}")
                values[i] = int(v)
            elif v is None or v is pd.NA:
                fail(i, v, " (not null)")
            elif isinstance(v, (list, tuple, np.ndarray)):
                fail(i, v, f" (not a {type(v).__name__}; give several configs as a list of dicts or a DataFrame)")
            else:
                fail(i, v, f" (not a {type(v).__name__})")
    else:
        fail(0, raw[0].item() if hasattr(raw[0], "item") else raw[0], f" (not {raw.dtype})")
    bad = values < minimum
    if bad.any():
        fail(int(np.argmax(bad)), values[np.argmax(bad)].item(), "")
    bad = values > MAX_DIM
    if bad.any():
        fail(int(np.argmax(bad)), values[np.argmax(bad)].item(), f" and <= {MAX_DIM}")
    return values


def _bool_values(op: str, name: str, raw: np.ndarray, rows: np.ndarray, single: bool) -> np.ndarray:
    if raw.dtype.kind == "b":
        return raw.astype(bool)
    out = np.empty(len(raw), dtype=bool)
    for i, v in enumerate(raw):
        if isinstance(v, (bool, np.bool_)) or isinstance(v, (int, np.integer)) and v in (0, 1):
            out[i] = bool(v)
        else:
            raise InputError(f"{_where(int(rows[i]), single)} field {name!r} ({op}): must be a bool "
                             f"(True/False, or 0/1), got {v!r}")
    return out


def _raw_columns(op: str, configs) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], int, bool]:
    """{field: (values, present mask)}, the row count, and whether a single dict was given."""
    single = False
    if isinstance(configs, pd.Series):
        configs = configs.to_dict()
    if isinstance(configs, Mapping):
        configs, single = [configs], True
    if isinstance(configs, pd.DataFrame):
        n = len(configs)
        if not all(isinstance(c, str) for c in configs.columns):
            raise InputError(f"configs: column names must be strings, got {list(configs.columns)!r}")
        if configs.columns.duplicated().any():
            raise InputError(f"configs: duplicate columns {list(configs.columns[configs.columns.duplicated()])}")
        cols = {}
        for c in configs.columns:
            s = configs[c]
            if isinstance(s.dtype, pd.BooleanDtype):
                values = s.to_numpy(dtype=object, na_value=None) if s.isna().any() else s.to_numpy(dtype=bool)
            elif pd.api.types.is_extension_array_dtype(s.dtype) and pd.api.types.is_numeric_dtype(s.dtype):
                values = s.to_numpy(dtype=np.float64, na_value=np.nan)
            elif s.dtype.kind in "biuf":
                values = s.to_numpy()
            else:
                values = s.to_numpy(dtype=object)
            cols[c] = (values, np.ones(n, dtype=bool))
        return cols, n, False
    if isinstance(configs, (list, tuple)):
        for i, c in enumerate(configs):
            if not isinstance(c, Mapping):
                raise InputError(f"configs: item {i} must be a dict of config fields, got {type(c).__name__}")
        keys = list(dict.fromkeys(k for c in configs for k in c))
        cols = {}
        for k in keys:
            if not isinstance(k, str):
                raise InputError(f"configs: field names must be strings, got {k!r}")
            values = np.empty(len(configs), dtype=object)
            values[:] = [c.get(k, _MISSING) for c in configs]
            present = np.array([v is not _MISSING for v in values], dtype=bool)
            cols[k] = (values, present)
        return cols, len(configs), single
    raise InputError(f"configs: must be a dict, a list of dicts or a pandas DataFrame, got {type(configs).__name__}")


def _parse_fields(op: str, cols: dict, n: int, single: bool) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{given field: (validated values, present mask)}; unknown fields are refused."""
    canonical, shorthands = OP_COLUMNS[op], SHORTHANDS.get(op, {})
    allowed = list(canonical) + list(shorthands)
    unknown = [c for c in cols if c not in allowed]
    if unknown:
        raise InputError(f"configs: unknown field{'s' if len(unknown) > 1 else ''} {unknown} for {op}; "
                         f"allowed: {', '.join(allowed)}")
    parsed = {}
    for name, (raw, present) in cols.items():
        rows = np.flatnonzero(present)
        sub = raw[present] if not present.all() else raw
        target = shorthands[name][0] if name in shorthands else name
        if target in BOOL_COLUMNS:
            values = _bool_values(op, name, sub, rows, single)
        else:
            values = _int_values(op, name, sub, rows, 0 if target.startswith("pad_") else 1, single)
        if sub is not raw:  # some rows lack the field: place the values of those that have it
            full = np.zeros(n, dtype=values.dtype)
            full[present] = values
            values = full
        parsed[name] = (values, present)
    return parsed


def _column(op: str, col: str, parsed: dict, n: int, single: bool) -> np.ndarray:
    """One canonical column from its own field and its shorthands (which must agree), else its default."""
    sources = [col] + [s for s, pair in SHORTHANDS.get(op, {}).items() if col in pair]
    values, present = None, np.zeros(n, dtype=bool)
    for src in (s for s in sources if s in parsed):
        v, p = parsed[src]
        if values is None:
            values, present = v, p
            continue
        clash = present & p & (values != v)
        if clash.any():
            i = int(np.argmax(clash))
            raise InputError(f"{_where(i, single)} field {col!r} ({op}): conflicting values {values[i].item()!r} "
                             f"and {v[i].item()!r} from {sources[0]!r} / {src!r}; give one of them")
        values = np.where(present, values, v)
        present = present | p
    if not present.all():
        if col not in DEFAULTS[op]:
            i = int(np.argmin(present))
            hint = f" (or {sources[1]!r})" if len(sources) > 1 else ""
            required = [c for c in OP_COLUMNS[op] if c not in DEFAULTS[op]]
            raise InputError(f"{_where(i, single)}: missing field {col!r}{hint} for {op}; required: "
                             f"{', '.join(required)}")
        default = DEFAULTS[op][col]
        values = np.full(n, default) if values is None else np.where(present, values, default)
    if values is None:  # no configs at all
        values = np.zeros(0)
    return values.astype(bool if col in BOOL_COLUMNS else np.int64, copy=False)


def normalize_configs(op: str, configs) -> pd.DataFrame:
    """Validate ``configs`` and return a DataFrame of exactly the op's canonical columns (int64 / bool),
    with defaults filled in and shorthands expanded. Raises InputError naming the row and field."""
    op = check_op(op)
    cols, n, single = _raw_columns(op, configs)
    parsed = _parse_fields(op, cols, n, single)
    frame = pd.DataFrame({col: _column(op, col, parsed, n, single) for col in OP_COLUMNS[op]},
                         columns=list(OP_COLUMNS[op]))
    if op == "conv2d" and n:
        _check_conv2d(frame, single)
    return frame


def _check_conv2d(frame: pd.DataFrame, single: bool) -> None:
    g = frame["groups"].to_numpy()
    for col in ("in_channels", "out_channels"):
        bad = frame[col].to_numpy() % g != 0
        if bad.any():
            i = int(np.argmax(bad))
            raise InputError(f"{_where(i, single)} field 'groups' (conv2d): must divide {col} "
                             f"({frame[col].iloc[i]}), got {g[i]}")
    for side, size in (("h", "height"), ("w", "width")):
        span = frame[f"dilation_{side}"].to_numpy() * (frame[f"kernel_{side}"].to_numpy() - 1) + 1
        padded = frame[size].to_numpy() + 2 * frame[f"pad_{side}"].to_numpy()
        bad = span > padded
        if bad.any():
            i = int(np.argmax(bad))
            raise InputError(f"{_where(i, single)} field 'kernel_{side}' (conv2d): the dilated kernel ({span[i]}) "
                             f"must fit the padded input ({size} + 2*pad_{side} = {padded[i]})")


# ------------------------------------------------------------------------------------------- other inputs

def resolve_gpu(value, field: str = "gpu") -> dict:
    """The registry spec of a GPU name/alias or spec dict; InputError naming ``field`` otherwise."""
    if not isinstance(value, (str, Mapping)):
        raise InputError(f"{field}: must be a GPU name or a spec dict, got {type(value).__name__}")
    try:
        return gpus.gpu_spec(value)
    except (ValueError, TypeError) as exc:
        raise InputError(f"{field}: {exc}") from None


def resolve_precision(value, field: str = "precision") -> str:
    """The canonical precision of ``value`` in any case or by a common alias ("BF16", "bfloat16", "half")."""
    try:
        return schema.normalize_precision(value, field)
    except ValueError as exc:
        raise InputError(str(exc)) from None


def check_precision(precision, specs: list[tuple[str, dict]]) -> str:
    """The canonical precision, refused where a GPU of ``specs`` ((field, spec) pairs) has no path for it."""
    precision = resolve_precision(precision)
    for field, spec in specs:
        if not gpus.supports_precision(spec, precision):
            ok = [p for p in PRECISIONS if gpus.supports_precision(spec, p)]
            raise InputError(f"precision: {spec['name']} ({field}) cannot run {precision} (no {precision} path); "
                             f"it supports: {', '.join(ok)}")
    return precision


def check_phase(phase) -> str:
    """``phase`` if it is one of PREDICT_PHASES."""
    if phase not in PREDICT_PHASES:
        raise InputError(f"phase: unknown phase {phase!r}; allowed: {', '.join(PREDICT_PHASES)}")
    return phase


def check_flag(value, field: str) -> bool:
    """``value`` if it is a bool (True/False); InputError naming ``field`` otherwise."""
    if not isinstance(value, (bool, np.bool_)):
        raise InputError(f"{field}: must be True or False, got {value!r}")
    return bool(value)


def check_measured(measured_ms, n: int) -> np.ndarray:
    """Measured times as a float64 array of ``n``: one positive number for all, or one per config."""
    if isinstance(measured_ms, (bool, np.bool_, str, bytes)):
        raise InputError(f"measured_ms: must be a positive number or an array of {n}, got {measured_ms!r}")
    if isinstance(measured_ms, numbers.Real):
        values = np.full(n, float(measured_ms))
    else:
        try:
            arr = np.asarray(measured_ms)
        except Exception as exc:  # ragged or odd input: name it
            raise InputError(f"measured_ms: must be a positive number or an array of {n} ({exc})") from None
        if arr.dtype.kind == "b" or arr.dtype.kind not in "iuf" or arr.ndim != 1:
            raise InputError(f"measured_ms: must be a positive number or a 1-D numeric array of {n}, got "
                             f"{arr.dtype} with shape {arr.shape}")
        if len(arr) != n:
            raise InputError(f"measured_ms: has {len(arr)} values but configs has {n}; give one per config "
                             "or a single number")
        values = arr.astype(np.float64)
    bad = ~(np.isfinite(values) & (values > 0))
    if bad.any():
        i = int(np.argmax(bad))
        where = f" at index {i}" if n > 1 else ""
        raise InputError(f"measured_ms: must be finite and > 0, got {float(values[i])!r}{where}")
    return values


def check_weights(weights) -> list[float]:
    """``weights`` as floats, each a real number in [0, 1] (the share of the measurement that carries over)."""
    if isinstance(weights, (str, bytes, Mapping, set, frozenset)) or np.ndim(weights) == 0:
        raise InputError(f"weights: must be a list of numbers in [0, 1], got {type(weights).__name__}")
    out = []
    for w in weights:
        if isinstance(w, (bool, np.bool_)) or not isinstance(w, (int, float, np.integer, np.floating)) \
                or not 0.0 <= float(w) <= 1.0:
            raise InputError(f"weights: each must be a number in [0, 1], got {w!r}")
        out.append(float(w))
    if not out:
        raise InputError("weights: give at least one weight (1.0 is Habitat's ratio)")
    return out
