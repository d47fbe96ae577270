"""Kernel sweeps: time op configs forward and backward on every GPU of the host, into the dataset.

The parent process plans the seeded sweep, skips configs already measured (resume), hands one task at a
time to one worker process per device, and is the only writer: rows are flushed in shards written
atomically. A worker that hangs past ``timeout_s`` is killed (its task becomes ``timeout`` rows) and
restarted; OOM and library errors become ``oom``/``error`` rows. ``python -m pipeline.collect gpu=h200``.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing as mp
import os
import socket
import time
import traceback
import uuid
from collections import Counter, deque
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from pipeline import schema
from pipeline.features import BYTES_PER_ELEMENT
from pipeline.ops import get_op
from pipeline.ops.base import sample_configs
from pipeline.timing import TimingSettings, measure

CUDA_FATAL = ("illegal memory access", "unspecified launch failure", "device-side assert", "CUDA error: an illegal",
              "misaligned address", "cudaErrorLaunchFailure")


@dataclass(frozen=True)
class Task:
    op: str
    config: dict
    config_id: str
    precision: str


@dataclass
class Sweep:
    """Plain settings of a sweep (what the Hydra config holds), so the sweep runs without Hydra too."""
    gpu: str
    device: str = "auto"
    ops: tuple[str, ...] = schema.OPS
    precisions: tuple[str, ...] | None = None
    n: int = 2000
    seed: int = 0
    out: str = "datasets"
    spaces: Mapping[str, Mapping] = field(default_factory=dict)
    timing: TimingSettings = field(default_factory=TimingSettings)
    timeout_s: float = 60.0
    shard_rows: int = 512
    shard_seconds: float = 60.0
    memory_fraction: float = 0.5
    shard: int = 0
    num_shards: int = 1
    progress: bool = True
    time_limit_s: float | None = None
    fault_injection: Mapping[str, list] = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------- planning

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


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def device_memory_bytes(device: str) -> float:
    if device == "cpu":
        return 2 * 1024**3  # keep CPU sweeps small
    import torch

    free, _total = torch.cuda.mem_get_info(torch.device(device))
    return float(free)


def plan(sweep: Sweep, device_kind: str, memory_bytes: float) -> list[Task]:
    """Every (op, config, precision) task of the sweep: seeded, the same configs on every GPU, minus those
    whose tensors would not fit in ``memory_fraction`` of the device memory."""
    precisions = tuple(sweep.precisions or (("fp32", "bf16") if device_kind == "cuda" else ("fp32",)))
    for p in precisions:
        if p not in schema.PRECISIONS:
            raise ValueError(f"precisions: unknown {p!r}; allowed: {', '.join(schema.PRECISIONS)}")
    per_op: list[list[Task]] = []
    for op in sweep.ops:
        spec = get_op(op)
        if op not in sweep.spaces:
            raise ValueError(f"spaces: no config space for op {op!r} (add conf/space/{op}.yaml)")
        space = sweep.spaces[op]["gpu" if device_kind == "cuda" else "cpu"]
        tasks: list[Task] = []
        for index, cfg in enumerate(sample_configs(spec, space, sweep.n, sweep.seed)):
            if index % sweep.num_shards != sweep.shard:
                continue
            cid = schema.config_id(op, cfg)
            for precision in precisions:
                need = spec.memory_elems(cfg) * BYTES_PER_ELEMENT[precision] * 1.5
                if need <= sweep.memory_fraction * memory_bytes:
                    tasks.append(Task(op, cfg, cid, precision))
        per_op.append(tasks)
    # Interleave the ops so that a sweep stopped early (time limit, crash) has covered every op evenly.
    return [t for group in itertools.zip_longest(*per_op) for t in group if t is not None]


def completed(out: str | os.PathLike, gpu: str) -> set[tuple[str, str, str]]:
    """(op, config_id, precision) already in the dataset for this GPU label (a task's rows land together)."""
    import pyarrow.parquet as pq

    done = set()
    for path in schema.dataset_files(Path(out) / f"gpu={gpu}"):
        op = path.parent.name.split("=", 1)[1]
        table = pq.read_table(path, columns=["config_id", "precision"])
        done.update((op, c, p) for c, p in zip(table["config_id"].to_pylist(), table["precision"].to_pylist()))
    return done


# ------------------------------------------------------------------------------------------------ worker

def _set_precision_flags(torch, precision: str):
    tf32 = precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    return {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]


def _task_rows(task: Task, gpu: str, results: dict[str, tuple]) -> list[dict]:
    rows = []
    for phase in schema.PHASES:
        status, timing, error = results[phase]
        t = timing or (None, None, None, 0)
        rows.append({"config_id": task.config_id, "op": task.op, "gpu": gpu, "source": "own",
                     "precision": task.precision, "phase": phase, "time_ms": t[0], "time_p20_ms": t[1],
                     "time_p80_ms": t[2], "reps": t[3], "status": status, "error": error, **task.config})
    return rows


def run_task(task: Task, device: str, timing: TimingSettings, faults: Mapping[str, list]) -> tuple[dict, bool]:
    """Measure one task forward and backward. Returns ({phase: (status, timing, error)}, fatal)."""
    import torch

    device_type = "cuda" if device.startswith("cuda") else "cpu"
    results: dict[str, tuple] = {}
    fatal = False
    try:
        if task.config_id in faults.get("hang", []):
            time.sleep(3600)
        if task.config_id in faults.get("crash", []):
            os._exit(17)
        if task.config_id in faults.get("oom", []):
            raise torch.OutOfMemoryError("injected out-of-memory (fault_injection.oom)")
        dtype = _set_precision_flags(torch, task.precision)
        fn, inputs, params = get_op(task.op).build(task.config, device, dtype)
        flush = _l2_flusher(device) if timing.flush_l2 else None
        results["forward"] = ("ok", measure(lambda: fn(*inputs), device_type, timing, flush), "")
        out = fn(*inputs)
        grad_out = torch.randn_like(out)
        wrt = inputs + params
        results["backward"] = ("ok", measure(lambda: torch.autograd.grad(out, wrt, grad_out, retain_graph=True),
                                             device_type, timing, flush), "")
    except torch.OutOfMemoryError as exc:
        _fill(results, "oom", exc)
    except Exception as exc:  # library errors (cuDNN, cuBLAS, unsupported dtype...) become rows
        _fill(results, "error", exc)
        fatal = any(marker in str(exc) for marker in CUDA_FATAL)
    finally:
        fn = inputs = params = out = grad_out = wrt = None  # noqa: F841  (free before the next task)
        if device_type == "cuda" and not fatal:
            torch.cuda.empty_cache()
    return results, fatal


_L2_BUFFERS: dict[str, Any] = {}


def _l2_flusher(device: str):
    """A callable that overwrites a buffer twice the size of the device's L2 cache (64 MiB on a CPU)."""
    import torch

    if device not in _L2_BUFFERS:
        size = (2 * torch.cuda.get_device_properties(torch.device(device)).L2_cache_size
                if device.startswith("cuda") else 64 * 2**20)
        _L2_BUFFERS[device] = torch.empty(size, dtype=torch.uint8, device=device)
    return _L2_BUFFERS[device].zero_


def _fill(results: dict, status: str, exc: BaseException):
    message = f"{type(exc).__name__}: {exc}"[:500]
    for phase in schema.PHASES:
        results.setdefault(phase, (status, None, message))


def environment(device: str, timing: TimingSettings) -> dict[str, Any]:
    """What the dataset records about where and how it was measured."""
    import platform

    import torch

    env: dict[str, Any] = {"host": socket.gethostname(), "python": platform.python_version(),
                           "torch": torch.__version__, "cuda": torch.version.cuda,
                           "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
                           "cudnn_benchmark": True, "tf32": "off for fp32, on for tf32",
                           "timing_method": timing.describe("cuda" if device.startswith("cuda") else "cpu"),
                           "device": device}
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        env.update(gpu_name=props.name, sm_count=props.multi_processor_count,
                   memory_gb=round(props.total_memory / 1e9, 1),
                   l2_cache_mb=round(getattr(props, "L2_cache_size", 0) / 2**20, 1),
                   compute_capability=f"{props.major}.{props.minor}", **_nvidia_smi(int(device.split(':')[1])))
    else:
        env.update(gpu_name=f"CPU ({platform.processor() or platform.machine()})", cpu_count=os.cpu_count())
    return env


def _nvidia_smi(index: int) -> dict[str, Any]:
    import subprocess

    fields = "driver_version,clocks.max.sm,clocks.max.mem,clocks.sm,power.limit"
    try:
        line = subprocess.run(["nvidia-smi", f"--id={index}", f"--query-gpu={fields}", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20).stdout.strip()
        values = [v.strip() for v in line.split(",")]
        return dict(zip(("driver", "max_sm_clock_mhz", "max_mem_clock_mhz", "sm_clock_mhz_at_start", "power_limit"),
                        values))
    except (OSError, subprocess.SubprocessError):
        return {"driver": None}


def characterise(device: str) -> dict[str, Any]:
    """Measured achievable memory bandwidth and matmul throughput per precision, so a GPU missing from
    the registry can still be described."""
    import torch

    if not device.startswith("cuda"):
        return {}
    timing = TimingSettings(warmup_ms=20, min_time_ms=50, min_reps=5, max_reps=50)
    result: dict[str, Any] = {}
    src = torch.empty(512 * 2**20 // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    ms = measure(lambda: dst.copy_(src), "cuda", timing)[0]
    result["copy_bandwidth_gbps"] = round(2 * src.numel() * 4 / (ms * 1e-3) / 1e9, 1)
    del src, dst
    size = 8192
    for precision in ("fp32", "tf32", "fp16", "bf16"):
        dtype = _set_precision_flags(torch, precision)
        a = torch.randn(size, size, dtype=dtype, device=device)
        b = torch.randn(size, size, dtype=dtype, device=device)
        ms = measure(lambda: a @ b, "cuda", timing)[0]
        result[f"matmul_{precision}_tflops"] = round(2 * size**3 / (ms * 1e-3) / 1e12, 1)
        del a, b
    _set_precision_flags(torch, "fp32")
    torch.cuda.empty_cache()
    return result


def worker_main(conn, device: str, gpu: str, timing: TimingSettings, faults: Mapping[str, list],
                describe: bool):
    """One process per device: receive a task, send back its rows; exit after a fatal CUDA error."""
    import torch

    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    torch.backends.cudnn.benchmark = True
    if device == "cpu":
        torch.set_num_threads(1)
    env = environment(device, timing)
    if describe:
        env["characterisation"] = characterise(device)
    conn.send(("ready", env))
    while True:
        task = conn.recv()
        if task is None:
            return
        results, fatal = run_task(task, device, timing, faults)
        conn.send(("done", _task_rows(task, gpu, results)))
        if fatal:
            os._exit(3)


# ------------------------------------------------------------------------------------------------ parent

class Worker:
    def __init__(self, ctx, device: str, sweep: Sweep, describe: bool):
        self.device, self.gpu = device, sweep.gpu
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=worker_main, args=(child, device, sweep.gpu, sweep.timing,
                                                          dict(sweep.fault_injection), describe), daemon=True)
        self.proc.start()
        child.close()
        self.task: Task | None = None
        self.started = time.monotonic()  # of start-up until ready, then of the current task
        self.ready = False

    def send(self, task: Task):
        self.task, self.started = task, time.monotonic()
        self.conn.send(task)

    def kill(self):
        self.proc.kill()
        self.proc.join(5)
        self.conn.close()

    def stop(self):
        try:
            self.conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        self.proc.join(10)
        if self.proc.is_alive():
            self.kill()


class ShardWriter:
    """Buffers rows in the parent and flushes them as atomically written shards."""

    def __init__(self, sweep: Sweep, run_id: str, metadata: dict):
        self.sweep, self.run_id, self.metadata = sweep, run_id, metadata
        self.rows: list[dict] = []
        self.seq = 0
        self.last = time.monotonic()
        self.files: list[Path] = []

    def add(self, rows: list[dict]):
        self.rows.extend(rows)
        if len(self.rows) >= self.sweep.shard_rows or time.monotonic() - self.last >= self.sweep.shard_seconds:
            self.flush()

    def flush(self):
        self.last = time.monotonic()
        if not self.rows:
            return
        frame = schema.make_rows(self.rows)
        name = f"part-{self.run_id}-{self.seq:05d}"
        self.files += schema.write_partition(frame, self.sweep.out, name, self.metadata)
        self.seq += 1
        self.rows = []


def run_sweep(sweep: Sweep) -> dict[str, Any]:
    """Run the sweep to completion (resuming any earlier one) and return its summary."""
    devices = resolve_devices(sweep.device)
    kind = "cuda" if devices[0].startswith("cuda") else "cpu"
    memory = min(device_memory_bytes(d) for d in devices)
    all_tasks = plan(sweep, kind, memory)
    done = completed(sweep.out, sweep.gpu)
    pending = deque(t for t in all_tasks if (t.op, t.config_id, t.precision) not in done)
    print(f"sweep {sweep.gpu}: {len(all_tasks)} tasks planned on {len(devices)} device(s) {devices}, "
          f"{len(all_tasks) - len(pending)} already measured, {len(pending)} to run", flush=True)
    run_id = f"{time.strftime('%Y%m%d%H%M%S')}-{uuid.uuid4().hex[:6]}"
    summary: dict[str, Any] = {"run_id": run_id, "gpu": sweep.gpu, "devices": devices, "planned": len(all_tasks),
                               "skipped_done": len(all_tasks) - len(pending), "status": Counter(),
                               "op_seconds": Counter(), "op_tasks": Counter()}
    if not pending:
        return _finish(summary, 0.0)
    ctx = mp.get_context("spawn")
    workers = [Worker(ctx, d, sweep, describe=True) for d in devices]
    envs: dict[str, dict] = {}
    writer: ShardWriter | None = None
    bar = _progress(len(pending), sweep.progress)
    start = time.monotonic()
    restarts = 0
    try:
        while pending or any(w.task for w in workers):
            if sweep.time_limit_s is not None and time.monotonic() - start > sweep.time_limit_s and pending:
                print(f"\ntime limit of {sweep.time_limit_s:g} s reached: {len(pending)} tasks left for a resumed "
                      "run", flush=True)
                summary["left"] = len(pending)
                pending.clear()
            for w in workers:
                if w.ready and w.task is None and pending and writer is not None:
                    w.send(pending.popleft())
            for conn in wait([w.conn for w in workers if w.task is not None or not w.ready], timeout=0.5):
                w = next(x for x in workers if x.conn is conn)
                try:
                    kind_msg, payload = conn.recv()
                except (EOFError, OSError):
                    _lost(w, summary, writer, bar, f"worker process died (exit code {w.proc.exitcode})", "error")
                    restarts = _restart(workers, w, ctx, sweep, restarts, envs)
                    continue
                if kind_msg == "ready":
                    w.ready = True
                    envs.setdefault(w.device, payload)
                    if writer is None:
                        writer = ShardWriter(sweep, run_id, _metadata(sweep, payload, run_id))
                else:
                    _record(w, payload, summary, writer, bar)
            now = time.monotonic()
            for w in workers:
                # start-up (import, characterisation) gets a longer limit than one task
                limit = sweep.timeout_s * (1 if w.ready else 5)
                if (w.task is not None or not w.ready) and now - w.started > limit:
                    _lost(w, summary, writer, bar, f"timeout: no result after {sweep.timeout_s:g} s", "timeout")
                    restarts = _restart(workers, w, ctx, sweep, restarts, envs)
            if writer is not None and writer.rows and now - writer.last >= sweep.shard_seconds:
                writer.flush()
    finally:
        if writer is not None:
            writer.flush()
        for w in workers:
            w.stop()
        bar.close()
    summary["environment"] = envs
    return _finish(summary, time.monotonic() - start)


def _metadata(sweep: Sweep, env: dict, run_id: str) -> dict:
    return {**env, "gpu_label": sweep.gpu, "sweep_seed": sweep.seed, "sweep_n": sweep.n, "run_id": run_id,
            "shard": sweep.shard, "num_shards": sweep.num_shards, "source": "own"}


def _record(w: Worker, rows: list[dict], summary: dict, writer: ShardWriter | None, bar):
    task, w.task = w.task, None
    summary["op_seconds"][task.op] += time.monotonic() - w.started
    summary["op_tasks"][task.op] += 1
    for row in rows:
        summary["status"][row["status"]] += 1
    if writer is not None:
        writer.add(rows)
    bar.update(1)
    bar.set_postfix(dict(summary["status"]), refresh=False)


def _lost(w: Worker, summary: dict, writer, bar, message: str, status: str):
    """Rows for the task a dead or hung worker held, so the sweep records it and moves on."""
    if w.task is None:
        return
    results = {phase: (status, None, message) for phase in schema.PHASES}
    _record(w, _task_rows(w.task, w.gpu, results), summary, writer, bar)


def _restart(workers: list[Worker], w: Worker, ctx, sweep: Sweep, restarts: int, envs: dict) -> int:
    w.kill()
    restarts += 1
    if restarts > 20 + len(workers) * 5:
        raise RuntimeError("workers keep dying; giving up (see the error rows written so far)")
    workers[workers.index(w)] = Worker(ctx, w.device, sweep, describe=w.device not in envs)
    return restarts


def _finish(summary: dict, seconds: float) -> dict:
    summary["seconds"] = round(seconds, 1)
    summary["status"] = dict(summary["status"])
    summary["configs_per_s"] = {op: round(n / s, 2) if s else None
                                for op, n, s in ((op, summary["op_tasks"][op], summary["op_seconds"][op])
                                                 for op in summary["op_tasks"])}
    summary["op_seconds"] = {k: round(v, 1) for k, v in summary["op_seconds"].items()}
    summary["op_tasks"] = dict(summary["op_tasks"])
    total = sum(summary["op_tasks"].values())
    summary["tasks_per_s_wall"] = round(total / seconds, 2) if seconds else None
    return summary


def _progress(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, unit="cfg", disable=not enabled, smoothing=0.05, mininterval=2.0)


def print_summary(summary: dict):
    print(f"\nsweep {summary['gpu']} run {summary['run_id']}: {summary['seconds']} s, "
          f"{summary.get('tasks_per_s_wall')} config-precisions/s overall")
    print(f"  rows by status: {summary['status']}")
    for op, rate in summary["configs_per_s"].items():
        print(f"  {op:7s} {summary['op_tasks'][op]:6d} config-precisions, {rate} /s per worker")


def write_run_summary(sweep: Sweep, summary: dict):
    """Keep the run's summary beside its data (a hidden sidecar, written atomically)."""
    if not summary.get("op_tasks"):
        return
    path = Path(sweep.out) / f"gpu={sweep.gpu}" / f"_run-{summary['run_id']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as fh:
        fh.write(json.dumps(summary, indent=1, sort_keys=True, default=str))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    schema.fsync_dir(path.parent)


def sweep_from_config(cfg) -> Sweep:
    from omegaconf import OmegaConf

    c = OmegaConf.to_container(cfg, resolve=True)
    if not c.get("gpu"):
        raise ValueError("gpu: a dataset label is required, e.g. gpu=h200")
    unknown = set(c["ops"]) - set(schema.OPS)
    if unknown:
        raise ValueError(f"ops: unknown {sorted(unknown)}; allowed: {', '.join(schema.OPS)}")
    return Sweep(gpu=str(c["gpu"]), device=str(c["device"]), ops=tuple(c["ops"]),
                 precisions=tuple(c["precisions"]) if c.get("precisions") else None, n=int(c["n"]),
                 seed=int(c["seed"]), out=str(c["out"]), spaces=c["space"], timing=TimingSettings(**c["timing"]),
                 timeout_s=float(c["timeout_s"]), shard_rows=int(c["shard_rows"]),
                 shard_seconds=float(c["shard_seconds"]), memory_fraction=float(c["memory_fraction"]),
                 shard=int(c["shard"]), num_shards=int(c["num_shards"]), progress=bool(c["progress"]),
                 time_limit_s=float(c["time_limit_s"]) if c.get("time_limit_s") else None,
                 fault_injection=c.get("fault_injection") or {})


def main():
    import hydra
    from hydra.utils import to_absolute_path

    @hydra.main(config_path="../conf", config_name="collect", version_base=None)
    def _app(cfg):
        sweep = sweep_from_config(cfg)
        sweep.out = to_absolute_path(sweep.out)
        summary = run_sweep(sweep)
        write_run_summary(sweep, summary)
        print_summary(summary)

    _app()


if __name__ == "__main__":
    main()
