"""MLflow bookkeeping: logger construction, final metrics, artifacts, registered model versions and aliases.

Tracking URI: the config value, else ``$MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db`` (the repo root when
run from there); always passed explicitly (MLFlowLogger reads its default at import time). Artifacts go under
``mlruns/`` unless configured. One experiment per op (``pipeline-<op>``); one registered model per op
(``pipeline-<op>``) whose versions point at the logged checkpoint folders; alias ``champion`` marks the version
users load. The registry uses aliases, not the deprecated stages.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.atomic import atomic_write

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
CHAMPION_ALIAS = "champion"


def experiment_name(op: str, prefix: str = "pipeline-") -> str:
    return f"{prefix}{op}"


def registered_model_name(op: str) -> str:
    return f"pipeline-{op}"


def resolve_tracking_uri(value: str | None = None) -> str:
    return value or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


def resolve_artifact_location(value: str | None = "mlruns") -> str | None:
    """A plain folder becomes an absolute file URI (MLflow stores it with the experiment); URIs pass through."""
    if not value:
        return None
    if "://" in str(value) or str(value).startswith("file:"):
        return str(value)
    return Path(value).resolve().as_uri()


def client(tracking_uri: str):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri)


def make_logger(logger_cfg: Mapping, op: str, run_name: str, tags: Mapping[str, str] | None = None):
    """Instantiate the configured logger (``_target_``, normally MLFlowLogger) for one run of ``op``."""
    from hydra.utils import instantiate

    cfg = dict(logger_cfg)
    prefix = cfg.pop("experiment_prefix", "pipeline-")
    uri = resolve_tracking_uri(cfg.pop("tracking_uri", None))
    artifacts = resolve_artifact_location(cfg.pop("artifact_location", "mlruns"))
    logger = instantiate(cfg, experiment_name=experiment_name(op, prefix), tracking_uri=uri,
                         artifact_location=artifacts, run_name=run_name, tags=dict(tags or {}))
    logger.resolved_tracking_uri = uri
    return logger


def flatten(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """Nested metric dicts -> ``{"a/b/c": value}`` (numbers only; keys made MLflow-safe)."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        name = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            out.update(flatten(value, name))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:
            out[_safe(name)] = float(value)
    return out


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "/_.- :" else "_" for ch in name)


def log_metrics(tracking_uri: str, run_id: str, metrics: Mapping[str, float], step: int = 0) -> None:
    import time

    from mlflow.entities import Metric

    c = client(tracking_uri)
    now = int(time.time() * 1000)
    items = [Metric(key=k, value=float(v), timestamp=now, step=step) for k, v in metrics.items()]
    for i in range(0, len(items), 900):
        c.log_batch(run_id, metrics=items[i:i + 900])


def log_artifact_bytes(tracking_uri: str, run_id: str, files: Mapping[str, bytes | str],
                       artifact_path: str | None = None) -> None:
    """Write ``{name: content}`` to a temp folder and log them as run artifacts."""
    c = client(tracking_uri)
    with tempfile.TemporaryDirectory() as tmp:
        for name, data in files.items():
            c.log_artifact(run_id, str(atomic_write(Path(tmp) / name, data)), artifact_path)


def set_tags(tracking_uri: str, run_id: str, tags: Mapping[str, Any]) -> None:
    c = client(tracking_uri)
    for k, v in tags.items():
        c.set_tag(run_id, k, str(v))


def register_checkpoint(tracking_uri: str, op: str, run_id: str, folder: str | Path, version: int) -> str:
    """Log the published checkpoint folder to the run, log it as a ``python_function`` model wrapping the
    prediction API (``pipeline.serving.pyfunc``) and register that as a model version; returns its number."""
    from mlflow.exceptions import MlflowException

    from pipeline.serving.pyfunc import log_pyfunc

    c = client(tracking_uri)
    c.log_artifacts(run_id, str(folder), f"checkpoint/v{int(version)}")
    name = registered_model_name(op)
    try:
        c.get_registered_model(name)
    except MlflowException:
        c.create_registered_model(name, description=f"Per-op time scaler for {op}: a python_function model wrapping "
                                                    "pipeline.api (pipeline.checkpoint files)")
    info = log_pyfunc(tracking_uri, run_id, op, folder, version)
    mv = c.create_model_version(name, source=info.model_uri, run_id=run_id, model_id=info.model_id,
                                tags={"op": op, "checkpoint_version": str(int(version)),
                                      "checkpoint_path": f"checkpoints/{op}/v{int(version)}"})
    return str(mv.version)


def set_champion_alias(tracking_uri: str, op: str, model_version: str) -> None:
    client(tracking_uri).set_registered_model_alias(registered_model_name(op), CHAMPION_ALIAS, str(model_version))
