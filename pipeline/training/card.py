"""The model card of a trained op: what it was trained on, how, and how well (``checkpoint`` stores it)."""

from __future__ import annotations

import math
from collections.abc import Mapping

from pipeline.training.config import to_dict

CITATIONS = {
    "neusight": "NeuSight: S. Lee, A. Phanishayee, D. Mahajan, 'Forecasting GPU Performance for Deep Learning "
                "Training and Inference', ASPLOS'25; data from github.com/sitar-lab/NeuSight (MIT license)",
    "neusight-label": "NeuSight (ASPLOS'25) whole-model node tables, github.com/sitar-lab/NeuSight (MIT license)",
    "deepbench": "DeepBench, Baidu Research, github.com/baidu-research/DeepBench (Apache-2.0 license)",
    "vidur": "Vidur: A. Agrawal et al., 'Vidur: A Large-Scale Simulation Framework for LLM Inference', MLSys'24; "
             "profiling data from github.com/microsoft/vidur (MIT license)",
    "aiconfigurator": "AIConfigurator, NVIDIA, github.com/ai-dynamo/aiconfigurator (Apache-2.0 license): measured "
                      "GEMM tables",
}
METRIC_DEFINITION = ("absolute % error |predicted_ms / measured_ms - 1| x 100 per row; mape = mean, median_ape, "
                     "p90_ape; 'test' = configs hashed into the test split on training GPUs; 'leave_gpu_out' = a "
                     "model trained without that GPU; 'unseen' = rows of excluded sources (never trained on)")


def finite(obj):
    """A copy without non-finite floats (cards are strict JSON)."""
    if isinstance(obj, Mapping):
        return {k: finite(v) for k, v in obj.items() if not (isinstance(v, float) and not math.isfinite(v))}
    if isinstance(obj, list):
        return [finite(v) for v in obj]
    return obj


def data_card(table, res, holdout) -> dict:
    """The card's ``training_data``, with citations of the public sources among the rows."""
    card = table.data_card(res.masks, holdout)
    card["citations"] = {s: CITATIONS[s] for s in sorted(set(table.frame["source"])) if s in CITATIONS}
    return card


def build_card(cfg, res, training_data: Mapping, metrics: Mapping) -> dict:
    """Everything ``checkpoint.publish`` stores besides the files (it adds op, version, created, files)."""
    n_params = int(sum(v.size for v in res.weights.values()))
    return {**res.card_core,
            "mlflow_run_id": res.run_id,
            "training_data": dict(training_data),
            "metrics": finite(dict(metrics)),
            "ranges": res.ranges,
            "training": {"seed": res.seed, "epochs": res.epochs, "best_epoch": res.best_epoch,
                         "restarts": res.restarts, "members": res.members,
                         "train_seconds": round(res.train_seconds, 1), "n_parameters": n_params,
                         "loss": cfg.model.get("loss"), "optimizer": to_dict(cfg.optimizer),
                         "trainer": {k: v for k, v in to_dict(cfg.trainer).items() if k != "_target_"},
                         "framework": "pytorch_lightning"},
            "metric_definition": METRIC_DEFINITION}
