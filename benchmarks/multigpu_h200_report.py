"""Turn a ``benchmarks/multigpu_h200.py`` run into the multi-GPU validation report (any machine, no GPU needed).

    python benchmarks/multigpu_h200_report.py <run folder or .tgz> --install   # rows -> datasets/collectives,
                                                                              # refit, reports/multigpu_h200.md
    python benchmarks/multigpu_h200_report.py <run folder> --summary-only      # print the tables, change nothing

For every case (model, precision) and path (NVLink, host): the measured DDP step on 2 GPUs against the prediction
made from the traced one-GPU step (the same GPU: ``Trace.to``) plus DDP's copies and the exposed all-reduce of its
buckets (``pipeline.step.parallel``), with the collective model fitted on the public data only (``public``: a true
prediction, this host's collectives unseen) and refitted with this host's collectives (``refit``). The overhead
alone (measured 2-GPU step - measured 1-GPU step) is compared with the predicted overhead, and DDP's rebuilt bucket
sizes with ``ddp_buckets``. ``--install`` copies the collective rows into ``datasets/collectives/gpu=<label>/``,
refits ``conf/collectives_model.yaml`` and ``reports/collectives.md``, and writes ``reports/multigpu_h200.{md,csv}``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from pipeline import gpus  # noqa: E402
from pipeline.atomic import atomic_write  # noqa: E402
from pipeline.collectives import schema as cschema  # noqa: E402
from pipeline.collectives.cli import DATA_ROOTS  # noqa: E402
from pipeline.collectives.fit import busbw_gbps, fit_model  # noqa: E402
from pipeline.collectives.model import CollectiveModel  # noqa: E402
from pipeline.markdown import markdown_table  # noqa: E402
from pipeline.step import Trace, data_parallel_step, ddp_buckets  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PUBLIC_ROOTS = [REPO / root for root in DATA_ROOTS.split(",")]


def _open(run: Path) -> Path:
    if run.is_dir():
        return run
    folder = Path(tempfile.mkdtemp(prefix="multigpu-"))
    with tarfile.open(run) as tar:
        tar.extractall(folder, filter="data")
    return folder


def _models(run: Path, install: bool) -> dict[str, CollectiveModel]:
    """``public``: the committed fit; ``refit``: refitted with this run's collectives (installed, or in memory)."""
    models = {"public": CollectiveModel.load()}
    files = cschema.collective_files(run / "collectives")
    if not files:
        return models  # nothing measured: no refit
    labels = {s["label"] for s in map(gpus.gpu_spec, gpus.known_gpus())}
    if any(p.parent.name.split("=", 1)[1] not in labels for p in files):
        return models  # a CPU smoke run (label cpu-demo): no refit
    if install:
        for path in files:
            cschema.read_file(path)  # validated before it is copied
            dest = PUBLIC_ROOTS[0] / path.parent.name / path.name
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest)
        from pipeline.collectives.cli import main as collectives_main
        collectives_main(["fit"])
        models["refit"] = CollectiveModel.load()
    else:
        roots = [r for r in PUBLIC_ROOTS if r.is_dir()] + [run / "collectives"]
        models["refit"] = fit_model(roots)[0]
    return models


def _case_rows(run: Path, models: dict, ddp: list[dict], gpu: str) -> pd.DataFrame:
    rows = []
    trace_dirs = sorted((run / "traces").glob("*"))
    spec = gpus.gpu_spec(gpu) if trace_dirs else None
    for trace_dir in trace_dirs:
        trace = Trace.load(trace_dir)
        model_name, precision = trace_dir.name.rsplit("-", 1)
        origin = trace.origin if trace.origin not in (None, "cpu") else gpu
        pred = trace.to(gpu, origin=origin, scalers=False)
        mine = [d for d in ddp if d["model"] == model_name and d["precision"] == precision]
        one = next((d["step_ms"] for d in mine if d["world"] == 1), np.nan)
        two = [d for d in mine if d["world"] == 2]
        buckets = list(ddp_buckets(trace.grads)["bytes"]) if two else []
        for measured in two:
            for variant, model in models.items():
                def comm(nbytes, _dtype, model=model, path=measured["path"], spec=spec):
                    return model.time_ms("all_reduce", nbytes, 2, spec, path)

                dp = data_parallel_step(pred.ops, trace.grads, comm, copy_gbps=spec["memory_bandwidth_gbps"])
                overhead = dp["copy_ms"] + dp["exposed_ms"]
                pred_2gpu = pred.total_ms + overhead
                rows.append({"model": model_name, "precision": precision, "path": measured["path"],
                             "collectives": variant, "measured_1gpu_ms": trace.total_ms, "measured_ddp1_ms": one,
                             "pred_1gpu_ms": pred.total_ms, "measured_2gpu_ms": measured["step_ms"],
                             "pred_2gpu_ms": pred_2gpu, "err_pct": 100 * (pred_2gpu / measured["step_ms"] - 1),
                             "measured_overhead_ms": measured["step_ms"] - trace.total_ms,
                             "pred_overhead_ms": overhead, "comm_ms": dp["comm_ms"], "exposed_ms": dp["exposed_ms"],
                             "copy_ms": dp["copy_ms"],
                             "err_from_measured_1gpu_pct": 100 * ((trace.total_ms + overhead) / measured["step_ms"]
                                                                  - 1),
                             "buckets_match_ddp": buckets == measured.get("rebuilt_bucket_sizes")})
    return pd.DataFrame(rows)


