"""Which cuDNN algorithm runs the conv2d rows that beat the physical lower bound?

The bound (``pipeline.features.bound_ms``) is the direct algorithm's GEMM FLOPs over the peak, a quarter of them for a
Winograd-capable 3x3 convolution. A few measured rows run below it, fp32 convolutions with large kernels over small
inputs (reports/model_experiments.md, section 25); only a transform algorithm such as FFT does that much less
arithmetic. This picks the dataset's ``ok`` conv2d rows of one GPU label below ``--max-ratio`` of the bound (and, for
contrast, the ``--controls`` rows of 5x5-or-larger kernels closest above it), autotunes each config as the collector
does (``cudnn.benchmark``), profiles its forward and backward calls and names the algorithm from the GPU kernels
that ran. Needs a CUDA GPU; the selection runs anywhere.

    python benchmarks/conv_algorithms.py --root datasets --gpu h200 --out reports/gpu_checks/
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipeline import features, schema  # noqa: E402
from pipeline.atomic import atomic_write  # noqa: E402
from pipeline.markdown import markdown_table  # noqa: E402
from pipeline.ops import get_op  # noqa: E402

ALGORITHMS = (("fft", ("fft", "cgemm", "gemm_cf32", "gemm_cf16", "flip_filter")), ("winograd", ("winograd",)),
              ("direct", ("alg0_engine", "dgrad_engine", "dgrad2d_alg1", "conv_depthwise", "conv2d_grouped")),
              ("gemm", ("gemm", "xmma", "scudnn", "implicit", "sm80_", "sm90_", "cutlass")))
"""Kernel-name substrings (lower case) per algorithm family, first match wins (FFT's complex products run as
``cgemm`` kernels, named ``xmma_gemm_cf32cf32_...`` on sm80 and later); anything else is ``other`` (transposes,
casts, reductions: the work around a convolution)."""


def algorithm(kernel: str) -> str:
    """The algorithm family a GPU kernel's name belongs to."""
    name = kernel.lower()
    return next((family for family, keys in ALGORITHMS if any(k in name for k in keys)), "other")


def bound_ratios(rows: pd.DataFrame, gpu: str) -> pd.Series:
    """Each row's measured time over its physical lower bound on ``gpu``."""
    cols = list(get_op("conv2d").columns)
    ratio = pd.Series(np.nan, index=rows.index)
    for (precision, phase), group in rows.groupby(["precision", "phase"]):
        ratio[group.index] = group["time_ms"].to_numpy() / features.bound_ms("conv2d", group[cols], gpu, precision,
                                                                               phase)
    return ratio


def select(rows: pd.DataFrame, gpu: str, max_ratio: float = 1.0, controls: int = 2) -> pd.DataFrame:
    """One row per (config, precision) task: the tasks with a phase below ``max_ratio`` of the bound, then the
    ``controls`` large-kernel (5x5 or more) tasks whose lower ratio is closest above it. Columns: the config,
    precision, ``kind`` (below / control) and each phase's measured ms and ratio."""
    rows = rows.assign(ratio=bound_ratios(rows, gpu))
    cols = list(get_op("conv2d").columns)
    wide = rows.pivot_table(index=["config_id", "precision"], columns="phase", values=["time_ms", "ratio"],
                            aggfunc="first")
    wide.columns = [f"{phase}_{value}" for value, phase in wide.columns]
    wide = wide.join(rows.drop_duplicates(["config_id", "precision"]).set_index(["config_id", "precision"])[cols])
    wide = wide.assign(_low=wide.filter(like="_ratio").min(axis=1)).sort_values("_low")
    below = wide[wide["_low"] < max_ratio].assign(kind="below")
    large = (wide["kernel_h"] * wide["kernel_w"] >= 25) & (wide["_low"] >= max_ratio)
    control = wide[large].head(controls).assign(kind="control")
    return pd.concat([below, control]).drop(columns="_low").reset_index()


