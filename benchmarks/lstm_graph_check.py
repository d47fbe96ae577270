"""Can CUDA-graph replay give the ``host_paced`` LSTM tasks a GPU time, forward and backward?

An LSTM call that launches more kernels than the launch queue holds (a 5-layer bidirectional LSTM at sequence 200:
4,000-6,100 kernels) cannot be kept ahead of the host by any busy-wait, so the collector marks it ``host_paced``
and it stays out of training. A CUDA graph launches all of a call's kernels with one host call. This captures,
for tasks of the shipped dataset, the forward (``fn(x)``) and a whole training step (forward, then
``torch.autograd.grad`` of it) and replays them; the backward's graph time is step minus forward. For ``ok``
tasks it sets these beside the collector's recorded times (``time_ms``): where they agree, graph replay could
stand in for the host-paced ones (graphs also remove the launch gaps between dependent kernels, so expect them
a little faster). ``capture`` says whether each capture worked. Needs a CUDA GPU.

    python benchmarks/lstm_graph_check.py --n 6 --out reports/gpu_checks/
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from timing_check import graph_ms  # noqa: E402

from pipeline import schema  # noqa: E402
from pipeline.collect.worker import set_precision_flags  # noqa: E402
from pipeline.markdown import markdown_table  # noqa: E402
from pipeline.ops import get_op  # noqa: E402

CONFIG = schema.OP_CONFIG_COLUMNS["lstm"]


def tasks(rows: pd.DataFrame, n: int, seed: int) -> pd.DataFrame:
    """Up to ``n`` host_paced tasks (drawn with ``seed``) and the ``n`` ok tasks with the most sequential steps
    (layers x sequence x directions), one row per task, its forward and backward times side by side."""
    wide = rows.pivot_table(index=["config_id", "precision"], columns="phase", values="time_ms", aggfunc="first")
    wide.columns = [f"{phase}_ms" for phase in wide.columns]
    status = rows.groupby(["config_id", "precision"])["status"].agg(
        lambda s: "host_paced" if (s == "host_paced").any() else "ok")
    configs = rows.drop_duplicates(["config_id", "precision"]).set_index(["config_id", "precision"])[list(CONFIG)]
    table = wide.join(status).join(configs)
    table["steps"] = table["num_layers"] * table["seq_len"] * np.where(table["bidirectional"], 2, 1)
    paced = table[table["status"] == "host_paced"]
    paced = paced.sample(min(n, len(paced)), random_state=seed)
    ok = table[table["status"] == "ok"].nlargest(n, "steps")   # the ok tasks nearest the paced ones: longest chains
    return pd.concat([paced, ok]).reset_index()


def graph_times(cfg: dict, precision: str) -> dict:
    """Forward and step (forward + backward) graph-replay ms per call; NaN where capture failed."""
    import torch

    fn, inputs, params = get_op("lstm").build(cfg, "cuda", set_precision_flags(torch, precision))
    grad_out = torch.randn_like(fn(*inputs))

    def step():
        torch.autograd.grad(fn(*inputs), inputs + params, grad_out)

    result = {}
    for name, call in (("forward_graph_ms", functools.partial(fn, *inputs)), ("step_graph_ms", step)):
        try:
            result[name] = graph_ms(call, calls=2, replays=5)
        except Exception as exc:  # noqa: BLE001 -- a failed capture is the finding; the row says so
            torch.cuda.synchronize()
            result[name] = float("nan")
            result[f"{name}_error"] = f"{type(exc).__name__}: {exc}"[:200]
    result["backward_graph_ms"] = result["step_graph_ms"] - result["forward_graph_ms"]
    return result


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """Per status: tasks, captures that worked, and graph time over the collector's time (median), per phase."""
    out = []
    for status, group in df.groupby("status"):
        captured = group.dropna(subset=["forward_graph_ms", "step_graph_ms"])
        out.append({"status": status, "tasks": len(group), "captured": len(captured),
                    "forward_graph_over_recorded": np.median(captured["forward_graph_ms"] / captured["forward_ms"])
                    if len(captured) else np.nan,
                    "backward_graph_over_recorded": np.median(captured["backward_graph_ms"] / captured["backward_ms"])
                    if len(captured) else np.nan})
    return pd.DataFrame(out).round(3)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=6, help="tasks per status (host_paced, ok)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--root", default="datasets")
    parser.add_argument("--gpu", default="h200")
    parser.add_argument("--out", default="reports/gpu_checks")
    args = parser.parse_args(argv)
    rows = schema.read_dataset(args.root, gpus=[args.gpu])
    rows = rows[(rows["op"] == "lstm") & rows["status"].isin(["ok", "host_paced"])]
    if rows.empty:
        parser.error(f"--root/--gpu: no ok or host_paced LSTM rows for {args.gpu} under {args.root}")
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("lstm_graph_check: needs a CUDA GPU")
    torch.backends.cudnn.benchmark = True
    picked = tasks(rows, args.n, args.seed)
    measured = []
    for task in picked.to_dict("records"):
        cfg = {k: bool(task[k]) if k in schema.BOOL_COLUMNS else int(task[k]) for k in CONFIG}
        measured.append({**task, **graph_times(cfg, task["precision"])})
        print(measured[-1], file=sys.stderr, flush=True)
        torch.cuda.empty_cache()
    df = pd.DataFrame(measured)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "lstm_graph_check.csv", index=False)
    text = (f"# LSTM CUDA-graph replay on {torch.cuda.get_device_name()}\n\n`python benchmarks/lstm_graph_check.py "
            f"--n {args.n} --seed {args.seed}`\n\n{markdown_table(summary(df))}\n")
    (out / "lstm_graph_check.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
