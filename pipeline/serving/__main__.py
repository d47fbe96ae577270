"""Register published checkpoint versions in MLflow as ``python_function`` models (e.g. on a fresh clone, whose
local registry is empty): ``python -m pipeline.serving [--ops bmm,linear] [--all-versions] [--tracking-uri URI]``.

Each version gets a run in the op's experiment (``pipeline-<op>``) holding the pyfunc model, and a version of the
registered model ``pipeline-<op>``; the alias ``champion`` follows ``champion.json``. Then::

    mlflow.pyfunc.load_model("models:/pipeline-linear@champion").predict(frame)
    mlflow models serve -m models:/pipeline-linear@champion --env-manager local -p 5001
"""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline import checkpoint as ck
from pipeline.schema import OPS


def register(op: str, version: int, root: Path, tracking_uri: str) -> str:
    """Log ``root/<op>/v<version>`` as a pyfunc model in a run of its own and register it; the model version."""
    from pipeline.training import tracking as T

    c = T.client(tracking_uri)
    name = T.experiment_name(op)
    exp = c.get_experiment_by_name(name)
    exp_id = exp.experiment_id if exp is not None else c.create_experiment(
        name, artifact_location=T.resolve_artifact_location("mlruns"))
    run_id = c.create_run(exp_id, run_name=f"{op}-register-v{version}",
                          tags={"pipeline.kind": "register", "pipeline.op": op}).info.run_id
    mv = T.register_checkpoint(tracking_uri, op, run_id, root / op / f"v{version}", version)
    c.set_terminated(run_id, "FINISHED")
    if ck.champion_version(root, op) == version:
        T.set_champion_alias(tracking_uri, op, mv)
    return mv


def main(argv=None) -> None:
    from pipeline.api import InputError, load_scaler
    from pipeline.training.tracking import resolve_tracking_uri

    parser = argparse.ArgumentParser(prog="python -m pipeline.serving", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", default=",".join(OPS), help="ops to register (default: all)")
    parser.add_argument("--all-versions", action="store_true", help="every published version, not the champion only")
    parser.add_argument("--root", default=str(Path(__file__).resolve().parent.parent.parent / "checkpoints"))
    parser.add_argument("--tracking-uri", default=None, help="default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db")
    args = parser.parse_args(argv)
    root, uri = Path(args.root), resolve_tracking_uri(args.tracking_uri)
    for op in [o for o in args.ops.split(",") if o]:
        if op not in OPS:
            parser.error(f"--ops: unknown op {op!r}; allowed: {', '.join(OPS)}")
        champion = ck.champion_version(root, op)
        versions = ck.list_versions(root, op) if args.all_versions else [v for v in [champion] if v is not None]
        for version in versions:
            try:
                load_scaler(op, version, root=root)
            except InputError as exc:
                print(f"{op} v{version}: skipped ({exc})", flush=True)
                continue
            print(f"{op} v{version}: registered as pipeline-{op} version {register(op, version, root, uri)}"
                  + (" (champion)" if version == champion else ""), flush=True)


if __name__ == "__main__":
    main()
