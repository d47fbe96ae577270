"""Calibrate the collective model (``pipeline.collectives.model``) on measured rows and judge it on held-out data.

- **Classes** (``nvlink``, ``pcie``, ``host``): per protocol regime (three where a system spans many sizes, else
  one) latency, step latency and efficiency by relative least squares (non-negative, efficiency at most 1), the
  regimes found by alternating fit and assignment (each row to the regime that predicts it fastest), crowding by a
  grid search; on the one-node rows of every system of the class (system = GPU and path). **Systems**: the same
  per system (crowding from the class where the system has one GPU count only).
  **Network**: latency, step latency and efficiency across nodes on the multi-node rows, with the intra-node part
  from the system's fit and each source's network bandwidth from its metadata.
- **Held out**: each system of a class with another system is predicted by the class fitted without it (an unseen
  system, as a GPU the data lacks is predicted); and every third message size of each system is predicted by the
  system fitted on the rest.
- **Learned correction**: a piecewise-linear factor over log2(message size) per class (NCCL's protocols and
  channel counts change with size, which latency + bytes / bandwidth cannot follow), fitted alternately with the
  parameters. It is kept only if it lowers the mean absolute error on the held-out systems (by 5 % of it and at
  least 0.1 points); the fit says which.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import itertools
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline import gpus
from pipeline.collectives import schema as cschema
from pipeline.collectives.model import (
    CollectiveModel,
    Correction,
    LinkParams,
    Protocol,
    algorithm_factor,
    algorithm_steps,
    base_ms,
    link_gbps,
)
from pipeline.evaluation.metrics import ape, summarise

__all__ = ["KNOTS", "GAMMAS", "load_rows", "fit_params", "fit_class", "fit_model", "ape", "predict_rows",
           "busbw_gbps"]

KNOTS = (14.0, 18.0, 22.0, 26.0)
"""Hinges of the learned correction, log2(bytes): 16 KiB, 256 KiB, 4 MiB, 64 MiB."""
GAMMAS = tuple(np.round(np.arange(-0.5, 2.51, 0.1), 2))
_LINE_ROUNDS = 30
_RIDGE = 1e-2
_MIN_GAIN, _MIN_GAIN_PP = 0.05, 0.1
"""The correction is kept if it lowers the held-out mean absolute error by 5 % of itself and 0.1 points."""
_ROUNDS = 3


def load_rows(roots) -> tuple[pd.DataFrame, dict[str, float]]:
    """The ok rows under ``roots`` with ``system`` and ``link_gbps`` columns, and the network bandwidth per GPU
    label from the files' metadata (``topology[].network.inter_node_gbps``)."""
    roots = [roots] if isinstance(roots, (str, Path)) else list(roots)
    rows, metadata = cschema.read_collectives_and_metadata(roots)
    networks: dict[str, float] = {}
    for path, meta in metadata:
        gpu = dict(seg.split("=", 1) for seg in path.parent.parts if "=" in seg)["gpu"]
        for topo in meta.get("topology") or []:
            gbps = (topo.get("network") or {}).get("inter_node_gbps") if isinstance(topo, dict) else None
            if gbps:
                networks[gpu] = float(gbps)
    if rows.empty:
        return rows.assign(system=pd.Series(dtype=object), link_gbps=pd.Series(dtype=float)), networks
    rows["system"] = rows["gpu"] + "/" + rows["interconnect"]
    links = {s: link_gbps(gpus.gpu_spec(s.split("/")[0]), s.split("/")[1]) for s in rows["system"].unique()}
    rows["link_gbps"] = rows["system"].map(links)
    return rows, networks


def _columns(rows: pd.DataFrame, gamma: float) -> np.ndarray:
    """Design columns (us): 1, steps, factor * bytes * crowding / link (coefficient 1 / efficiency)."""
    per_node = rows["n_gpus"].to_numpy(dtype=float) / rows["nodes"].to_numpy(dtype=float)
    collective = rows["collective"].to_numpy()
    crowd = np.maximum(per_node / 2.0, 1.0) ** gamma
    data = algorithm_factor(collective, rows["n_gpus"].to_numpy(dtype=float)) * rows["bytes"].to_numpy(dtype=float)
    return np.column_stack([np.ones(len(rows)), algorithm_steps(collective, per_node),
                            data * crowd / (rows["link_gbps"].to_numpy(dtype=float) * 1e3)])


