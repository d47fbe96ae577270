"""How long a collective takes: latency + bytes over bus bandwidth, per interconnect class (numpy/PyYAML only).

For ``n`` GPUs and a message of ``S`` bytes (``pipeline.collectives.schema``'s convention), the ring algorithm
moves ``factor * S`` bytes through each GPU's link -- all_reduce ``2(n-1)/n``, reduce_scatter, all_gather and
all_to_all ``(n-1)/n`` -- in ``steps`` hops (``2(n-1)`` and ``n-1``). For each of NCCL's protocol regimes
(LL, LL128, Simple: fast to start or fast to stream) ``p``

    t_p = latency_p + step_latency_p * steps + factor * S / bus_p,
    bus_p = efficiency_p * link / max(n / 2, 1) ** crowding,

and the collective takes the fastest, ``min_p t_p``, as NCCL picks its protocol by size. ``link`` is the GPU's
bandwidth per direction on the path, from the registry (``conf/gpus.yaml``, ``interconnect``): NVLink
``nvlink_gbps``; PCIe (peer to peer, ``pcie``) and host memory (``host``) the PCIe link from ``pcie_gen`` and
``pcie_lanes``. The efficiencies (the share of the link a protocol reaches, at most 1), latencies and the crowding
(how the bandwidth each GPU gets shrinks as more GPUs share switches, root complexes or host memory; about 0 on a
switched NVLink domain) are fitted per class on measured rows (``pipeline.collectives.fit``), and per system where
that system (GPU and path) was measured. A learned correction over message size is applied only where the fit kept
it (it did better on held-out systems). Across nodes (``n > gpus_per_node``) the bus bandwidth is at most
``network efficiency * inter_node_gbps`` (a node's network bandwidth per direction, from ``conf/multigpu.yaml`` or
the caller: it cannot be measured on one host), and the network adds its latency per step between nodes.

The fitted parameters live in ``conf/collectives_model.yaml``, written by ``python -m pipeline.collectives fit``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from pipeline import gpus
from pipeline.collectives.schema import COLLECTIVES, INTERCONNECTS

__all__ = ["MODEL_PATH", "PCIE_LANE_GBPS", "LinkParams", "Correction", "CollectiveModel", "algorithm_factor",
           "algorithm_steps", "link_gbps", "resolve_interconnect", "node_count", "base_ms"]

MODEL_PATH = Path(__file__).resolve().parents[2] / "conf" / "collectives_model.yaml"
PCIE_LANE_GBPS = {1: 2.5 * 0.8 / 8, 2: 5.0 * 0.8 / 8, 3: 8.0 * 128 / 130 / 8, 4: 16.0 * 128 / 130 / 8,
                  5: 32.0 * 128 / 130 / 8, 6: 64.0 * 242 / 256 / 8}
"""GB/s per lane and direction: transfer rate (GT/s) x line-code efficiency (8b/10b to gen 2, 128b/130b for gens
3-5, FLIT 242/256 for gen 6) / 8 bits."""


def _multiplier(collective) -> np.ndarray:
    """2 for all_reduce (reduce-scatter then all-gather), 1 for the others; ``collective`` one name or an array."""
    names = np.asarray(collective, dtype=object)
    bad = ~np.isin(names, COLLECTIVES)
    if bad.any():
        raise ValueError(f"collective: {names[bad].flat[0]!r} is not one of {', '.join(COLLECTIVES)}")
    return np.where(names == "all_reduce", 2.0, 1.0)


def algorithm_factor(collective, n) -> np.ndarray:
    """Bytes through each GPU's link per message byte (ring): all_reduce 2(n-1)/n, the others (n-1)/n."""
    n = np.asarray(n, dtype=float)
    return _multiplier(collective) * (n - 1.0) / n


def algorithm_steps(collective, n) -> np.ndarray:
    """Hops of the ring: all_reduce 2(n-1), the others n-1."""
    return _multiplier(collective) * (np.asarray(n, dtype=float) - 1.0)