def profile_task(cfg: dict, precision: str, reps: int = 5) -> list[dict]:
    """Per phase and GPU kernel: calls per op call and mean us, after the config's autotuning first calls."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from pipeline.collect.worker import set_precision_flags

    fn, inputs, params = get_op("conv2d").build(cfg, "cuda", set_precision_flags(torch, precision))
    forward = functools.partial(fn, *inputs)
    out = forward()
    backward = functools.partial(torch.autograd.grad, out, inputs + params, torch.randn_like(out), retain_graph=True)
    rows = []
    for phase, call in (("forward", forward), ("backward", backward)):
        call()
        call()                                   # autotuned, then run on the picked algorithm
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                call()
            torch.cuda.synchronize()
        for event in prof.key_averages():
            if event.device_type.name == "CUDA" and event.count:
                rows.append({"precision": precision, "phase": phase, "kernel": event.key,
                             "calls_per_op": event.count / reps, "us_per_op": event.device_time_total / reps,
                             "algorithm": algorithm(event.key)})
    return rows


def summary(tasks: pd.DataFrame, kernels: pd.DataFrame) -> pd.DataFrame:
    """Per task and phase: the bound ratio, the measured and profiled ms, and the algorithm family holding most
    of the profiled GPU time (with its share and its longest kernel)."""
    out = []
    for _, task in tasks.iterrows():
        for phase in ("forward", "backward"):
            k = kernels[(kernels["config_id"] == task["config_id"]) & (kernels["precision"] == task["precision"])
                        & (kernels["phase"] == phase)]
            if k.empty:
                continue
            by_family = k.groupby("algorithm")["us_per_op"].sum().sort_values(ascending=False)
            top = by_family.index[0]
            out.append({"kind": task["kind"], "precision": task["precision"], "phase": phase,
                        "kernel": f"{task['kernel_h']}x{task['kernel_w']}",
                        "input": f"{task['batch']}x{task['in_channels']}x{task['height']}x{task['width']}",
                        "out_channels": task["out_channels"], "groups": task["groups"],
                        "bound_ratio": task.get(f"{phase}_ratio"), "measured_ms": task.get(f"{phase}_time_ms"),
                        "profiled_ms": k["us_per_op"].sum() / 1e3, "algorithm": top,
                        "share": by_family.iloc[0] / by_family.sum(),
                        "longest_kernel": k.sort_values("us_per_op").iloc[-1]["kernel"][:60]})
    return pd.DataFrame(out).round(3)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default="datasets")
    parser.add_argument("--gpu", default="h200", help="dataset label whose rows are selected")
    parser.add_argument("--max-ratio", type=float, default=1.0, help="select tasks with a phase below this x bound")
    parser.add_argument("--controls", type=int, default=2, help="large-kernel tasks above it, for contrast")
    parser.add_argument("--n", type=int, default=12, help="at most this many tasks below the ratio")
    parser.add_argument("--out", default="reports/gpu_checks")
    parser.add_argument("--summarize", action="store_true",
                        help="no GPU: name the algorithms of <out>/conv_algorithms.csv again and rewrite its summary")
    args = parser.parse_args(argv)
    if args.max_ratio <= 0 or args.n < 1 or args.controls < 0:
        parser.error("--max-ratio must be > 0, --n >= 1 and --controls >= 0")
    try:
        rows = schema.read_dataset(args.root, ops=["conv2d"], gpus=[args.gpu], status="ok")
    except (FileNotFoundError, ValueError) as err:
        parser.error(f"--root/--gpu: no conv2d rows of {args.gpu!r} under {args.root!r} ({err})")
    if rows.empty:
        parser.error(f"--root/--gpu: no ok conv2d rows of {args.gpu!r} under {args.root!r}")
    command = (f"python benchmarks/conv_algorithms.py --root {args.root} --gpu {args.gpu} --max-ratio "
               f"{args.max_ratio} --controls {args.controls} --n {args.n}")
    if args.summarize:   # every task of the selection rule, for those the csv holds (rows may have come since)
        print(summarize(Path(args.out), select(rows, args.gpu, args.max_ratio, len(rows)), command))
        return
    tasks = select(rows, args.gpu, args.max_ratio, args.controls)
    tasks = pd.concat([tasks[tasks["kind"] == "below"].head(args.n), tasks[tasks["kind"] == "control"]])
    print(f"{(tasks['kind'] == 'below').sum()} tasks below {args.max_ratio}x the bound, "
          f"{(tasks['kind'] == 'control').sum()} controls", flush=True)
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("conv_algorithms: needs a CUDA GPU")
    torch.backends.cudnn.benchmark = True
    cols = list(get_op("conv2d").columns)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    kernels: list[dict] = []
    for i, (_, task) in enumerate(tasks.iterrows(), 1):
        cfg = {c: task[c].item() if hasattr(task[c], "item") else task[c] for c in cols}
        start = time.perf_counter()
        try:
            kernels += [{"config_id": task["config_id"], **row} for row in profile_task(cfg, task["precision"])]
        except (torch.OutOfMemoryError, RuntimeError) as err:   # one config cuDNN refuses ends only itself
            print(f"{task['precision']} {type(err).__name__}: {str(err)[:200]} for {cfg}", file=sys.stderr, flush=True)
        torch.cuda.empty_cache()
        print(f"task {i}/{len(tasks)} ({task['kind']}, {task['precision']}, {cfg['kernel_h']}x{cfg['kernel_w']}): "
              f"{time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
        text = write(out, tasks, pd.DataFrame(kernels), command, torch.cuda.get_device_name())  # after every task
    print(text)


def summarize(out: Path, tasks: pd.DataFrame, command: str) -> str:
    """Rewrite ``out``'s summary from its kernels csv, the algorithm of each kernel named again by ``algorithm``
    (for a change of the name rules; the device is the one the summary names). ``tasks`` are the selection's,
    restricted to the configs the csv holds."""
    csv, md = out / "conv_algorithms.csv", out / "conv_algorithms.md"
    if not csv.exists() or not md.exists():
        raise SystemExit(f"conv_algorithms --summarize: needs {csv} and {md} from a GPU run")
    kernels = pd.read_csv(csv)
    kernels["algorithm"] = kernels["kernel"].map(algorithm)
    device = md.read_text().splitlines()[0].rsplit(" on ", 1)[-1]
    held = pd.MultiIndex.from_frame(kernels[["config_id", "precision"]])
    tasks = tasks[pd.MultiIndex.from_frame(tasks[["config_id", "precision"]]).isin(held)]
    return write(out, tasks, kernels, command, device)


def write(out: Path, tasks: pd.DataFrame, kernels: pd.DataFrame, command: str, device: str) -> str:
    """The kernels so far (csv) and their summary (md), each written atomically: a run stopped by its time limit
    leaves the tasks it finished."""
    table = summary(tasks, kernels) if not kernels.empty else pd.DataFrame()
    text = (f"# conv2d rows below the physical lower bound: the algorithms cuDNN picked, on {device}\n\n"
            f"`{command}`\n\nPer task and phase: measured time over the bound, the dataset's time and the profiled "
            f"one per call, the algorithm family holding most of the profiled GPU time and its share. Kernels per "
            f"call: `conv_algorithms.csv`.\n\n{markdown_table(table) if not table.empty else 'No task ran.'}\n")
    atomic_write(out / "conv_algorithms.csv", kernels.to_csv(index=False))
    atomic_write(out / "conv_algorithms.md", text)
    return text


if __name__ == "__main__":
    main()
