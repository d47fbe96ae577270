"""Does a conv2d task's first call still autotune after the collector's screen (``screen_ms``)?

PyTorch keeps one cuDNN algorithm per convolution key and process. The screen's untuned call (autotuning off) used
to run under the task's own key, so its heuristic pick stayed in the cache and the task's first call reused it
instead of autotuning. This runs the collector's own task code (``run_task``) on the same conv2d configs (fp32 and
bf16, forward and backward) in five passes, each in a fresh process:

- ``none``: no screen (how the sweeps before ``screen_ms`` ran);
- ``none_again``: the same, once more: how far two autotuned runs differ;
- ``heuristic_key``: an untuned call under the task's own key first, as the screened sweeps of 2026-12-02 did;
- ``screen``: the collector's screen (``untuned_call_ms``, ``screen_ms=250``);
- ``limit3``: no screen, ``cudnn_benchmark_limit=3`` (3 autotuning tries instead of PyTorch's 10: 4x faster).

Per pass it reports the first calls' seconds (autotuning runs every candidate: much longer than one call) and each
GPU time against ``none``. A pass is as good as autotuning if it differs from ``none`` no more than ``none_again``.
Exit code 3 when the screen's first calls, on the phases all three passes measured, take under half the time of the
faster unscreened pass's (``MIN_FIRST_CALL_SHARE``: the screen's pick was reused, not autotuned; two unscreened
passes' first calls differ by about a quarter, as part of them is CUDA's lazy kernel loading), when its GPU times'
p90 difference from ``none`` exceeds ``MAX_P90_DIFF_PCT`` (the heuristic pick's was 41 %), or when the screen leaves
fewer ``ok`` rows than the unscreened pass (its deterministic algorithms skipped or failed tasks that autotune).
``benchmarks/gpu_call.sh`` then drops ``screen_ms`` from its sweep.

    python benchmarks/screen_check.py --n 6 --out reports/gpu_checks
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from partition_specs import result_line  # noqa: E402
from timing_check import space_configs  # noqa: E402

from pipeline import schema  # noqa: E402
from pipeline.collect.plan import Task  # noqa: E402
from pipeline.timing import TimingSettings  # noqa: E402

MODES = ("none", "none_again", "heuristic_key", "screen", "limit3")
STRATA_MS = [0.02, 0.2, 2, 20]  # up to ~20 ms: autotuning takes many times a call, and the check must stay short
SCREEN_MS = 250.0
MIN_FIRST_CALL_SHARE = 0.5  # screened / unscreened first-call seconds below this: the first call did not autotune
MAX_P90_DIFF_PCT = 10.0  # screened GPU times further than this from unscreened (p90): not the autotuned algorithms
KEY = ["config_id", "precision", "phase"]


def run_pass(mode: str, n: int, seed: int) -> list[dict]:
    """The forward and backward times and first-call seconds of each config, as a sweep in ``mode`` measures them."""
    import torch

    from pipeline.collect.worker import run_task, set_precision_flags
    from pipeline.ops import get_op

    torch.backends.cudnn.benchmark = True
    if mode == "limit3":
        torch.backends.cudnn.benchmark_limit = 3
    x = torch.randn(1, 8, 8, 8, device="cuda", requires_grad=True)   # CUDA's and cuDNN's lazy start-up, in no pass's
    torch.nn.functional.conv2d(x, torch.randn(8, 8, 3, 3, device="cuda")).sum().backward()   # first-call times
    torch.cuda.synchronize()
    rows = []
    for precision in ("fp32", "bf16"):
        for cfg in space_configs("conv2d", n, seed, precision, STRATA_MS):
            if mode == "heuristic_key":  # the old screen: an untuned call under the task's own cuDNN key
                dtype = set_precision_flags(torch, precision)
                fn, inputs, params = get_op("conv2d").build(cfg, "cuda", dtype)
                torch.backends.cudnn.benchmark = False
                out = fn(*inputs)
                torch.autograd.grad(out, inputs + params, torch.randn_like(out))   # the task's own backward
                torch.cuda.synchronize()
                torch.backends.cudnn.benchmark = True
                del fn, inputs, params, out
            task = Task("conv2d", cfg, schema.config_id("conv2d", cfg), precision)
            results, _ = run_task(task, "cuda:0", TimingSettings(), {},
                                  screen_ms=SCREEN_MS if mode == "screen" else None)
            for phase, (status, timing, _error) in results.items():
                rows.append({"mode": mode, "config_id": task.config_id, "precision": precision, "phase": phase,
                             "status": status, "time_ms": timing and timing.median_ms,
                             "first_call_s": timing and timing.first_s})
            print(f"{mode} {precision} {task.config_id}: " + ", ".join(
                f"{ph} {r[1].median_ms:.4f} ms (first call {r[1].first_s:.2f} s)" if r[1] else f"{ph} {r[0]}"
                for ph, r in results.items()), file=sys.stderr, flush=True)
    return rows


def _ok(rows: pd.DataFrame, mode: str) -> pd.DataFrame:
    """``mode``'s ok rows, indexed by config, precision and phase (the same in every pass)."""
    return rows[(rows["status"] == "ok") & (rows["mode"] == mode)].set_index(KEY)


