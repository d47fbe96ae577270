"""Can SM partitions measure the backward? Inside a green context, autograd's own CUDA threads escape the partition,
so the collector can time the backward as the same ATen ops called on its thread (``explicit_backward``). This
checks, on a CUDA GPU, that the two paths take the same GPU time on the whole GPU, and that inside a partition
the explicit backward takes a plausible share of the forward's time.

    python benchmarks/backward_check.py --n 12 --sms 32 --out reports/ [--ops linear,bmm]

Each pass prints one progress line per config on stderr, so a pass cut short still shows what it measured.
conv2d's first calls autotune: on an H200 a whole-GPU pass timed 5 fp32 configs in 110 s, so --n 2 (4 configs
per pass) suits conv2d.
"""

from __future__ import annotations

import argparse
import functools
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

from pipeline.ops import get_op  # noqa: E402
from pipeline.timing import TimingSettings, measure  # noqa: E402

OPS = ("linear", "bmm", "conv2d")
SETTINGS = TimingSettings()


STRATA_MS = [0, 0.05, 0.5, 2]  # a few ms at most: the check must stay short


def compare(n: int, sms: int | None, ops: tuple[str, ...] = OPS) -> pd.DataFrame:
    """Forward, autograd backward (whole GPU only) and explicit backward GPU times per config."""
    import torch

    from pipeline.collect.worker import enter_partition, set_precision_flags

    torch.backends.cudnn.benchmark = True
    if sms:
        enter_partition("cuda:0", sms)
    rows = []
    for op in ops:
        spec = get_op(op)
        for precision in ("fp32", "bf16"):
            dtype = set_precision_flags(torch, precision)
            for cfg in space_configs(op, n, 5, precision, STRATA_MS):
                fn, inputs, params = spec.build(cfg, "cuda", dtype)
                out = fn(*inputs)
                grad = torch.randn_like(out)
                row = {"op": op, "precision": precision, **cfg,
                       "forward_ms": measure(functools.partial(fn, *inputs), "cuda", SETTINGS).median_ms,
                       "explicit_ms": measure(spec.explicit_backward(cfg, fn, inputs, grad), "cuda",
                                              SETTINGS).median_ms}
                if not sms:
                    autograd = functools.partial(torch.autograd.grad, out, inputs + params, grad, retain_graph=True)
                    row["autograd_ms"] = measure(autograd, "cuda", SETTINGS).median_ms
                rows.append(row)
                autograd_note = f", autograd backward {row['autograd_ms']:.4f} ms" if not sms else ""
                print(f"sms={sms or 'all'} {op} {precision} {len(rows)}: forward {row['forward_ms']:.4f} ms, "
                      f"explicit backward {row['explicit_ms']:.4f} ms{autograd_note}", file=sys.stderr, flush=True)
                del fn, inputs, params, out, grad
                torch.cuda.empty_cache()
    return pd.DataFrame(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=12, help="configs per op and precision")
    parser.add_argument("--sms", type=int, default=32, help="SM partition for the second pass")
    parser.add_argument("--out", default="reports")
    parser.add_argument("--ops", default=",".join(OPS), help=f"comma-separated subset of {','.join(OPS)}")
    parser.add_argument("--child-timeout", type=float, default=900.0, help="seconds per pass")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    ops = tuple(o for o in args.ops.split(",") if o)
    if not ops or set(ops) - set(OPS):
        parser.error(f"--ops: {args.ops!r}; allowed: a comma-separated subset of {','.join(OPS)}")
    if args.child is not None:  # one process per context: a green context cannot be left
        print("RESULT " + compare(args.n, args.child or None, ops).to_json(orient="records"), flush=True)
        return 0
    frames = {}
    for sms in (0, args.sms):
        proc = subprocess.run([sys.executable, __file__, "--n", str(args.n), "--ops", ",".join(ops),
                               "--child", str(sms)], stdout=subprocess.PIPE, text=True, timeout=args.child_timeout)
        payload = result_line(proc.stdout)
        if proc.returncode or payload is None:
            print(f"pass sms={sms}: failed with exit code {proc.returncode} (its stderr is above)", file=sys.stderr)
            return 1
        frames[sms] = pd.DataFrame(json.loads(payload))
    full, part = frames[0], frames[args.sms]
    full["explicit_vs_autograd"] = full["explicit_ms"] / full["autograd_ms"]
    part["backward_over_forward"] = part["explicit_ms"] / part["forward_ms"]
    full["backward_over_forward"] = full["autograd_ms"] / full["forward_ms"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    full.to_csv(out / "backward_check_full.csv", index=False)
    part.to_csv(out / f"backward_check_sm{args.sms}.csv", index=False)
    summary = pd.DataFrame({
        "explicit/autograd (whole GPU) median": full.groupby("op")["explicit_vs_autograd"].median(),
        "p90 abs. diff.": full.groupby("op")["explicit_vs_autograd"].apply(lambda r: (r - 1).abs().quantile(0.9)),
        "backward/forward whole GPU": full.groupby("op")["backward_over_forward"].median(),
        f"backward/forward {args.sms} SMs (explicit)": part.groupby("op")["backward_over_forward"].median(),
    }).round(3)
    print(summary.to_string())
    (out / "backward_check.md").write_text("# Explicit backward check\n\n" + summary.to_markdown() + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