def _interconnect_of(spec: Mapping) -> dict:
    ic = spec.get("interconnect")
    if not isinstance(ic, Mapping):
        raise ValueError(f"GPU {spec.get('name')!r} has no 'interconnect' fields (pipeline.gpus.INTERCONNECT_FIELDS): "
                         f"add them to its spec dict to predict more than one GPU")
    return dict(ic)


def link_gbps(spec: Mapping, interconnect: str) -> float:
    """The GPU's bandwidth per direction on ``interconnect`` (GB/s), from its registry fields."""
    ic = _interconnect_of(spec)
    if interconnect == "nvlink":
        if ic["nvlink_gbps"] is None:
            raise ValueError(f"interconnect: {spec.get('label', spec.get('name'))} has no NVLink "
                             f"(nvlink_gbps is null); use 'pcie' or 'host'")
        return float(ic["nvlink_gbps"])
    if interconnect in ("pcie", "host"):
        return PCIE_LANE_GBPS[int(ic["pcie_gen"])] * int(ic["pcie_lanes"])
    raise ValueError(f"interconnect: {interconnect!r} is not one of {', '.join(INTERCONNECTS)}")


def resolve_interconnect(spec: Mapping, interconnect: str | None, n_gpus: int) -> str:
    """The path ``n_gpus`` GPUs use: ``interconnect`` checked against the GPU, or for ``None``/``"auto"`` NVLink
    where one NVLink domain holds the GPUs of a node, else PCIe; ``"none"`` for one GPU."""
    if isinstance(n_gpus, bool) or not isinstance(n_gpus, (int, np.integer)) or n_gpus < 1:
        raise ValueError(f"n_gpus must be a whole number >= 1, got {n_gpus!r}")
    if interconnect not in (None, "auto", *INTERCONNECTS):
        raise ValueError(f"interconnect: {interconnect!r} is not one of auto, {', '.join(INTERCONNECTS)}")
    if n_gpus == 1:
        return "none"
    ic = _interconnect_of(spec)
    in_node = min(n_gpus, int(ic["gpus_per_node"]))
    domain = ic["nvlink_gpus"] or 0
    if interconnect in (None, "auto"):
        return "nvlink" if domain >= in_node and domain > 0 else "pcie"
    if interconnect == "nvlink" and domain < in_node:
        name = spec.get("label", spec.get("name"))
        raise ValueError(f"interconnect 'nvlink': {name} has no NVLink" if not domain else
                         f"interconnect 'nvlink': one NVLink domain of {name} joins {domain} GPUs, fewer than the "
                         f"{in_node} of a node here; use 'pcie' or 'host'")
    return interconnect


def node_count(spec: Mapping, n_gpus: int, inter_node_gbps: float | None) -> int:
    """Nodes ``n_gpus`` GPUs of ``spec`` span; past one node the network bandwidth must be given (shared by the
    model and ``pipeline.step.forecast``, which checks it before any tracking)."""
    if n_gpus == 1:
        return 1
    per_node = int(spec["interconnect"]["gpus_per_node"])
    if n_gpus > per_node and inter_node_gbps is None:
        raise ValueError(f"n_gpus={n_gpus}: more GPUs than one {spec['label']} node holds ({per_node}); give "
                         f"inter_node_gbps (a node's network bandwidth per direction, GB/s; CLI "
                         f"--inter-node-gbps, or inter_node.bandwidth_gbps in conf/multigpu.yaml)")
    return math.ceil(n_gpus / per_node)


@dataclass(frozen=True)
class Protocol:
    """One of NCCL's protocol regimes (LL, LL128, Simple): its latency, latency per ring step, and the share of the
    link it reaches. Low-latency protocols start fast and move data slowly; Simple the other way round."""

    latency_us: float
    step_latency_us: float
    efficiency: float


