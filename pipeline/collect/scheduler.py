"""The parent process of a sweep: plans, hands one task at a time to one worker per device, watches them,
and is the only writer (rows are flushed in shards written atomically).

A worker that hangs past ``timeout_s`` is killed (its task becomes ``timeout`` rows) and restarted; OOM and
library errors become ``oom``/``error`` rows; a resumed sweep skips the tasks already in the dataset.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import signal
import threading
import time
import uuid
from collections import Counter, deque
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any

from pipeline import schema
from pipeline.atomic import atomic_write
from pipeline.collect.plan import (
    Sweep,
    Task,
    check_label,
    completed,
    device_memory_bytes,
    device_names,
    plan,
    resolve_devices,
)
from pipeline.collect.worker import SCREEN_KEY, explicit_backward_in, task_phases, task_rows, worker_main

WORKER_STOP_S = 10.0   # how long a finished sweep waits for its workers to exit before killing them


class Worker:
    def __init__(self, ctx, device: str, sweep: Sweep, describe: bool):
        self.device, self.gpu = device, sweep.gpu
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=worker_main, args=(child, device, sweep.gpu, sweep.timing,
                                                          dict(sweep.fault_injection), describe,
                                                          sweep.sm_partition, sweep.cudnn_benchmark_limit,
                                                          sweep.partition_backward, sweep.screen_ms),
                                daemon=True)
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

    def ask_to_stop(self):
        with contextlib.suppress(BrokenPipeError, OSError):
            self.conn.send(None)

    def stop_by(self, deadline: float):
        """Wait for the asked worker until ``deadline`` (monotonic), then kill it."""
        self.proc.join(max(0.0, deadline - time.monotonic()))
        if self.proc.is_alive():
            self.kill()


class ShardWriter:
    """Buffers rows in the parent and flushes them as atomically written shards."""

    def __init__(self, sweep: Sweep, run_id: str, metadata: dict, on_flush=None):
        self.sweep, self.run_id, self.metadata, self.on_flush = sweep, run_id, metadata, on_flush
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
        if self.on_flush is not None:
            self.on_flush()


def run_sweep(sweep: Sweep) -> dict[str, Any]:
    """Run the sweep to completion (resuming any earlier one) and return its summary.

    ``sweep.time_limit_s`` counts from this call, so reading the dataset and planning (which grow with the dataset)
    come out of the same time box as the measurements."""
    began = time.monotonic()
    devices = resolve_devices(sweep.device)
    kind = "cuda" if devices[0].startswith("cuda") else "cpu"
    check_label(sweep.gpu, device_names(devices), sweep.sm_partition)
    done = completed(sweep.out, sweep.gpu)
    failed = {key for key, ok in done.items() if not ok}
    print(f"sweep {sweep.gpu}: drawing the configs of {', '.join(sweep.ops)}", flush=True)
    all_tasks = plan(sweep, kind, min(device_memory_bytes(d) for d in devices), failed)
    pending = deque(t for t in all_tasks if (t.op, t.config_id, t.precision) not in done)
    lost = sum((t.op, t.config_id, t.precision) in failed for t in all_tasks)
    print(f"sweep {sweep.gpu}: {len(all_tasks)} tasks planned on {len(devices)} device(s) {devices}, "
          f"{len(all_tasks) - len(pending)} already measured ({lost} without a result"
          f"{', each replaced by a further config' if sweep.replace_failed else ''}), {len(pending)} to run "
          f"(planned in {time.monotonic() - began:.0f} s)",
          flush=True)
    run_id = f"{time.strftime('%Y%m%d%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:6]}"   # UTC start
    summary: dict[str, Any] = {"run_id": run_id, "gpu": sweep.gpu, "devices": devices, "planned": len(all_tasks),
                               "replace_failed": sweep.replace_failed,
                               "skipped_done": len(all_tasks) - len(pending), "status": Counter(),
                               "op_seconds": Counter(), "op_tasks": Counter(), "op_time_split": {}}
    if not pending:
        return _finish(summary, 0.0)
    start = time.monotonic()
    summary["planning_s"] = round(start - began, 2)
    if sweep.time_limit_s is not None and start - began > sweep.time_limit_s:   # spent on planning: no workers
        print(f"\ntime limit of {sweep.time_limit_s:g} s reached while planning: {len(pending)} tasks left for a "
              "resumed run", flush=True)
        return _finish({**summary, "left": len(pending), "limit_reached_s": round(start - began, 2)}, 0.0)
    run = _Run(sweep, devices, pending, summary, start, began)
    try:
        run.loop()
    finally:
        with _interrupts_deferred():   # a second Ctrl-C or SIGINT (timeout's, to the group) must not cut the flush
            run.close()
    summary["environment"] = run.envs
    return {**_finish(summary, time.monotonic() - start), "complete": True}


class _Run:
    """The state of one sweep in the parent: workers, queue, writer, progress."""

    def __init__(self, sweep: Sweep, devices: list[str], pending: deque, summary: dict, start: float, began: float):
        self.sweep, self.pending, self.summary, self.start, self.began = sweep, pending, summary, start, began
        self.ctx = mp.get_context("spawn")
        self.workers = [Worker(self.ctx, d, sweep, describe=True) for d in devices]
        self.envs: dict[str, dict] = {}
        self.writer: ShardWriter | None = None
        self.bar = _progress(len(pending), sweep.progress)
        self.restarts = 0

    def loop(self) -> None:
        sweep = self.sweep
        while self.pending or any(w.task for w in self.workers):
            if sweep.time_limit_s is not None and time.monotonic() - self.began > sweep.time_limit_s and self.pending:
                self.summary["limit_reached_s"] = round(time.monotonic() - self.began, 2)
                print(f"\ntime limit of {sweep.time_limit_s:g} s reached: {len(self.pending)} tasks left for a "
                      "resumed run", flush=True)
                self.summary["left"] = len(self.pending)
                self.pending.clear()
            for w in self.workers:
                if w.ready and w.task is None and self.pending and self.writer is not None:
                    w.send(self.pending.popleft())
            busy = [w.conn for w in self.workers if w.task is not None or not w.ready]
            for conn in wait(busy, timeout=0.5):
                self._receive(next(x for x in self.workers if x.conn is conn))
            self._watch()

    def _receive(self, w: Worker) -> None:
        try:
            kind, *payload = w.conn.recv()
        except (EOFError, OSError):
            self._lost(w, f"worker process died (exit code {w.proc.exitcode})", "error")
            return
        if kind == "ready":
            w.ready = True
            self.envs.setdefault(w.device, payload[0])
            if self.writer is None:
                self.writer = ShardWriter(self.sweep, self.summary["run_id"],
                                          _metadata(self.sweep, payload[0], self.summary["run_id"]),
                                          on_flush=self._save_summary)
        else:
            self._record(w, payload[0], payload[1] if len(payload) > 1 else None)

    def _watch(self) -> None:
        """Kill and restart workers past their time limit; flush rows that waited too long."""
        now = time.monotonic()
        for w in list(self.workers):
            limit = self.sweep.timeout_s * (1 if w.ready else 5)  # start-up (imports, characterisation) is longer
            if (w.task is not None or not w.ready) and now - w.started > limit:
                self._lost(w, f"timeout: no result after {self.sweep.timeout_s:g} s", "timeout")
        if self.writer is not None and self.writer.rows and now - self.writer.last >= self.sweep.shard_seconds:
            self.writer.flush()

    def _record(self, w: Worker, rows: list[dict], seconds: dict | None = None) -> None:
        task, w.task = w.task, None
        self.summary["op_seconds"][task.op] += time.monotonic() - w.started
        for part, value in (seconds or {}).items():
            self.summary["op_time_split"].setdefault(task.op, Counter())[part] += value
        self.summary["op_tasks"][task.op] += 1
        for row in rows:
            self.summary["status"][row["status"]] += 1
        if self.writer is not None:
            self.writer.add(rows)
        self.bar.update(1)
        self.bar.set_postfix(dict(self.summary["status"]), refresh=False)

    def _save_summary(self) -> None:
        """The summary so far beside the rows just flushed, so a sweep killed later keeps its throughput."""
        partial = _finish({**self.summary, "environment": self.envs}, time.monotonic() - self.start)
        write_run_summary(self.sweep, {**partial, "complete": False})

    def _lost(self, w: Worker, message: str, status: str) -> None:
        """Rows for the task a dead or hung worker held (so the sweep records it), then a fresh worker."""
        if w.task is not None:
            phases = task_phases(self.sweep.sm_partition, self.sweep.partition_backward)
            self._record(w, task_rows(w.task, w.gpu, dict.fromkeys(phases, (status, None, message))))
        w.kill()
        self.restarts += 1
        if self.restarts > 20 + len(self.workers) * 5:
            raise RuntimeError("workers keep dying; giving up (see the error rows written so far)")
        self.workers[self.workers.index(w)] = Worker(self.ctx, w.device, self.sweep,
                                                     describe=w.device not in self.envs)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.flush()
        for w in self.workers:   # all asked first, so that workers busy in a long call cost 10 s, not 10 s each
            w.ask_to_stop()
        deadline = time.monotonic() + WORKER_STOP_S
        for w in self.workers:
            w.stop_by(deadline)
        self.bar.close()


@contextlib.contextmanager
def _interrupts_deferred():
    """SIGINT ignored inside (main thread only: elsewhere Python delivers none), the earlier handler after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _metadata(sweep: Sweep, env: dict, run_id: str) -> dict:
    return {**env, "gpu_label": sweep.gpu, "sweep_seed": sweep.seed, "sweep_n": sweep.n, "run_id": run_id,
            "shard": sweep.shard, "num_shards": sweep.num_shards, "source": "own",
            "sm_partition": sweep.sm_partition, "max_estimated_ms": sweep.max_estimated_ms,
            "cudnn_benchmark_limit": sweep.cudnn_benchmark_limit, "screen_ms": sweep.screen_ms,
            "replace_failed": sweep.replace_failed,
            "screen_key": SCREEN_KEY if sweep.screen_ms is not None else None,
            "backward": ("explicit ATen ops" if explicit_backward_in(sweep.sm_partition, sweep.partition_backward)
                         else "torch.autograd.grad")}


