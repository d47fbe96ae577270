"""The thin prediction API: load a published per-op scaler and predict op times on any GPU.

    from pipeline import load_scaler
    s = load_scaler("conv2d")                    # the champion under the repo's checkpoints/
    s = load_scaler("bmm", version=3)            # a given version (root=... for another folder)
    s.op, s.version, s.card                      # card: the published card.json as a dict
    ms = s.predict(configs, gpu, precision="fp32", phase="forward")
    ms = s.scale(configs, measured_ms, origin, dest, precision="fp32", phase="forward")

``configs`` is a dict, a list of dicts or a DataFrame with the op's config columns (``schema.OP_CONFIG_COLUMNS``);
``gpu``/``origin``/``dest`` a registry name or alias, or a spec dict (``gpus.gpu_spec``); ``precision`` one of
fp32, tf32, fp16, bf16; ``phase`` forward, backward or total (forward + backward). Results are float64 arrays of
milliseconds, one per config. ``scale`` is Habitat's ratio: ``measured * model(dest) / model(origin)``.

Defaults: conv2d ``stride=1, padding=0, dilation=1, groups=1, bias=True`` (per side), with the square
shorthands ``kernel_size, stride, padding, dilation`` expanding to their ``_h``/``_w`` columns; linear
``bias=True``; lstm ``num_layers=1, bidirectional=False, bias=True``. Anything else is required.

Bad input raises ValueError naming the field and what is allowed. Configs outside the training ranges (card
``ranges``, with a 5 % tolerance) are predicted but flagged: one UserWarning per call, or per-row flags with
``return_flags=True`` (then no warning).

Only numpy, pandas, safetensors and PyYAML (through ``gpus``) are imported here, never torch, Lightning, MLflow
or Hydra; the MLP runs as a vectorised numpy forward pass.
"""

from __future__ import annotations

import importlib
import math
import numbers
import warnings
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd

from pipeline import checkpoint, gpus
from pipeline.features import CONFIG_DEFAULTS
from pipeline.schema import BOOL_COLUMNS, OP_CONFIG_COLUMNS, PRECISIONS
from pipeline.schema import PHASES as SCHEMA_PHASES

__all__ = ["Scaler", "load_scaler", "normalize_configs", "resolve_gpu", "InputError", "DEFAULT_ROOT", "OP_COLUMNS",
           "DEFAULTS", "SHORTHANDS", "PRECISIONS", "PHASES", "RANGE_TOLERANCE"]

DEFAULT_ROOT = Path(__file__).resolve().parent.parent / "checkpoints"

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
PHASES = SCHEMA_PHASES + ("total",)
RANGE_TOLERANCE = 0.05
"""A feature counts as out of range beyond ``[min, max]`` widened by this fraction of ``max - min``."""
MAX_DIM = 2**31 - 1
_CHUNK = 1 << 11
_ROWS_PER_PASS = 1 << 16
_MISSING = object()


class InputError(ValueError):
    """Bad input to the prediction API; the message names the field and what is allowed."""


# ---------------------------------------------------------------------------------------- config handling

def _check_op(op) -> str:
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
        values = raw.astype(np.int64)
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
        if isinstance(v, (bool, np.bool_)):
            out[i] = bool(v)
        elif isinstance(v, (int, np.integer)) and v in (0, 1):
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


