"""Does the collector time an LSTM's GPU work, or the host's rate of launching it? An LSTM enqueues kernels per
layer and step, so its host time per call can exceed its GPU time. On the same configs this compares:

- ``new_ms``: the collector's method (``pipeline.collect.worker.run_task``): each group of calls queued behind a
  busy-wait of its own; ``status`` is ``host_paced`` where the host still enqueued a group when its wait ran out;
- ``old_ms``: one busy-wait covering every call (``TimingSettings.chain_busy_wait = False``): the calls' launches
  overflow the launch queue, the host blocks, and the GPU runs at the host's pace;
- ``kernel_ms``: the sum of the call's GPU kernel times under the PyTorch profiler (GPU busy time, no gaps), and
  ``kernels``, how many kernels one call launches (beyond ~1,000 queued launches the host blocks, and no
  busy-wait can keep the GPU ahead of it);
- ``graph_ms``: CUDA-graph replay of the forward call (no launches from the host at all; NaN for the backward and
  where capture fails);
- ``host_ms``: the host's time per call.

Expectation: ``new_ms`` stays near ``kernel_ms`` and ``graph_ms`` (gaps between dependent kernels add a few us
each; the profiler's sum counts a bidirectional LSTM's concurrent kernels twice) even where ``host_ms`` is far
above them; ``old_ms`` follows ``host_ms`` there. An ``ok`` row *follows the host* when ``new_ms`` is over
``--max-ratio`` times the larger of ``kernel_ms`` and ``graph_ms`` and at least 0.8 ``host_ms``. Needs a CUDA GPU.

    python benchmarks/lstm_timing_check.py --n 8 --out reports/ [--precisions fp32,bf16,tf32,fp16] [--max-ratio 1.5]

With ``--max-ratio R`` it exits 1 if more than 10 % of the ``ok`` rows follow the host, none is ``ok``, or over
25 % are ``host_paced`` (a check that discards most rows proves nothing; ``benchmarks/gpu_call.sh`` sweeps
LSTMs only when it passes).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from timing_check import graph_ms, space_configs  # noqa: E402

from pipeline import schema, timing  # noqa: E402
from pipeline.collect.plan import Task  # noqa: E402
from pipeline.collect.worker import run_task, set_precision_flags  # noqa: E402
from pipeline.markdown import markdown_table  # noqa: E402
from pipeline.ops import get_op  # noqa: E402

SETTINGS = timing.TimingSettings()
OLD_RULE = dataclasses.replace(SETTINGS, chain_busy_wait=False)   # one busy-wait for all calls
MAX_FOLLOWING = 0.1          # share of ok rows that may follow the host
MAX_PACED = 0.25             # share of rows that may be host_paced


def kernel_ms(cfg: dict, precision: str, calls: int = 5) -> dict[str, tuple[float, float, float]]:
    """{phase: (summed GPU kernel ms per call, kernels per call, CUDA-graph replay ms per call)}."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    dtype = set_precision_flags(torch, precision)
    fn, inputs, params = get_op("lstm").build(cfg, "cuda", dtype)
    out = fn(*inputs)
    grad_out = torch.randn_like(out)
    calls_of = {"forward": lambda: fn(*inputs),
                "backward": functools.partial(torch.autograd.grad, out, inputs + params, grad_out, retain_graph=True)}
    result = {}
    for phase, call in calls_of.items():
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(calls):
                call()
            torch.cuda.synchronize()
        events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
        total_us = sum(e.device_time_total for e in events)
        graph = float("nan")
        if phase == "forward":  # capturing autograd's backward is fragile, and a failed capture can poison the context
            try:
                graph = graph_ms(call, calls=2, replays=5)
            except Exception:  # noqa: BLE001 -- some cuDNN paths cannot be captured; the column says so
                torch.cuda.synchronize()
        result[phase] = (total_us / calls / 1e3, sum(e.count for e in events) / calls, graph)
    return result


def timed(task: Task, settings: timing.TimingSettings) -> dict:
    """The collector's (GPU ms, host ms, status) per phase under ``settings``."""
    results, _ = run_task(task, "cuda:0", settings, {})
    return {phase: (t.median_ms, t.host_ms, status) for phase, (status, t, _) in results.items() if t is not None}