def _finish(summary: dict, seconds: float) -> dict:
    """A finished copy of ``summary`` (rates, plain dicts); ``summary`` itself keeps counting."""
    summary = dict(summary)
    summary["seconds"] = round(seconds, 1)
    summary["status"] = dict(summary["status"])
    summary["configs_per_s"] = {op: round(n / s, 2) if s else None
                                for op, n, s in ((op, summary["op_tasks"][op], summary["op_seconds"][op])
                                                 for op in summary["op_tasks"])}
    summary["op_seconds"] = {k: round(v, 1) for k, v in summary["op_seconds"].items()}
    summary["op_tasks"] = dict(summary["op_tasks"])
    summary["op_time_split"] = {op: {k: round(v, 1) for k, v in split.items()}
                                for op, split in summary.get("op_time_split", {}).items()}
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
        split = summary.get("op_time_split", {}).get(op, {})
        detail = ", ".join(f"{k} {v:g}" for k, v in split.items())
        print(f"  {op:7s} {summary['op_tasks'][op]:6d} config-precisions, {rate} /s per worker ({detail})")


def write_run_summary(sweep: Sweep, summary: dict):
    """Keep the run's summary beside its data (a hidden sidecar, written atomically)."""
    if not summary.get("op_tasks"):
        return
    path = Path(sweep.out) / f"gpu={sweep.gpu}" / f"_run-{summary['run_id']}.json"
    atomic_write(path, json.dumps(summary, indent=1, sort_keys=True, default=str))