def _nnls(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, float]:
    """Least squares with non-negative coefficients, the last (1 / efficiency) at least 1 -- no protocol moves
    more than its link carries. Exact: every subset of free coefficients is tried."""
    shifted = b - a[:, -1]
    best, best_loss = np.zeros(a.shape[1]), float(np.sum(shifted ** 2))
    for size in range(1, a.shape[1] + 1):
        for subset in itertools.combinations(range(a.shape[1]), size):
            coef = np.zeros(a.shape[1])
            coef[list(subset)] = np.linalg.lstsq(a[:, subset], shifted, rcond=None)[0]
            loss = float(np.sum((a @ coef - shifted) ** 2))
            if np.all(coef >= 0) and loss < best_loss:
                best, best_loss = coef, loss
    best = best.copy()
    best[-1] += 1.0
    return best, best_loss


def _fit_lines(a: np.ndarray, log_size: np.ndarray, k: int) -> tuple[list[np.ndarray], float]:
    """k protocol lines by alternating fit and assignment (each row to the line that predicts it fastest, as NCCL
    picks the fastest protocol), started from size quantiles; ``a``: design rows already divided by the measured
    times. Returns the lines and the squared relative error."""
    edges = np.quantile(log_size, np.linspace(0, 1, k + 1)[1:-1])
    assign = np.searchsorted(edges, log_size, side="right")
    lines: list[np.ndarray] = []
    for _ in range(_LINE_ROUNDS):
        lines = [_nnls(a[assign == j], np.ones(int((assign == j).sum())))[0]
                 for j in range(k) if (assign == j).sum() >= 3]
        relative = np.column_stack([a @ c for c in lines])
        new = np.argmin(relative, axis=1)
        if len(lines) == k and np.array_equal(new, assign):
            break
        assign = new
    relative = np.column_stack([a @ c for c in lines])
    return lines, float(np.sum((relative.min(axis=1) - 1.0) ** 2))


def protocol_count(rows: pd.DataFrame) -> int:
    """Protocol regimes a fit can resolve: three (LL, LL128, Simple) where a system spans many sizes, else one."""
    return 3 if rows["bytes"].nunique() >= 12 else 1


def fit_params(rows: pd.DataFrame, gamma: float | None = None, scale: np.ndarray | None = None,
               protocols: int | None = None) -> LinkParams:
    """Fit one parameter set on ``rows`` (one node each) by relative least squares; ``gamma`` fixed or searched
    (only where the rows hold more than one GPU count: coarse grid, then a finer one around the best);
    ``scale`` divides the measured times first (the learned correction); ``protocols``: regimes to fit (default
    ``protocol_count``)."""
    measured = rows["time_ms"].to_numpy(dtype=float) * 1e3 / (1.0 if scale is None else scale)
    log_size = np.log2(rows["bytes"].to_numpy(dtype=float))
    k = protocols or protocol_count(rows)

    def fit(g):
        return _fit_lines(_columns(rows, g) / measured[:, None], log_size, k)

    if gamma is not None or rows["n_gpus"].nunique() == 1:
        g = 0.0 if gamma is None else gamma
        lines, _ = fit(g)
    else:
        coarse = {g: fit(g) for g in GAMMAS}
        g0 = min(coarse, key=lambda g: coarse[g][1])
        fine = {g: fit(g) for g in np.round(np.arange(g0 - 0.08, g0 + 0.081, 0.02), 2)} | {g0: coarse[g0]}
        g = min(fine, key=lambda v: fine[v][1])
        lines = fine[g][0]
    found = sorted((Protocol(float(c[0]), float(c[1]), float(1.0 / c[2])) for c in lines),
                   key=lambda p: p.efficiency)
    return LinkParams(protocols=tuple(found), crowding=float(g), rows=int(len(rows)),
                      systems=tuple(sorted(rows["system"].unique())))


