"""``python -m pipeline.collectives``: measure collectives on this host, or fit the collective model.

    python -m pipeline.collectives collect --gpu h200 [--out datasets/collectives] [--paths auto,host]
        [--counts 2] [--sizes 4K,1M,2G] [--dtypes fp32,bf16] [--time-limit-s 300] [--device cpu --backend gloo]
    python -m pipeline.collectives fit [--data datasets/collectives,datasets/external/collectives]
        [--model conf/collectives_model.yaml] [--report reports]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import yaml

from pipeline.atomic import atomic_write
from pipeline.collectives.model import MODEL_PATH

__all__ = ["main"]

DATA_ROOTS = "datasets/collectives,datasets/external/collectives"


def _collect(args) -> int:
    from pipeline import gpus
    from pipeline.collectives.collect import DEFAULT_SIZES, MEASURED_COLLECTIVES, MEASURED_DTYPES, parse_size, run_sweep

    if args.device == "cuda":
        gpus.gpu_label(args.gpu)  # our own measurements carry a registry label
    sizes = [parse_size(s) for s in args.sizes.split(",")] if args.sizes else DEFAULT_SIZES
    counts = [int(c) for c in args.counts.split(",")] if args.counts else None
    started = time.time()
    files = run_sweep(args.out, args.gpu, paths=args.paths.split(","), counts=counts, sizes=sizes,
                      dtypes=(args.dtypes or ",".join(MEASURED_DTYPES)).split(","),
                      collectives=(args.collectives or ",".join(MEASURED_COLLECTIVES)).split(","),
                      time_limit_s=args.time_limit_s, backend=args.backend, device=args.device)
    print(f"wrote {len(files)} files in {time.time() - started:.0f} s")
    return 0 if files else 1


def _fit(args) -> int:
    from pipeline.collectives.fit import fit_model, load_rows
    from pipeline.collectives.report import write_report

    roots = [r for r in args.data.split(",") if r]
    loaded = load_rows(roots)  # read once: the fit and the report share it
    model, tables = fit_model(roots, loaded)
    text = ("# The collective model's fitted parameters, written by `python -m pipeline.collectives fit` (do not "
            "edit by hand;\n# re-run the fit). Read by pipeline.collectives.model.CollectiveModel.load.\n"
            + yaml.safe_dump(model.to_dict(), sort_keys=False, width=120))
    Path(args.model).parent.mkdir(parents=True, exist_ok=True)
    atomic_write(args.model, text)
    print(f"wrote {args.model}: classes {', '.join(sorted(model.classes))}; {len(model.systems)} systems; "
          f"correction kept: {model.meta['correction']['kept']}")
    if args.report:
        for path in write_report(model, tables, roots, args.report, loaded):
            print(f"wrote {path}")
    return 0


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m pipeline.collectives", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("collect", help="measure collectives on this host (one process per GPU)")
    c.add_argument("--gpu", required=True, help="registry label of this host's GPUs (the dataset partition)")
    c.add_argument("--out", default="datasets/collectives")
    c.add_argument("--paths", default="auto,host", help="auto (NCCL's default path: nvlink or pcie) and/or host "
                                                       "(NCCL_P2P_DISABLE=1)")
    c.add_argument("--counts", default=None, help="GPU counts (default: 2, 4, 8, ... and all visible GPUs)")
    c.add_argument("--sizes", default=None, help="message sizes, e.g. 4K,64K,1M,2G (default 4 KiB-2 GiB by x4)")
    c.add_argument("--dtypes", default=None, help="fp32,bf16 (default)")
    c.add_argument("--collectives", default=None, help="all_reduce,reduce_scatter,all_gather (default)")
    c.add_argument("--time-limit-s", type=float, default=300.0, help="the whole sweep's time box")
    c.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    c.add_argument("--backend", default="nccl", choices=["nccl", "gloo"])
    f = sub.add_parser("fit", help="fit conf/collectives_model.yaml and write the report")
    f.add_argument("--data", default=DATA_ROOTS, help="comma-separated roots of collective tables")
    f.add_argument("--model", default=str(MODEL_PATH))
    f.add_argument("--report", default="reports", help="folder for collectives.md/.png ('' for none)")
    return ap


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _collect(args) if args.command == "collect" else _fit(args)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
