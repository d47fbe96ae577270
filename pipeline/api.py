"""The thin prediction API: load a published per-op scaler and predict op times on any GPU.

    from pipeline import load_scaler
    s = load_scaler("conv2d")                    # the champion under the repo's checkpoints/
    s = load_scaler("bmm", version=3)            # a given version (root=... for another folder)
    s.op, s.version, s.card                      # card: the published card.json as a dict
    ms = s.predict(configs, gpu, precision="fp32", phase="forward")
    ms = s.scale(configs, measured_ms, origin, dest, precision="fp32", phase="forward")

``configs`` is a dict, a list of dicts or a DataFrame with the op's config columns (``schema.OP_CONFIG_COLUMNS``);
``gpu``/``origin``/``dest`` a registry name or alias, or a spec dict (``gpus.gpu_spec``); ``precision`` one of
fp32, tf32, fp16, bf16 (any case, or an alias such as bfloat16 or half); ``phase`` forward, backward or total
(forward + backward). Results are float64 arrays of milliseconds, one per config. ``scale`` is Habitat's ratio:
``measured * model(dest) / model(origin)``.

Defaults: conv2d ``stride=1, padding=0, dilation=1, groups=1, bias=True`` (per side), with the square
shorthands ``kernel_size, stride, padding, dilation`` expanding to their ``_h``/``_w`` columns; linear
``bias=True``; lstm ``num_layers=1, bidirectional=False, bias=True``. Anything else is required.

Bad input raises ValueError naming the field and what is allowed. Configs outside the training ranges (card
``ranges``, with a 5 % tolerance) are predicted but flagged: one UserWarning per call, or per-row flags with
``return_flags=True`` (then no warning).

Inputs are validated by ``pipeline.inputs``; the MLP runs in ``pipeline.mlp``, a vectorised numpy forward pass
and the only one: training metrics, the champion rules and the evaluation report predict through ``Scaler`` too.
Only numpy, pandas, safetensors and PyYAML (through ``gpus``) are imported, never torch, Lightning, MLflow or Hydra.
"""

from __future__ import annotations

import importlib
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline import checkpoint
from pipeline.inputs import (DEFAULTS, OP_COLUMNS, PREDICT_PHASES, SHORTHANDS, InputError, check_measured,
                             check_op, check_phase, check_precision, normalize_configs, resolve_gpu,
                             resolve_precision)
from pipeline.mlp import MLP
from pipeline.schema import PRECISIONS

__all__ = ["Scaler", "load_scaler", "normalize_configs", "resolve_gpu", "resolve_precision", "InputError",
           "DEFAULT_ROOT", "OP_COLUMNS", "DEFAULTS", "SHORTHANDS", "PRECISIONS", "PREDICT_PHASES", "RANGE_TOLERANCE"]

DEFAULT_ROOT = Path(__file__).resolve().parent.parent / "checkpoints"
RANGE_TOLERANCE = 0.05
"""A feature counts as out of range beyond ``[min, max]`` widened by this fraction of ``max - min``."""
_ROWS_PER_PASS = 1 << 16


def _features_module():
    return importlib.import_module("pipeline.features")


class Scaler:
    """A loaded, verified per-op scaler. Build with ``load_scaler``."""

    def __init__(self, op: str, version: int, card: dict, weights: dict[str, np.ndarray]):
        self.op = op
        self.version = int(version)
        self.card = card
        self._mlp = MLP(card, weights)
        self._features = _features_module()
        names = list(card["features"]["names"])
        expected = list(self._features.feature_names(op))
        if names != expected:
            raise InputError(f"checkpoint {op} v{version}: card features.names {names} differ from what "
                             f"pipeline.features builds for {op} {expected}; this checkpoint needs another "
                             "version of the code")
        kind = card["target"].get("kind")
        if kind not in self._features.TARGET_KINDS:
            raise InputError(f"checkpoint {op} v{version}: target kind {kind!r} is not one pipeline.features "
                             f"inverts ({', '.join(self._features.TARGET_KINDS)}); this checkpoint needs another "
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
        spec = resolve_gpu(gpu, "gpu")
        precision = check_precision(precision, [("gpu", spec)])
        phase = check_phase(phase)
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
        measured = check_measured(measured_ms, len(frame))
        src = resolve_gpu(origin, "origin")
        dst = resolve_gpu(dest, "dest")
        precision = check_precision(precision, [("origin", src), ("dest", dst)])
        phase = check_phase(phase)
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
    op = check_op(op)
    if version is not None and (isinstance(version, (bool, np.bool_)) or not isinstance(version, (int, np.integer))
                                or version < 1):
        raise InputError(f"version: must be an integer >= 1 or None (the champion), got {version!r}")
    root = DEFAULT_ROOT if root is None else Path(root)
    card, weights = checkpoint.load(root, op, None if version is None else int(version))
    return Scaler(op, card["version"], card, weights)
