"""More work is never predicted faster: every training row paired with the same config at three times the batch.

An unconstrained fit lets the predicted time fall as the batch grows: scalers trained on dataset v2 predicted a
conv2d with three times the batch 0.40x as long and an LSTM 0.63x (on random configs of the bounds test). The
loss adds ``monotone_weight x mean(relu(ln t(row) - ln t(row, batch x 3)))``, zero wherever the larger batch is
predicted at least as slow. Three, not two: an odd factor keeps every dimension's alignment, and an aligned GEMM
may truly be faster than a misaligned one of half its size.
"""

from __future__ import annotations

import numpy as np

from pipeline.gpus import gpu_spec
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


def penalty(y_row, y_larger, gain):
    """Mean over rows of ``relu(ln t(row) - ln t(larger))`` (torch tensors): how much faster the larger batch is
    predicted, where it is."""
    import torch

    return torch.relu(y_row - y_larger - gain).mean()
