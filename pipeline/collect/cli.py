"""``python -m pipeline.collect gpu=<label> [overrides]``: the Hydra entry point over ``conf/collect.yaml``."""

from __future__ import annotations

import math
from pathlib import Path

from pipeline import schema
from pipeline.collect.plan import Sweep
from pipeline.collect.scheduler import print_summary, run_sweep, write_run_summary
from pipeline.timing import TimingSettings

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
PARTITION_BACKWARD = ("skip", "explicit")


def sweep_from_config(cfg) -> Sweep:
    """The plain Sweep settings of a composed collect config (validated: errors name the field)."""
    from omegaconf import OmegaConf

    c = OmegaConf.to_container(cfg, resolve=True)
    if not c.get("gpu"):
        raise ValueError("gpu: a dataset label is required, e.g. gpu=h200")
    unknown = set(c["ops"]) - set(schema.OPS)
    if unknown:
        raise ValueError(f"ops: unknown {sorted(unknown)}; allowed: {', '.join(schema.OPS)}")
    n = c["n"]
    if isinstance(n, dict):
        bad = set(n) - set(schema.PRECISIONS)
        if bad:
            raise ValueError(f"n: unknown precisions {sorted(bad)}; allowed: {', '.join(schema.PRECISIONS)}")
        n = {p: int(v) for p, v in n.items()}
    else:
        n = int(n)
    partition = _optional_int(c, "sm_partition")
    backward = c.get("partition_backward", "skip")
    if backward not in PARTITION_BACKWARD:
        raise ValueError(f"partition_backward: {backward!r} is not one of {', '.join(PARTITION_BACKWARD)}")
    return Sweep(gpu=str(c["gpu"]), device=str(c["device"]), ops=tuple(c["ops"]),
                 precisions=tuple(c["precisions"]) if c.get("precisions") else None, n=n,
                 seed=int(c["seed"]), out=str(c["out"]), spaces=c["space"], catalogs=c.get("catalog") or {},
                 timing=TimingSettings(**c["timing"]), timeout_s=_positive(c, "timeout_s", "s"),
                 shard_rows=int(c["shard_rows"]), shard_seconds=float(c["shard_seconds"]),
                 memory_fraction=float(c["memory_fraction"]), shard=int(c["shard"]),
                 num_shards=int(c["num_shards"]), progress=bool(c["progress"]),
                 time_limit_s=_optional_positive(c, "time_limit_s", "s"),
                 sm_partition=partition,
                 max_estimated_ms=_optional_positive(c, "max_estimated_ms", "ms"),
                 cudnn_benchmark_limit=_optional_int(c, "cudnn_benchmark_limit"),
                 screen_ms=_optional_positive(c, "screen_ms", "ms"),
                 partition_backward=backward, replace_failed=_flag(c, "replace_failed"),
                 fault_injection=c.get("fault_injection") or {})


def _optional_positive(c: dict, key: str, unit: str) -> float | None:
    return None if c.get(key) is None else _positive(c, key, unit, "null or ")


def _positive(c: dict, key: str, unit: str, alternative: str = "") -> float:
    value = c.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(f"{key}: must be {alternative}a positive, finite number of {unit}, got {value!r}")
    return float(value)


def _flag(c: dict, key: str) -> bool:
    value = c.get(key, True)
    if not isinstance(value, bool):
        raise ValueError(f"{key}: must be true or false, got {value!r}")
    return value


def _optional_int(c: dict, key: str) -> int | None:
    value = c.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{key}: must be null or a positive whole number, got {value!r}")
    return value


def main():
    import hydra
    from hydra.utils import to_absolute_path

    @hydra.main(config_path=str(CONF_DIR), config_name="collect", version_base=None)
    def _app(cfg):
        sweep = sweep_from_config(cfg)
        sweep.out = to_absolute_path(sweep.out)
        summary = run_sweep(sweep)
        write_run_summary(sweep, summary)
        print_summary(summary)

    _app()
