"""Predict how long deep-learning ops and training steps take on GPUs you do not have.

Light by design: ``from pipeline import load_scaler`` imports numpy/pandas only. Heavier entry points
(``track``, which needs torch) load on first use.
"""

_LAZY = {
    "load_scaler": "pipeline.api",
    "Scaler": "pipeline.api",
    "track": "pipeline.step",
    "Trace": "pipeline.step",
    "predict_trace": "pipeline.step",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
