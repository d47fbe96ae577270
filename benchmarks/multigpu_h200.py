"""Multi-GPU validation run on a 2-GPU host (the H200 pair): collectives, traced one-GPU steps, measured DDP steps.

Time-boxed (``--time-limit-s``, default 470 s in all) and written under one folder ``--out``:

1. ``collectives/gpu=<label>/*.parquet``: the collective sweep (``pipeline.collectives.collect``): all_reduce,
   reduce_scatter, all_gather, 4 KiB-2 GiB, fp32 and bf16, every GPU count, over NCCL's default path (NVLink
   here) and the host path (``NCCL_P2P_DISABLE=1``); NVLink multicast off.
2. ``traces/<model>-<precision>/``: each case's one-GPU step tracked on GPU 0 (``pipeline.step.track``: ops,
   gradient table, measured step) -- what the prediction starts from.
3. ``ddp.json``: the same cases as DDP steps on 2 GPUs over each path, and on 1 GPU (DDP's own overhead), each
   the median of ``--steps`` steps, with DDP's rebuilt bucket sizes.
4. ``meta.json``: topology (``nvidia-smi topo -m``), versions, what ran and how long each phase took.

Cases: ResNet-50 (batch 64) and the BERT-like encoder (batch 16, seq 512), fp32 (TF32 off) and bf16 autocast.
``benchmarks/multigpu_h200_report.py`` turns the folder into ``reports/multigpu_h200.md`` on any machine.

    python benchmarks/multigpu_h200.py --out /tmp/mg                       # on the GPU host (~8 min)
    python benchmarks/multigpu_h200.py --out /tmp/mg --cpu --time-limit-s 120   # CPU smoke test (gloo, tiny)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from pipeline.collectives.collect import NCCL_ENV  # noqa: E402 - imports no torch: the env is set before it loads

os.environ.update(NCCL_ENV)

CASES = [{"model": m, "precision": p, **cfg} for m, cfg in
         (("resnet50", {"batch": 64}), ("bert", {"batch": 16, "config": {"seq": 512, "layers": 12}}))
         for p in ("fp32", "bf16")]
TINY_CASES = [{"model": m, "precision": p, "batch": 2, "config": {}} for m in ("resnet50", "bert") for p in ("fp32",)]


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _write_json(path: Path, data) -> None:
    from pipeline.atomic import atomic_write
    atomic_write(path, json.dumps(data, indent=1, default=str))


def collectives(args, out: Path, seconds: float) -> dict:
    from pipeline.collectives.collect import parse_size, run_sweep
    sizes = [parse_size(s) for s in args.sizes.split(",")] if args.sizes else None
    kwargs = {"sizes": sizes} if sizes else {}
    files = run_sweep(out / "collectives", args.gpu, paths=("host",) if args.cpu else (args.default_path, "host"),
                      time_limit_s=seconds,
                      backend=args.backend, device=args.device, log=log,
                      counts=[2] if args.cpu else None, **kwargs)
    return {"files": [str(f.relative_to(out)) for f in files]}


def traces(args, out: Path, cases: list[dict], deadline: float) -> dict:
    import torch

    from pipeline.step import models, track
    done = {}
    for case in cases:
        if time.time() > deadline:
            break
        name = f"{case['model']}-{case['precision']}"
        step = models.make_step(case["model"], case["batch"], case["precision"], args.trace_device, tiny=args.cpu,
                                **case.get("config", {}))
        trace = track(step, warmup=3, repeats=args.steps, device=args.trace_device)
        trace.save(out / "traces" / name)
        done[name] = {"measured_ms": trace.total_ms, "tracked_ms": trace.tracked_ms, "ops": len(trace.ops),
                      "params": len(trace.grads), "grad_bytes": int(trace.grads["bytes"].sum())}
        log(f"trace {name}: step {trace.total_ms:.2f} ms, {len(trace.ops)} ops, {len(trace.grads)} parameters")
        del step, trace
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return done


def ddp(args, out: Path, cases: list[dict], deadline: float, default_path: str) -> dict:
    from pipeline.step.ddp import measure_ddp
    results, runs = [], list(dict.fromkeys([(2, default_path), (2, "host"), (1, default_path)]))
    for i, (world, path) in enumerate(runs):
        left = deadline - time.time()
        if left < 20:
            log(f"ddp x{world} {path}: skipped (time box)")
            continue
        share = left / (len(runs) - i)
        started = time.time()
        results += measure_ddp(cases, world, out / f".ddp-{world}-{path}.json", path=path, device=args.device,
                               backend=args.backend, steps=args.steps, time_limit_s=share - 15, tiny=args.cpu)
        log(f"ddp x{world} {path}: {time.time() - started:.0f} s")
        _write_json(out / "ddp.json", results)
    return {"runs": len(results)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--gpu", default="h200", help="registry label of the host's GPUs")
    ap.add_argument("--time-limit-s", type=float, default=470.0)
    ap.add_argument("--collectives-s", type=float, default=170.0, help="share of the time box for the sweep")
    ap.add_argument("--steps", type=int, default=15, help="timed steps per DDP case and trace")
    ap.add_argument("--sizes", default=None, help="collective sizes (default 4 KiB-2 GiB by x4)")
    ap.add_argument("--default-path", default="auto", choices=["auto", "nvlink", "pcie"],
                    help="label of NCCL's default path (auto: from nvidia-smi topo -m)")
    ap.add_argument("--cpu", action="store_true", help="smoke test: gloo on the CPU, tiny models, 2 processes")
    args = ap.parse_args(argv)
    args.device, args.backend = ("cpu", "gloo") if args.cpu else ("cuda", "nccl")
    if args.cpu:
        args.gpu = "cpu-demo"  # CPU rows never carry a GPU's label
    args.trace_device = "cpu" if args.cpu else "cuda:0"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    end = time.time() + args.time_limit_s
    from pipeline.collectives.collect import detect_default_path, topology
    topo = "" if args.cpu else topology()
    meta = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "args": vars(args), "topology": topo, "phases": {}}
    try:
        import torch
        meta.update(torch=torch.__version__, gpus=torch.cuda.device_count(),
                    nccl=".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None)
    except Exception as exc:  # noqa: BLE001
        meta["torch_error"] = repr(exc)
    cases = TINY_CASES if args.cpu else CASES
    default = "host" if args.cpu else (detect_default_path(topo) if args.default_path == "auto" else args.default_path)
    meta["default_path"] = default
    ddp_share = 0.35 * args.time_limit_s  # what the DDP runs keep; the traces stop before it
    phases = [("collectives", lambda: collectives(args, out, min(args.collectives_s, 0.4 * args.time_limit_s))),
              ("traces", lambda: traces(args, out, cases, end - ddp_share)),
              ("ddp", lambda: ddp(args, out, cases, end, default))]
    for name, run in phases:
        started = time.time()
        try:
            meta["phases"][name] = {"result": run()}
        except Exception:  # noqa: BLE001 - one failing phase must not lose the others
            meta["phases"][name] = {"error": traceback.format_exc()[-3000:]}
            log(f"{name} failed:\n{meta['phases'][name]['error']}")
        meta["phases"][name]["seconds"] = round(time.time() - started, 1)
        _write_json(out / "meta.json", meta)
    log(f"done in {args.time_limit_s - (end - time.time()):.0f} s; wrote {out}")
    return 0 if all("error" not in p for p in meta["phases"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
