"""Training of the per-op scalers: data module, Lightning model, MLflow tracking, plots, publishing.

Plain functions around two Lightning classes; ``pipeline.train`` (Hydra) is the entry point. Everything
here imports torch/Lightning/MLflow lazily where it can, so ``pipeline.training.data`` stays usable alone.
"""
