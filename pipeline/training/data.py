"""Training data of one op: every dataset under ``datasets/`` (own + ``datasets/external``), filtered, split by
config, turned into features and targets once; and the LightningDataModule that serves it.

Row roles (``OpTable.masks``):
- training domain: sources allowed by ``data.sources`` minus ``data.exclude_sources``; split by a hash of
  ``config_id`` into train/val/test (80/10/10 by default), so one config (on any GPU, precision or phase) is
  never on two sides of the split;
- holdout: rows of ``holdout_gpus`` (leave-GPU-out): never trained on, reported separately;
- unseen: rows of ``data.exclude_sources`` (default ``neusight-label``, layer shapes of real models on GPUs
  such as H100 and L4): never trained on, always reported;
- heuristic: rows under ``data.heuristic_roots`` (relative to ``data.root``), our own conv2d sweeps whose cuDNN
  algorithm was its heuristic pick, not autotuned (source ``own-heuristic``, feature ``cudnn_heuristic`` 1):
  trained on where their config is in the train split and their GPU is not held out; never validated or tested
  on, and left out of every error reported, so every reported number is of autotuned rows. Only ops with that
  input read them. ``data.sources``, where set, must list ``own-heuristic`` to keep them; in
  ``data.exclude_sources`` they would become the unseen set. A GPU with heuristic rows alone is not one the card
  calls seen (its ``gpus``).

Rows measured below ``data.min_bound_ratio`` x the physical lower bound (``features.bound_ms``) are dropped and
counted: no kernel beats it, so such a time is a measurement error.

The launch floor, a separate term: a host-timed source (no ``host_ms``) measures ``max(GPU time, its host's launch
floor)``. Where such a source marks rows ``launch_bound`` (per source, GPU, precision and phase), ``floor_ms`` is
their own time (the GPU time is at most that) and, for its other rows, the median time of its launch-bound rows.
Training compares ``max(predicted GPU time, floor_ms)`` with the measurement, and so does every error reported on
those rows; the model itself predicts GPU time.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline import features as F
from pipeline import targets as T
from pipeline.schema import OP_CONFIG_COLUMNS, op_frame, read_dataset

SPLITS = ("train", "val", "test")


def _as_list(value) -> list | None:
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    return list(value)


def split_of(config_ids: Iterable[str], salt: str = "pipeline-split-v1", train: float = 0.8,
             val: float = 0.1) -> np.ndarray:
    """'train' / 'val' / 'test' per config id: a salted sha256 hash mapped to [0, 1), cut at the fractions.

    Deterministic and independent of the rest of the data: the same config lands on the same side in every run,
    on every GPU, so a champion and a challenger can be compared on one test split.
    """
    ids = pd.Series(list(config_ids), dtype=object)
    uniq = ids.unique()
    u = np.array([int.from_bytes(hashlib.sha256(f"{salt}:{c}".encode()).digest()[:8], "big") / 2.0 ** 64
                  for c in uniq])
    labels = np.where(u < train, "train", np.where(u < train + val, "val", "test"))
    lookup = dict(zip(uniq, labels))
    return ids.map(lookup).to_numpy(dtype=object)


def _filter(frame: pd.DataFrame, op: str, data_cfg: Mapping) -> tuple[pd.DataFrame, dict, dict[str, int]]:
    """(rows kept by the ``data`` filters, registry specs of their GPUs, dropped row counts by reason).

    Rows of ``exclude_sources`` (the unseen set) pass the source and GPU filters: they are reported, not trained on.
    """
    from pipeline.gpus import gpu_spec

    dropped: dict[str, int] = {}

    def drop(mask, why: str) -> None:
        nonlocal frame
        mask = np.asarray(mask, dtype=bool)
        if mask.any():
            dropped[why] = dropped.get(why, 0) + int(mask.sum())
            frame = frame[~mask].reset_index(drop=True)

    excluded = _as_list(data_cfg.get("exclude_sources")) or []
    for key, column in (("sources", "source"), ("gpus", "gpu")):
        wanted = _as_list(data_cfg.get(key))
        if wanted is not None:
            drop(~frame[column].isin(wanted) & ~frame["source"].isin(excluded), f"{column} not in data.{key}")
    for key, column in (("precisions", "precision"), ("phases", "phase")):
        wanted = _as_list(data_cfg.get(key))
        if wanted is not None:
            drop(~frame[column].isin(wanted), f"{column} not in data.{key}")
    for i, rule in enumerate(data_cfg.get("exclude_rows") or []):
        drop(_matches(frame, rule, f"data.exclude_rows[{i}]"), f"data.exclude_rows[{i}] {dict(rule)}")
    specs = {}
    for label in frame["gpu"].unique():
        try:
            specs[label] = gpu_spec(label)
        except ValueError:
            warnings.warn(f"{op}: GPU label {label!r} is not in the registry (conf/gpus.yaml); its rows are "
                          "skipped", stacklevel=3)
    drop(~frame["gpu"].isin(list(specs)), "gpu not in the registry")
    drop(~_supported(frame, specs), "precision the GPU has no path for (conf/gpus.yaml)")
    t = frame["time_ms"].to_numpy(dtype=float)
    drop(~(np.isfinite(t) & (t > 0)), "time not finite and > 0")
    return frame.reset_index(drop=True), specs, dropped


def _matches(frame: pd.DataFrame, rule: Mapping, where: str) -> np.ndarray:
    """Rows matching every ``column: value or [values]`` of ``rule``."""
    mask = np.ones(len(frame), dtype=bool)
    for column, values in dict(rule).items():
        if column not in frame.columns:
            raise ValueError(f"{where}: unknown column {column!r}; allowed: {', '.join(map(str, frame.columns))}")
        mask &= frame[column].isin(_as_list(values)).to_numpy()
    return mask


GROUP_KEYS = ["source", "gpu", "precision", "phase"]  # one measured device, precision and phase
HEURISTIC_SOURCE = "own-heuristic"   # the source of the rows read from ``data.heuristic_roots``
HEURISTIC_FEATURE = F.HEURISTIC_FEATURE   # the input that tells them apart (only ops whose library picks algorithms)
TRAINED_DOMAINS = ("train", "heuristic")   # the domains whose rows a fit may train on (``OpTable.masks``)


def read_heuristic_rows(root: str | Path, op: str) -> pd.DataFrame:
    """The ok rows of ``op`` under ``root`` (none where it does not exist), labelled ``HEURISTIC_SOURCE``."""
    return read_dataset(root, ops=[op], status="ok").assign(source=HEURISTIC_SOURCE)


def row_features(frame: pd.DataFrame, op: str, specs: Mapping[str, dict], target_kind: str):
    """Features, targets, head inputs (``targets.aux``) and measured / bound of every row, built per GPU."""
    X = np.zeros((len(frame), len(F.feature_names(op))))
    y, aux, over_bound = np.zeros(len(frame)), np.ones(len(frame)), np.zeros(len(frame))
    for label, idx in frame.groupby("gpu", sort=True).indices.items():
        sub = frame.iloc[idx]
        rows = F.prepare(op, sub, specs[label], sub["precision"].to_numpy(), sub["phase"].to_numpy())
        rows.heuristic = (sub["source"] == HEURISTIC_SOURCE).to_numpy(dtype=np.float64)
        ms = sub["time_ms"].to_numpy(dtype=float)
        X[idx] = F.matrix(rows)
        y[idx] = T.ms_to_target(target_kind, ms, rows)
        aux[idx] = T.aux(target_kind, rows)
        over_bound[idx] = ms / (rows.bound_s * 1e3)
    return X, y, aux, over_bound


def launch_floors(frame: pd.DataFrame) -> np.ndarray:
    """Per row, the host launch floor its measurement is bounded by (module docstring); NaN where none."""
    floor = np.full(len(frame), np.nan)
    if not len(frame):
        return floor
    flagged = frame["launch_bound"].fillna(False).to_numpy(dtype=bool) & frame["host_ms"].isna().to_numpy()
    time = frame["time_ms"].to_numpy(dtype=float)
    for _, idx in frame.groupby(GROUP_KEYS, sort=False).indices.items():
        marked = idx[flagged[idx]]
        if len(marked) and frame["host_ms"].iloc[idx].isna().all():
            floor[idx] = np.median(time[marked])
            floor[marked] = time[marked]
    return floor


def _supported(frame: pd.DataFrame, specs: Mapping[str, dict]) -> np.ndarray:
    """Rows whose GPU can run their precision: the prediction API refuses the others, so no model learns them."""
    from pipeline.gpus import supports_precision

    ok = np.ones(len(frame), dtype=bool)
    for (gpu, precision), idx in frame.groupby(["gpu", "precision"], sort=False).indices.items():
        ok[idx] = supports_precision(specs[gpu], precision)
    return ok


def fingerprint(frame: pd.DataFrame) -> str:
    """sha256 of the sorted lines 'config_id,precision,phase,time_ms' of ``frame`` (order-independent)."""
    lines = sorted(f"{c},{p},{ph},{t!r}" for c, p, ph, t in
                   zip(frame["config_id"], frame["precision"], frame["phase"], frame["time_ms"].astype(float)))
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


@dataclass
class OpTable:
    """All usable rows of one op with their features (``X``, columns ``feature_names(op)``) and targets ``y``."""

    op: str
    frame: pd.DataFrame  # op_frame columns + 'split' + 'domain' ('train' sources, 'heuristic' or 'unseen')
    X: np.ndarray
    y: np.ndarray
    target_kind: str = T.TARGET_KIND
    dropped: dict = field(default_factory=dict)
    split_cfg: dict = field(default_factory=dict)
    aux: np.ndarray | None = None       # the head's extra input per row (targets.aux)
    floor_ms: np.ndarray | None = None  # host launch floor of the row's measurement (NaN: none; launch_floors)

    @classmethod
    def load(cls, root: str | Path, op: str, data_cfg: Mapping | None = None,
             target_kind: str = T.TARGET_KIND) -> OpTable:
        """Read every dataset under ``root`` for ``op`` (status ok) and those of ``data.heuristic_roots``, and apply
        the ``data`` config filters."""
        data_cfg = dict(data_cfg or {})
        frames = [read_dataset(root, ops=[op], status="ok")]
        if HEURISTIC_FEATURE in F.feature_names(op):   # the other ops' rows could not say how they were timed
            frames += [read_heuristic_rows(Path(root) / r, op)
                       for r in _as_list(data_cfg.get("heuristic_roots")) or []]
        frame = pd.concat([f for f in frames if len(f)] or frames[:1], ignore_index=True)
        return cls.from_frame(frame, op, data_cfg, target_kind)

    @classmethod
    def from_frame(cls, frame: pd.DataFrame, op: str, data_cfg: Mapping | None = None,
                   target_kind: str = T.TARGET_KIND) -> OpTable:
        """The usable rows of ``frame`` for ``op`` under the ``data`` config, split and turned into features."""
        data_cfg = dict(data_cfg or {})
        frame = frame[frame["status"] == "ok"] if "status" in frame else frame
        frame = op_frame(frame, op) if len(frame) else op_frame(frame.assign(op=op), op)
        frame, specs, dropped = _filter(frame, op, data_cfg)
        split_cfg = {"salt": str(data_cfg.get("split_salt", "pipeline-split-v1")),
                     "train": float(data_cfg.get("train_fraction", 0.8)),
                     "val": float(data_cfg.get("val_fraction", 0.1))}
        frame["split"] = split_of(frame["config_id"], split_cfg["salt"], split_cfg["train"], split_cfg["val"])
        excluded = _as_list(data_cfg.get("exclude_sources")) or []
        if (frame["source"] == HEURISTIC_SOURCE).any() and HEURISTIC_FEATURE not in F.feature_names(op):
            raise ValueError(f"{op}: rows of source {HEURISTIC_SOURCE!r}, but {op}'s features have no "
                             f"{HEURISTIC_FEATURE!r} input to tell them apart; allowed for: "
                             + ", ".join(o for o in OP_CONFIG_COLUMNS if HEURISTIC_FEATURE in F.feature_names(o)))
        frame["domain"] = np.select([frame["source"].isin(excluded), frame["source"] == HEURISTIC_SOURCE],
                                    ["unseen", "heuristic"], "train")
        X, y, aux, over_bound = row_features(frame, op, specs, target_kind)
        table = cls(op=op, frame=frame, X=X, y=y, target_kind=target_kind, dropped=dropped, split_cfg=split_cfg,
                    aux=aux, floor_ms=launch_floors(frame))
        bad = ~(np.isfinite(X).all(axis=1) & np.isfinite(y))
        minimum = float(data_cfg.get("min_bound_ratio") or 0.0)
        below = np.isfinite(over_bound) & (over_bound < minimum)
        for mask, why in ((bad, "non-finite features"),
                          (below & ~bad, f"measured below {minimum:g} x the physical lower bound")):
            if mask.any():
                dropped[why] = int(mask.sum())
        return table.subset(~(bad | below)) if (bad | below).any() else table

    def subset(self, keep: np.ndarray) -> OpTable:
        """A copy with the rows of boolean mask ``keep``."""
        return OpTable(op=self.op, frame=self.frame[keep].reset_index(drop=True), X=self.X[keep], y=self.y[keep],
                       target_kind=self.target_kind, dropped=dict(self.dropped), split_cfg=dict(self.split_cfg),
                       aux=self.aux[keep], floor_ms=self.floor_ms[keep])

    # -------------------------------------------------------------------------------------------- views

    def masks(self, holdout_gpus: Sequence[str] = ()) -> dict[str, np.ndarray]:
        """Boolean row masks: train / val / test (training domain without holdout GPUs; train also the heuristic
        rows of train-split configs on other GPUs), holdout, unseen."""
        domain = self.frame["domain"].to_numpy()
        dom = domain == "train"
        on_held = self.frame["gpu"].isin(list(holdout_gpus)).to_numpy()
        held = on_held & dom
        split = self.frame["split"].to_numpy()
        out = {s: dom & ~held & (split == s) for s in SPLITS}
        out["train"] |= (domain == "heuristic") & ~on_held & (split == "train")
        out["holdout"] = held
        out["unseen"] = domain == "unseen"
        return out

    def training_gpus(self) -> list[str]:
        return sorted(self.frame.loc[self.frame["domain"] == "train", "gpu"].unique())

    def summary(self) -> pd.DataFrame:
        """Rows per domain, source, GPU, precision and phase (what the run used)."""
        if self.frame.empty:
            return pd.DataFrame(columns=["domain", "source", "gpu", "precision", "phase", "rows"])
        return (self.frame.groupby(["domain", *GROUP_KEYS]).size()
                .rename("rows").reset_index())

    def data_card(self, masks: Mapping[str, np.ndarray], holdout_gpus: Sequence[str] = ()) -> dict:
        """The card's ``training_data``: rows per split, per source/GPU with fingerprints, filters, split rule."""
        used = masks["train"] | masks["val"] | masks["test"]
        sub = self.frame[used]
        by = {}
        for (source, gpu), part in sub.groupby(["source", "gpu"], sort=True):
            by[f"{source}/{gpu}"] = {
                "source": source, "gpu": gpu, "rows": int(len(part)),
                "rows_by_split": {s: int((part["split"] == s).sum()) for s in SPLITS},
                "precisions": sorted(part["precision"].unique()), "phases": sorted(part["phase"].unique()),
                "fingerprint": fingerprint(part)}
        return {
            "rows": int(used.sum()),
            "rows_by_split": {s: int(masks[s].sum()) for s in SPLITS},
            "by_source_gpu": by,
            "gpus": sorted(sub.loc[sub["domain"] == "train", "gpu"].unique()),   # "seen" by the API's intervals
            "sources": sorted(sub["source"].unique()),
            "fingerprint": fingerprint(sub) if len(sub) else None,
            "fingerprint_rule": "sha256 of the sorted lines 'config_id,precision,phase,time_ms' (status ok rows)",
            "holdout_gpus": sorted(holdout_gpus),
            "unseen_rows": int(masks["unseen"].sum()),
            "split": {**self.split_cfg, "by": "sha256(salt:config_id) -> [0,1): train < train_fraction <= val < "
                                              "train_fraction + val_fraction <= test"},
            "dropped": dict(self.dropped),
        }


def format_summary(table: OpTable) -> str:
    """Rows per source/GPU (columns: precision/phase) as text, for the console."""
    s = table.summary()
    if s.empty:
        return f"{table.op}: no rows"
    s["pp"] = s["precision"] + "/" + s["phase"]
    wide = s.pivot_table(index=["domain", "source", "gpu"], columns="pp", values="rows", aggfunc="sum",
                         fill_value=0)
    wide["total"] = wide.sum(axis=1)
    return wide.to_string()
