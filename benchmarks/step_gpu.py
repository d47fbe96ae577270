"""GPU validation of whole-step tracking: measured step vs tracked ops vs the same-GPU prediction.

On a CUDA GPU, for ResNet-50 (batch 64) and a 12-layer BERT-base encoder (batch 16, seq 512), in fp32 (TF32
off) and bf16 autocast:

- the measured step: CUDA events around whole untracked steps, median of ``--repeats`` after ``--warmup``;
- the tracked step: every ATen op's time (``pipeline.step.track``, queued CUDA-event timing), their sum and its
  coverage of the measured step, the unattributed remainder, and the tracking overhead;
- the prediction from this GPU to itself, ``Trace.to(<this GPU>)`` (scalers where published, wave scaling
  otherwise), against the measured step (target: within 5 %).

Writes ``<out>/results.json`` (rewritten after every case, so a crash loses nothing finished), ``summary.md``,
and per case ``<out>/<model>-<precision>/ops.csv`` (+ ``ops.parquet`` where pyarrow exists) and ``trace.json``.
One failing case is recorded with its error and the rest still run. Needs torch, numpy, pandas and PyYAML.

    python benchmarks/step_gpu.py --out results/step_gpu              # on the GPU machine (~1-2 min on an H200)
    python benchmarks/step_gpu.py --out /tmp/step_cpu --tiny          # CPU smoke test of the same path
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

CASES = {"resnet50": {"batch": 64}, "bert": {"batch": 16, "seq": 512, "layers": 12},
         # optional (--models gnmt,dcgan): Habitat's other two models
         "gnmt": {"batch": 64, "seq": 50}, "dcgan": {"batch": 64}}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def run_case(model: str, precision: str, args, origin) -> dict:
    import torch

    from pipeline.step import models, track

    cfg = dict(CASES[model])
    batch = cfg.pop("batch") if not args.tiny else 2
    if args.tiny:
        cfg = {}
    device = args.device
    t0 = time.time()
    step = models.make_step(model, batch, precision, device, tiny=args.tiny, **cfg)
    trace = track(step, warmup=args.warmup, repeats=args.repeats, device=device, timing=args.timing)
    log(f"  tracked in {time.time() - t0:.1f} s: {trace.summary().splitlines()[1]}")
    res = {"model": model, "precision": precision, "batch": batch, "config": cfg, "tiny": args.tiny,
           "measured_ms": trace.total_ms, "step_times_ms": trace.meta["step_times_ms"],
           "tracked_ms": trace.tracked_ms, "coverage": trace.coverage, "unattributed_ms": trace.unattributed_ms,
           "tracked_wall_ms": trace.meta["tracked_wall_ms"], "tracking_overhead_x": trace.overhead,
           "n_ops": int(len(trace.ops)), "ops_by_kind": trace.ops["op"].value_counts().to_dict(),
           "ops_by_phase": trace.ops["phase"].value_counts().to_dict(),
           "measured_by_kind_phase": json.loads(trace.breakdown().round(4).to_json()),
           "device_name": trace.meta["device_name"], "detected_origin": trace.origin}
    if args.sync_timing and device.startswith("cuda"):
        sync = track(step, warmup=0, repeats=1, device=device, timing="sync")
        res.update(sync_tracked_ms=sync.tracked_ms, sync_coverage=sync.tracked_ms / trace.total_ms)
        log(f"  sync timing: tracked {sync.tracked_ms:.2f} ms = {100 * res['sync_coverage']:.1f} % of the step")
    if origin is not None:
        pred = trace.to(origin, origin=origin)
        res.update(origin=pred.origin, predicted_ms=pred.total_ms,
                   predicted_error_pct=100 * (pred.total_ms / trace.total_ms - 1),
                   predicted_with_unattributed_ms=pred.total_with_unattributed_ms,
                   methods=json.loads(pred.methods().to_json(orient="records")))
        log(f"  predicted {pred.origin} -> {pred.origin}: {pred.total_ms:.2f} ms vs measured {trace.total_ms:.2f} ms "
            f"({res['predicted_error_pct']:+.1f} %)")
    case_dir = Path(args.out) / f"{model}-{precision}"
    trace.save(case_dir)
    res["ops_dir"] = case_dir.name
    del step, trace
    gc.collect()
    if device.startswith("cuda"):
        res["max_memory_gb"] = torch.cuda.max_memory_allocated() / 1e9
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return res


def write_summary(results: list[dict], env: dict, out: Path) -> None:
    lines = ["# Whole-step tracking on " + str(env.get("device_name")), "",
             f"torch {env.get('torch')}, CUDA {env.get('cuda')}, cuDNN {env.get('cudnn')}; "
             f"timing {env.get('timing')}, warmup {env.get('warmup')}, repeats {env.get('repeats')}"
             f"{' (TINY models: smoke test)' if env.get('tiny') else ''}", "",
             "| model | precision | batch | measured step ms | tracked ops ms | coverage | unattributed ms | "
             "ops | tracking overhead | predicted ms (same GPU) | error |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['precision']} | | FAILED: {r['error'].splitlines()[0][:120]} "
                         "| | | | | | | |")
            continue
        pred = f"{r['predicted_ms']:.2f}" if "predicted_ms" in r else "n/a"
        err = f"{r['predicted_error_pct']:+.1f} %" if "predicted_error_pct" in r else "n/a"
        lines.append(f"| {r['model']} | {r['precision']} | {r['batch']} | {r['measured_ms']:.2f} | "
                     f"{r['tracked_ms']:.2f} | {100 * r['coverage']:.1f} % | {r['unattributed_ms']:+.2f} | "
                     f"{r['n_ops']} | {r['tracking_overhead_x']:.1f}x | {pred} | {err} |")
    (out / "summary.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--models", default="resnet50,bert", help=f"comma-separated, of {', '.join(CASES)}")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--timing", default="queued", choices=["queued", "sync"])
    ap.add_argument("--sync-timing", action="store_true", help="also track once with per-op synchronisation")
    ap.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    ap.add_argument("--origin", default=None, help="registry name of this GPU (default: detected)")
    ap.add_argument("--tiny", action="store_true", help="tiny models (CPU smoke test of this script)")
    ap.add_argument("--no-cudnn-benchmark", action="store_true")
    args = ap.parse_args(argv)

    import torch

    from pipeline.step.record import detect_origin

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.device == "cpu" and not args.tiny:
        print("no CUDA GPU: this benchmark is for a GPU (use --tiny for a CPU smoke test)", file=sys.stderr)
        return 2
    torch.backends.cudnn.benchmark = not args.no_cudnn_benchmark
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    detected, device_name = detect_origin(args.device)
    origin = args.origin or (detected if detected != "cpu" else None)
    if origin is None and args.tiny:
        origin = "h200"  # CPU smoke test: treat CPU times as H200 times, to exercise the prediction path
    env = {"device": args.device, "device_name": device_name, "origin": origin, "torch": torch.__version__,
           "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
           "python": platform.python_version(), "timing": args.timing, "warmup": args.warmup,
           "repeats": args.repeats, "tiny": args.tiny, "cudnn_benchmark": torch.backends.cudnn.benchmark,
           "cpu_origin_is_demo": args.device == "cpu"}
    log(f"device {device_name} ({args.device}), origin {origin}, torch {torch.__version__}")
    results: list[dict] = []
    t_all = time.time()
    for model in [m for m in args.models.split(",") if m]:
        for precision in [p for p in args.precisions.split(",") if p]:
            log(f"{model} {precision} ...")
            try:
                results.append(run_case(model, precision, args, origin))
            except Exception as exc:  # noqa: BLE001 - record it and go on with the next case
                log(f"  FAILED: {type(exc).__name__}: {exc}")
                results.append({"model": model, "precision": precision,
                                "error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"})
                gc.collect()
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
            env["elapsed_s"] = time.time() - t_all
            (out / "results.json").write_text(json.dumps({"env": env, "results": results}, indent=2, default=str))
            write_summary(results, env, out)
    log(f"done in {time.time() - t_all:.1f} s; wrote {out / 'results.json'} and {out / 'summary.md'}")
    print((out / "summary.md").read_text())
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