def normalize_configs(op: str, configs) -> pd.DataFrame:
    """Validate ``configs`` and return a DataFrame of exactly the op's canonical columns (int64 / bool),
    with defaults filled in and shorthands expanded. Raises InputError naming the row and field."""
    op = _check_op(op)
    cols, n, single = _raw_columns(op, configs)
    canonical = OP_COLUMNS[op]
    shorthands = SHORTHANDS.get(op, {})
    allowed = list(canonical) + list(shorthands)
    unknown = [c for c in cols if c not in allowed]
    if unknown:
        raise InputError(f"configs: unknown field{'s' if len(unknown) > 1 else ''} {unknown} for {op}; "
                         f"allowed: {', '.join(allowed)}")
    parsed: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name, (raw, present) in cols.items():
        rows = np.flatnonzero(present)
        sub = raw[present] if not present.all() else raw
        target = shorthands[name][0] if name in shorthands else name
        if target in BOOL_COLUMNS:
            values = _bool_values(op, name, sub, rows, single)
        else:
            minimum = 0 if target.startswith("pad_") else 1
            values = _int_values(op, name, sub, rows, minimum, single)
        full = np.zeros(n, dtype=values.dtype)
        full[present] = values
        parsed[name] = (full, present)
    out = {}
    for col in canonical:
        sources = [col] + [s for s, pair in shorthands.items() if col in pair]
        values, present = None, np.zeros(n, dtype=bool)
        for src in sources:
            if src not in parsed:
                continue
            v, p = parsed[src]
            if values is None:
                values, present = v.copy(), p.copy()
                continue
            clash = present & p & (values != v)
            if clash.any():
                i = int(np.argmax(clash))
                raise InputError(f"{_where(i, single)} field {col!r} ({op}): conflicting values "
                                 f"{values[i].item()!r} and {v[i].item()!r} from {sources[0]!r} / {src!r}; "
                                 "give one of them")
            values = np.where(present, values, v)
            present |= p
        if not present.all():
            if col in DEFAULTS[op]:
                default = DEFAULTS[op][col]
                if values is None:
                    values = np.full(n, default, dtype=bool if col in BOOL_COLUMNS else np.int64)
                else:
                    values = np.where(present, values, default)
            else:
                i = int(np.argmin(present))
                via = [s for s in sources if s != col]
                hint = f" (or {via[0]!r})" if via else ""
                required = [c for c in canonical if c not in DEFAULTS[op]]
                raise InputError(f"{_where(i, single)}: missing field {col!r}{hint} for {op}; required: "
                                 f"{', '.join(required)}")
        if values is None:  # no configs at all
            values = np.zeros(0)
        out[col] = values.astype(bool if col in BOOL_COLUMNS else np.int64)
    frame = pd.DataFrame(out, columns=list(canonical))
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
    return _gpu(field, value)


def _gpu(field: str, value) -> dict:
    if not isinstance(value, (str, Mapping)):
        raise InputError(f"{field}: must be a GPU name or a spec dict, got {type(value).__name__}")
    try:
        return gpus.gpu_spec(value)
    except (ValueError, TypeError) as exc:
        raise InputError(f"{field}: {exc}") from None


def _precision(precision, specs: list[tuple[str, dict]]) -> str:
    if precision not in PRECISIONS:
        raise InputError(f"precision: unknown precision {precision!r}; allowed: {', '.join(PRECISIONS)}")
    for field, spec in specs:
        if not gpus.supports_precision(spec, precision):
            ok = [p for p in PRECISIONS if gpus.supports_precision(spec, p)]
            raise InputError(f"precision: {spec['name']} ({field}) cannot run {precision} (no {precision} path); "
                             f"it supports: {', '.join(ok)}")
    return precision


def _phase(phase) -> str:
    if phase not in PHASES:
        raise InputError(f"phase: unknown phase {phase!r}; allowed: {', '.join(PHASES)}")
    return phase


def _measured(measured_ms, n: int) -> np.ndarray:
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


# ---------------------------------------------------------------------------------------------------- MLP

def _erf(x: np.ndarray) -> np.ndarray:
    """erf by Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7), in place-heavy numpy: numpy has no erf and scipy
    is not a dependency of the light API."""
    a = np.abs(x)
    e = np.multiply(a, a)
    np.negative(e, out=e)
    np.exp(e, out=e)
    t = np.multiply(a, np.float32(0.3275911), out=a)
    t += 1.0
    np.reciprocal(t, out=t)
    p = t * np.float32(1.061405429)
    for c in (-1.453152027, 1.421413741, -0.284496736, 0.254829592):
        p += np.float32(c)
        p *= t
    p *= e
    np.subtract(1.0, p, out=p)
    return np.copysign(p, x, out=p)


