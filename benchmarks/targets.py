"""The targets of the bounded scalers, measured: the report's checks (``reports/evaluation.json``, written by
``make evaluate``) and the prediction API's speed and size, measured again here on this machine.

    python benchmarks/targets.py [--report reports/evaluation.json] [--rows 200000]

Prints one line per target: goal, measured value, met/missed, and the machine the speed was measured on.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def api_numbers(rows: int) -> dict:
    from pipeline import api
    from pipeline.evaluation.speed import api_speed
    from pipeline.schema import OPS
    from pipeline.training.data import OpTable

    out = {}
    for op in OPS:
        if not (api.DEFAULT_ROOT / op / "champion.json").exists():
            continue
        table = OpTable.load(REPO / "datasets", op, {"exclude_sources": []})
        out[op] = api_speed(op, api.DEFAULT_ROOT, table, rows)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--report", default=str(REPO / "reports" / "evaluation.json"))
    parser.add_argument("--rows", type=int, default=200_000, help="batch size of the throughput measurement")
    args = parser.parse_args()
    report = json.loads(Path(args.report).read_text())
    print(f"report: {args.report} (commit {report.get('commit')})")
    for c in report.get("targets", []):
        verdict = {True: "met", False: "MISSED", None: "n/a"}[c["met"]]
        print(f"  {verdict:>6}  {c['target']}: {c['measured']}  (goal {c['goal']})")
    print(f"\nprediction API, measured now on {os.cpu_count()} CPU cores ({platform.processor() or platform.machine()},"
          f" {platform.system()}), best of 3:")
    for op, s in api_numbers(args.rows).items():
        if "error" in s:
            print(f"  {op}: failed ({s['error']})")
            continue
        print(f"  {op:>7}: import+load+predict {1000 * s['import_load_predict_s']:.0f} ms over numpy+pandas "
              f"(goal <= 500 ms), {s['predictions_per_s'] / 1e6:.2f} M predictions/s (goal >= 1), weights "
              f"{s['weights_bytes'] / 1024:.0f} KiB (goal <= 1024 KiB)")


if __name__ == "__main__":
    main()
