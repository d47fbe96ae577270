"""Is a held-out GPU's error a device-level bias or a config-level spread? One leave-GPU-out retrain (the
evaluation's reduced settings), then the held-out GPU's error and its median predicted / measured ratio per
precision, phase and op size. A ratio far from 1 in every size band is a bias of the whole device (its clock
under load, its timing method), which no per-config correction learned on other GPUs can remove.

    python benchmarks/holdout_bias.py --op linear --gpu h200 [overrides of conf/evaluate.yaml ...]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline import intervals, schema  # noqa: E402
from pipeline.evaluation.logo import held_out_with, holdout_errors, reduced_fit  # noqa: E402
from pipeline.markdown import markdown_table  # noqa: E402
from pipeline.training.config import target_kind, to_dict  # noqa: E402
from pipeline.training.data import OpTable  # noqa: E402

SIZES_MS = [0, intervals.SMALL_MS, 0.5, 5, float("inf")]  # the report's launch-scale class first, then decades
SIZE_NAMES = ["<50us", "50-500us", "0.5-5ms", ">=5ms"]


def bias_table(op: str, gpu: str, overrides: list[str]) -> tuple[pd.DataFrame, float, float]:
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(ROOT / "conf"), version_base=None):
        cfg = compose("evaluate", overrides=overrides)
    table = OpTable.load(Path(cfg.data.root), op, to_dict(cfg.data), target_kind=target_kind(cfg))
    if gpu not in table.training_gpus():
        raise SystemExit(f"--gpu: {gpu!r} has no {op} rows; GPUs with rows: {table.training_gpus()}")
    res, sub = reduced_fit(cfg, op, table, held_out_with(gpu, table, cfg.eval.logo), "holdout-bias")
    err = holdout_errors(sub, res, gpu)
    err["ratio"] = err["pred_ms"] / err["time_ms"]
    err["size"] = pd.cut(err["time_ms"], SIZES_MS, labels=SIZE_NAMES, right=False)
    out = (err.groupby(["precision", "phase", "size"], observed=True)
           .agg(rows=("ape", "size"), mape=("ape", "mean"), median_pred_over_measured=("ratio", "median"))
           .reset_index())
    return out, float(err["ape"].mean()), float(err["ratio"].median())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--op", required=True, choices=schema.OPS)
    ap.add_argument("--gpu", required=True, help="registry label of the GPU to leave out, e.g. h200")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of conf/evaluate.yaml")
    args = ap.parse_args()
    out, mape, ratio = bias_table(args.op, args.gpu, args.overrides)
    print(f"{args.op}, {args.gpu} left out: MAPE {mape:.1f} %, median predicted / measured {ratio:.3f}\n")
    out["median_pred_over_measured"] = out["median_pred_over_measured"].map("{:.3f}".format)
    print(markdown_table(out.rename(columns={"mape": "MAPE %"})))


if __name__ == "__main__":
    main()
