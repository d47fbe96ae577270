"""Command line: track a built-in model's training step here and predict its time and cost on other GPUs.

    python -m pipeline.step --model resnet50 --batch 64 --precision bf16 --gpus a100,h100,l4,t4 [--plot out.png]
    python -m pipeline.step --model bert --batch 16 --precision bf16 --gpus h100,l40s --ngpus 1,2,4,8 --plot s.png

On a CPU there is no GPU to scale from, so it refuses; ``--origin-gpu <gpu>`` treats the CPU times as that GPU's,
for demos only.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline import gpus
from pipeline.atomic import atomic_write
from pipeline.schema import PRECISIONS
from pipeline.step.forecast import StepPrediction, predict_step
from pipeline.step.predict import FALLBACKS, SCALER_MODES
from pipeline.step.wave import MODES

__all__ = ["main"]

_CPU_REFUSAL = ("this runs on the CPU: scaling CPU op times to a GPU is not meaningful (wave scaling and the "
                "scalers' transfer carry measured GPU times to another GPU). Run it on a GPU, or -- for a demo of "
                "the machinery only -- add --origin-gpu <gpu> to treat the CPU times as if measured on that GPU.")


def _num(v, fmt: str) -> str:
    return format(v, fmt) if np.isfinite(v) else "n/a"


def _format(table: pd.DataFrame) -> str:
    multi = table["n_gpus"].max() > 1
    head = f"{'GPU':<16} " + (f"{'n':>3} {'path':<7} " if multi else "") + f"{'step ms':>10} {'steps/s':>9} "
    head += (f"{'thru':>9} {'eff':>5} {'comm ms':>8} {'exposed':>8} " if multi else "")
    lines = [head + f"{'$/h':>8} {'$ / 1k steps':>13}  {'scaler':>6}  note"]
    for r in table.itertuples(index=False):
        line = f"{r.gpu:<16} " + (f"{r.n_gpus:>3} {r.interconnect:<7} " if multi else "")
        line += f"{_num(r.step_ms, '10.2f'):>10} {_num(r.steps_per_s, '9.2f'):>9} "
        if multi:
            line += (f"{_num(r.throughput, '9.1f'):>9} {_num(r.scaling_efficiency, '5.2f'):>5} "
                     f"{_num(r.comm_ms, '8.2f'):>8} {_num(r.exposed_comm_ms, '8.2f'):>8} ")
        lines.append(line + f"{_num(r.usd_per_hour, '8.3f'):>8} {_num(r.usd_per_1k_steps, '13.4f'):>13}  "
                            f"{100 * r.scaler_share:5.0f}%  {r.note}")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m pipeline.step",
                                 description="Track a training step here and predict its time and cost on other "
                                             "GPUs.")
    ap.add_argument("--model", default="resnet50", help="built-in model: resnet50, bert, gnmt, dcgan")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--precision", default="fp32", choices=list(PRECISIONS))
    ap.add_argument("--gpus", default="a100,h100,l4,t4", help="comma-separated registry names")
    ap.add_argument("--origin", default=None, help="registry name of the GPU this runs on (default: detected)")
    ap.add_argument("--origin-gpu", default=None,
                    help="on a CPU only, for demos: treat the CPU-measured op times as if measured on this GPU")
    ap.add_argument("--device", default=None, help="cuda, cuda:N or cpu (default: cuda if available)")
    ap.add_argument("--ngpus", default="1", help="GPU counts, data parallel (DDP), e.g. 1,2,4,8")
    ap.add_argument("--interconnect", default="auto", choices=["auto", "nvlink", "pcie", "host"],
                    help="path between the GPUs of a node (auto: NVLink where it joins them, else PCIe)")
    ap.add_argument("--inter-node-gbps", type=float, default=None,
                    help="a node's network bandwidth per direction, GB/s, past one node (default conf/multigpu.yaml)")
    ap.add_argument("--plot", default=None, help="write a chart to this PNG: time and cost per GPU (one GPU), or "
                                                 "throughput against GPU count (several)")
    ap.add_argument("--csv", default=None, help="write the table to this CSV")
    ap.add_argument("--prices", default=None, help="price table (default: conf/prices.yaml)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--wave-mode", default="gamma", choices=list(MODES))
    ap.add_argument("--no-scalers", action="store_true", help="wave/roofline scaling only, even if scalers exist")
    ap.add_argument("--scaler-fallback", default="error", choices=list(FALLBACKS),
                    help="when a published scaler cannot be used (missing, modified): stop (error, default) or "
                         "wave-scale its ops (wave)")
    ap.add_argument("--scaler-mode", default="calibrated", choices=list(SCALER_MODES),
                    help="scaler ops on another GPU: the card's calibrated transfer (calibrated, default), the "
                         "scaler's prediction for that GPU (direct), or Habitat's ratio, measured x model(dest) / "
                         "model(origin) (ratio)")
    ap.add_argument("--tiny", action="store_true", help="a tiny version of the model (smoke tests on a CPU)")
    ap.add_argument("--breakdown", action="store_true", help="also print the per-op-kind breakdown per GPU")
    return ap


def _run(args) -> StepPrediction:
    """Check the arguments, track the model and predict it; ValueError/RuntimeError for bad input."""
    from pipeline.step import models
    from pipeline.step.record import device_of

    device = device_of(args.device)
    gpu_list = [g.strip() for g in args.gpus.split(",") if g.strip()]
    if not gpu_list:
        raise ValueError("--gpus: give at least one GPU")
    for g in gpu_list:
        gpus.gpu_spec(g)
    if device == "cpu" and args.origin not in (None, "cpu") and args.origin_gpu is None:
        raise ValueError(f"--origin {args.origin}: this runs on the CPU; --origin names the GPU it runs on. To "
                         f"treat CPU times as {args.origin}'s (demo only), use --origin-gpu {args.origin}")
    if device == "cpu" and args.origin_gpu is None:
        raise ValueError(_CPU_REFUSAL)
    try:
        counts = [int(n) for n in args.ngpus.split(",") if n.strip()]
    except ValueError:
        raise ValueError(f"--ngpus: whole numbers separated by commas, e.g. 1,2,4,8, got {args.ngpus!r}") from None
    step_fn = models.make_step(args.model, args.batch, args.precision, device, tiny=args.tiny)
    title = f"{args.model}{' (tiny)' if args.tiny else ''}, batch {args.batch}, {args.precision}"
    print(f"tracking {title} on {device} ...", flush=True)
    return predict_step(step_fn, gpu_list, origin=None if args.origin == "cpu" else args.origin,
                        origin_gpu=args.origin_gpu, prices=args.prices,
                        scalers=False if args.no_scalers else None, fallback=args.scaler_fallback,
                        scaler_mode=args.scaler_mode, wave_mode=args.wave_mode, warmup=args.warmup,
                        repeats=args.repeats, device=device,
                        title=title, n_gpus=counts, interconnect=args.interconnect,
                        inter_node_gbps=args.inter_node_gbps, batch=args.batch)


def _report(result: StepPrediction, args) -> None:
    print(result.trace.summary())
    if result.demo:
        print(f"DEMO: CPU op times treated as measured on {result.origin}; the numbers below are not a "
              f"prediction for this model.")
    print(f"origin {result.origin}; predicted training step, sorted by time:")
    print(_format(result.table))
    if args.breakdown:
        for label, pred in result.predictions.items():
            print(f"\n{label}: predicted ms by op kind and phase")
            print(pred.breakdown().round(3).to_string())
    prices_used = result.table[result.table["price_source"] != ""].drop_duplicates("gpu")
    if len(prices_used):
        print("prices: list prices, edit conf/prices.yaml -- " +
              "; ".join(f"{r.gpu}: {r.price_source} ({r.price_date})" for r in prices_used.itertuples()))
    mode = "none: --no-scalers" if args.no_scalers else f"scaler mode {args.scaler_mode}"
    print(f"scaler = share of the predicted time from the per-op scalers ({mode}); the rest is wave/roofline "
          "scaling.")
    if result.table["n_gpus"].max() > 1:
        print(f"data parallel: thru = throughput ({result.table.attrs['throughput_unit']}); eff = one-GPU step / "
              f"n-GPU step; comm = all-reduce of DDP's buckets, exposed = its part after backward (added); $/h for "
              f"all n GPUs. All-reduce times: " + "; ".join(sorted(set(result.table["comm_basis"]) - {""})))


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        result = _run(args)
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print("error: " + " ".join([str(exc), *getattr(exc, "__notes__", [])]), file=sys.stderr)
        return 2
    _report(result, args)
    if args.csv:
        Path(args.csv).parent.mkdir(parents=True, exist_ok=True)
        atomic_write(args.csv, result.table.to_csv(index=False))
        print(f"wrote {args.csv}")
    if args.plot:
        result.plot(args.plot)
        print(f"wrote {args.plot}")
    return 0
