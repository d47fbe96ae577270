"""How fast is a compute-bound GEMM after a few ms of load, and after seconds of it? A GPU starts a burst of work
at its boost clock and, under a power cap, settles lower. Datasets timed after a short warm-up (CUDA-graph replay
right after the first calls) and after a long one (this collector: >= 100 ms of back-to-back calls) then differ
by the ratio of the two clocks. This script measures that ratio: it queues a square GEMM back to back for
``--seconds`` after an idle pause, brackets every call with CUDA events, and logs the SM clock and the power
draw with ``nvidia-smi`` meanwhile.

    python benchmarks/clock_check.py --out reports/ [--n 8192] [--seconds 3] [--precisions bf16,tf32]

Writes clock_check.csv (one row per call: precision, start ms since the first call, call ms, TFLOP/s),
clock_smi.csv (the nvidia-smi log) and clock_check.json (the rate in time windows since the first call).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.collect.worker import set_precision_flags  # noqa: E402
from pipeline.schema import PRECISIONS  # noqa: E402

WINDOWS_MS = ((0, 25), (25, 100), (100, 500), (500, 1000), (1000, 2000), (2000, 1e9))


def gemm_trace(precision: str, n: int, seconds: float, idle_s: float) -> pd.DataFrame:
    """Per-call GPU times of an n^3 GEMM queued back to back for ``seconds``, after ``idle_s`` of idle."""
    import torch

    dtype = set_precision_flags(torch, precision)
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=a.dtype)
    torch.matmul(a, b)                              # cuBLAS handle, heuristics: not timed
    torch.cuda.synchronize()
    time.sleep(idle_s)
    first = torch.cuda.Event(enable_timing=True)
    first.record()
    events = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:     # the host stays far ahead: calls are ms long
        pair = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        pair[0].record()
        torch.matmul(a, b)
        pair[1].record()
        events.append(pair)
        if len(events) % 64 == 0:                    # bound the queue without ever letting the GPU idle
            events[-32][1].synchronize()
    torch.cuda.synchronize()
    begin = np.array([first.elapsed_time(s) for s, _ in events])
    call = np.array([s.elapsed_time(e) for s, e in events])
    return pd.DataFrame({"precision": precision, "start_ms": begin, "call_ms": call,
                         "tflops": 2 * n ** 3 / (call * 1e-3) / 1e12})


def summarize(trace: pd.DataFrame) -> dict:
    """Median TFLOP/s per window since the first call, and the ratio of the last window to the first."""
    out = {}
    for precision, rows in trace.groupby("precision"):
        rates = {}
        for lo, hi in WINDOWS_MS:
            sel = rows[(rows.start_ms >= lo) & (rows.start_ms < hi)]
            if len(sel):
                rates[f"{lo:g}-{hi:g} ms" if hi < 1e9 else f">= {lo:g} ms"] = round(float(sel.tflops.median()), 1)
        values = list(rates.values())
        out[precision] = {"tflops_by_window": rates, "last_over_first": round(values[-1] / values[0], 4),
                          "calls": int(len(rows))}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--idle", type=float, default=2.0, help="idle seconds before each trace (the clock recovers)")
    ap.add_argument("--precisions", default="bf16,tf32")
    args = ap.parse_args(argv)
    precisions = args.precisions.split(",")
    bad = [p for p in precisions if p not in PRECISIONS]
    if bad:
        ap.error(f"--precisions: unknown {bad}; allowed: {sorted(PRECISIONS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "clock_smi.csv", "w") as smi_log:
        smi = subprocess.Popen(["nvidia-smi", "--format=csv,nounits", "-lms", "20",
                                "--query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu"],
                               stdout=smi_log, stderr=subprocess.DEVNULL)
        try:
            trace = pd.concat([gemm_trace(p, args.n, args.seconds, args.idle) for p in precisions])
        finally:
            smi.terminate()
            smi.wait()
    trace.to_csv(args.out / "clock_check.csv", index=False)
    summary = summarize(trace)
    (args.out / "clock_check.json").write_text(json.dumps({"n": args.n, "seconds": args.seconds, **summary}, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
