"""Training of the per-op scalers: data, data module, Lightning model, fit, card, MLflow tracking, champion rules.

Plain functions around two Lightning classes; ``pipeline.train`` (Hydra) is the entry point. Metrics and
predictions come from ``pipeline.evaluation`` (through the prediction API). Everything here imports
torch/Lightning/MLflow lazily where it can, so ``pipeline.training.data`` stays usable alone.
"""
