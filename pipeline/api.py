"""The thin prediction API: load a published per-op scaler and predict op times on any GPU.

    from pipeline import load_scaler
    s = load_scaler("conv2d")                    # the champion under the repo's checkpoints/
    s = load_scaler("bmm", version=3)            # a given version (root=... for another folder)
    s.op, s.version, s.card                      # card: the published card.json as a dict
    ms = s.predict(configs, gpu, precision="fp32", phase="forward")
    ms = s.scale(configs, measured_ms, origin, dest, precision="fp32", phase="forward")
    ms = s.transfer(configs, measured_ms, origin, dest, precision="fp32", phase="forward")
    [(ms, flags), ...] = s.carry(configs, measured_ms, origin, [dest, ...], weights=[1.0, s.ratio_weight])

``configs`` is a dict, a list of dicts or a DataFrame with the op's config columns (``schema.OP_CONFIG_COLUMNS``);
``gpu``/``origin``/``dest`` a registry name or alias, or a spec dict (``gpus.gpu_spec``); ``precision`` one of
fp32, tf32, fp16, bf16 (any case, or an alias such as bfloat16 or half); ``phase`` forward, backward or total
(forward + backward). Results are float64 arrays of milliseconds, one per config. ``scale`` is Habitat's ratio:
``measured * model(dest) / model(origin)``. ``transfer`` keeps only the share of the origin's measurement that the
card's calibration found to carry over to other GPUs: ``model(dest) * (measured / model(origin)) ** w`` with
``w = card["transfer"]["ratio_weight"]`` (``pipeline.transfer``; 0 is ``predict(dest)``, 1 is ``scale``).

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
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline import checkpoint, intervals, targets, transfer
from pipeline.inputs import (
    DEFAULTS,
    OP_COLUMNS,
    PREDICT_PHASES,
    SHORTHANDS,
    InputError,
    check_flag,
    check_measured,
    check_op,
    check_phase,
    check_precision,
    check_weights,
    normalize_configs,
    resolve_gpu,
    resolve_precision,
)
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

    def __init__(self, op: str, version: int, card: dict, weights: dict[str, np.ndarray],
                 members: int | None = None):
        self.op = op
        self.version = int(version)
        self.card = card
        self._features = _features_module()
        wanted = card["target"].get("features_version")
        have = self._features.features_version(op)
        if wanted is not None and wanted != have:
            raise InputError(f"checkpoint {op} v{version}: trained with features_version {wanted}, but "
                             f"pipeline.features builds version {have} for {op}; this checkpoint "
                             "needs another version of the code")
        names = list(card["features"]["names"])
        expected = list(self._features.feature_names(op))
        if names != expected:
            raise InputError(f"checkpoint {op} v{version}: card features.names {names} differ from what "
                             f"pipeline.features builds for {op} {expected}; this checkpoint needs another "
                             "version of the code")
        kind = card["target"].get("kind")
        if kind not in targets.TARGET_KINDS:
            raise InputError(f"checkpoint {op} v{version}: target kind {kind!r} is not one pipeline.targets "
                             f"inverts ({', '.join(targets.TARGET_KINDS)}); this checkpoint needs another "
                             "version of the code")
        try:
            self._mlp = MLP(card, weights, members)
        except InputError as err:
            raise InputError(f"checkpoint {op} v{version}: {err}") from None
        self._kind = kind
        ranges = card.get("ranges") or {}
        lo = np.full(len(names), -np.inf)
        hi = np.full(len(names), np.inf)
        for j, name in enumerate(names):
            if name in ranges:
                a, b = (float(v) for v in ranges[name])
                slack = RANGE_TOLERANCE * (b - a)
                lo[j], hi[j] = a - slack, b + slack
        self._lo, self._hi = lo, hi
        self._seen = set((card.get("training_data") or {}).get("gpus") or [])

    def __repr__(self) -> str:
        return f"Scaler(op={self.op!r}, version={self.version}, target={self._kind!r})"

    # -- one phase on one GPU: (ms, bound ms, out-of-range flags), inputs already validated
    def _phase_ms(self, frame: pd.DataFrame, spec: dict, precision: str, phase: str):
        n = len(frame)
        ms, bound = np.empty(n, dtype=np.float64), np.empty(n, dtype=np.float64)
        flags = np.empty(n, dtype=bool)
        for start in range(0, n, _ROWS_PER_PASS):
            part = frame.iloc[start:start + _ROWS_PER_PASS] if n > _ROWS_PER_PASS else frame
            stop = start + len(part)
            rows = self._features.prepare(self.op, part, spec, precision, phase)
            feats = self._features.matrix(rows)
            flags[start:stop] = ((feats < self._lo) | (feats > self._hi)).any(axis=1)
            ms[start:stop] = targets.members_to_ms(self._kind, self._mlp(feats), rows)
            bound[start:stop] = rows.bound_s * 1e3
        return ms, bound, flags

    def _with_floor(self, ms, phase: str):
        floors = self.card.get("launch_floor_ms")
        if not floors or phase not in floors:
            raise InputError(f"launch_floor: {self.op} v{self.version} has no launch floor for {phase} in its card")
        return np.maximum(ms, float(floors[phase]["ms"]))

    def _one_phase(self, frame, spec, precision, phase, want_interval: bool, launch_floor: bool):
        ms, bound, flags = self._phase_ms(frame, spec, precision, phase)
        low = high = None
        if want_interval:
            seen = spec.get("label") in self._seen
            low, high = intervals.interval(self.card["interval"], ms, bound, seen)
        if launch_floor:
            ms, low, high = (None if a is None else self._with_floor(a, phase) for a in (ms, low, high))
        return ms, low, high, flags

    def _model(self, frame, spec, precision, phase, want_interval=False, launch_floor=False):
        if phase != "total":
            return self._one_phase(frame, spec, precision, phase, want_interval, launch_floor)
        parts = [self._one_phase(frame, spec, precision, p, want_interval, launch_floor)
                 for p in ("forward", "backward")]
        total = [None if a is None else a + b for a, b in zip(parts[0][:3], parts[1][:3])]
        return total[0], total[1], total[2], parts[0][3] | parts[1][3]

    def _warn(self, flags, gpu_text: str) -> None:
        if flags.any():
            warnings.warn(f"{self.op} v{self.version}: {int(flags.sum())} of {len(flags)} configs on {gpu_text} "
                          "fall outside the training ranges of the model's features; those predictions are "
                          "extrapolations (predict(..., return_flags=True) gives per-row flags)",
                          UserWarning, stacklevel=3)

    def predict(self, configs, gpu, precision: str = "fp32", phase: str = "forward", *,
                return_flags: bool = False, return_interval: bool = False, launch_floor: bool = False):
        """Predicted GPU time in ms (float64 array, one per config) of ``configs`` on ``gpu``.

        - ``return_interval=True``: returns ``(ms, low, high)``, an 80 % interval per prediction (card
          ``interval``: calibrated on held-out configs for GPUs the model trained on, on leave-one-GPU-out passes
          for the others);
        - ``return_flags=True``: also returns the per-row flags (True outside the training ranges), last; no
          warning then, otherwise one UserWarning per call if any config is out of range;
        - ``launch_floor=True``: each time is at least the host's launch floor per call (card
          ``launch_floor_ms``): what an eager loop of a tiny op sees, rather than the GPU's time.
        """
        return_flags, return_interval = check_flag(return_flags, "return_flags"), check_flag(return_interval,
                                                                                              "return_interval")
        launch_floor = check_flag(launch_floor, "launch_floor")
        frame = normalize_configs(self.op, configs)
        spec = resolve_gpu(gpu, "gpu")
        precision = check_precision(precision, [("gpu", spec)])
        phase = check_phase(phase)
        if return_interval and not self.card.get("interval"):
            raise InputError(f"return_interval: {self.op} v{self.version} has no calibrated interval in its card")
        if len(frame) == 0:
            empty = np.zeros(0, dtype=np.float64)
            ms = low = high = empty
            flags = np.zeros(0, dtype=bool)
        else:
            ms, low, high, flags = self._model(frame, spec, precision, phase, return_interval, launch_floor)
        if not return_flags:
            self._warn(flags, spec["name"])
        out = (ms, low, high) if return_interval else (ms,)
        out += (flags,) if return_flags else ()
        return out if len(out) > 1 else out[0]

    @property
    def ratio_weight(self) -> float | None:
        """The card's calibrated share of an origin's measurement that carries over to another GPU (``transfer``);
        None for a checkpoint published without that calibration."""
        card = self.card.get("transfer") or {}
        return None if card.get("ratio_weight") is None else float(card["ratio_weight"])

    def scale(self, configs, measured_ms, origin, dest, precision: str = "fp32", phase: str = "forward", *,
              return_flags: bool = False):
        """Habitat-style scaling: ``measured_ms * model(dest) / model(origin)`` (float64 array of ms).

        ``measured_ms`` is one positive number (for every config) or an array with one per config.
        """
        return self._from_measured(configs, measured_ms, origin, dest, precision, phase, 1.0, return_flags)

    def transfer(self, configs, measured_ms, origin, dest, precision: str = "fp32", phase: str = "forward", *,
                 return_flags: bool = False):
        """``model(dest) * (measured_ms / model(origin)) ** ratio_weight`` (float64 array of ms), the weight from
        the card (``ratio_weight``); on the origin itself, the measurement. A checkpoint without the calibration
        is refused: use ``predict`` or ``scale`` with it.

        ``measured_ms`` is one positive number (for every config) or an array with one per config.
        """
        weight = self.ratio_weight
        if weight is None:
            raise InputError(f"transfer: {self.op} v{self.version} has no calibrated ratio weight in its card "
                             "(card transfer.ratio_weight; published before it existed); use predict() or scale(), "
                             "or retrain (make train)")
        return self._from_measured(configs, measured_ms, origin, dest, precision, phase, weight, return_flags)

    def _from_measured(self, configs, measured_ms, origin, dest, precision: str, phase: str, weight: float,
                       return_flags: bool):
        frame, measured, src, [dst], precision, phase = self._checked(configs, measured_ms, origin, [dest], "dest",
                                                                      precision, phase)
        if len(frame) == 0:
            empty = np.zeros(0, dtype=np.float64)
            return (empty, np.zeros(0, dtype=bool)) if return_flags else empty
        [([out], flags)] = self._carry(frame, measured, src, [dst], precision, phase, [weight])
        if return_flags:
            return out, flags
        self._warn(flags, src["name"] if src == dst else f"{src['name']}/{dst['name']}")
        return out

    def carry(self, configs, measured_ms, origin, dests, precision: str = "fp32", phase: str = "forward", *,
              weights=(1.0,)) -> list[tuple[np.ndarray, np.ndarray]]:
        """One measurement per config on ``origin`` carried over to several GPUs at once, per ratio weight:
        ``model(dest) * (measured_ms / model(origin)) ** w``; ``w = 1`` is ``scale``, ``w = ratio_weight`` is
        ``transfer``, ``w = 0`` the model alone. Per destination (in order): a float64 array
        [len(weights), len(configs)] of ms (the measurement itself where the destination is the origin) and the
        out-of-range flags (returned, not warned about). The model runs once per distinct GPU, so many
        destinations cost one pass each."""
        if isinstance(dests, (str, Mapping)) or not hasattr(dests, "__iter__"):
            raise InputError(f"dests: must be a list of GPU names or spec dicts, got {type(dests).__name__}")
        dests = list(dests)
        if not dests:
            raise InputError("dests: give at least one GPU")
        frame, measured, src, dsts, precision, phase = self._checked(configs, measured_ms, origin, dests, "dests",
                                                                     precision, phase)
        ws = check_weights(weights)
        if len(frame) == 0:
            return [(np.zeros((len(ws), 0)), np.zeros(0, dtype=bool)) for _ in dsts]
        return [(np.stack(times), flags) for times, flags in self._carry(frame, measured, src, dsts, precision,
                                                                           phase, ws)]

    def _checked(self, configs, measured_ms, origin, dests: list, field: str, precision, phase):
        """The inputs of a carry, validated: (configs frame, measured ms, origin spec, destination specs, precision,
        phase); ``field`` names the destinations in errors."""
        frame = normalize_configs(self.op, configs)
        measured = check_measured(measured_ms, len(frame))
        src = resolve_gpu(origin, "origin")
        dsts = [resolve_gpu(d, field) for d in dests]
        precision = check_precision(precision, [("origin", src), *((field, d) for d in dsts)])
        return frame, measured, src, dsts, precision, check_phase(phase)

    def _carry(self, frame: pd.DataFrame, measured: np.ndarray, src: dict, dsts: list[dict], precision: str,
               phase: str, weights: list[float]) -> list[tuple[list[np.ndarray], np.ndarray]]:
        """Per destination: the measurement on ``src`` carried over with each ratio weight (one array per weight),
        and the out-of-range flags. On the origin itself the result is the measurement. The model runs once per
        distinct GPU. Validates nothing (``_checked`` does)."""
        ms_o, _, _, f_o = self._model(frame, src, precision, phase)
        done: list[tuple[dict, np.ndarray, np.ndarray]] = []  # (spec, model ms, flags) per distinct destination
        out = []
        for dst in dsts:
            if dst == src:
                out.append(([measured.copy() for _ in weights], f_o.copy()))
                continue
            hit = next((d for d in done if d[0] == dst), None)
            if hit is None:
                ms_d, _, _, f_d = self._model(frame, dst, precision, phase)
                hit = (dst, ms_d, f_d)
                done.append(hit)
            out.append(([transfer.apply(hit[1], measured, ms_o, w) for w in weights], f_o | hit[2]))
        return out


def _positive_int(value) -> bool:
    return not isinstance(value, (bool, np.bool_)) and isinstance(value, (int, np.integer)) and value >= 1


def load_scaler(op: str, version: int | None = None, root=None, members: int | None = None) -> Scaler:
    """Load (and verify, by sha256) the published scaler of ``op``: ``version=None`` is the champion;
    ``root`` defaults to the repository's ``checkpoints/``. ``members=k`` uses only the first k members of an
    ensemble: faster (the MLP is most of an ensemble's cost), less accurate, its intervals still the whole
    ensemble's."""
    op = check_op(op)
    if version is not None and not _positive_int(version):
        raise InputError(f"version: must be an integer >= 1 or None (the champion), got {version!r}")
    if members is not None and not _positive_int(members):
        raise InputError(f"members: must be an integer >= 1 or None (every member), got {members!r}")
    root = DEFAULT_ROOT if root is None else Path(root)
    card, weights = checkpoint.load(root, op, None if version is None else int(version))
    return Scaler(op, card["version"], card, weights, members)
