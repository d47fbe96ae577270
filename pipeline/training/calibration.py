"""What a card carries besides the model: its 80 % interval, calibrated on data the model never trained on, and
the host launch floor measured with our own rows.

- ``interval``: ``pipeline.intervals.calibrate`` on the main fit's validation and test configs (GPUs the model
  trained on: group ``seen``) and on the leave-GPU-out passes of the same run (group ``unseen``), every GPU
  weighing the same. Rows whose measurement is a host's launch floor (``at_floor``) say nothing about the GPU
  time and are left out.
- ``launch_floor_ms``: per phase, the median host time per call (``host_ms``) of our own rows -- what an eager
  loop of a tiny op costs on the host that measured them (``predict(..., launch_floor=True)``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from pipeline import intervals


def _usable(frame: pd.DataFrame) -> pd.DataFrame:
    if frame is None or frame.empty:
        return pd.DataFrame(columns=["pred_ms", "time_ms"])
    return frame[~frame["at_floor"].astype(bool)] if "at_floor" in frame else frame


def interval_card(seen: pd.DataFrame, unseen: Sequence[pd.DataFrame], level: float = intervals.LEVEL) -> dict | None:
    """The card's ``interval`` from error frames of held-out configs (``seen``) and held-out GPUs (``unseen``);
    None when there are too few rows to calibrate."""
    parts = [(_usable(seen), True)] + [(_usable(f), False) for f in unseen]
    parts = [(f, s) for f, s in parts if len(f)]
    if not parts:
        return None
    pred = np.concatenate([f["pred_ms"].to_numpy(float) for f, _ in parts])
    true = np.concatenate([f["time_ms"].to_numpy(float) for f, _ in parts])
    groups = np.concatenate([intervals.group_names(f["pred_ms"].to_numpy(float), s) for f, s in parts])
    devices = np.concatenate([f["gpu"].to_numpy() for f, _ in parts])
    if len(pred) < intervals.MIN_GROUP_ROWS:
        return None
    card = intervals.calibrate(pred, true, groups, level, devices=devices)
    card["calibrated_on_data"] = {"seen": "validation and test configs of the training GPUs (main fit)",
                                  "unseen": f"{len(unseen)} leave-GPU-out passes of the training run"}
    return card


def launch_floor_card(frame: pd.DataFrame) -> dict:
    """{phase: {"ms", "rows", "gpus"}}: the median ``host_ms`` of the rows that recorded it."""
    if "host_ms" not in frame:
        return {}
    own = frame[frame["host_ms"].notna()]
    return {phase: {"ms": float(part["host_ms"].median()), "rows": int(len(part)),
                    "gpus": sorted(part["gpu"].unique()), "what": "median host time per call (host_ms)"}
            for phase, part in own.groupby("phase")}
