"""More work is never predicted faster: every training row paired with the same config at three times the batch.

An unconstrained fit lets the predicted time fall as the batch grows: scalers trained on dataset v2 predicted a
conv2d with three times the batch 0.40x as long and an LSTM 0.63x (on random configs of the bounds test). The
loss adds ``monotone_weight x mean(relu(ln t(row) - ln t(row, batch x 3)))``, zero wherever the larger batch is
predicted at least as slow. Three, not two: an odd factor keeps every dimension's alignment, and an aligned GEMM
may truly be faster than a misaligned one of half its size.
"""

from __future__ import annotations

import numpy as np

from pipeline.gpus import gpu_label, gpu_spec, known_gpus, supports_precision
from pipeline.training.data import row_features

WORK_FACTOR = 3


def more_work_rows(table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row of ``table`` (an ``OpTable``) with the batch times ``WORK_FACTOR``: its features, head input and
    ``ln(reference(larger) / reference(row))``, so that ln t(larger) - ln t(row) = y(larger) - y(row) + that.
    Built as ``OpTable``'s own features are; the reference ratio is ``y(row) - y(larger)`` at the row's measured
    time (``y = ln(time / reference)``)."""
    larger = table.frame.assign(batch=table.frame["batch"] * WORK_FACTOR)
    specs = {label: gpu_spec(label) for label in larger["gpu"].unique()}
    X, y_larger, aux, _ = row_features(larger, table.op, specs, table.target_kind)
    return X, aux, table.y - y_larger


def elsewhere_frame(frame):
    """Each row moved to a GPU it was not measured on (the registry's GPUs in turn), in its precision where that
    GPU has it, else fp32."""
    labels = sorted({gpu_label(name) for name in known_gpus()})
    moved = frame.assign(gpu=[labels[(i * 7) % len(labels)] for i in range(len(frame))])
    same = moved["gpu"].to_numpy() == frame["gpu"].to_numpy()
    moved.loc[same, "gpu"] = [labels[(labels.index(g) + 1) % len(labels)] for g in moved.loc[same, "gpu"]]
    supported = np.array([supports_precision(gpu_spec(g), p) for g, p in zip(moved["gpu"], moved["precision"])])
    moved.loc[~supported, "precision"] = "fp32"
    return moved


def elsewhere_rows(table) -> tuple[np.ndarray, ...]:
    """The pairs of ``more_work_rows`` on a GPU each row was not measured on (``elsewhere_frame``): the penalty
    then also holds where an op has no data, which is where a fit extrapolates. Returns (features, head input) of
    the moved row and of its larger pair, and their ``ln(reference(larger) / reference(row))``."""
    moved = elsewhere_frame(table.frame)
    specs = {label: gpu_spec(label) for label in moved["gpu"].unique()}
    larger = moved.assign(batch=moved["batch"] * WORK_FACTOR)
    X_row, y_row, aux_row, _ = row_features(moved, table.op, specs, table.target_kind)
    X_larger, y_larger, aux_larger, _ = row_features(larger, table.op, specs, table.target_kind)
    return X_row, aux_row, X_larger, aux_larger, y_row - y_larger


def penalty(y_row, y_larger, gain):
    """Mean over rows of ``relu(ln t(row) - ln t(larger))`` (torch tensors): how much faster the larger batch is
    predicted, where it is."""
    import torch

    return torch.relu(y_row - y_larger - gain).mean()