def summarise(rows: pd.DataFrame) -> pd.DataFrame:
    """Per mode: first-call seconds, and its ok GPU times against the ``none`` pass (ratio = mode / none)."""
    base = _ok(rows, "none")["time_ms"]
    out = []
    for mode, group in rows.groupby("mode", sort=False):
        ratio = (_ok(rows, mode)["time_ms"] / base).dropna()
        diff = (ratio - 1).abs() * 100
        out.append({"mode": mode, "rows": len(group), "ok": int((group["status"] == "ok").sum()),
                    "first_call_s": round(float(group["first_call_s"].sum()), 2),
                    "median_ratio": round(float(ratio.median()), 3), "p90_ratio": round(float(ratio.quantile(0.9)), 3),
                    "max_ratio": round(float(ratio.max()), 3), "p90_abs_diff_pct": round(float(diff.quantile(0.9)), 1),
                    "share_over_10pct": round(float((diff > 10).mean()), 3)})
    return pd.DataFrame(out)


def first_call_share(rows: pd.DataFrame, mode: str = "screen") -> float:
    """``mode``'s first-call seconds over the faster unscreened pass's (``none`` or ``none_again``), on the phases
    all three measured ``ok``."""
    passes = [_ok(rows, m)["first_call_s"] for m in ("none", "none_again", mode)]
    common = passes[0].index.intersection(passes[1].index).intersection(passes[2].index)
    if not len(common):
        return float("nan")
    return float(passes[2].loc[common].sum() / min(passes[0].loc[common].sum(), passes[1].loc[common].sum()))


def screen_verdict(rows: pd.DataFrame) -> tuple[str, bool]:
    """Whether the screen keeps autotuning intact: its first calls take at least ``MIN_FIRST_CALL_SHARE`` of the
    unscreened ones' time, its GPU times stay within ``MAX_P90_DIFF_PCT`` of theirs, and it leaves as many ``ok``
    rows."""
    lost = len(_ok(rows, "none")) - len(_ok(rows, "screen"))
    share = first_call_share(rows)
    if lost > 0:
        return f"screen: {lost} fewer ok rows than without it (over_budget or error): it drops tasks", False
    if share != share:  # NaN: no phase measured in every pass
        return "screen: no phase was measured ok both with and without it: nothing to compare", False
    if share < MIN_FIRST_CALL_SHARE:
        return f"screen: first calls take {share:.2f}x the unscreened ones' time: its pick was reused", False
    p90 = float(summarise(rows).set_index("mode").loc["screen", "p90_abs_diff_pct"])
    if p90 > MAX_P90_DIFF_PCT:
        return (f"screen: GPU times {p90:.1f} % from the unscreened ones (p90), over {MAX_P90_DIFF_PCT:g} %: "
                "not the autotuned algorithms", False)
    return (f"screen: first calls take {share:.2f}x the unscreened ones' time and GPU times are {p90:.1f} % from "
            "theirs (p90): the first call still autotunes", True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=6, help="conv2d configs per precision (fp32, bf16)")
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--out", default="reports/gpu_checks")
    parser.add_argument("--child-timeout", type=float, default=300.0, help="seconds per pass")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.n < 1:
        parser.error(f"--n: {args.n}; allowed: a positive number of configs per precision")
    import torch

    if not torch.cuda.is_available():
        print("screen_check needs a CUDA GPU (cuDNN's algorithm cache is what it checks)", file=sys.stderr)
        return 1
    if args.child:
        print("RESULT " + json.dumps(run_pass(args.child, args.n, args.seed)), flush=True)
        return 0
    rows = []
    for mode in MODES:  # one process per pass: PyTorch's algorithm cache lives as long as the process
        try:
            proc = subprocess.run([sys.executable, __file__, "--n", str(args.n), "--seed", str(args.seed),
                                   "--child", mode], stdout=subprocess.PIPE, text=True, timeout=args.child_timeout)
        except subprocess.TimeoutExpired:
            print(f"pass {mode}: over {args.child_timeout:g} s (its progress lines are above)", file=sys.stderr)
            return 1
        payload = result_line(proc.stdout)
        if proc.returncode or payload is None:
            print(f"pass {mode}: failed with exit code {proc.returncode} (its stderr is above)", file=sys.stderr)
            return 1
        rows += json.loads(payload)
    frame = pd.DataFrame(rows)
    summary = summarise(frame)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(out / "screen_check.csv", index=False)
    text = summary.to_markdown(index=False)
    (out / "screen_check.md").write_text("# Screen check: does the first call after the screen autotune?\n\n"
                                         f"`python benchmarks/screen_check.py --n {args.n} --seed {args.seed}`\n\n"
                                         + text + "\n")
    verdict, passed = screen_verdict(frame)
    (out / "screen_check.md").write_text((out / "screen_check.md").read_text() + "\n" + verdict + "\n")
    print(text + "\n" + verdict)
    return 0 if passed else 3


if __name__ == "__main__":
    sys.exit(main())
