"""Characterise SM partitions (green contexts) of this host's GPU: the SMs a launch reaches, the copy
bandwidth and the matmul rate per precision, for the full GPU and for each partition (one process each).

Prints one JSON line per partition and writes them to ``--out``. The registry entries of the partition labels
(``h200-sm<N>``) take their rates from these measurements. ``python benchmarks/partition_specs.py 64 32 16``
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = """
import json, sys, torch
sys.path.insert(0, {root!r})
from pipeline.collect.worker import characterise, count_reachable_sms, enter_partition
torch.cuda.set_device(0)
sms = {sms}
info = enter_partition("cuda:0", sms) if sms else {{"sm_partition_requested": None,
                                                    "sm_partition_reached": count_reachable_sms("cuda:0")}}
info.update(characterise("cuda:0"))
print("RESULT " + json.dumps(info), flush=True)
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sms", type=int, nargs="*", default=[64, 32, 16])
    parser.add_argument("--out", default="reports/partition_specs.jsonl")
    args = parser.parse_args(argv)
    results = []
    for sms in [0] + args.sms:
        proc = subprocess.run([sys.executable, "-c", CHILD.format(root=str(ROOT), sms=sms)], capture_output=True,
                              text=True, timeout=300)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode or not lines:
            print(f"partition {sms}: failed (exit {proc.returncode}): {proc.stderr[-2000:]}", file=sys.stderr)
            continue
        result = json.loads(lines[-1][7:])
        results.append(result)
        print(json.dumps(result), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(json.dumps(r) + "\n" for r in results))
    return 0 if len(results) == len(args.sms) + 1 else 1


if __name__ == "__main__":
    sys.exit(main())
