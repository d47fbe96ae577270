"""How fast the prediction API is on this machine: cold-process latency and batch throughput."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from pipeline import api
from pipeline import checkpoint as ck
from pipeline.schema import OP_CONFIG_COLUMNS

_REPO = Path(__file__).resolve().parent.parent.parent
_SNIPPET = r"""
import json, sys, time
t0 = time.perf_counter()
import numpy, pandas
t1 = time.perf_counter()
import pipeline
s = pipeline.load_scaler(sys.argv[1], root=sys.argv[2])
s.predict(json.loads(sys.argv[3]), "h100", return_flags=True)
t2 = time.perf_counter()
heavy = [m for m in ("torch", "lightning", "pytorch_lightning", "mlflow", "hydra") if m in sys.modules]
print(json.dumps({"numpy_pandas_s": t1 - t0, "import_load_predict_s": t2 - t1, "heavy": heavy}))
"""


def _cold_start(op: str, root: Path, config: dict) -> dict:
    """The best of 3 fresh processes: import + load_scaler (sha256 checks included) + one prediction."""
    runs = []
    for _ in range(3):
        res = subprocess.run([sys.executable, "-c", _SNIPPET, op, str(root), json.dumps(config)],
                             capture_output=True, text=True, timeout=300, cwd=_REPO)
        if res.returncode != 0:
            return {"error": res.stderr.strip().splitlines()[-1] if res.stderr.strip() else "failed"}
        runs.append(json.loads(res.stdout))
    return min(runs, key=lambda r: r["import_load_predict_s"])


def api_speed(op: str, root: Path, table, batch_rows: int) -> dict:
    """Cold-process import+load+first-prediction latency, and batch predictions per second (best of 3)."""
    cols = list(OP_CONFIG_COLUMNS[op])
    one = {c: (bool(v) if isinstance(v, (bool, np.bool_)) else int(v)) for c, v in table.frame.iloc[0][cols].items()}
    best = _cold_start(op, root, one)
    if "error" in best:
        return best
    scaler = api.load_scaler(op, root=root)
    pool = table.frame[cols]
    batch = pool.iloc[np.random.default_rng(0).integers(0, len(pool), batch_rows)].reset_index(drop=True)
    scaler.predict(batch.iloc[:1000], "h100", return_flags=True)
    times = []
    for _ in range(3):
        t = time.perf_counter()
        scaler.predict(batch, "h100", "fp32", "forward", return_flags=True)
        times.append(time.perf_counter() - t)
    weights = root / op / f"v{scaler.version}" / ck.WEIGHTS_FILE
    arch = scaler.card["architecture"]
    return {"numpy_pandas_import_s": best["numpy_pandas_s"], "import_load_predict_s": best["import_load_predict_s"],
            "heavy_modules": best["heavy"], "batch_rows": batch_rows, "predictions_per_s": batch_rows / min(times),
            "hidden": arch["hidden"], "activation": arch["activation"],
            "n_parameters": int(sum(np.prod(w.shape) for w in ck.load(root, op, scaler.version)[1].values())),
            "weights_bytes": weights.stat().st_size}
