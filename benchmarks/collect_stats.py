"""Collector throughput and measurement spread of an own dataset, from its rows and run summaries.

    python benchmarks/collect_stats.py --gpu h200 [--root datasets]

Configs/s per op come from the sidecar run summaries the collector writes (per worker, i.e. per GPU), counting
an op of a run only while some of its rows are still in the dataset (not all retired). Where the time goes: first
calls (cuDNN's autotuning), and the time no measured task accounts for (``op_seconds`` less its split into first
calls, timing and the rest): tasks that ended without a result, mostly ``timeout`` ones and the worker restart
after them. The spread is the median of (p80 - p20) / median over ``ok`` rows.
"""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline import schema  # noqa: E402


def throughput(label_dir: Path) -> tuple[int, float, dict, dict, dict, dict, dict]:
    """(runs, sweep seconds, config-precisions, seconds, and of the runs that split their time: seconds,
    first-call seconds and seconds without a result, per op) of the runs under ``label_dir`` whose rows of that op
    are still there (retired rows leave their run summaries behind). A run that splits its time but not an op's
    spent all of that op's time without a result (every task of it failed)."""
    runs = [json.loads(p.read_text()) for p in sorted(label_dir.glob("_run-*.json"))]
    tasks, seconds, split_seconds, first_calls, no_result, wall, counted = {}, {}, {}, {}, {}, 0.0, 0
    for run in runs:
        kept = [op for op in run["op_tasks"] if any((label_dir / f"op={op}").glob(f"part-{run['run_id']}-*.parquet"))]
        if not kept:
            continue
        counted, wall = counted + 1, wall + run["seconds"]
        for op in kept:
            n = run["op_tasks"][op]
            tasks[op] = tasks.get(op, 0) + n
            seconds[op] = seconds.get(op, 0.0) + run["op_seconds"][op]
            if "op_time_split" not in run:   # written before the collector split its time
                continue
            split = run["op_time_split"].get(op, {})
            split_seconds[op] = split_seconds.get(op, 0.0) + run["op_seconds"][op]
            first_calls[op] = first_calls.get(op, 0.0) + split.get("first_call_s", 0.0)
            no_result[op] = no_result.get(op, 0.0) + max(run["op_seconds"][op] - sum(split.values()), 0.0)
    return counted, wall, tasks, seconds, split_seconds, first_calls, no_result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", required=True, help="dataset label, e.g. h200")
    parser.add_argument("--root", default="datasets")
    args = parser.parse_args()
    runs, wall, tasks, seconds, split_seconds, first_calls, no_result = throughput(Path(args.root) / f"gpu={args.gpu}")
    if not runs:
        raise SystemExit(f"--gpu: no run summaries with rows under {args.root}/gpu={args.gpu}")
    print(f"{runs} runs, {wall:.0f} s of sweep wall time")
    print("op       config-precisions   configs/s per GPU (fwd+bwd)   share of time: in first calls (autotuning)"
          "   in tasks without a result (timeouts)")
    for op in sorted(tasks):
        whole = split_seconds.get(op)
        share = f"{first_calls[op] / whole:.0%}" if whole else "n/a"
        lost = f"{no_result[op] / whole:.0%}" if whole else "n/a"
        print(f"{op:8s} {tasks[op]:17d}   {tasks[op] / seconds[op]:8.2f}                      {share:>4s}"
              f"                                        {lost:>4s}")
    rows = schema.read_dataset(args.root, gpus=[args.gpu], status="ok")
    rows = rows.assign(spread=(rows["time_p80_ms"] - rows["time_p20_ms"]) / rows["time_ms"])
    print("\nmedian relative spread (p80 - p20) / median, ok rows")
    print(rows.pivot_table(index="op", columns=["precision", "phase"], values="spread", aggfunc="median")
          .round(3).to_string())
    print(f"all ok rows: {rows['spread'].median():.3f} over {len(rows)} rows")


if __name__ == "__main__":
    main()
