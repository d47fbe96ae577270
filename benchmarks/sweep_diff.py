"""Two sweeps of the same configs, compared: time ratio B / A on the (op, config, precision, phase) rows both
measured. Used for run-to-run repeatability (the same sweep on two machine starts) and for what a collection
setting changes (for example conv2d with ``cudnn_benchmark_limit=3`` against PyTorch's default autotuning).

    python benchmarks/sweep_diff.py <root A> <root B> --gpu h200 [--run-a ID] [--run-b ID]

A root is a dataset folder (``datasets`` or a sweep's ``out=``); ``--run-a``/``--run-b`` keep only the files of
one collector run (the id in ``part-<run>-NNNNN.parquet``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline import schema  # noqa: E402
from pipeline.markdown import markdown_table  # noqa: E402

KEYS = ["op", "config_id", "precision", "phase"]


def read_sweep(root: str, gpu: str, run: str | None) -> pd.DataFrame:
    files = [f for f in schema.dataset_files(Path(root) / f"gpu={gpu}") if run is None or f"-{run}-" in f.name]
    if not files:
        raise SystemExit(f"no dataset files for gpu={gpu}" + (f" and run {run}" if run else "") + f" under {root}")
    rows = pd.concat([schema.read_file(f) for f in files], ignore_index=True)
    return rows[rows["status"] == "ok"]


def compare(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    both = a[KEYS + ["time_ms"]].merge(b[KEYS + ["time_ms"]], on=KEYS, suffixes=("_a", "_b"))
    if both.empty:
        raise SystemExit("the two sweeps share no (op, config, precision, phase) rows")
    both["ratio"] = both["time_ms_b"] / both["time_ms_a"]
    both["abs_diff_pct"] = (both["ratio"] - 1).abs() * 100

    def stats(g: pd.DataFrame) -> pd.Series:
        return pd.Series({"rows": len(g), "median_ratio": g["ratio"].median(), "p10_ratio": g["ratio"].quantile(0.1),
                          "p90_ratio": g["ratio"].quantile(0.9), "max_ratio": g["ratio"].max(),
                          "median_abs_diff_pct": g["abs_diff_pct"].median(),
                          "p90_abs_diff_pct": g["abs_diff_pct"].quantile(0.9)})

    per = both.groupby(["op", "precision", "phase"]).apply(stats, include_groups=False).reset_index()
    total = stats(both).to_frame().T.assign(op="all", precision="", phase="")
    out = pd.concat([per, total[per.columns]], ignore_index=True)
    out["rows"] = out["rows"].astype(np.int64)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root_a")
    ap.add_argument("root_b")
    ap.add_argument("--gpu", required=True, help="dataset label, e.g. h200")
    ap.add_argument("--run-a")
    ap.add_argument("--run-b")
    args = ap.parse_args()
    out = compare(read_sweep(args.root_a, args.gpu, args.run_a), read_sweep(args.root_b, args.gpu, args.run_b))
    print(markdown_table(out, digits=3))


if __name__ == "__main__":
    main()