def _collective_rows(run: Path, models: dict, gpu: str) -> pd.DataFrame:
    """All-reduce bus bandwidth at 64 MiB and the largest size measured, per path: measured and modelled."""
    rows = cschema.read_collectives(run / "collectives")
    out = []
    ar = rows[(rows["collective"] == "all_reduce") & (rows["dtype"] == "bf16")]
    for (path, n), sub in ar.groupby(["interconnect", "n_gpus"]):
        for size in sorted({64 * 2 ** 20, int(sub["bytes"].max())} & set(sub["bytes"])):
            row = sub[sub["bytes"] == size].iloc[[0]]
            entry = {"path": path, "n_gpus": int(n), "MiB": size / 2 ** 20,
                     "measured GB/s": float(busbw_gbps(row, row["time_ms"])[0])}
            for variant, model in models.items():
                t = model.time_ms("all_reduce", [size], int(n), gpu, path)
                entry[f"{variant} GB/s"] = float(busbw_gbps(row, t)[0])
            out.append(entry)
    return pd.DataFrame(out)


def report(run: Path, install: bool) -> tuple[str, pd.DataFrame]:
    meta = json.loads((run / "meta.json").read_text())
    ddp = json.loads((run / "ddp.json").read_text()) if (run / "ddp.json").exists() else []
    cpu = bool(meta["args"].get("cpu"))
    if cpu and install:
        raise SystemExit("error: a CPU smoke run (--cpu) is not a measurement: it is not installed")
    gpu = "h200" if cpu else meta["args"]["gpu"]  # a CPU run's times stand for an H200's (demo)
    models = _models(run, install)
    cases = _case_rows(run, models, ddp, gpu)
    coll = (_collective_rows(run, models, gpu) if cschema.collective_files(run / "collectives") and not cpu
            else pd.DataFrame())
    phases = {k: v.get("seconds") for k, v in meta["phases"].items()}
    text = "\n\n".join([
        f"# Multi-GPU validation on a 2-GPU {gpu} host" + (" -- CPU SMOKE RUN, NOT A MEASUREMENT" if cpu else ""),
        f"Run {meta['started']} (torch {meta.get('torch')}, NCCL {meta.get('nccl')}, {meta.get('gpus')} GPUs; NCCL's "
        f"default path labelled `{meta.get('default_path')}`; NVLink multicast off). Phases (s): {phases}. "
        "Regenerate: `python benchmarks/multigpu_h200_report.py <run> --install`.",
        "## Measured DDP steps against the prediction\n\nPrediction = the traced one-GPU step predicted on the same "
        "GPU + DDP's gradient copies + the all-reduce backward does not hide; `public`: collective model fitted "
        "on the public data only (this host unseen), `refit`: with this host's collectives. "
        "`err_from_measured_1gpu_pct` adds the predicted overhead to the measured one-GPU step (the data-parallel "
        "part alone). Target: within 5 %.\n\n" + (markdown_table(cases) if len(cases) else "no cases measured"),
        "## All-reduce bus bandwidth (bf16)\n\n" + (markdown_table(coll) if len(coll) else "no collectives measured"),
        "Topology (`nvidia-smi topo -m`):\n\n```\n" + (meta.get("topology") or "(not recorded)").strip() + "\n```"])
    return text, cases


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", help="the run folder or its .tgz")
    ap.add_argument("--install", action="store_true", help="copy the collectives into datasets/, refit, write reports")
    ap.add_argument("--summary-only", action="store_true", help="print the report, write nothing")
    ap.add_argument("--out", default=str(REPO / "reports"))
    args = ap.parse_args(argv)
    run = _open(Path(args.run))
    text, cases = report(run, install=args.install and not args.summary_only)
    print(text)
    if not args.summary_only:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write(out / "multigpu_h200.md", text + "\n")
        atomic_write(out / "multigpu_h200.csv", cases.to_csv(index=False))
        print(f"wrote {out / 'multigpu_h200.md'}, {out / 'multigpu_h200.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
