"""Measure collectives with torch.distributed: one process per GPU, every GPU count and path the host offers.

For each path (``nvlink``/``pcie``: NCCL's default, labelled from ``nvidia-smi topo -m``; ``host``:
``NCCL_P2P_DISABLE=1``, the GPUs exchange data through host memory over PCIe) and each GPU count (powers of two up
to the host's count, and the count itself), ``n`` processes are spawned; ``NCCL_NVLS_ENABLE=0`` always (NVLink
multicast stays off). Each measures all_reduce, reduce_scatter and all_gather at every message size and dtype:

- a warm-up (2 calls), an estimate of one call, then ``reps`` timed groups of back-to-back calls (enough calls for
  ``group_ms`` per group, at most 64), each group between a device-wide sync of all ranks (a one-element
  all-reduce and a stream sync) and CUDA events on the rank's stream (wall clock on the CPU); time per call =
  group time / calls; reps = clamp(target_ms / group time, 5, 40);
- each rep's time is the slowest rank's (the collective ends when the last rank ends); the row holds the median
  and p20/p80 over reps.

Rank 0 writes ``<out>/gpu=<label>/<name>.parquet`` per (path, GPU count), atomically, through the collective
schema, with the topology, NCCL version and settings, and the timing method in the metadata. Out-of-memory and
library errors become ``oom``/``error`` rows; past the deadline the remaining configs are not run (the ranks agree
by a broadcast, so none waits for the others). On a machine without GPUs ``backend="gloo"`` and ``device="cpu"``
run the same code on CPU tensors (tests).
"""

from __future__ import annotations

import datetime as _dt
import math
import re
import subprocess
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

from pipeline.collectives import schema as cschema
from pipeline.distributed import NCCL_ENV, agree_stop, free_port, path_env, slowest_rank, spawn, spread

__all__ = ["MEASURED_COLLECTIVES", "MEASURED_DTYPES", "DEFAULT_SIZES", "NCCL_ENV", "TIMING_METHOD", "gpu_counts",
           "detect_default_path", "topology", "run_sweep", "parse_size"]

MEASURED_COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")
MEASURED_DTYPES = ("fp32", "bf16")
DEFAULT_SIZES = tuple(4096 * 4 ** i for i in range(10)) + (2 * 2 ** 30,)
"""4 KiB to 1 GiB by factors of 4, and 2 GiB."""
TIMING_METHOD = ("GPU time per call: CUDA events around groups of back-to-back calls on each rank's stream after a "
                 "sync of all ranks (group >= {group_ms} ms, at most 64 calls), 2 warm-up calls; reps = clamp("
                 "{target_ms} ms / group time, 5, 40); per rep the slowest rank; median, p20, p80 over reps. CPU "
                 "(gloo): wall clock instead of events.")
_SIZE = re.compile(r"^(\d+)\s*([kmg]?)i?b?$", re.I)


def parse_size(text: str) -> int:
    """'4K', '16MiB', '2G', '4096' -> bytes (powers of 1024)."""
    match = _SIZE.match(str(text).strip())
    if not match:
        raise ValueError(f"sizes: {text!r} is not a size like 4096, 4K, 16M or 2G")
    return int(match.group(1)) * 1024 ** " kmg".index(match.group(2).lower() or " ")


def gpu_counts(available: int) -> list[int]:
    """GPU counts to measure: 2, 4, 8, ... up to ``available``, and ``available`` itself."""
    counts = [2 ** i for i in range(1, int(math.log2(max(available, 1))) + 1)]
    return sorted(set(counts + ([available] if available >= 2 else [])))


def topology() -> str:
    """``nvidia-smi topo -m`` (empty where nvidia-smi is missing)."""
    try:
        return subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def detect_default_path(topo: str) -> str:
    """``nvlink`` where the topology links GPU0 and GPU1 by NV#, else ``pcie``."""
    for line in topo.splitlines():
        cells = re.sub(r"\x1b\[[0-9;]*m", "", line).split()
        if len(cells) > 2 and cells[0] == "GPU0" and cells[1] == "X":  # GPU0's row (the header also starts GPU0)
            return "nvlink" if cells[2].startswith("NV") else "pcie"
    return "pcie"


