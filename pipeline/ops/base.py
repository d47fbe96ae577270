"""The interface every op module implements, and the seeded sampler they share.

An op spec knows its config space (wide random ranges plus layer shapes of real models), how to build
inputs and a callable on a device and dtype, and its forward FLOPs and memory footprint (to filter configs
that cannot fit or would take too long before running them).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, Callable, Mapping

import numpy as np

from pipeline.schema import OP_CONFIG_COLUMNS, config_id

Config = dict[str, Any]


def log_int(rng: np.random.Generator, lo: int, hi: int) -> int:
    """An integer log-uniformly distributed over [lo, hi]."""
    return int(min(hi, max(lo, math.floor(math.exp(rng.uniform(math.log(lo), math.log(hi + 1)))))))


def choice(rng: np.random.Generator, options, weights=None):
    """One of ``options`` (a Python value, not a numpy scalar), optionally weighted."""
    p = None if weights is None else np.asarray(weights, float) / float(np.sum(weights))
    return options[int(rng.choice(len(options), p=p))]


class OpSpec(ABC):
    name: str

    @property
    def columns(self) -> tuple[str, ...]:
        return OP_CONFIG_COLUMNS[self.name]

    @abstractmethod
    def sample_random(self, rng: np.random.Generator, space: Mapping) -> Config | None:
        """A config from the wide ranges of ``space`` (None if the draw is invalid)."""

    @abstractmethod
    def real_shapes(self, space: Mapping) -> list[Config]:
        """Layer shapes of real models at typical batch sizes."""

    @abstractmethod
    def flops(self, cfg: Config) -> float:
        """Forward FLOPs (multiply-add = 2)."""

    @abstractmethod
    def memory_elems(self, cfg: Config) -> float:
        """Elements held for a forward+backward measurement (inputs, weights, outputs, gradients)."""

    @abstractmethod
    def build(self, cfg: Config, device: str, dtype) -> tuple[Callable, list, list]:
        """(fn, inputs, params): ``fn(*inputs)`` runs the op; inputs and params require grad."""

    def valid(self, cfg: Config) -> bool:
        return True


def sample_configs(spec: OpSpec, space: Mapping, n: int, seed: int) -> list[Config]:
    """``n`` configs, seeded and prefix-stable: config i depends only on (seed, op, i), so every GPU and
    every run with the same seed measures the same configs, and a smaller ``n`` gives a prefix.

    A draw is a real model's layer with probability ``space.real_fraction``, otherwise a point of the wide
    ranges; draws that are invalid or exceed ``space.max_flops`` are redrawn from the same stream.
    """
    real = spec.real_shapes(space)
    op_index = list(OP_CONFIG_COLUMNS).index(spec.name)
    max_flops = float(space.get("max_flops", math.inf))
    configs: list[Config] = []
    seen: set[str] = set()
    i = 0
    while len(configs) < n:
        rng = np.random.default_rng([int(seed), op_index, i])
        i += 1
        for _ in range(100):
            if real and rng.uniform() < float(space.get("real_fraction", 0.0)):
                cfg = dict(real[int(rng.integers(len(real)))])
            else:
                cfg = spec.sample_random(rng, space)
            if cfg is not None and spec.valid(cfg) and spec.flops(cfg) <= max_flops:
                break
        else:
            continue
        cid = config_id(spec.name, cfg)
        if cid in seen:
            continue
        seen.add(cid)
        configs.append({c: cfg[c] for c in spec.columns})
        if i > 50 * n + 1000:
            raise RuntimeError(f"{spec.name}: could not draw {n} distinct valid configs from the space")
    return configs