def _activate(x: np.ndarray, kind: str) -> np.ndarray:
    if kind == "relu":
        return np.maximum(x, 0, out=x)
    if kind == "gelu":  # exact (erf) GELU, torch.nn.GELU()'s default
        g = _erf(x * np.float32(1 / math.sqrt(2)))
        g += 1.0
        g *= x
        g *= np.float32(0.5)
        return g
    if kind == "silu":
        with np.errstate(over="ignore"):
            e = np.negative(x)
            np.exp(e, out=e)
            e += 1.0
            return np.divide(x, e, out=e)
    raise InputError(f"architecture.activation: {kind!r} is not one of {checkpoint.ACTIVATIONS}")


class _MLP:
    def __init__(self, card: dict, weights: dict[str, np.ndarray]):
        n = checkpoint.layer_count(weights)
        self.layers = [(np.ascontiguousarray(weights[f"layers.{i}.weight"].T, dtype=np.float32),
                        weights[f"layers.{i}.bias"].astype(np.float32)) for i in range(n)]
        if self.layers[-1][0].shape[1] != 1:
            raise InputError(f"weights: the last layer must have 1 output, got {self.layers[-1][0].shape[1]}")
        self.activation = card["architecture"]["activation"]
        self.mean = np.asarray(card["features"]["mean"], dtype=np.float32)
        self.inv_std = (1.0 / np.asarray(card["features"]["std"], dtype=np.float64)).astype(np.float32)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """Outputs (float64, one per row) for raw features ``x`` (n, F): standardise, then the layers in order.
        Runs in float32 over small row blocks, which keeps the temporaries in cache."""
        out = np.empty(len(x), dtype=np.float64)
        last = len(self.layers) - 1
        for start in range(0, len(x), _CHUNK):
            h = x[start:start + _CHUNK].astype(np.float32)
            h -= self.mean
            h *= self.inv_std
            for i, (w, b) in enumerate(self.layers):
                h = h @ w
                h += b
                if i < last:
                    h = _activate(h, self.activation)
            out[start:start + _CHUNK] = h[:, 0]
        return out


# ------------------------------------------------------------------------------------------------ Scaler

def _features_module():
    return importlib.import_module("pipeline.features")


