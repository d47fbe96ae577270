"""Which kernels does a linear layer run, forward and backward, per precision, and at what rate? Used to explain
why the H200's tf32 backward reaches a lower share of the tf32 rate than its forward.

    python benchmarks/kernel_profile.py --out reports/ [--shapes 8192x8192x8192,4096x1024x4096]

Each shape is m x n x k (tokens, out features, in features). Writes kernel_profile.csv: per shape, precision and
phase, each GPU kernel's name, calls and mean time, and the phase's TFLOP/s over its GEMM kernels.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.collect.worker import set_precision_flags  # noqa: E402
from pipeline.schema import PRECISIONS  # noqa: E402


def profile_linear(m: int, n: int, k: int, precision: str, reps: int = 20) -> list[dict]:
    """Kernel names and mean times of ``reps`` forward and ``reps`` backward passes of nn.functional.linear."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    dtype = set_precision_flags(torch, precision)
    x = torch.randn(m, k, device="cuda", dtype=dtype, requires_grad=True)
    w = torch.randn(n, k, device="cuda", dtype=dtype, requires_grad=True)
    grad = torch.randn(m, n, device="cuda", dtype=dtype)
    rows = []
    for phase in ("forward", "backward"):
        y = torch.nn.functional.linear(x, w)
        y.backward(grad, retain_graph=True)                       # warm both phases
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(reps):
                if phase == "forward":
                    torch.nn.functional.linear(x, w)
                else:
                    torch.autograd.grad(y, (x, w), grad, retain_graph=True)
            torch.cuda.synchronize()
        for event in prof.key_averages():
            if event.device_type.name != "CUDA" or not event.count:
                continue
            rows.append({"m": m, "n": n, "k": k, "precision": precision, "phase": phase, "kernel": event.key,
                         "calls": event.count // reps,
                         "mean_us": event.device_time_total / event.count})
    return rows


def rates(kernels: pd.DataFrame) -> pd.DataFrame:
    """TFLOP/s of each phase over the kernels that look like GEMMs (the rest is casts, reductions, copies)."""
    gemm = kernels[kernels.kernel.str.contains("gemm|cutlass|sm90|xmma|Kernel2", case=False, regex=True)]
    per = gemm.assign(us=gemm.mean_us * gemm.calls).groupby(["m", "n", "k", "precision", "phase"]).us.sum()
    per = per.reset_index()
    flops = 2.0 * per.m * per.n * per.k * per.phase.map({"forward": 1, "backward": 2})
    return per.assign(tflops=flops / (per.us * 1e-6) / 1e12)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shapes", default="8192x8192x8192,4096x1024x4096,16384x4096x1024")
    ap.add_argument("--precisions", default="fp32,tf32,bf16")
    args = ap.parse_args(argv)
    try:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
        assert all(len(s) == 3 for s in shapes)
    except (ValueError, AssertionError):
        ap.error(f"--shapes: expected comma-separated MxNxK, got {args.shapes!r}")
    precisions = args.precisions.split(",")
    if any(p not in PRECISIONS for p in precisions):
        ap.error(f"--precisions: allowed values are {sorted(PRECISIONS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    kernels = pd.DataFrame([r for (m, n, k) in shapes for p in precisions for r in profile_linear(m, n, k, p)])
    kernels.to_csv(args.out / "kernel_profile.csv", index=False)
    with pd.option_context("display.width", 200, "display.max_colwidth", 90, "display.max_rows", 500):
        print(kernels.to_string(index=False))
        print(rates(kernels).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
