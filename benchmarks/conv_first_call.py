"""Where a conv2d sweep's time goes: the anatomy of each config's first (cuDNN-autotuning) calls.

conv2d sweeps spend ~90 % of their wall time in first calls, where cuDNN autotunes the forward, data-gradient and
weight-gradient convolutions. Whether that time is the GPU running candidate algorithms or the host building
execution plans decides what could make it faster (only host work can overlap with other measurements). Per
config and phase this records the first call's wall time, the GPU kernel time inside it (PyTorch profiler, CUDA
activity) and the kernels launched, next to the config's estimated and measured steady time per call. Configs
come from the collector's stratified space (its time bands, its catalog share). Needs a CUDA GPU.

    python benchmarks/conv_first_call.py --n 12 --precisions fp32,bf16 --out reports/gpu_checks/
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from timing_check import space_configs  # noqa: E402

from pipeline import gpus, schema  # noqa: E402
from pipeline.collect.worker import set_precision_flags  # noqa: E402
from pipeline.markdown import markdown_table  # noqa: E402
from pipeline.ops import get_op  # noqa: E402
from pipeline.ops.base import estimate_ms  # noqa: E402


def first_call(call) -> tuple[float, float, int]:
    """(wall s, GPU kernel s, kernels) of one synced call under the profiler."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        call()
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA"]
    return wall, sum(e.device_time_total for e in events) / 1e6, int(sum(e.count for e in events))


def steady_ms(call, calls: int = 5) -> float:
    import torch

    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    call()
    begin.record()
    for _ in range(calls):
        call()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / calls


def config_rows(cfg: dict, precision: str, reference: dict) -> list[dict]:
    """One row per phase of ``cfg``: its first call's anatomy and its steady time per call."""
    import functools

    import torch

    spec = get_op("conv2d")
    fn, inputs, params = spec.build(cfg, "cuda", set_precision_flags(torch, precision))
    forward = functools.partial(fn, *inputs)
    anatomy = {"forward": first_call(forward)}
    out = forward()
    backward = functools.partial(torch.autograd.grad, out, inputs + params, torch.randn_like(out), retain_graph=True)
    anatomy["backward"] = first_call(backward)
    calls = {"forward": forward, "backward": backward}
    estimated = estimate_ms(spec, cfg, precision, reference)
    return [{"precision": precision, "phase": phase, "estimated_ms": estimated, "steady_ms": steady_ms(calls[phase]),
             "first_wall_s": wall, "first_gpu_s": gpu, "kernels": kernels, **cfg}
            for phase, (wall, gpu, kernels) in anatomy.items()]


def run(n: int, seed: int, precisions: list[str]) -> pd.DataFrame:
    import torch

    torch.backends.cudnn.benchmark = True
    reference = gpus.gpu_spec("h200")
    rows = []
    for precision in precisions:
        for cfg in space_configs("conv2d", n, seed, precision):
            try:
                rows += config_rows(cfg, precision, reference)
            except torch.OutOfMemoryError:
                print(f"{precision} out of memory: {cfg}", file=sys.stderr, flush=True)
            torch.cuda.empty_cache()
            print(f"{precision} {rows[-1] if rows else cfg}", file=sys.stderr, flush=True)
    return pd.DataFrame(rows)


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """First-call wall and GPU seconds summed per band of estimated time, and the GPU's share of that wall time."""
    bands = pd.cut(df["estimated_ms"], [0, 0.05, 0.5, 5, 50, np.inf], right=False)
    table = df.groupby([bands.astype(str), "phase"], observed=True).agg(
        rows=("first_wall_s", "size"), first_wall_s_sum=("first_wall_s", "sum"), first_gpu_s_sum=("first_gpu_s", "sum"),
        median_kernels=("kernels", "median"), median_steady_ms=("steady_ms", "median")).reset_index()
    table = table.rename(columns={"estimated_ms": "estimated_ms band"})
    total = df.groupby("phase")[["first_wall_s", "first_gpu_s"]].sum().add_suffix("_sum").reset_index().assign(
        **{"estimated_ms band": "all", "rows": df.groupby("phase").size().values})
    table = pd.concat([table, total], ignore_index=True)
    table["gpu_share"] = table["first_gpu_s_sum"] / table["first_wall_s_sum"]
    return table.round(3)


def slowest(df: pd.DataFrame, n: int = 3) -> pd.DataFrame:
    """The ``n`` slowest first calls with their configs: a few outliers can hold most of a sweep's time."""
    columns = ["precision", "phase", "estimated_ms", "steady_ms", "first_wall_s", "first_gpu_s", "batch",
               "in_channels", "out_channels", "height", "width", "kernel_h", "kernel_w", "stride_h", "dilation_h",
               "groups"]
    return df.sort_values("first_wall_s").tail(n)[columns].round(3)


def report(df: pd.DataFrame, command: str, device: str) -> str:
    return (f"# conv2d first calls on {device}\n\n`{command}`\n\nSeconds are sums over the band's rows.\n\n"
            f"{markdown_table(summary(df))}\n\nThe three slowest first calls:\n\n{markdown_table(slowest(df))}\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=12, help="configs per precision")
    parser.add_argument("--seed", type=int, default=7, help="sampling seed (not the sweep's 0: fresh configs)")
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--out", default="reports/gpu_checks")
    args = parser.parse_args(argv)
    precisions = args.precisions.split(",")
    unknown = [p for p in precisions if p not in schema.PRECISIONS]
    if unknown:
        parser.error(f"--precisions: unknown {', '.join(unknown)}; allowed: {', '.join(schema.PRECISIONS)}")
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("conv_first_call: needs a CUDA GPU")
    df = run(args.n, args.seed, precisions)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / "conv_first_call.csv", index=False)
    text = report(df, f"python benchmarks/conv_first_call.py --n {args.n} --seed {args.seed} --precisions "
                      f"{args.precisions}", torch.cuda.get_device_name())
    (out / "conv_first_call.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
