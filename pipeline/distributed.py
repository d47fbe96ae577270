"""The process-group scaffolding that the collective sweep and the DDP step measurement share.

Both spawn one process per GPU (gloo on the CPU) over a local TCP rendezvous with the same NCCL settings, let
rank 0 decide when a time-boxed run stops, and take each timed repetition as the slowest rank's: one copy keeps
the two measurements comparable. Importing this module does not import torch, so ``NCCL_ENV`` can be applied
before torch loads.
"""

from __future__ import annotations

import os
import socket

import numpy as np

__all__ = ["NCCL_ENV", "PATH_ENV", "path_env", "free_port", "spawn", "agree_stop", "slowest_rank", "spread"]

NCCL_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
"""Set for every path: NVLink multicast off."""
PATH_ENV = {"host": {"NCCL_P2P_DISABLE": "1"}}


def path_env(path: str) -> dict:
    """The environment of a run over ``path``: ``NCCL_ENV`` and the path's own settings."""
    return {**NCCL_ENV, **PATH_ENV.get(path, {})}


def free_port() -> int:
    """A free local port for the rendezvous, so concurrent runs do not collide."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, world: int, body, cfg: dict) -> None:
    os.environ.update(cfg["env"])
    import torch
    import torch.distributed as dist

    if cfg["device"] == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(cfg["backend"], init_method=f"tcp://127.0.0.1:{cfg['port']}", rank=rank,
                            world_size=world)
    try:
        body(rank, world, cfg)
    finally:
        dist.destroy_process_group()


def spawn(body, world: int, cfg: dict) -> None:
    """Run ``body(rank, world, cfg)`` (a module-level function) in ``world`` processes, each in the process group
    that ``cfg`` describes (``env``, ``device``, ``backend``, ``port``); the group is torn down even on errors."""
    import torch.multiprocessing as mp

    mp.spawn(_rank_main, args=(world, body, cfg), nprocs=world, join=True)


def agree_stop(stop: bool, device) -> bool:
    """Rank 0's decision, broadcast to all, so that no rank waits in a collective the others skipped."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1.0 if stop else 0.0], device=device)
    dist.broadcast(flag, 0)
    return bool(flag.item())


def slowest_rank(times: list[float], device) -> np.ndarray:
    """Each entry's maximum over the ranks: a collective or a data-parallel step ends when its last rank ends."""
    import torch
    import torch.distributed as dist

    values = torch.tensor(times, device=device)
    dist.all_reduce(values, op=dist.ReduceOp.MAX)
    return values.cpu().numpy()


def spread(values: np.ndarray) -> tuple[float, float, float]:
    """Median, p20 and p80: the centre and a spread that one outlier repetition does not move."""
    return float(np.median(values)), float(np.percentile(values, 20)), float(np.percentile(values, 80))