def predict_rows(rows: pd.DataFrame, params: LinkParams, correction: Correction | None = None, cls: str = "",
                 network: LinkParams | None = None, networks: dict | None = None) -> np.ndarray:
    """Model times (ms) of ``rows`` with ``params`` (and the correction of class ``cls``); multi-node rows take
    their network bandwidth from ``networks`` (GPU label -> GB/s)."""
    inter = rows["gpu"].map(networks or {}).to_numpy(dtype=float)
    out = base_ms(rows["collective"].to_numpy(), rows["bytes"].to_numpy(dtype=float),
                  rows["n_gpus"].to_numpy(dtype=float), rows["link_gbps"].to_numpy(dtype=float), params, network,
                  rows["nodes"].to_numpy(dtype=float), inter)
    if correction is not None:
        out = out * correction.factor(cls, rows["bytes"].to_numpy())
    return out


def _fit_correction(rows: pd.DataFrame, residual: np.ndarray, cls: str) -> Correction:
    x = np.log2(rows["bytes"].to_numpy(dtype=float))
    shell = Correction(KNOTS, {}, (float(x.min()), float(x.max())))
    basis = shell.basis(rows["bytes"].to_numpy())
    penalty = _RIDGE * np.eye(basis.shape[1])
    coef = np.linalg.solve(basis.T @ basis + penalty * len(rows), basis.T @ residual)
    return Correction(KNOTS, {cls: tuple(float(c) for c in coef)}, shell.x_range)


def fit_class(rows: pd.DataFrame, cls: str, learn: bool) -> tuple[LinkParams, Correction | None]:
    """A class's parameters, alternating with its learned correction when ``learn``."""
    params = fit_params(rows)
    if not learn:
        return params, None
    correction = None
    for _ in range(_ROUNDS):
        residual = np.log(rows["time_ms"].to_numpy() / predict_rows(rows, params))
        correction = _fit_correction(rows, residual, cls)
        params = fit_params(rows, scale=correction.factor(cls, rows["bytes"].to_numpy()))
    return params, correction


def _held_out_systems(single: pd.DataFrame, learn: bool) -> pd.DataFrame:
    """Each system predicted by its class fitted without it (classes with one system are skipped)."""
    out = []
    for cls, rows in single.groupby("interconnect"):
        for system in sorted(rows["system"].unique()) if rows["system"].nunique() > 1 else []:
            train, test = rows[rows["system"] != system], rows[rows["system"] == system]
            params, corr = fit_class(train, cls, learn)
            err = summarise(ape(predict_rows(test, params, corr, cls), test["time_ms"]))
            out.append({"class": cls, "system": system, "rows": len(test), "mean_ape": err["mape"],
                        "median_ape": err["median_ape"], "p90_ape": err["p90_ape"]})
    return pd.DataFrame(out)


def _held_out_sizes(single: pd.DataFrame, classes: dict, correction: Correction | None) -> pd.DataFrame:
    """Every third message size of each system predicted by the system fitted on the others."""
    out = []
    for system, rows in single.groupby("system"):
        sizes = np.sort(rows["bytes"].unique())
        test_sizes = set(sizes[1::3])
        test = rows["bytes"].isin(test_sizes).to_numpy()
        cls = rows["interconnect"].iloc[0]
        params = _system_params(rows[~test], classes[cls], correction, cls)
        err = ape(predict_rows(rows[test], params, correction, cls), rows[test]["time_ms"])
        out.append({"system": system, "rows": int(test.sum()), "mean_ape": float(err.mean()),
                    "median_ape": float(np.median(err))})
    return pd.DataFrame(out)


def _system_params(rows: pd.DataFrame, cls_params: LinkParams, correction: Correction | None, cls: str
                   ) -> LinkParams:
    gamma = None if rows["n_gpus"].nunique() > 1 else cls_params.crowding
    scale = correction.factor(cls, rows["bytes"].to_numpy()) if correction is not None else None
    return fit_params(rows, gamma=gamma, scale=scale)


