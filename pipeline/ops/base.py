"""The interface every op module implements, and the seeded sampler they share.

An op spec knows its config space (wide random ranges plus layer shapes of real models), how to build
inputs and a callable on a device and dtype, and its forward FLOPs and memory footprint (to filter configs
that cannot fit or would take too long before running them).
"""

from __future__ import annotations

import bisect
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from pipeline import physics
from pipeline.schema import OP_CONFIG_COLUMNS, PRECISIONS, config_id

Config = dict[str, Any]
PRECISION_INDEX = {p: i for i, p in enumerate(PRECISIONS)}
NOMINAL_EFFICIENCY = 0.75   # share of the datasheet roofline a large kernel sustains (for estimates only)
LATENCY_MS = 0.003          # a kernel's fixed cost on the GPU (for estimates only)
DRAWS_PER_CONFIG = 400      # rejection-sampling attempts per config before the index is skipped
MAX_MISSES = 1000           # failed draws tolerated (plus 20 per config asked for)
BAND_PATIENCE = 10          # a time band whose draws fail this many times in a row is left out


def log_int(rng: np.random.Generator, lo: int, hi: int) -> int:
    """An integer log-uniformly distributed over [lo, hi]."""
    return int(min(hi, max(lo, math.floor(math.exp(rng.uniform(math.log(lo), math.log(hi + 1)))))))


_CDFS: dict[tuple, list[float]] = {}


def choice(rng: np.random.Generator, options, weights=None):
    """One of ``options`` (a Python value, not a numpy scalar), optionally weighted: the draw of
    ``rng.choice(len(options), p=weights / sum(weights))`` (one ``integers`` or one ``random`` call, the same
    cumulative-weight lookup), with the cumulative weights kept, since planning a sweep draws hundreds of
    thousands of times from a few fixed menus."""
    if weights is None:
        return options[int(rng.integers(0, len(options)))]
    key = tuple(weights)
    cdf = _CDFS.get(key)
    if cdf is None:
        if not all(w >= 0 for w in key) or not sum(key) > 0:
            raise ValueError(f"weights: {list(key)} must be non-negative with a positive sum")
        c = (np.asarray(weights, float) / float(np.sum(weights))).cumsum()
        cdf = _CDFS[key] = (c / c[-1]).tolist()
    if len(cdf) != len(options):
        raise ValueError(f"weights: {len(cdf)} weights for {len(options)} options")
    return options[bisect.bisect_right(cdf, rng.random())]


class OpSpec(ABC):
    name: str

    @property
    def columns(self) -> tuple[str, ...]:
        return OP_CONFIG_COLUMNS[self.name]

    @abstractmethod
    def sample_random(self, rng: np.random.Generator, space: Mapping) -> Config | None:
        """A config from the wide ranges of ``space`` (None if the draw is invalid)."""

    @abstractmethod
    def real_shapes(self, catalog: Mapping, space: Mapping) -> list[Config]:
        """Layer shapes of real models (``conf/catalog/<op>.yaml``) that fit the limits of ``space``."""

    def flops(self, cfg: Config) -> float:
        """Forward FLOPs (``pipeline.physics``: GEMM work, multiply-add = 2)."""
        return physics.flops(self.name, cfg)

    def memory_elems(self, cfg: Config) -> float:
        """Elements held for a forward+backward measurement (inputs, weights, outputs, gradients)."""
        return physics.footprint_elements(self.name, cfg)

    @abstractmethod
    def build(self, cfg: Config, device: str, dtype) -> tuple[Callable, list, list]:
        """(fn, inputs, params): ``fn(*inputs)`` runs the op; inputs and params require grad."""

    def valid(self, cfg: Config) -> bool:
        return True

    def explicit_backward(self, cfg: Config, fn, inputs: list, grad_out) -> Callable | None:
        """A callable that computes the gradients with the same ATen ops autograd would call, on the calling
        thread (autograd runs CUDA backward ops on threads of its own, which an SM partition does not reach);
        None where the op has none."""
        return None

    def sequential_steps(self, cfg: Config) -> int:
        """Kernels that must run one after another (an LSTM's time steps x layers): each costs latency."""
        return 1


