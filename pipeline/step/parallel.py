"""Data-parallel steps (PyTorch DDP): the gradient buckets, their all-reduce overlapped with backward, what is left.

Each of ``n`` GPUs runs the one-GPU step on its own batch; DDP sums the gradients with all-reduce while backward
goes on. As in ``torch.nn.parallel.DistributedDataParallel`` (after its first iteration, when it rebuilds the
buckets in the order the gradients became ready; for most models the reverse of registration order):

- **Buckets**: gradients in ready order (ties and never-ready ones in reverse registration order), per dtype, a
  bucket closing once it holds at least its cap: 1 MiB for the first (``dist._DEFAULT_FIRST_BUCKET_BYTES``), 25 MiB
  after (``bucket_cap_mb``'s default).
- **Overlap**: a bucket's all-reduce starts when its last gradient is ready and the previous bucket's all-reduce
  is done (one communication stream, buckets in order); only the part that ends after the last backward op is
  added to the step (the optimizer waits for it).
- **Copies** (``gradient_as_bucket_view=False``, DDP's default): each gradient is copied (scaled by 1/n) into its
  bucket on the compute stream as it becomes ready, and the buckets are copied back into the gradients after the
  last all-reduce: twice the gradient bytes read and written, at the GPU's memory bandwidth.

``ready`` times are the predicted one-GPU step's own: the sum of the predicted op times up to the op after which
the gradient was ready (``Trace.grads.ready_seq``). numpy/pandas only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

__all__ = ["DDP_BUCKET_MB", "DDP_FIRST_BUCKET_MB", "MULTIGPU_PATH", "ddp_buckets", "overlap", "data_parallel_step",
           "configured_inter_node_gbps", "check_gpu_counts"]

MULTIGPU_PATH = Path(__file__).resolve().parents[2] / "conf" / "multigpu.yaml"

DDP_BUCKET_MB = 25.0
"""DDP's default ``bucket_cap_mb`` (MiB)."""
DDP_FIRST_BUCKET_MB = 1.0
"""DDP's first bucket when ``bucket_cap_mb`` is left at its default (``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES``,
1 MiB): the gradients ready last go out quickly."""
_MIB = 2 ** 20


def _check_grads(grads: pd.DataFrame | None) -> pd.DataFrame:
    if grads is None or len(grads) == 0:
        raise ValueError("the trace has no gradient table (Trace.grads): a data-parallel prediction needs the "
                         "parameters' sizes and when their gradients are ready. Track a step whose optimizer is a "
                         "torch.optim optimizer, or pass parameters=model.parameters() to track / predict_step")
    missing = [c for c in ("param", "bytes", "dtype", "ready_seq") if c not in grads]
    if missing:
        raise ValueError(f"grads: missing columns {missing}")
    return grads


def ddp_buckets(grads: pd.DataFrame, bucket_mb: float = DDP_BUCKET_MB,
                first_bucket_mb: float = DDP_FIRST_BUCKET_MB) -> pd.DataFrame:
    """DDP's buckets of ``grads``, in the order they are all-reduced: ``bucket``, ``bytes``, ``params``, ``dtype``,
    ``ready_seq`` (of its last gradient; ``inf`` if one is never ready)."""
    grads = _check_grads(grads)
    if not (bucket_mb > 0 and first_bucket_mb > 0):
        raise ValueError(f"bucket_mb and first_bucket_mb must be > 0, got {bucket_mb}, {first_bucket_mb}")
    ready = grads["ready_seq"].to_numpy(dtype=float)
    ready = np.where(ready < 0, np.inf, ready)
    order = np.lexsort((-grads["param"].to_numpy(), ready))
    open_: dict[str, dict] = {}
    limits: dict[str, float] = {}
    buckets = []
    for i in order:
        dtype = str(grads["dtype"].iloc[i])
        b = open_.setdefault(dtype, {"bytes": 0, "params": 0, "ready_seq": -np.inf, "first": len(buckets)})
        b["bytes"] += int(grads["bytes"].iloc[i])
        b["params"] += 1
        b["ready_seq"] = max(b["ready_seq"], ready[i])
        limit = limits.setdefault(dtype, first_bucket_mb * _MIB)
        if b["bytes"] >= limit:
            buckets.append({**open_.pop(dtype), "dtype": dtype})
            limits[dtype] = bucket_mb * _MIB
    buckets += [{**b, "dtype": d} for d, b in open_.items()]
    frame = pd.DataFrame(buckets).sort_values(["ready_seq", "first"], kind="stable").reset_index(drop=True)
    frame.insert(0, "bucket", np.arange(len(frame)))
    return frame[["bucket", "bytes", "params", "dtype", "ready_seq"]]