def _fit_network(multi: pd.DataFrame, systems: dict, networks: dict) -> LinkParams | None:
    """Network latency and efficiency on multi-node rows, the intra-node part from each system's fit."""
    multi = multi[multi["gpu"].isin(list(networks)) & multi["system"].isin(list(systems))]
    if multi.empty:
        return None
    intra, cols = np.empty(len(multi)), np.empty((len(multi), 3))
    for i, row in enumerate(multi.itertuples(index=False)):
        p, per_node = systems[row.system], row.n_gpus / row.nodes
        steps = float(algorithm_steps(row.collective, per_node))
        intra[i] = min(q.latency_us + q.step_latency_us * steps for q in p.protocols)
        cols[i] = (1.0, float(algorithm_steps(row.collective, row.nodes)),
                   float(algorithm_factor(row.collective, row.n_gpus)) * row.bytes / (networks[row.gpu] * 1e3))
    measured = multi["time_ms"].to_numpy(dtype=float) * 1e3
    coef, _ = _nnls(cols / measured[:, None], 1.0 - intra / measured)
    return LinkParams((Protocol(float(coef[0]), float(coef[1]), float(1.0 / coef[2])),), 0.0, len(multi),
                      tuple(sorted(multi["system"].unique())))


def _fingerprint(rows: pd.DataFrame) -> str:
    keys = rows.sort_values(["system", "config_id"])[["system", "config_id", "time_ms"]]
    return hashlib.sha256(keys.to_csv(index=False).encode()).hexdigest()[:16]


def fit_model(roots, loaded: tuple[pd.DataFrame, dict[str, float]] | None = None
              ) -> tuple[CollectiveModel, dict[str, pd.DataFrame]]:
    """Fit every class, system and the network on the rows under ``roots``; decide on the learned correction.
    ``loaded``: ``load_rows(roots)`` where the caller has read it already (it is not changed).

    Returns the model and the tables the report shows (held-out systems with and without the correction, held-out
    sizes, in-sample errors per system)."""
    rows, networks = load_rows(roots) if loaded is None else loaded
    single, multi = rows[rows["nodes"] == 1], rows[rows["nodes"] > 1]
    if single.empty:
        raise ValueError(f"no one-node collective rows under {roots}: run `make import` or collect some")
    base_ho, learned_ho = _held_out_systems(single, False), _held_out_systems(single, True)
    without, with_ = _pooled(base_ho), _pooled(learned_ho)
    keep = bool(len(base_ho)) and with_ < (1 - _MIN_GAIN) * without and without - with_ > _MIN_GAIN_PP
    classes, coefs = {}, {}
    for cls, cls_rows in single.groupby("interconnect"):
        classes[cls], corr = fit_class(cls_rows, cls, keep)
        if corr is not None:
            coefs.update(corr.coef)
    x = np.log2(single["bytes"].to_numpy(dtype=float))
    correction = Correction(KNOTS, coefs, (float(x.min()), float(x.max()))) if keep else None
    systems = {s: _system_params(r, classes[r["interconnect"].iloc[0]], correction, r["interconnect"].iloc[0])
               for s, r in single.groupby("system")}
    network = _fit_network(multi, systems, networks)
    in_sample = pd.DataFrame([{"system": s, "rows": len(r), "mean_ape": float(ape(predict_rows(
        r, systems[s], correction, r["interconnect"].iloc[0], network, networks), r["time_ms"]).mean())}
        for s, r in rows[rows["system"].isin(list(systems))].groupby("system")])
    meta = {"fitted": _dt.date.today().isoformat(), "command": "python -m pipeline.collectives fit",
            "rows": int(len(rows)), "fingerprint": _fingerprint(rows),
            "systems": {s: int(n) for s, n in rows.groupby("system").size().items()},
            "networks_gbps": networks,
            "correction": {"kept": keep, "held_out_mean_ape_without": without,
                           "held_out_mean_ape_with": with_}}
    model = CollectiveModel(classes, systems, network, correction, meta)
    return model, {"held_out_systems": base_ho, "held_out_systems_learned": learned_ho,
                   "held_out_sizes": _held_out_sizes(single, classes, correction), "in_sample": in_sample}


def _pooled(table: pd.DataFrame) -> float:
    """Mean absolute % error over all held-out rows (systems weighted by their rows)."""
    if table.empty:
        return float("nan")
    return float(np.average(table["mean_ape"], weights=table["rows"]))


def busbw_gbps(rows: pd.DataFrame, times_ms) -> np.ndarray:
    """Bus bandwidth (GB/s, nccl-tests' definition) of rows at the given times."""
    factor = algorithm_factor(rows["collective"].to_numpy(), rows["n_gpus"].to_numpy(dtype=float))
    return factor * rows["bytes"].to_numpy(dtype=float) / (np.asarray(times_ms, dtype=float) * 1e6)
