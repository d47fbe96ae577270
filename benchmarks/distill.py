"""Can one MLP learn an ensemble's accuracy at one member's prediction speed? Distillation: one student, seeded
like the ensemble's first member, trained on the same rows with the measured ln-time target moved towards the
champion ensemble's prediction, ``y + alpha * ln(ensemble / measured)`` (alpha 0: the measured target, 1: the
ensemble's). Scored as the champion rules score a new version (``group_mape`` on the test split), next to the
champion and its first member alone.

    python benchmarks/distill.py --op conv2d --alpha 0.5,1 [overrides of conf/train.yaml ...]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline import api, schema  # noqa: E402
from pipeline import checkpoint as ck  # noqa: E402
from pipeline.evaluation.predictions import predict_rows  # noqa: E402
from pipeline.markdown import markdown_table  # noqa: E402
from pipeline.training.config import target_kind, to_dict  # noqa: E402
from pipeline.training.data import OpTable  # noqa: E402
from pipeline.training.fit import fit  # noqa: E402
from pipeline.training.publish import group_mape  # noqa: E402


def distilled(table: OpTable, teacher_ms: np.ndarray, train: np.ndarray, alpha: float) -> OpTable:
    """``table`` with the train rows' targets moved ``alpha`` of the way (in ln time) to the teacher's."""
    y = table.y.copy()
    measured = table.frame["time_ms"].to_numpy(float)
    y[train] += alpha * np.log(teacher_ms[train] / measured[train])
    return dataclasses.replace(table, y=y)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--op", required=True, choices=schema.OPS)
    ap.add_argument("--alpha", default="1", help="comma-separated target shifts in [0, 1]; default 1")
    ap.add_argument("--seed", type=int, default=0, help="the student's seed (default 0, the first member's)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    alphas = [float(a) for a in args.alpha.split(",")]
    if not all(0 <= a <= 1 for a in alphas):
        raise SystemExit(f"--alpha: values in [0, 1]; got {args.alpha}")
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(ROOT / "conf"), version_base=None):
        cfg = compose("train", overrides=["~logger", *args.overrides])
    cfg.seed = args.seed
    table = OpTable.load(Path(cfg.data.root), args.op, to_dict(cfg.data), target_kind=target_kind(cfg))
    masks = table.masks(list(cfg.eval.get("holdout_gpus") or []))
    version = ck.champion_version(cfg.checkpoints_dir, args.op)
    teacher = api.load_scaler(args.op, version, cfg.checkpoints_dir)
    first = api.load_scaler(args.op, version, cfg.checkpoints_dir, members=1)
    train_idx = np.flatnonzero(masks["train"])
    teacher_ms = np.full(len(table.y), np.nan)
    teacher_ms[train_idx] = predict_rows(teacher, table, train_idx)[0]
    test_idx = np.flatnonzero(masks["test"])
    val_idx = np.flatnonzero(masks["val"])
    rows = []
    held = teacher.card["architecture"].get("members", 1)
    for name, scaler in ((f"v{version} ({held} members)", teacher), (f"v{version} member 0", first)):
        rows.append({"model": name, "test_group_mape": group_mape(table, masks["test"],
                                                                  predict_rows(scaler, table, test_idx)[0]),
                     "val_group_mape": group_mape(table, masks["val"], predict_rows(scaler, table, val_idx)[0]),
                     "fit_s": None})
    for alpha in alphas:
        t0 = time.perf_counter()
        res = fit(copy.deepcopy(cfg), args.op, distilled(table, teacher_ms, masks["train"], alpha),
                  patience=cfg.fit.get("patience"))
        rows.append({"model": f"student alpha={alpha:g} (seed {args.seed})",
                     "test_group_mape": group_mape(table, masks["test"], res.preds["test"]),
                     "val_group_mape": group_mape(table, masks["val"], res.preds["val"]),
                     "fit_s": round(time.perf_counter() - t0)})
        print(rows[-1], flush=True)
    print(f"\n{args.op}: {len(test_idx):,} test rows, {len(val_idx):,} validation rows, {len(train_idx):,} train rows")
    print(markdown_table(pd.DataFrame(rows), digits=2))


if __name__ == "__main__":
    main()