def overlap(ready_ms, comm_ms, backward_end_ms: float) -> dict:
    """All-reduces on one stream, in order, each starting when its bucket is ready and the previous one is done:
    ``exposed_ms`` (the part after ``backward_end_ms``), ``comm_end_ms``, ``comm_ms`` (their sum), ``starts``."""
    ready_ms, comm_ms = np.asarray(ready_ms, dtype=float), np.asarray(comm_ms, dtype=float)
    if ready_ms.shape != comm_ms.shape:
        raise ValueError(f"ready_ms and comm_ms differ in length: {ready_ms.shape} vs {comm_ms.shape}")
    if np.any(comm_ms < 0) or np.any(~np.isfinite(comm_ms)):
        raise ValueError("comm_ms must be finite and >= 0")
    end, starts = 0.0, []
    for r, c in zip(np.minimum(ready_ms, backward_end_ms), comm_ms):
        start = max(r, end)
        starts.append(start)
        end = start + c
    return {"exposed_ms": max(end - backward_end_ms, 0.0), "comm_end_ms": end, "comm_ms": float(comm_ms.sum()),
            "starts": np.asarray(starts)}


def data_parallel_step(ops: pd.DataFrame, grads: pd.DataFrame, comm_ms: Callable[[np.ndarray, str], np.ndarray],
                       bucket_mb: float = DDP_BUCKET_MB, first_bucket_mb: float = DDP_FIRST_BUCKET_MB,
                       column: str = "pred_ms", copy_gbps: float | None = None) -> dict:
    """The data-parallel step from a predicted one-GPU step: ``ops`` with ``seq``, ``phase`` and ``column`` (op
    times), ``grads`` (``Trace.grads``), ``comm_ms(bucket bytes, dtype)`` the all-reduce time of each bucket.

    ``copy_gbps`` (the GPU's memory bandwidth, GB/s): DDP's gradient copies (``gradient_as_bucket_view=False``,
    its default) -- each gradient scaled by 1/n into its bucket as it becomes ready (read + write, on the compute
    stream, so backward grows by it), and every bucket copied back into the gradients once the last all-reduce is
    done (read + write, before the optimizer); None leaves them out.

    Returns ``step_ms`` (one-GPU step + copies + exposed all-reduce), ``single_ms``, ``comm_ms``, ``exposed_ms``,
    ``copy_ms``, ``buckets``, ``grad_bytes`` and ``backward_end_ms``."""
    ops = ops.sort_values("seq", kind="stable")
    times = ops[column].to_numpy(dtype=float) * (ops["count"].to_numpy(dtype=float) if "count" in ops else 1.0)
    ends = np.cumsum(np.nan_to_num(times))
    backward = np.flatnonzero(ops["phase"].to_numpy() == "backward")
    backward_end = float(ends[backward[-1]]) if len(backward) else float(ends[-1])
    buckets = ddp_buckets(grads, bucket_mb, first_bucket_mb)
    seqs = ops["seq"].to_numpy()
    finite = np.isfinite(buckets["ready_seq"].to_numpy(dtype=float))
    position = np.searchsorted(seqs, buckets["ready_seq"].to_numpy(dtype=float)[finite], side="left") - 1
    ready = np.full(len(buckets), backward_end)
    ready[finite] = np.where(position >= 0, ends[np.clip(position, 0, len(ends) - 1)], 0.0)
    copy_each = (2.0 * buckets["bytes"].to_numpy(dtype=float) / (copy_gbps * 1e6) if copy_gbps
                 else np.zeros(len(ready)))
    ready = ready + np.cumsum(copy_each)  # each bucket's copies run before it can go out, and delay what follows
    backward_end += float(copy_each.sum())
    comm = np.zeros(len(buckets))
    for dtype, idx in buckets.groupby("dtype").groups.items():
        comm[idx] = comm_ms(buckets.loc[idx, "bytes"].to_numpy(dtype=float), str(dtype))
    result = overlap(ready, comm, backward_end)
    single = float(np.nansum(times)) if np.all(np.isfinite(times)) else float("nan")
    copy_ms = 2.0 * float(copy_each.sum())
    return {"step_ms": single + copy_ms + result["exposed_ms"], "single_ms": single, "comm_ms": result["comm_ms"],
            "exposed_ms": result["exposed_ms"], "copy_ms": copy_ms, "buckets": int(len(buckets)),
            "grad_bytes": int(buckets["bytes"].sum()), "backward_end_ms": backward_end}


def configured_inter_node_gbps(path=None) -> float | None:
    """``inter_node.bandwidth_gbps`` of ``conf/multigpu.yaml`` (None where unset): a node's network bandwidth per
    direction in GB/s, for predictions past one node."""
    path = Path(path) if path is not None else MULTIGPU_PATH
    if not path.exists():
        return None
    raw = yaml.safe_load(path.read_text()) or {}
    value = (raw.get("inter_node") or {}).get("bandwidth_gbps")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise ValueError(f"{path.name}: inter_node.bandwidth_gbps must be a positive number of GB/s or null, "
                         f"got {value!r}")
    return float(value)


def check_gpu_counts(n_gpus) -> list[int]:
    """``n_gpus`` (one count or several) as a sorted list of whole numbers >= 1; ValueError otherwise."""
    values = [n_gpus] if isinstance(n_gpus, (int, np.integer)) and not isinstance(n_gpus, bool) else list(n_gpus)
    bad = [v for v in values if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1]
    if bad or not values:
        raise ValueError(f"n_gpus: whole numbers >= 1 (e.g. [1, 2, 4, 8]), got {n_gpus!r}")
    return sorted({int(v) for v in values})
