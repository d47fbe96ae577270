"""Measure data-parallel (DDP) training steps of the built-in models: one process per GPU (gloo on the CPU).

``measure_ddp(cases, world, ...)`` spawns ``world`` processes; each builds every case's model wrapped in
``DistributedDataParallel`` (``pipeline.step.models.make_step(..., wrap=...)``), runs ``warmup`` steps (DDP rebuilds
its buckets in gradient-ready order after the first), then times ``steps`` steps (CUDA events around each step,
wall clock on the CPU). A step's time is the slowest rank's; the result holds the median and p20/p80 and DDP's own
bucket sizes after the rebuild (``rebuilt_bucket_sizes`` of its logging data), to check ``ddp_buckets`` against.
``NCCL_NVLS_ENABLE=0`` always; ``path="host"`` adds ``NCCL_P2P_DISABLE=1``. Ranks agree on a deadline by a
broadcast, so a time-boxed run stops cleanly between cases.
"""

from __future__ import annotations

import json
import time

from pipeline.atomic import atomic_write
from pipeline.distributed import agree_stop, free_port, path_env, slowest_rank, spawn, spread

__all__ = ["measure_ddp"]


def _rank_cases(rank: int, world: int, cfg: dict) -> list[dict]:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from pipeline.step import models

    cuda = cfg["device"] == "cuda"
    device = f"cuda:{rank}" if cuda else "cpu"
    results = []
    for case in cfg["cases"]:
        if agree_stop(time.time() > cfg["deadline"], device):
            break
        torch.manual_seed(rank)
        wrap = (lambda m: DDP(m, device_ids=[rank])) if cuda else (lambda m: DDP(m))
        step = models.make_step(case["model"], case["batch"], case["precision"], device, tiny=cfg["tiny"],
                                wrap=wrap, **case.get("config", {}))
        for _ in range(cfg["warmup"]):
            step()
        times = []
        for _ in range(cfg["steps"]):
            if cuda:
                torch.cuda.synchronize(device)
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                step()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                step()
                times.append((time.perf_counter() - t0) * 1e3)
        median, p20, p80 = spread(slowest_rank(times, device))
        logging = step.modules[0]._get_ddp_logging_data()
        results.append({**case, "world": world, "path": cfg["path"], "step_ms": median, "step_p20_ms": p20,
                        "step_p80_ms": p80, "steps": len(times),
                        "rebuilt_bucket_sizes": [int(v) for v in
                                                 str(logging.get("rebuilt_bucket_sizes", "")).split(",") if v.strip()],
                        "bucket_cap_bytes": int(logging.get("bucket_cap_bytes", 0))})
        del step
        if cuda:
            torch.cuda.empty_cache()
    return results


def _measure_rank(rank: int, world: int, cfg: dict) -> None:
    """One rank, inside its process group (``pipeline.distributed.spawn``): rank 0 writes the results."""
    results = _rank_cases(rank, world, cfg)
    if rank == 0:
        atomic_write(cfg["result"], json.dumps(results, indent=1))


def measure_ddp(cases: list[dict], world: int, result_path, *, path: str = "nvlink", device: str = "cuda",
                backend: str = "nccl", warmup: int = 5, steps: int = 15, time_limit_s: float = 120.0,
                tiny: bool = False) -> list[dict]:
    """Measure each case (``{"model", "batch", "precision"[, "config"]}``) as a DDP step on ``world`` processes;
    returns (and writes to ``result_path``, as JSON) one dict per case measured within ``time_limit_s``."""
    if world < 1 or warmup < 2 or steps < 1:
        raise ValueError(f"world >= 1, warmup >= 2 (DDP rebuilds its buckets after the first step) and steps >= 1, "
                         f"got {world}, {warmup}, {steps}")
    cfg = {"cases": list(cases), "device": device, "backend": backend, "warmup": warmup, "steps": steps,
           "tiny": tiny, "path": path, "env": path_env(path), "port": free_port(),
           "deadline": time.time() + time_limit_s, "result": str(result_path)}
    spawn(_measure_rank, world, cfg)
    return json.loads(open(result_path).read())
