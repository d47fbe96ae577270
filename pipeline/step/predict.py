"""Predict each op of a traced step on another GPU: per-op scalers for conv2d/linear/bmm/lstm, wave scaling else.

``predict_trace(ops, origin, dest)`` adds ``pred_ms``, ``method`` and ``note`` per row. conv2d/linear/bmm/lstm
rows use the published per-op scaler (``pipeline.load_scaler(op)``), with the scaler phase of column
``scaler_phase``: ``backward`` for rows that are a whole backward of the op (``convolution_backward``, the rnn
backward, a module's backward from a node table), ``forward`` for forward-type kernels -- including the GEMMs and
bmm's that run in the backward pass, which are scaled as the GEMM they are, with their own shapes. All ``other``
ops use wave scaling (``pipeline.step.wave``).

How a scaler row becomes a destination time (``scaler_mode``, ``SCALER_MODES``): ``calibrated`` (default) is the
scaler's ``transfer``, ``model(dest) * (measured / model(origin)) ** w`` with the weight its card was calibrated
to (``pipeline.transfer``); ``direct`` is its prediction for the destination, ``predict(config, dest)`` (w = 0);
``ratio`` is Habitat's ``measured * model(dest) / model(origin)`` (``scale``, w = 1). In every mode a row on its
own GPU keeps its measured time. The full ratio carries the model's error on the origin into every destination,
and on GPUs it never saw that error is mostly the GPU's own level, which says nothing about another GPU: on
NeuSight's BERT-Large/GPT-2-Large steps the ratio errs about twice as much off the diagonal as the direct
prediction (reports/label_validation.md; why: reports/model_experiments.md, section 11).

A published scaler that cannot be used -- missing, failing its checksum, built for other features -- stops the
prediction with that error: a silent switch to the (much less accurate) wave scaling would pass off a broken
install as a prediction. ``fallback="wave"`` opts into wave scaling for those rows instead (``note`` says why);
``scalers=False`` uses wave scaling for every row. numpy/pandas only.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline import api, gpus
from pipeline.api import InputError
from pipeline.checkpoint import CheckpointError, ChecksumError
from pipeline.schema import BOOL_COLUMNS, OP_CONFIG_COLUMNS, PHASES
from pipeline.step import wave
from pipeline.step.classify import OP_KINDS, SCALED_KINDS, fill_blocks

__all__ = ["predict_trace", "resolve_origin", "published_scaler", "clear_scaler_cache", "FALLBACKS",
           "SCALER_MODES", "SCALER_LOAD_ERRORS"]

FALLBACKS = ("error", "wave")
SCALER_MODES = ("calibrated", "direct", "ratio")
"""How a scaler row is predicted: the card's calibrated ``transfer``, ``predict(dest)``, or Habitat's ``scale``."""
_MODE_METHOD = {"calibrated": "transfer", "direct": "predict", "ratio": "scale"}
SCALER_LOAD_ERRORS = (CheckpointError, ChecksumError, InputError)
"""Why a published scaler cannot be loaded: no such checkpoint, a modified file, features of another version."""

_SCALER_CACHE: dict[tuple[str, str], Any] = {}


def resolve_origin(origin):
    """Check that ``origin`` names a GPU; a CPU origin is refused with the way out."""
    if origin is None:
        raise ValueError("origin: the device this trace was measured on is not in the GPU registry; pass "
                         "origin=<registry name or spec dict>")
    if isinstance(origin, str) and origin.strip().lower() == "cpu":
        raise ValueError("origin: this trace was measured on a CPU. Scaling CPU op times to a GPU is not "
                         "meaningful (wave scaling and the scalers' transfer carry measured GPU times to another "
                         "GPU). Track on a GPU, or -- for a demo only -- pass origin='<gpu>' (CLI: --origin-gpu) to "
                         "treat the CPU times as if measured on that GPU.")
    return origin


def clear_scaler_cache() -> None:
    """Forget loaded scalers, e.g. after publishing a new checkpoint."""
    _SCALER_CACHE.clear()


def published_scaler(op: str, root=None):
    """``pipeline.load_scaler(op, root=root)``, cached per process; raises ``SCALER_LOAD_ERRORS``."""
    root = Path(api.DEFAULT_ROOT if root is None else root)
    key = (op, str(root.resolve()))
    if key not in _SCALER_CACHE:
        _SCALER_CACHE[key] = api.load_scaler(op, root=root)
    return _SCALER_CACHE[key]


def _scaler_for(op: str, scalers, root, fallback: str) -> tuple[Any, str]:
    """(scaler or None, why not) for the rows of ``op``."""
    if scalers is False:
        return None, "scalers disabled"
    if scalers is not None:
        given = scalers.get(op)
        return (given, "") if given is not None else (None, f"no {op} scaler given")
    try:
        return published_scaler(op, root), ""
    except SCALER_LOAD_ERRORS as exc:
        if fallback == "wave":
            return None, f"no usable published {op} scaler ({type(exc).__name__}: {str(exc)[:160]})"
        exc.add_note(f"predict_trace: the published {op} scaler cannot be used. Fix or retrain it (make train "
                     f"OP={op}), or pass fallback='wave' (CLI: --scaler-fallback wave) to wave-scale its rows, "
                     "or scalers=False (CLI: --no-scalers) to wave-scale every row.")
        raise


def _accepts_flags(method) -> bool:
    try:
        params = inspect.signature(method).parameters
    except (TypeError, ValueError):  # no introspectable signature
        return False
    return "return_flags" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _call_scaler(scaler, mode: str, cfg: pd.DataFrame, measured: np.ndarray, origin, dest, precision: str,
                 phase: str):
    """The destination time of each config under ``mode`` -> (ms, out-of-range flags or None); on the origin
    itself, the measurement in every mode."""
    if origin == dest:
        return np.asarray(measured, dtype=float).copy(), None
    method = getattr(scaler, _MODE_METHOD[mode])
    args = (cfg, dest) if mode == "direct" else (cfg, measured, origin, dest)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # out-of-range configs: reported per row in ``note`` instead
        if not _accepts_flags(method):
            return np.asarray(method(*args, precision=precision, phase=phase), dtype=float), None
        ms, flags = method(*args, precision=precision, phase=phase, return_flags=True)
    return np.asarray(ms, dtype=float), np.asarray(flags, dtype=bool)


@dataclass
class _Rows:
    """The columns predict_trace reads, as arrays, and the three it writes."""

    frame: pd.DataFrame
    kind: np.ndarray
    time_ms: np.ndarray
    precision: np.ndarray
    scaler_phase: np.ndarray
    pred: np.ndarray
    method: np.ndarray
    note: np.ndarray

    def numeric(self, name: str) -> np.ndarray:
        if name in self.frame:
            return pd.to_numeric(self.frame[name], errors="coerce").to_numpy(dtype=float)
        return np.full(len(self.frame), np.nan)


def _read(ops: pd.DataFrame) -> _Rows:
    if "op" not in ops or "time_ms" not in ops:
        raise ValueError("ops: needs the columns 'op' and 'time_ms' (see pipeline.step.TRACE_COLUMNS)")
    out = ops.copy().reset_index(drop=True)
    n = len(out)
    kind = out["op"].astype(str).to_numpy()
    bad = sorted(set(kind) - set(OP_KINDS))
    if bad:
        raise ValueError(f"ops: unknown op kinds {bad}; allowed: {', '.join(OP_KINDS)}")
    phase = out["phase"].astype(str).to_numpy() if "phase" in out else np.full(n, "forward", dtype=object)
    given = (out["scaler_phase"].where(out["scaler_phase"].notna(), None).to_numpy(dtype=object)
             if "scaler_phase" in out else np.full(n, None, dtype=object))
    sphase = np.array([s if s in PHASES else ("backward" if p == "backward" else "forward")
                       for s, p in zip(given, phase)], dtype=object)
    prec = out["precision"].astype(str).to_numpy() if "precision" in out else np.full(n, "fp32", dtype=object)
    return _Rows(frame=out, kind=kind, time_ms=pd.to_numeric(out["time_ms"], errors="coerce").to_numpy(dtype=float),
                 precision=prec, scaler_phase=sphase, pred=np.full(n, np.nan),
                 method=np.full(n, "", dtype=object), note=np.full(n, "", dtype=object))


def _mark_unsupported(rows: _Rows, ospec: dict, dspec: dict) -> np.ndarray:
    """Rows whose precision a GPU cannot run get NaN and ``unsupported``; returns the supported mask."""
    why_not: dict[str, str] = {}
    for p in set(rows.precision):
        if p not in gpus.PRECISIONS:
            why_not[p] = f"unknown precision {p!r}"
        elif not gpus.supports_precision(ospec, p):
            why_not[p] = f"{p} has no path on {ospec['name']}"
        elif not gpus.supports_precision(dspec, p):
            why_not[p] = f"{p} has no path on {dspec['name']}"
    supported = np.array([p not in why_not for p in rows.precision], dtype=bool)
    rows.method[~supported] = "unsupported"
    rows.note[~supported] = [why_not[p] for p in rows.precision[~supported]]
    return supported


def _scale_kind(rows: _Rows, op: str, todo: np.ndarray, scaler, ospec, dspec, fallback: str, mode: str) -> None:
    """Scale the rows of ``op`` in ``todo`` with ``scaler`` under ``mode``, one call per (precision, scaler phase)."""
    cols = list(OP_CONFIG_COLUMNS[op])
    missing = [c for c in cols if c not in rows.frame]
    if missing:
        rows.note[todo] = f"no config columns {missing}"
        return
    for (p, ph), idx in pd.Series(np.flatnonzero(todo)).groupby([rows.precision[todo], rows.scaler_phase[todo]]):
        idx = idx.to_numpy()
        cfg = rows.frame.loc[idx, cols]
        if cfg.isna().any().any():
            rows.note[idx] = f"{op}: incomplete config columns"
            continue
        cfg = cfg.astype({c: (bool if c in BOOL_COLUMNS else np.int64) for c in cols}).reset_index(drop=True)
        try:
            ms, flags = _call_scaler(scaler, mode, cfg, rows.time_ms[idx], ospec, dspec, p, ph)
        except InputError as exc:
            if fallback != "wave":
                exc.add_note(f"predict_trace: the {op} scaler refused {len(idx)} {p} {ph} rows; pass "
                             "fallback='wave' to wave-scale them")
                raise
            rows.note[idx] = f"{op} scaler refused the rows ({str(exc)[:120]})"
            continue
        ok = np.isfinite(ms) & (ms > 0)
        rows.pred[idx[ok]] = ms[ok]
        rows.method[idx[ok]] = "scaler"
        if flags is not None:
            rows.note[idx[ok & flags]] = "outside the scaler's training ranges"
        rows.note[idx[~ok]] = f"{op} scaler gave no finite positive time"


def _check_mode(op: str, scaler, mode: str) -> None:
    """A scaler that cannot serve ``mode``: TypeError without its method; InputError for ``calibrated`` with a
    published scaler whose card has no calibrated ratio weight."""
    if scaler is None:
        return
    needed = _MODE_METHOD[mode]
    if not callable(getattr(scaler, needed, None)):
        raise TypeError(f"scalers: the {op} scaler has no {needed}() method, which scaler_mode={mode!r} uses; "
                        f"allowed modes: {', '.join(SCALER_MODES)}")
    if mode == "calibrated" and isinstance(scaler, api.Scaler) and scaler.ratio_weight is None:
        raise InputError(f"scaler_mode='calibrated': {op} v{scaler.version} has no calibrated ratio weight in its "
                         f"card (card transfer.ratio_weight); pass scaler_mode='direct' or 'ratio', or recalibrate "
                         f"it (make train OP={op} ARGS='recalibrate=true')")


def predict_trace(ops: pd.DataFrame, origin, dest, *, scalers: Mapping | bool | None = None,
                  fallback: str = "error", scaler_root=None, scaler_mode: str = "calibrated", wave_mode: str = "gamma",
                  compute: str = "peak", launch_ms: float = wave.LAUNCH_BOUND_MS) -> pd.DataFrame:
    """Predict each op of ``ops`` (measured on ``origin``) on ``dest``: a copy with ``pred_ms``, ``method`` and
    ``note``.

    ``ops`` needs ``op`` and ``time_ms``; optional: ``phase`` (forward), ``scaler_phase`` (its phase, optimizer
    -> forward), ``precision`` (fp32), ``flops``, ``bytes``, ``blocks`` (or ``elements``), ``tensor_core``,
    ``count`` (weight of the row in totals) and the canonical config columns of conv2d/linear/bmm/lstm rows
    (``TRACE_COLUMNS``). ``origin``/``dest``: registry names or spec dicts.

    ``scalers``: ``None`` loads the published scalers (``pipeline.load_scaler``, from ``scaler_root`` if
    given); ``False`` uses wave scaling only; a mapping ``{op: scaler}`` injects scaler objects (anything with
    the method ``scaler_mode`` uses: ``.transfer(configs, measured_ms, origin, dest, precision=, phase=)`` for
    ``calibrated``, ``.predict(configs, gpu, precision=, phase=)`` for ``direct``, ``.scale`` -- as ``transfer`` --
    for ``ratio``), and an op it lacks is wave-scaled.
    ``scaler_mode``: ``calibrated``, ``direct`` or ``ratio`` (``SCALER_MODES``; see the module docstring).
    ``fallback``: ``"error"`` (default) raises when a published scaler cannot be loaded (``SCALER_LOAD_ERRORS``)
    or refuses its rows; ``"wave"`` wave-scales those rows and says why in ``note``.
    ``method``: ``scaler`` or a ``pipeline.step.wave`` rule (``wave-launch``, ``wave-bandwidth``,
    ``wave-gamma``, ``wave-memory``, ``wave-compute``), ``unsupported`` (NaN: the precision has no path on a
    GPU), ``zero`` (a 0 ms op).
    """
    if fallback not in FALLBACKS:
        raise ValueError(f"fallback: {fallback!r} is not one of {', '.join(FALLBACKS)}")
    if scaler_mode not in SCALER_MODES:
        raise ValueError(f"scaler_mode: {scaler_mode!r} is not one of {', '.join(SCALER_MODES)}")
    ospec, dspec = gpus.gpu_spec(resolve_origin(origin)), gpus.gpu_spec(dest)
    rows = _read(ops)
    t = rows.time_ms
    supported = _mark_unsupported(rows, ospec, dspec)
    zero = supported & ~(t > 0)
    rows.pred[zero] = np.where(np.isfinite(t[zero]), t[zero], 0.0)
    rows.method[zero] = "zero"
    todo = supported & (t > 0)
    for op in SCALED_KINDS:
        mine = todo & (rows.kind == op)
        if mine.any():
            scaler, why = _scaler_for(op, scalers, scaler_root, fallback)
            _check_mode(op, scaler, scaler_mode)
            if scaler is None:
                rows.note[mine] = why
            else:
                _scale_kind(rows, op, mine, scaler, ospec, dspec, fallback, scaler_mode)
    rest = todo & (rows.method == "")
    if rest.any():
        tc = (rows.frame["tensor_core"].fillna(False).astype(bool).to_numpy() if "tensor_core" in rows.frame
              else np.isin(rows.kind, SCALED_KINDS) & (rows.precision != "fp32"))
        rows.pred[rest], rows.method[rest] = wave.scale_other(
            t[rest], rows.numeric("flops")[rest], rows.numeric("bytes")[rest], ospec, dspec, rows.precision[rest],
            blocks=fill_blocks(rows.frame)[rest], tensor_core=tc[rest], mode=wave_mode, compute=compute,
            launch_ms=launch_ms)
    out = rows.frame
    out["pred_ms"], out["method"], out["note"] = rows.pred, rows.method, rows.note
    return out