def square_ish(rng: np.random.Generator, lo: int, hi: int, count: int, align: int = 1) -> list[int]:
    """``count`` dims around one log-uniform base size (each within a factor 2 of it, rounded to a multiple of
    ``align``): the large, balanced GEMMs that run near peak, which independent log-uniform dims rarely draw."""
    base = math.exp(rng.uniform(math.log(lo), math.log(hi)))
    dims = (base * 2.0 ** rng.uniform(-1, 1) for _ in range(count))
    return [int(min(hi // align * align, max(align, round(d / align) * align))) for d in dims]


def estimate_ms(spec: OpSpec, cfg: Config, precision: str, device: Mapping,
                view: physics.Work | None = None) -> float:
    """A rough forward GPU time on ``device`` (a registry spec): the roofline at its datasheet rates over a
    nominal efficiency, plus a few microseconds of latency per sequential kernel. Used to stratify and cap
    sweeps, not to predict. ``view``: ``physics.work(spec.name, cfg)``, where the caller has it."""
    view = physics.work(spec.name, cfg) if view is None else view
    seconds = max(view.flops() / (physics.peak_tflops(device, precision) * 1e12),
                  view.elements() * physics.element_bytes(precision) / (device["memory_bandwidth_gbps"] * 1e9))
    return seconds * 1e3 / NOMINAL_EFFICIENCY + LATENCY_MS * spec.sequential_steps(cfg)


def sample_configs(spec: OpSpec, space: Mapping, n: int, seed: int, precision: str = "fp32",
                   catalog: Mapping | None = None, partial: bool = False) -> list[Config]:
    """``n`` distinct valid configs for ``precision``, seeded and prefix-stable: config i depends only on
    (seed, op, precision, i), so every GPU and every run with the same seed measures the same configs, and a
    smaller ``n`` gives a prefix.

    With ``space.strata_ms`` (edges of estimated forward time on ``space.reference_gpu``), config j is drawn
    into band ``j % bands`` (equal counts per time band, wherever the op's time goes; a band the space cannot
    reach is dropped); without it, any draw is kept. A draw is a real model's layer (from ``catalog``, within
    the band) with probability ``space.real_fraction``, otherwise a point of the wide ranges. Raises
    ValueError when the space cannot yield ``n`` distinct configs, unless ``partial``: then the ones it yields.
    """
    strata = _Strata(spec, space, precision, spec.real_shapes(catalog or {}, space))
    streams = (int(seed), list(OP_CONFIG_COLUMNS).index(spec.name), PRECISION_INDEX[precision])
    configs: list[Config] = []
    seen: set[str] = set()
    streak = [0] * strata.bands  # consecutive failed draws per band; a band failing BAND_PATIENCE times is dropped
    i = misses = 0
    while len(configs) < n:
        live = [b for b in range(strata.bands) if streak[b] < BAND_PATIENCE]
        if not live or misses > MAX_MISSES + 20 * n:
            if partial:
                break
            raise ValueError(f"space: the {spec.name} space yields only {len(configs)} distinct valid configs for "
                             f"{precision} (asked for {n}); widen its ranges or ask for fewer")
        target = live[len(configs) % len(live)]
        cfg = strata.draw(np.random.default_rng([*streams, i]), target, seen)
        i += 1
        if cfg is None:
            misses += 1
            streak[target] += 1
            continue
        streak[target] = 0
        seen.add(config_id(spec.name, cfg))
        configs.append({c: cfg[c] for c in spec.columns})
    return configs


class _Strata:
    """Draws for one (op, precision): rejection sampling into a band of estimated time."""

    def __init__(self, spec: OpSpec, space: Mapping, precision: str, real: list[Config]):
        self.spec, self.space, self.precision = spec, space, precision
        self.real_fraction = float(space.get("real_fraction", 0.0))
        edges = space.get("strata_ms")
        self.edges = [float(e) for e in edges] if edges else [0.0, math.inf]
        if edges:
            from pipeline.gpus import gpu_spec

            self.device = gpu_spec(space.get("reference_gpu", "h200"))
        self.max_flops = float(space.get("max_flops") or math.inf)
        self.max_elems = float(space.get("max_memory_gb") or math.inf) * 1e9 / physics.element_bytes(precision)
        real = [c for c in real if self.fits(c)]
        self.real = [[c for c in real if self.band(c) == b] for b in range(len(self.edges) - 1)]

    def fits(self, cfg: Config) -> bool:
        """Valid, within the FLOPs cap, and its tensors (forward and backward) within the memory cap."""
        return self.spec.valid(cfg) and self.within_caps(physics.work(self.spec.name, cfg))

    def within_caps(self, view: physics.Work) -> bool:
        """``view``'s forward FLOPs and forward + backward tensors (twice the forward's elements) within the caps:
        what ``OpSpec.flops`` and ``memory_elems`` compute from it (no op overrides them; one that did would
        need its own caps here)."""
        return view.flops() <= self.max_flops and 2.0 * view.forward_elements <= self.max_elems

    def band(self, cfg: Config, view: physics.Work | None = None) -> int | None:
        if len(self.edges) == 2:
            return 0
        t = estimate_ms(self.spec, cfg, self.precision, self.device, view)
        for b in range(len(self.edges) - 1):
            if self.edges[b] <= t < self.edges[b + 1]:
                return b
        return None

    @property
    def bands(self) -> int:
        return len(self.edges) - 1

    def draw(self, rng: np.random.Generator, target: int, seen: set[str]) -> Config | None:
        """A new config (id not in ``seen``) in band ``target``, or None after too many attempts."""
        for _ in range(DRAWS_PER_CONFIG):
            if self.real[target] and rng.uniform() < self.real_fraction:
                cfg = dict(self.real[target][int(rng.integers(len(self.real[target])))])
            else:
                cfg = self.spec.sample_random(rng, self.space)
                if cfg is None or not self.spec.valid(cfg):
                    continue
                view = physics.work(self.spec.name, cfg)   # once per draw: planning draws ~25 per config
                if not self.within_caps(view) or self.band(cfg, view) != target:
                    continue
            if config_id(self.spec.name, cfg) not in seen:
                return cfg
        return None