@dataclass(frozen=True)
class LinkParams:
    """Fitted parameters of one interconnect class, one measured system or the network: the protocol regimes
    (NCCL picks the fastest for each size, so the model takes the minimum over them) and the crowding."""

    protocols: tuple
    crowding: float = 0.0
    rows: int = 0
    systems: tuple = ()

    @property
    def efficiency(self) -> float:
        """The bandwidth-bound (best) efficiency: the share of the link large messages reach."""
        return max(p.efficiency for p in self.protocols)

    def to_dict(self) -> dict:
        return {"protocols": [asdict(p) for p in self.protocols], "crowding": self.crowding, "rows": self.rows,
                "systems": list(self.systems)}

    @classmethod
    def from_dict(cls, d: Mapping) -> LinkParams:
        protocols = tuple(Protocol(float(p["latency_us"]), float(p["step_latency_us"]), float(p["efficiency"]))
                          for p in d["protocols"])
        if not protocols or any(p.efficiency <= 0 or p.latency_us < 0 or p.step_latency_us < 0 for p in protocols):
            raise ValueError(f"collective model: bad protocols {d['protocols']!r} (efficiency > 0, latencies >= 0)")
        return cls(protocols, float(d.get("crowding", 0.0)), int(d.get("rows", 0)), tuple(d.get("systems", ())))


def base_ms(collective, nbytes, n, link, params: LinkParams, network: LinkParams | None = None,
            nodes=1, inter_node_gbps=None) -> np.ndarray:
    """The analytical time (ms) without the learned correction: the fastest protocol; 0 for one GPU. Every
    argument but the parameters may be an array (one value per row)."""
    n = np.asarray(n, dtype=float)
    nodes = np.asarray(nodes, dtype=float)
    data = algorithm_factor(collective, n) * np.asarray(nbytes, dtype=float)
    crowd = np.maximum(n / nodes / 2.0, 1.0) ** params.crowding
    steps = algorithm_steps(collective, n / nodes)
    across = nodes > 1
    if np.any(across):
        if network is None or inter_node_gbps is None:
            raise ValueError("inter_node_gbps: a collective across nodes needs the network's bandwidth per node "
                             "and a fitted network class")
        net = network.protocols[0]
        network_bus = np.where(across, net.efficiency * np.asarray(inter_node_gbps, dtype=float), np.inf)
        net_latency = np.where(across, net.latency_us + net.step_latency_us * algorithm_steps(collective, nodes), 0)
    else:
        network_bus, net_latency = np.inf, 0.0
    best = np.full(np.broadcast(data, crowd).shape, np.inf)
    for p in params.protocols:
        bus = np.minimum(p.efficiency * np.asarray(link, dtype=float) / crowd, network_bus)
        best = np.minimum(best, p.latency_us + p.step_latency_us * steps + net_latency + data / (bus * 1e3))
    return np.where(n > 1, best / 1e3, 0.0)


@dataclass(frozen=True)
class Correction:
    """A learned factor over message size per class: ``exp(basis(log2 bytes) @ coef[class])``, with hinges at
    ``knots``; ``log2 bytes`` clipped to the fitted range."""

    knots: tuple
    coef: Mapping[str, tuple]
    x_range: tuple

    def basis(self, nbytes) -> np.ndarray:
        x = np.clip(np.log2(np.maximum(np.asarray(nbytes, dtype=float), 1.0)), *self.x_range)
        return np.column_stack([np.ones_like(x), x] + [np.maximum(x - k, 0.0) for k in self.knots])

    def factor(self, cls: str, nbytes) -> np.ndarray:
        nbytes = np.atleast_1d(np.asarray(nbytes, dtype=float))
        if cls not in self.coef:
            return np.ones_like(nbytes)
        return np.exp(self.basis(nbytes) @ np.asarray(self.coef[cls], dtype=float))

    def to_dict(self) -> dict:
        return {"knots": list(self.knots), "x_range": list(self.x_range),
                "coef": {k: [float(c) for c in v] for k, v in self.coef.items()}}

    @classmethod
    def from_dict(cls, d: Mapping) -> Correction:
        return cls(tuple(d["knots"]), {k: tuple(v) for k, v in d["coef"].items()}, tuple(d["x_range"]))


