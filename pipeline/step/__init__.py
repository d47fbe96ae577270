"""Whole training steps: track one on this device, predict it (time, steps/s, cost) on GPUs you do not have.

    import pipeline
    trace = pipeline.track(step_fn)            # runs step_fn (forward, backward, optimizer) after warm-up
    trace.total_ms                             # measured step (median of untracked steps)
    trace.ops                                  # one row per executed ATen op
    pred = trace.to("h100")                    # per-op scalers (calibrated transfer) and wave scaling
    pred.total_ms, pred.breakdown()            # predicted step, ms per op kind and phase

    from pipeline.step import predict_step
    result = predict_step(step_fn, ["a100", "h100", "l4"], plot="step.png")   # time, steps/s, cost per GPU

Modules: ``classify`` (which ATen op is which kind, its canonical config and counters), ``record`` (the
dispatch-mode recorder and its timing: ``track``), ``trace`` (``Trace``, ``Prediction``), ``predict``
(``predict_trace``: per-op scalers and wave scaling), ``wave`` (wave/roofline scaling), ``forecast``
(``predict_step``), ``parallel`` (data parallel: DDP's buckets and their overlap with backward), ``plots``,
``prices``, ``models`` (built-in example models), ``labels`` (validation on NeuSight's
measured steps), ``cli`` (``python -m pipeline.step``). Importing this package does not import torch.
"""

from pipeline.step.classify import OP_KINDS, STEP_PHASES, TRACE_COLUMNS
from pipeline.step.cli import main
from pipeline.step.forecast import StepPrediction, plot_scaling, plot_step, predict_step
from pipeline.step.parallel import DDP_BUCKET_MB, DDP_FIRST_BUCKET_MB, data_parallel_step, ddp_buckets, overlap
from pipeline.step.predict import FALLBACKS, clear_scaler_cache, predict_trace, resolve_origin
from pipeline.step.prices import PRICES_PATH, load_prices, price_for
from pipeline.step.record import track
from pipeline.step.trace import Prediction, Trace

__all__ = ["track", "Trace", "Prediction", "predict_trace", "predict_step", "StepPrediction", "plot_step",
           "plot_scaling", "ddp_buckets", "overlap", "data_parallel_step", "DDP_BUCKET_MB", "DDP_FIRST_BUCKET_MB",
           "resolve_origin", "clear_scaler_cache", "load_prices", "price_for", "main", "OP_KINDS", "STEP_PHASES",
           "TRACE_COLUMNS", "FALLBACKS", "PRICES_PATH"]
