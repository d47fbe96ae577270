"""Log a published checkpoint version as an MLflow ``python_function`` model and register it.

The logged model holds the version's files unchanged (``checkpoints/<op>/v<N>/``: weights, card, hashes; the
loader verifies them), ``pipeline/serving/model.py`` as its model code, and the ``pipeline`` package and ``conf/``
(the GPU registry) as its code: MLflow pickles nothing. Each version becomes a version of the registered model
``pipeline-<op>``; the alias ``champion`` follows ``champion.json``.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pandas as pd

PACKAGE = Path(__file__).resolve().parent.parent
REGISTRY = PACKAGE.parent / "conf"  # conf/gpus.yaml, where pipeline.gpus looks for it next to the package
MODEL_CODE = Path(__file__).resolve().parent / "model.py"


def input_example(op: str) -> pd.DataFrame:
    """One request row: a config of the op on an H100 in bf16, forward."""
    from pipeline.api import load_scaler  # noqa: F401  (the package must import before logging it)

    configs = {"conv2d": {"batch": 32, "in_channels": 64, "out_channels": 64, "height": 56, "width": 56,
                          "kernel_h": 3, "kernel_w": 3, "pad_h": 1, "pad_w": 1},
               "linear": {"batch": 4096, "in_features": 4096, "out_features": 4096, "bias": True},
               "bmm": {"batch": 64, "m": 512, "k": 64, "n": 512},
               "lstm": {"batch": 32, "seq_len": 64, "input_size": 512, "hidden_size": 512}}
    return pd.DataFrame([{**configs[op], "gpu": "h100", "precision": "bf16", "phase": "forward"}])


def signature(op: str):
    """Inputs: the op's config columns (optional ones may be left out), gpu, precision, phase; outputs: ms, low_ms,
    high_ms."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema

    from pipeline.inputs import DEFAULTS, OP_COLUMNS
    from pipeline.schema import BOOL_COLUMNS

    cols = [ColSpec("boolean" if c in BOOL_COLUMNS else "long", c, required=c not in DEFAULTS[op])
            for c in OP_COLUMNS[op]]
    cols += [ColSpec("string", "gpu"), ColSpec("string", "precision", required=False),
             ColSpec("string", "phase", required=False)]
    return ModelSignature(inputs=Schema(cols), outputs=Schema([ColSpec("double", c) for c in ("ms", "low_ms",
                                                                                                "high_ms")]))


def log_pyfunc(tracking_uri: str, run_id: str, op: str, folder: str | Path, version: int):
    """Log checkpoint ``folder`` (``<root>/<op>/v<N>``) as a pyfunc model of run ``run_id``; its ModelInfo."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / "checkpoints" / op / f"v{int(version)}"
        shutil.copytree(folder, staged)
        with mlflow.start_run(run_id=run_id):
            return mlflow.pyfunc.log_model(
                name=f"pyfunc-v{int(version)}", python_model=str(MODEL_CODE), code_paths=[str(PACKAGE), str(REGISTRY)],
                artifacts={"checkpoints": str(Path(tmp) / "checkpoints")},
                model_config={"op": op, "version": int(version)}, signature=signature(op),
                input_example=input_example(op),
                pip_requirements=["numpy", "pandas", "pyarrow", "safetensors", "pyyaml"])