def run(n: int, seed: int, precisions: list[str]) -> pd.DataFrame:
    import torch

    torch.backends.cudnn.benchmark = True
    rows = []
    for precision in precisions:
        for cfg in space_configs("lstm", n, seed, precision):
            task = Task("lstm", cfg, "check", precision)
            new, old, kernels = timed(task, SETTINGS), timed(task, OLD_RULE), kernel_ms(cfg, precision)
            for phase in schema.PHASES:
                if phase in new and phase in old:
                    rows.append({"precision": precision, "phase": phase, **cfg, "new_ms": new[phase][0],
                                 "old_ms": old[phase][0], "kernel_ms": kernels[phase][0],
                                 "kernels": kernels[phase][1], "graph_ms": kernels[phase][2],
                                 "host_ms": new[phase][1], "status": new[phase][2]})
            print(f"{precision} {rows[-1] if rows else cfg}", file=sys.stderr, flush=True)
            torch.cuda.empty_cache()
    return pd.DataFrame(rows)


def gpu_reference(frame: pd.DataFrame) -> pd.Series:
    """The larger of the kernel sum and graph replay (the sum where capture failed)."""
    return np.fmax(frame["kernel_ms"], frame["graph_ms"])


def following_host(frame: pd.DataFrame, max_ratio: float) -> pd.Series:
    """Rows whose new_ms follows the host: over ``max_ratio`` times the GPU reference and near host_ms."""
    return (frame["new_ms"] > max_ratio * gpu_reference(frame)) & (frame["new_ms"] >= 0.8 * frame["host_ms"])


def summary(frame: pd.DataFrame, max_ratio: float = 1.5) -> pd.DataFrame:
    """Per precision and phase: median ratios of the ok rows to the kernel sum and graph replay, the share of ok
    rows following the host, and the rows the collector marked host_paced (with their median time over the larger
    GPU reference: near 1 means the flag was cautious)."""
    ratios = {f"{col}_over_kernel": frame[f"{col}_ms"] / frame.kernel_ms for col in ("new", "old", "host")}
    f = frame.assign(**ratios, new_over_graph=frame.new_ms / frame.graph_ms,
                     following=following_host(frame, max_ratio), paced=frame.status == "host_paced")
    ok = f[f.status == "ok"].groupby(["precision", "phase"]).agg(
        ok_rows=("new_ms", "size"),
        new_over_kernel=("new_over_kernel", "median"),
        new_over_graph=("new_over_graph", "median"),
        old_over_kernel=("old_over_kernel", "median"),
        host_over_kernel=("host_over_kernel", "median"),
        following_host=("following", "mean"))
    f = f.assign(paced_over_gpu=np.where(f.paced, f.new_ms / gpu_reference(f), np.nan))
    every = f.groupby(["precision", "phase"]).agg(rows=("new_ms", "size"), host_paced=("paced", "sum"),
                                                  paced_over_gpu=("paced_over_gpu", "median"),
                                                  kernels_max=("kernels", "max"))
    return every.join(ok)


def within(frame: pd.DataFrame, max_ratio: float) -> bool:
    """Whether some rows are ok, at most ``MAX_FOLLOWING`` of them follow the host, and at most ``MAX_PACED`` of
    all rows are host_paced."""
    ok = frame[frame["status"] == "ok"]
    paced = float((frame["status"] == "host_paced").mean()) if len(frame) else 1.0
    return bool(len(ok)) and float(following_host(ok, max_ratio).mean()) <= MAX_FOLLOWING and paced <= MAX_PACED


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=8, help="configs per precision")
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--precisions", default="fp32,bf16,tf32,fp16")
    ap.add_argument("--out", type=Path, default=Path("reports"))
    ap.add_argument("--max-ratio", type=float, default=None,
                    help="exit 1 if over 10 %% of the ok rows follow the host (new_ms over this times the GPU "
                         "reference and near host_ms), none is ok, or over 25 %% are host_paced")
    args = ap.parse_args(argv)
    precisions = args.precisions.split(",")
    bad = [p for p in precisions if p not in schema.PRECISIONS]
    if bad:
        ap.error(f"--precisions: unknown {bad}; allowed: {list(schema.PRECISIONS)}")
    import torch

    if not torch.cuda.is_available():
        print("lstm_timing_check needs a CUDA GPU", file=sys.stderr)
        return 2
    frame = run(args.n, args.seed, precisions)
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out / "lstm_timing_check.csv", index=False)
    table = summary(frame, args.max_ratio or 1.5)
    (args.out / "lstm_timing_check.md").write_text(
        f"# LSTM timing check on {torch.cuda.get_device_name()}\n\n{markdown_table(table.reset_index(), digits=3)}\n")
    print(table.round(3).to_string())
    if args.max_ratio is not None and not within(frame, args.max_ratio):
        print(f"over {MAX_FOLLOWING:.0%} of the ok rows follow the host, none is ok, or over {MAX_PACED:.0%} of the "
              "rows are host_paced", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
