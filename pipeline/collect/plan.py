"""What a sweep measures: its settings, the devices it runs on, and its tasks (resume-aware)."""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pipeline import physics, schema
from pipeline.ops import get_op
from pipeline.ops.base import estimate_ms, sample_configs
from pipeline.timing import TimingSettings

DEFAULT_N = {"fp32": 3000, "bf16": 3000, "tf32": 1500, "fp16": 1500}
PARTITION_OPS = ("conv2d", "linear", "bmm")   # cuDNN LSTMs hung under SM partitions (green contexts)


@dataclass(frozen=True)
class Task:
    op: str
    config: dict
    config_id: str
    precision: str


@dataclass
class Sweep:
    """Plain settings of a sweep (what the Hydra config holds), so the sweep runs without Hydra too.

    ``n`` is the number of configs per op for every precision, or a mapping precision -> count. With
    ``replace_failed``, each task already in the dataset that ended without a result (a row not ``ok``, in either
    phase) is replaced by the next config of the seeded sequence that the sweep's filters keep, so resumed sweeps
    top up to the configs of the first ``n`` the filters keep, all measured.
    ``sm_partition`` runs every worker inside a green context of that many SMs (an extra device balance
    of the same GPU); ``max_estimated_ms`` skips configs whose estimated forward time on the device (the
    reference GPU scaled to the partition's SMs) exceeds it.
    """
    gpu: str
    device: str = "auto"
    ops: tuple[str, ...] = schema.OPS
    precisions: tuple[str, ...] | None = None
    n: int | Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_N))
    seed: int = 0
    out: str = "datasets"
    spaces: Mapping[str, Mapping] = field(default_factory=dict)
    catalogs: Mapping[str, Mapping] = field(default_factory=dict)
    timing: TimingSettings = field(default_factory=TimingSettings)
    timeout_s: float = 60.0
    shard_rows: int = 512
    shard_seconds: float = 60.0
    memory_fraction: float = 0.5
    shard: int = 0
    num_shards: int = 1
    progress: bool = True
    time_limit_s: float | None = None
    sm_partition: int | None = None
    max_estimated_ms: float | None = None
    cudnn_benchmark_limit: int | None = None
    screen_ms: float | None = None
    partition_backward: str = "skip"
    replace_failed: bool = True
    fault_injection: Mapping[str, list] = field(default_factory=dict)

    def count(self, precision: str) -> int:
        if isinstance(self.n, Mapping):
            if precision not in self.n:
                raise ValueError(f"n: no count for precision {precision!r}; give one of "
                                 f"{', '.join(schema.PRECISIONS)} or a single number")
            return int(self.n[precision])
        return int(self.n)


def resolve_devices(device: str) -> list[str]:
    """'auto' → every visible GPU, else the CPU; 'cuda' → every visible GPU; 'cuda:N'; 'cpu'."""
    if device == "cpu":
        return ["cpu"]
    count = _cuda_count()
    if device == "auto":
        return [f"cuda:{i}" for i in range(count)] or ["cpu"]
    if device == "cuda":
        if count == 0:
            raise ValueError("device: 'cuda' asked for, but no CUDA GPU is visible (use device=cpu)")
        return [f"cuda:{i}" for i in range(count)]
    if device.startswith("cuda:") and device[5:].isdigit():
        if int(device[5:]) >= count:
            raise ValueError(f"device: {device!r} is not visible ({count} CUDA GPUs)")
        return [device]
    raise ValueError(f"device: {device!r} is not one of auto, cuda, cuda:N, cpu")


def expected_label(device_name: str, sm_partition: int | None) -> str | None:
    """The dataset label a sweep on this GPU must use: the registry's label, plus ``-sm<N>`` in a partition
    (None for a GPU the registry lacks)."""
    from pipeline.gpus import gpu_label

    try:
        label = gpu_label(device_name)
    except ValueError:
        return None
    return label if sm_partition is None else f"{label}-sm{sm_partition}"


def check_label(gpu: str, device_names: Mapping[str, str], sm_partition: int | None) -> None:
    """Refuse a label that names another GPU than the one measured: rows of two GPUs under one label would be
    trained on as one GPU. A GPU the registry lacks may take any label the registry does not use."""
    from pipeline.gpus import gpu_spec

    for device, name in device_names.items():
        want = expected_label(name, sm_partition)
        if want is not None and gpu != want:
            where = f"{device} ({name!r}{f', {sm_partition} SMs' if sm_partition else ''})"
            raise ValueError(f"gpu: {gpu!r} is not the label of {where}; use gpu={want}")
        if want is None:
            try:
                taken = gpu_spec(gpu)["name"]
            except ValueError:
                continue
            raise ValueError(f"gpu: {gpu!r} is the registry's label of {taken!r}, but {device} is {name!r}; "
                             f"give this GPU another label (or add it to conf/gpus.yaml)")


def device_names(devices: list[str]) -> dict[str, str]:
    """torch.cuda.get_device_name of each CUDA device (none for the CPU)."""
    if not devices[0].startswith("cuda"):
        return {}
    import torch

    return {d: torch.cuda.get_device_name(torch.device(d)) for d in devices}


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def device_memory_bytes(device: str) -> float:
    if device == "cpu":
        return 2 * 1024**3  # keep CPU sweeps small
    import torch

    free, _total = torch.cuda.mem_get_info(torch.device(device))
    return float(free)


def sweep_precisions(sweep: Sweep, device_kind: str) -> tuple[str, ...]:
    precisions = tuple(sweep.precisions or (("fp32", "bf16") if device_kind == "cuda" else ("fp32",)))
    for p in precisions:
        if p not in schema.PRECISIONS:
            raise ValueError(f"precisions: unknown {p!r}; allowed: {', '.join(schema.PRECISIONS)}")
    return precisions