class Scaler:
    """A loaded, verified per-op scaler. Build with ``load_scaler``."""

    def __init__(self, op: str, version: int, card: dict, weights: dict[str, np.ndarray]):
        self.op = op
        self.version = int(version)
        self.card = card
        self._mlp = _MLP(card, weights)
        self._features = _features_module()
        names = list(card["features"]["names"])
        expected = list(self._features.feature_names(op))
        if names != expected:
            raise InputError(f"checkpoint {op} v{version}: card features.names {names} differ from what "
                             f"pipeline.features builds for {op} {expected}; this checkpoint needs another "
                             "version of the code")
        built = getattr(self._features, "FEATURES_VERSION", None)
        wanted = card["target"].get("features_version")
        if wanted is not None and built is not None and wanted != built:
            raise InputError(f"checkpoint {op} v{version}: trained with features_version {wanted}, but "
                             f"pipeline.features is version {built}; this checkpoint needs another version of the "
                             "code")
        ranges = card.get("ranges") or {}
        lo = np.full(len(names), -np.inf)
        hi = np.full(len(names), np.inf)
        for j, name in enumerate(names):
            if name in ranges:
                a, b = (float(v) for v in ranges[name])
                slack = RANGE_TOLERANCE * (b - a)
                lo[j], hi[j] = a - slack, b + slack
        self._lo, self._hi = lo, hi
        self._names = names

    def __repr__(self) -> str:
        return f"Scaler(op={self.op!r}, version={self.version}, target={self.card['target'].get('kind')!r})"

    # -- one phase on one GPU: (ms, out-of-range flags), inputs already validated
    def _phase_ms(self, frame: pd.DataFrame, spec: dict, precision: str, phase: str):
        n = len(frame)
        ms = np.empty(n, dtype=np.float64)
        flags = np.empty(n, dtype=bool)
        for start in range(0, n, _ROWS_PER_PASS):
            part = frame.iloc[start:start + _ROWS_PER_PASS] if n > _ROWS_PER_PASS else frame
            stop = start + len(part)
            feats = np.asarray(self._features.build_features(self.op, part, spec, precision, phase),
                               dtype=np.float64)
            if feats.shape != (len(part), len(self._names)):
                raise RuntimeError(f"pipeline.features.build_features returned shape {feats.shape}, expected "
                                   f"{(len(part), len(self._names))}")
            flags[start:stop] = ((feats < self._lo) | (feats > self._hi)).any(axis=1)
            y = self._mlp(feats)
            ms[start:stop] = self._features.target_to_ms(self.op, self.card["target"]["kind"], y, part, spec,
                                                         precision, phase)
        return ms, flags

    def _model(self, frame, spec, precision, phase):
        if phase == "total":
            fwd, f1 = self._phase_ms(frame, spec, precision, "forward")
            bwd, f2 = self._phase_ms(frame, spec, precision, "backward")
            return fwd + bwd, f1 | f2
        return self._phase_ms(frame, spec, precision, phase)

    def _finish(self, ms, flags, return_flags: bool, gpu_text: str):
        if return_flags:
            return ms, flags
        if flags.any():
            warnings.warn(f"{self.op} v{self.version}: {int(flags.sum())} of {len(flags)} configs on {gpu_text} "
                          "fall outside the training ranges of the model's features; those predictions are "
                          "extrapolations (predict(..., return_flags=True) gives per-row flags)",
                          UserWarning, stacklevel=3)
        return ms

    def predict(self, configs, gpu, precision: str = "fp32", phase: str = "forward", *,
                return_flags: bool = False):
        """Predicted op time in ms (float64 array, one per config) of ``configs`` on ``gpu``.

        With ``return_flags=True`` returns ``(ms, flags)``: flags[i] is True where config i lies outside
        the training ranges (no warning then); otherwise one UserWarning is raised per call if any does.
        """
        frame = normalize_configs(self.op, configs)
        spec = _gpu("gpu", gpu)
        precision = _precision(precision, [("gpu", spec)])
        phase = _phase(phase)
        if len(frame) == 0:
            empty = np.zeros(0, dtype=np.float64)
            return (empty, np.zeros(0, dtype=bool)) if return_flags else empty
        ms, flags = self._model(frame, spec, precision, phase)
        return self._finish(ms, flags, return_flags, spec["name"])

    def scale(self, configs, measured_ms, origin, dest, precision: str = "fp32", phase: str = "forward", *,
              return_flags: bool = False):
        """Habitat-style scaling: ``measured_ms * model(dest) / model(origin)`` (float64 array of ms).

        ``measured_ms`` is one positive number (for every config) or an array with one per config.
        """
        frame = normalize_configs(self.op, configs)
        measured = _measured(measured_ms, len(frame))
        src = _gpu("origin", origin)
        dst = _gpu("dest", dest)
        precision = _precision(precision, [("origin", src), ("dest", dst)])
        phase = _phase(phase)
        if len(frame) == 0:
            empty = np.zeros(0, dtype=np.float64)
            return (empty, np.zeros(0, dtype=bool)) if return_flags else empty
        if src == dst:
            ms_o, flags = self._model(frame, src, precision, phase)
            return self._finish(measured.copy(), flags, return_flags, src["name"])
        ms_o, f_o = self._model(frame, src, precision, phase)
        ms_d, f_d = self._model(frame, dst, precision, phase)
        return self._finish(measured * (ms_d / ms_o), f_o | f_d, return_flags, f"{src['name']}/{dst['name']}")


def load_scaler(op: str, version: int | None = None, root=None) -> Scaler:
    """Load (and verify, by sha256) the published scaler of ``op``: ``version=None`` is the champion;
    ``root`` defaults to the repository's ``checkpoints/``."""
    op = _check_op(op)
    if version is not None and (isinstance(version, (bool, np.bool_)) or not isinstance(version, (int, np.integer))
                                or version < 1):
        raise InputError(f"version: must be an integer >= 1 or None (the champion), got {version!r}")
    root = DEFAULT_ROOT if root is None else Path(root)
    card, weights = checkpoint.load(root, op, None if version is None else int(version))
    return Scaler(op, card["version"], card, weights)
