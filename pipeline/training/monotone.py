"""More work is never predicted faster: every training row paired with the same config at three times the batch.

An unconstrained fit lets the predicted time fall as the batch grows: scalers trained on dataset v2 predicted a
conv2d with three times the batch 0.40x as long and an LSTM 0.63x (on random configs of the bounds test). The
loss adds ``monotone_weight x mean(relu(ln t(row) - ln t(row, batch x 3)))``, zero wherever the larger batch is
predicted at least as slow. Three, not two: an odd factor keeps every dimension's alignment, and an aligned GEMM
may truly be faster than a misaligned one of half its size.
"""

from __future__ import annotations

import numpy as np

from pipeline import features as F
from pipeline import targets as T
from pipeline.gpus import gpu_spec

WORK_FACTOR = 3


def more_work_rows(table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row of ``table`` (an ``OpTable``) with the batch times ``WORK_FACTOR``: its features, head input and
    ``ln(reference(larger) / reference(row))``, so that ln t(larger) - ln t(row) = y(larger) - y(row) + that.
    The row's own reference comes from its target (``y = ln(time / reference)``), not from its physics again."""
    frame = table.frame
    X, aux, log_ref_larger_ms = np.zeros_like(table.X), np.ones(len(frame)), np.zeros(len(frame))
    for label, idx in frame.groupby("gpu", sort=True).indices.items():
        base = frame.iloc[idx]
        larger = F.prepare(table.op, base.assign(batch=base["batch"] * WORK_FACTOR), gpu_spec(label),
                           base["precision"].to_numpy(), base["phase"].to_numpy())
        X[idx] = F.matrix(larger)
        aux[idx] = T.aux(table.target_kind, larger)
        log_ref_larger_ms[idx] = np.log(T.reference_s(table.target_kind, larger) * 1e3)
    log_ref_ms = np.log(frame["time_ms"].to_numpy(dtype=float)) - table.y
    return X, aux, log_ref_larger_ms - log_ref_ms


def penalty(y_row, y_larger, gain):
    """Mean over rows of ``relu(ln t(row) - ln t(larger))`` (torch tensors): how much faster the larger batch is
    predicted, where it is."""
    import torch

    return torch.relu(y_row - y_larger - gain).mean()