# --------------------------------------------------------------------------------------------- in a rank

class _Rank:
    """One process's view: its device, the calls, the timer, and the sync of all ranks."""

    def __init__(self, rank: int, world: int, device: str):
        import torch
        import torch.distributed as dist
        self.torch, self.dist, self.rank, self.world = torch, dist, rank, world
        self.cuda = device == "cuda"
        self.device = torch.device("cuda", rank) if self.cuda else torch.device("cpu")
        self.flag = torch.zeros(1, device=self.device)

    def sync(self) -> None:
        self.dist.all_reduce(self.flag)
        if self.cuda:
            self.torch.cuda.synchronize(self.device)

    def call(self, collective: str, nbytes: int, dtype: str):
        """A zero-argument function running the collective on fresh buffers, and the bytes it moves."""
        torch, dist = self.torch, self.dist
        dt = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
        elems = nbytes // cschema.DTYPE_BYTES[dtype]
        if collective != "all_reduce":
            elems -= elems % self.world
        big = torch.ones(elems, dtype=dt, device=self.device)
        if collective == "all_reduce":
            fn = lambda: dist.all_reduce(big)  # noqa: E731
        else:
            small = torch.ones(elems // self.world, dtype=dt, device=self.device)
            fn = ((lambda: dist.reduce_scatter_tensor(small, big)) if collective == "reduce_scatter"
                  else (lambda: dist.all_gather_into_tensor(big, small)))
        return fn, elems * cschema.DTYPE_BYTES[dtype]

    def time_group(self, fn, calls: int) -> float:
        """ms per call of ``calls`` back-to-back calls, after a sync of all ranks."""
        self.sync()
        if self.cuda:
            start, end = self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / calls
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        return (time.perf_counter() - t0) * 1e3 / calls

    def measure(self, fn, group_ms: float, target_ms: float) -> tuple[float, float, float, int]:
        for _ in range(2):
            fn()
        # the slowest rank's estimate: every rank runs the same number of calls
        estimate = float(slowest_rank([max(self.time_group(fn, 1), 1e-3)], self.device)[0])
        calls = int(min(64, max(1, math.ceil(group_ms / estimate))))
        reps = int(min(40, max(5, round(target_ms / (estimate * calls)))))
        return (*spread(slowest_rank([self.time_group(fn, calls) for _ in range(reps)], self.device)), reps)


def _plan(cfg: dict) -> list[tuple[str, str, int]]:
    return [(c, d, s) for d in cfg["dtypes"] for c in cfg["collectives"] for s in cfg["sizes"]]


def _run_one(rank_: _Rank, collective: str, dtype: str, nbytes: int, cfg: dict) -> dict:
    row = {"gpu": cfg["gpu"], "source": cfg["source"], "collective": collective, "n_gpus": rank_.world, "nodes": 1,
           "bytes": nbytes, "dtype": dtype, "interconnect": cfg["path"]}
    try:
        fn, row["bytes"] = rank_.call(collective, nbytes, dtype)
        median, p20, p80, reps = rank_.measure(fn, cfg["group_ms"], cfg["target_ms"])
        row.update(time_ms=median, time_p20_ms=p20, time_p80_ms=p80, reps=reps, status="ok")
    except Exception as exc:  # noqa: BLE001 - one failing size is a row, not a lost sweep
        oom = "out of memory" in str(exc).lower()
        row.update(status="oom" if oom else "error", error=f"{type(exc).__name__}: {str(exc)[:200]}", reps=0)
        if rank_.cuda:
            rank_.torch.cuda.empty_cache()
    return row


def _measure_group(rank: int, world: int, cfg: dict) -> None:
    """One rank of one (path, GPU count) group, inside its process group (``pipeline.distributed.spawn``): measure
    the plan, rank 0 writes the rows."""
    warnings.filterwarnings("ignore", category=FutureWarning)  # reduce_scatter_tensor: renamed in newer torch
    rank_, rows, plan = _Rank(rank, world, cfg["device"]), [], _plan(cfg)
    for collective, dtype, nbytes in plan:
        if agree_stop(time.time() > cfg["deadline"], rank_.device):
            break
        rows.append(_run_one(rank_, collective, dtype, nbytes, cfg))
    if rank == 0 and rows:
        meta = dict(cfg["metadata"], written=_dt.datetime.now().isoformat(timespec="seconds"),
                    planned=len(plan), measured=len(rows))
        cschema.write_table(cschema.make_rows(rows), cfg["out"], cfg["name"], meta)


# ------------------------------------------------------------------------------------------- the sweep

def _host_metadata(backend: str, device: str, topo: str) -> dict:
    """The metadata every (path, GPU count) group of a sweep shares: backend, versions, devices, topology."""
    import torch
    meta = {"source": "pipeline.collectives.collect", "backend": backend, "device": device,
            "torch": torch.__version__, "topology": topo}
    if device == "cuda":
        meta["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
        meta["device_names"] = sorted({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())})
        meta["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                        capture_output=True, text=True).stdout.strip().splitlines()[:1]
    return meta


def run_sweep(out, gpu: str, *, paths: Sequence[str] = ("auto", "host"), counts: Sequence[int] | None = None,
              sizes: Sequence[int] = DEFAULT_SIZES, dtypes: Sequence[str] = MEASURED_DTYPES,
              collectives: Sequence[str] = MEASURED_COLLECTIVES, time_limit_s: float = 300.0,
              backend: str = "nccl", device: str = "cuda", group_ms: float = 1.0, target_ms: float = 50.0,
              name: str | None = None, log=print) -> list[Path]:
    """Measure every (path, GPU count) group in turn, each within its share of ``time_limit_s``; returns the files.

    ``paths``: ``auto`` (NCCL's default path, labelled ``nvlink`` or ``pcie`` from the topology) and/or ``host``
    (peer-to-peer disabled). ``counts``: default every power of two up to the visible GPUs and their count."""
    bad = [p for p in paths if p not in ("auto", *cschema.INTERCONNECTS)]
    if bad:
        raise ValueError(f"paths: {bad} not among auto, {', '.join(cschema.INTERCONNECTS)}")
    if device == "cuda":
        import torch
        available = torch.cuda.device_count()
    else:
        available = max(counts or [2])
    counts = list(counts or gpu_counts(available))
    if not counts or min(counts) < 2 or max(counts) > available:
        raise ValueError(f"counts: {counts} must be >= 2 and at most the {available} devices available")
    topo = topology() if device == "cuda" else ""
    groups = [(detect_default_path(topo) if p == "auto" else p, n) for p in paths for n in counts]
    stamp = name or _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    end, written = time.time() + time_limit_s, []
    host = _host_metadata(backend, device, topo) if groups else {}  # the same for every group: queried once
    for i, (path, n) in enumerate(groups):
        share = (end - time.time()) / (len(groups) - i)
        env = path_env(path)
        cfg = {"gpu": gpu, "source": "pipeline.collectives", "path": path, "env": env, "backend": backend,
               "device": device, "port": free_port(), "deadline": time.time() + max(share, 0.0),
               "sizes": list(sizes), "dtypes": list(dtypes), "collectives": list(collectives),
               "group_ms": group_ms, "target_ms": target_ms, "out": str(out), "name": f"{stamp}-{path}-n{n}",
               "metadata": dict(host, path=path, env=env)}
        cfg["metadata"]["timing_method"] = TIMING_METHOD.format(group_ms=group_ms, target_ms=target_ms)
        started = time.time()
        spawn(_measure_group, n, cfg)
        path_file = Path(out) / f"gpu={gpu}" / f"{cfg['name']}.parquet"
        if path_file.exists():
            written.append(path_file)
        log(f"collectives {path} x{n}: {time.time() - started:.1f} s -> {path_file if path_file.exists() else '-'}")
    return written