@dataclass
class CollectiveModel:
    """Fitted parameters: per class (``nvlink``, ``pcie``, ``host``), per measured system (``<gpu>/<path>``), the
    network across nodes, and the learned correction if the fit kept it. ``meta``: how it was fitted."""

    classes: dict[str, LinkParams]
    systems: dict[str, LinkParams] = field(default_factory=dict)
    network: LinkParams | None = None
    correction: Correction | None = None
    meta: dict = field(default_factory=dict)

    def params(self, gpu_label: str, interconnect: str) -> tuple[LinkParams, str]:
        """(parameters, basis) for a GPU on a path: its own system's fit where measured, else its class's; a
        class without data falls back to ``pcie`` (the host path is PCIe without peer-to-peer) and says so."""
        key = f"{gpu_label}/{interconnect}"
        if key in self.systems:
            return self.systems[key], f"fitted on {key}"
        if interconnect in self.classes:
            return self.classes[interconnect], f"{interconnect} class"
        if interconnect == "host" and "pcie" in self.classes:
            return self.classes["pcie"], "pcie class (no host-path data fitted)"
        raise ValueError(f"interconnect {interconnect!r}: the collective model has no fit for it (fitted: "
                         f"{', '.join(sorted(self.classes))}); run `python -m pipeline.collectives fit` on data "
                         f"that holds it")

    def time_ms(self, collective: str, nbytes, n_gpus: int, gpu, interconnect: str | None = None, *,
                inter_node_gbps: float | None = None) -> np.ndarray:
        """Predicted time (ms) of ``collective`` over ``n_gpus`` GPUs of type ``gpu`` (registry name or spec dict)
        for each message size in ``nbytes``. ``interconnect``: ``None``/``auto``, ``nvlink``, ``pcie``, ``host``.
        More GPUs than a node holds need ``inter_node_gbps`` (a node's network bandwidth per direction, GB/s)."""
        spec = gpus.gpu_spec(gpu)
        nbytes = np.atleast_1d(np.asarray(nbytes, dtype=float))
        path = resolve_interconnect(spec, interconnect, n_gpus)
        if n_gpus == 1:
            return np.zeros_like(nbytes)
        nodes = node_count(spec, n_gpus, inter_node_gbps)
        if inter_node_gbps is not None and not (inter_node_gbps > 0 and math.isfinite(inter_node_gbps)):
            raise ValueError(f"inter_node_gbps must be a positive number of GB/s, got {inter_node_gbps!r}")
        params, _ = self.params(spec["label"], path)
        t = base_ms(collective, nbytes, n_gpus, link_gbps(spec, path), params, self.network, nodes,
                    inter_node_gbps)
        if self.correction is not None:
            t = t * self.correction.factor(path, nbytes)
        return t

    def describe(self, gpu, interconnect: str | None, n_gpus: int) -> str:
        """Which parameters a prediction uses, in words (for tables and reports)."""
        spec = gpus.gpu_spec(gpu)
        path = resolve_interconnect(spec, interconnect, n_gpus)
        return "one GPU" if n_gpus == 1 else f"{path}: {self.params(spec['label'], path)[1]}"

    # -------------------------------------------------------------------------------------------- files

    def to_dict(self) -> dict[str, Any]:
        return {"meta": self.meta, "classes": {k: v.to_dict() for k, v in self.classes.items()},
                "systems": {k: v.to_dict() for k, v in self.systems.items()},
                "network": self.network.to_dict() if self.network else None,
                "correction": self.correction.to_dict() if self.correction else None}

    @classmethod
    def from_dict(cls, d: Mapping) -> CollectiveModel:
        if not isinstance(d, Mapping) or not isinstance(d.get("classes"), Mapping) or not d["classes"]:
            raise ValueError("collective model: expected a mapping with a non-empty 'classes' section")
        return cls(classes={k: LinkParams.from_dict(v) for k, v in d["classes"].items()},
                   systems={k: LinkParams.from_dict(v) for k, v in (d.get("systems") or {}).items()},
                   network=LinkParams.from_dict(d["network"]) if d.get("network") else None,
                   correction=Correction.from_dict(d["correction"]) if d.get("correction") else None,
                   meta=dict(d.get("meta") or {}))

    @classmethod
    def load(cls, path=None) -> CollectiveModel:
        """The fitted model (default ``conf/collectives_model.yaml``)."""
        path = Path(path) if path is not None else MODEL_PATH
        try:
            raw = yaml.safe_load(path.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"collective model not found: {path} (write it with "
                                    f"`python -m pipeline.collectives fit`)") from None
        return cls.from_dict(raw)
