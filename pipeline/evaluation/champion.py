"""In-distribution error: the published champion on the held-out config split and on the unseen source.

Where nothing is published yet, a reduced fit on every training GPU (the ``eval.logo`` settings) stands in,
and the report says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pipeline import api
from pipeline import checkpoint as ck
from pipeline.evaluation.analysis import card_coverage
from pipeline.evaluation.metrics import ape
from pipeline.evaluation.predictions import error_frame, predict_rows, roofline_rows


def _stand_in(cfg, op: str, table) -> tuple[api.Scaler, dict]:
    from pipeline.evaluation.logo import reduced_fit

    res, sub = reduced_fit(cfg, op, table, [], "evaluate-main")
    return res.scaler(), {"available": True, "published": False, "version": None,
                          "trained_gpus": sorted(set(sub.frame.loc[res.masks["train"], "gpu"])),
                          "epochs": int(res.epochs), "train_rows": int(res.masks["train"].sum())}


def _published(scaler: api.Scaler, table) -> dict:
    card = scaler.card
    training_data = card.get("training_data") or {}
    salt = (training_data.get("split") or {}).get("salt")
    logo = (card.get("metrics") or {}).get("leave_gpu_out") or {}
    out = {"available": True, "published": True, "version": scaler.version, "created": card.get("created"),
           "trained_gpus": sorted(training_data.get("gpus", [])), "split_salt": salt,
           # the training run's own leave-GPU-out passes, as published in the card
           "card_leave_gpu_out": {g: {"mape": (v.get("all") or {}).get("mape"), "n": (v.get("all") or {}).get("n"),
                                      "epochs": v.get("epochs")} for g, v in logo.items() if isinstance(v, Mapping)}}
    why = split_mismatch(scaler, table)
    if why:
        out["why_no_test"] = why
    return out


def split_mismatch(scaler: api.Scaler, table) -> str | None:
    """Why ``table``'s test split is not the one ``scaler`` held out (its card's split salt differs), or None."""
    salt = ((scaler.card.get("training_data") or {}).get("split") or {}).get("salt")
    if salt in (None, table.split_cfg.get("salt")):
        return None
    return (f"v{scaler.version} was split with salt {salt!r}, the data here with {table.split_cfg.get('salt')!r}: "
            "its test configs are not known")


def run_champion(cfg, op: str, table) -> dict[str, Any]:
    """The champion (or stand-in) and its error frames ``frames[role]`` for roles test and unseen."""
    root = Path(cfg.checkpoints_dir)
    version = ck.champion_version(root, op) if (root / op).exists() else None
    if version is None:
        scaler, out = _stand_in(cfg, op, table)
    else:
        scaler = api.load_scaler(op, root=root)
        out = _published(scaler, table)
    frame = table.frame
    roles = {"test": (frame["domain"] == "train") & (frame["split"] == "test"), "unseen": frame["domain"] == "unseen"}
    frames = {}
    for role, mask in roles.items():
        if role == "test" and "why_no_test" in out:
            continue
        idx = np.flatnonzero(mask.to_numpy())
        if len(idx) == 0:
            frames[role] = pd.DataFrame()
            continue
        pred, flags = predict_rows(scaler, table, idx)
        f = error_frame(table, idx, pred)
        f["flag"] = flags
        f["roof_ape"] = ape(roofline_rows(table, idx), f["time_ms"])
        frames[role] = f
    out["frames"] = frames
    out["interval_coverage"] = {role: card_coverage(scaler, f) for role, f in frames.items() if not f.empty}
    return out
