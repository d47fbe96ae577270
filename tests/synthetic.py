"""SYNTHETIC FIXTURES for the training and evaluation tests: rows in the dataset schema whose times follow a
known, made-up law (not measurements), written by the tests into temporary folders.

Law (bmm): time_ms = 0.006 + bound_ms x (1.3 + 0.5 sin(ln(m n))), times 2 % Gaussian noise: a launch floor
plus the physical lower bound (``features.bound_ms``) scaled by a smooth, shape-dependent inefficiency that
neither the bound nor the plain roofline knows.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from pipeline import features as F
from pipeline.gpus import gpu_spec, supports_precision
from pipeline.schema import config_id, config_ids, make_rows, write_partition

SOURCE = "synthetic-fixture"
LAUNCH_FLOOR_MS = 0.006
NOISE = 0.02


def law_ms(configs: pd.DataFrame, gpu: str, precision: str, phase: str) -> np.ndarray:
    """The noise-free synthetic time of bmm ``configs`` on ``gpu``."""
    bound = F.bound_ms("bmm", configs, gpu_spec(gpu), precision, phase)
    inefficiency = 1.3 + 0.5 * np.sin(np.log(configs["m"].to_numpy() * configs["n"].to_numpy()))
    return LAUNCH_FLOOR_MS + bound * inefficiency


def synthetic_rows(gpus=("h200", "t4", "a100-pcie-40gb"), n_configs=120, seed=0, source=SOURCE,
                   precisions=("fp32", "bf16"), phases=("forward", "backward")) -> pd.DataFrame:
    """SYNTHETIC bmm rows following ``law_ms`` with noise; precisions a GPU has no path for are left out."""
    rng = np.random.default_rng(seed)
    cfgs = pd.DataFrame({"batch": rng.integers(1, 64, n_configs), "m": rng.integers(1, 1024, n_configs),
                         "k": rng.integers(1, 1024, n_configs), "n": rng.integers(1, 1024, n_configs)})
    ids = [config_id("bmm", {k: int(v) for k, v in c.items()}) for _, c in cfgs.iterrows()]
    parts = []
    for gpu in gpus:
        for p in precisions:
            if not supports_precision(gpu_spec(gpu), p):
                continue
            for ph in phases:
                t = law_ms(cfgs, gpu, p, ph) * rng.normal(1.0, NOISE, n_configs)
                parts.append(cfgs.assign(config_id=ids, op="bmm", gpu=gpu, source=source, precision=p, phase=ph,
                                         time_ms=t, time_p20_ms=t, time_p80_ms=t, reps=5, status="ok", error=None))
    return make_rows(pd.concat(parts, ignore_index=True).to_dict("records"))


def write_datasets(root: Path, n_configs: int = 120, gpus=("h200", "t4", "a100-pcie-40gb")) -> Path:
    """A datasets/ tree of synthetic fixtures: the training GPUs, an 'unseen' source on l4 (also synthetic) and
    a few failed rows that every reader must ignore."""
    note = {"note": "synthetic test fixture, not measurements"}
    write_partition(synthetic_rows(gpus=gpus, n_configs=n_configs), root, "synthetic", metadata=note)
    write_partition(synthetic_rows(gpus=("l4",), n_configs=30, seed=5, source="neusight-label", phases=("forward",)),
                    root / "external", "synthetic-unseen", metadata=note)
    bad = synthetic_rows(gpus=("t4",), n_configs=3, seed=9).assign(status="oom", time_ms=np.nan, time_p20_ms=np.nan,
                                                                   time_p80_ms=np.nan, reps=None, error="OOM")
    write_partition(bad, root, "synthetic-failed", metadata=note)
    return root


def synthetic_conv2d_rows(gpus=("h200", "t4"), n_configs=40, seed=0, source=SOURCE) -> pd.DataFrame:
    """SYNTHETIC conv2d rows (fp32, both phases) at 1.5x the physical lower bound: for the tests of the rows only
    conv2d's inputs can tell apart (its ``cudnn_heuristic``)."""
    rng = np.random.default_rng(seed)
    cfgs = pd.DataFrame({"batch": rng.integers(1, 64, n_configs), "in_channels": rng.integers(1, 256, n_configs),
                         "out_channels": rng.integers(1, 256, n_configs), "height": rng.integers(8, 64, n_configs),
                         "width": rng.integers(8, 64, n_configs), "kernel_h": 3, "kernel_w": 3, "stride_h": 1,
                         "stride_w": 1, "pad_h": 1, "pad_w": 1, "dilation_h": 1, "dilation_w": 1, "groups": 1,
                         "bias": True})
    ids = list(config_ids("conv2d", cfgs))
    parts = []
    for gpu in gpus:
        for ph in ("forward", "backward"):
            t = 1.5 * F.bound_ms("conv2d", cfgs, gpu_spec(gpu), "fp32", ph)
            parts.append(cfgs.assign(config_id=ids, op="conv2d", gpu=gpu, source=source, precision="fp32", phase=ph,
                                     time_ms=t, time_p20_ms=t, time_p80_ms=t, reps=5, status="ok", error=None))
    return make_rows(pd.concat(parts, ignore_index=True).to_dict("records"))