def sweep_ops(sweep: Sweep) -> tuple[str, ...]:
    if sweep.sm_partition is None:
        return tuple(sweep.ops)
    skipped = [op for op in sweep.ops if op not in PARTITION_OPS]
    if skipped:
        print(f"sm_partition: skipping {', '.join(skipped)} (only {', '.join(PARTITION_OPS)} run under SM "
              "partitions; cuDNN LSTMs hung there)", flush=True)
    return tuple(op for op in sweep.ops if op in PARTITION_OPS)


def plan(sweep: Sweep, device_kind: str, memory_bytes: float,
         failed: Collection[tuple[str, str, str]] = ()) -> list[Task]:
    """Every (op, config, precision) task of the sweep, in the order they run.

    Config i of an (op, precision) is the same on every GPU (seeded sampling); tasks are interleaved by i
    across ops and precisions, so a sweep stopped early has covered each evenly. Configs whose tensors would
    not fit in ``memory_fraction`` of the device memory, or whose estimated time exceeds
    ``max_estimated_ms``, are left out, as are the other shards' configs. ``failed`` holds the (op, config_id,
    precision) tasks that ended without a result; with ``sweep.replace_failed`` each planned one adds the next
    config the filters keep (a replacement that failed too adds another).
    """
    kind = "gpu" if device_kind == "cuda" else "cpu"
    by_index: dict[int, list[Task]] = {}
    for op in sweep_ops(sweep):
        if op not in sweep.spaces:
            raise ValueError(f"spaces: no config space for op {op!r} (add conf/space/{op}.yaml)")
        spec, space = get_op(op), sweep.spaces[op][kind]
        slow = _too_slow(sweep, spec, space)
        for precision in sweep_precisions(sweep, device_kind):
            keep = _filters(sweep, spec, slow, precision, memory_bytes)
            for index, cfg in _configs(sweep, op, spec, space, precision, failed, keep):
                by_index.setdefault(index, []).append(Task(op, cfg, schema.config_id(op, cfg), precision))
    return [t for index in sorted(by_index) for t in by_index[index]]


def _filters(sweep: Sweep, spec, slow, precision: str, memory_bytes: float):
    """A predicate on (index, config): in this job's shard, not estimated too slow, and fits the device memory."""
    def keep(index: int, cfg: dict) -> bool:
        need = spec.memory_elems(cfg) * physics.element_bytes(precision) * 1.5
        return (index % sweep.num_shards == sweep.shard and not slow(cfg, precision)
                and need <= sweep.memory_fraction * memory_bytes)
    return keep


def _configs(sweep: Sweep, op: str, spec, space: Mapping, precision: str,
             failed: Collection[tuple[str, str, str]], keep) -> list[tuple[int, dict]]:
    """(index in the seeded sequence, config) of the planned configs: those of the first n that ``keep(index,
    config)`` accepts, then, with replace_failed, as many more accepted ones as the planned ones that ``failed``."""
    n, catalog = sweep.count(precision), sweep.catalogs.get(op)
    lost = sum(1 for key in failed if key[0] == op and key[2] == precision) if sweep.replace_failed else 0
    size = n + lost
    configs = sample_configs(spec, space, size, sweep.seed, precision, catalog, partial=True) if lost else []
    if len(configs) < n:  # no failures, or the space cannot yield n: the plain draw (which raises then)
        configs = sample_configs(spec, space, n, sweep.seed, precision, catalog)
    planned = [(i, cfg) for i, cfg in enumerate(configs[:n]) if keep(i, cfg)]
    short = sum((op, schema.config_id(op, cfg), precision) in failed for _, cfg in planned) if lost else 0
    i = n
    while short:
        if i == len(configs):   # drawn out: draw further (the draws are prefix-stable) unless the space is spent
            if len(configs) < size:
                print(f"replace_failed: the {op} space has too few configs to replace {short} more failed "
                      f"{precision} tasks", flush=True)
                break
            size *= 2
            configs = sample_configs(spec, space, size, sweep.seed, precision, catalog, partial=True)
            continue
        if keep(i, configs[i]):
            planned.append((i, configs[i]))
            short -= (op, schema.config_id(op, configs[i]), precision) not in failed
        i += 1
    return planned


def _too_slow(sweep: Sweep, spec, space: Mapping):
    """A predicate: is this config's estimated time on the device above ``max_estimated_ms``?"""
    if sweep.max_estimated_ms is None or "reference_gpu" not in space:
        return lambda cfg, precision: False
    from pipeline.gpus import gpu_spec

    reference = gpu_spec(space["reference_gpu"])
    slowdown = reference["sm_count"] / sweep.sm_partition if sweep.sm_partition else 1.0
    return lambda cfg, precision: (estimate_ms(spec, cfg, precision, reference) * slowdown
                                   > sweep.max_estimated_ms)


def completed(out: str | os.PathLike, gpu: str) -> dict[tuple[str, str, str], bool]:
    """(op, config_id, precision) already in the dataset for this GPU label (a task's rows land together),
    each mapped to whether all its rows are ``ok``."""
    import pyarrow.parquet as pq

    done: dict[tuple[str, str, str], bool] = {}
    for path in schema.dataset_files(Path(out) / f"gpu={gpu}"):
        op = path.parent.name.split("=", 1)[1]
        table = pq.read_table(path, columns=["config_id", "precision", "status"])
        for c, p, status in zip(*(table[k].to_pylist() for k in ("config_id", "precision", "status"))):
            done[(op, c, p)] = done.get((op, c, p), True) and status == "ok"
    return done
