"""Which imported rows are launch-bound: their time is set by the host's launch rate, not by the GPU.

Host-timed sources (NeuSight: CUDA events around one call; DeepBench: library calls timed from the host)
cannot time an op faster than the host issues it, so their tiny ops sit on a floor. GPU-time sources (Vidur's
profiler kernel sums, AIConfigurator's CUDA-graph replay) have no such floor: ``launch_bound`` is False there.

The rule, per (source, GPU, op, precision, phase) group of a host-timed source (``LaunchRule``):

1. the floor is a low quantile of the group's times (``quantile``, default the 1st percentile);
2. rows within ``factor`` (default 1.5) of the floor form the band;
3. the floor counts as a launch floor only where the time is flat there: the band's roofline times
   (``max(FLOPs / peak, bytes / bandwidth)`` on the GPU's datasheet specs, ``pipeline.features``) span at
   least ``min_span`` (default 16x) -- the work changed 16-fold and the time did not leave the band. Otherwise
   the smallest configs are simply the fastest GPU work (e.g. single-wave GEMMs whose time follows the weight
   bytes), and no row is marked;
4. a band row is ``launch_bound`` when the group is flat and its own roofline time is below the floor (even an
   ideal GPU would have finished sooner).

``host_ms`` stays null: no source publishes a per-call host time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields

import numpy as np
import pandas as pd

from pipeline import features, schema
from pipeline.ingest.common import IngestError, Report, Source

GROUP_KEYS = ["gpu", "op", "precision", "phase"]


@dataclass(frozen=True)
class LaunchRule:
    """Settings of the launch-floor rule (module docstring); config key ``launch_bound``."""

    quantile: float = 0.01
    factor: float = 1.5
    min_span: float = 16.0

    def __post_init__(self):
        if not 0.0 <= self.quantile < 0.5:
            raise IngestError(f"config key `launch_bound.quantile`: must be in [0, 0.5), got {self.quantile!r}")
        if not self.factor >= 1.0:
            raise IngestError(f"config key `launch_bound.factor`: must be >= 1, got {self.factor!r}")
        if not self.min_span >= 1.0:
            raise IngestError(f"config key `launch_bound.min_span`: must be >= 1, got {self.min_span!r}")

    @classmethod
    def from_config(cls, settings: Mapping | None) -> LaunchRule:
        """The rule from the ``launch_bound`` config mapping (missing keys take the defaults)."""
        settings = dict(settings or {})
        allowed = [f.name for f in fields(cls)]
        unknown = sorted(set(settings) - set(allowed))
        if unknown:
            raise IngestError(f"config key `launch_bound`: unknown keys {unknown}; allowed: {', '.join(allowed)}")
        return cls(**{k: float(v) for k, v in settings.items()})

    def describe(self) -> str:
        return (f"floor = {self.quantile:g} quantile of time_ms per (source, gpu, op, precision, phase); "
                f"launch-bound = time_ms <= {self.factor:g} x floor and roofline time < floor, where the band "
                f"(time_ms <= {self.factor:g} x floor) has roofline times spanning >= {self.min_span:g}x "
                f"(a flat region); else no row of the group is launch-bound")


def mark_launch_bound(frame: pd.DataFrame, source: Source, rule: LaunchRule, report: Report) -> pd.DataFrame:
    """``frame`` (one source's finalized rows) with ``launch_bound`` and ``host_ms`` set; one floor record per
    group in ``report.launch_floors``."""
    frame = frame.copy()
    frame["host_ms"] = np.nan
    frame["launch_bound"] = False
    if frame.empty:
        return frame
    for key, index in frame.groupby(GROUP_KEYS, sort=True).groups.items():
        record = dict(zip(GROUP_KEYS, key), source=source.name, rows=len(index))
        if source.gpu_time:
            record.update(floor_ms=None, flat_span=None, flat=False, launch_bound=0)
        else:
            marked, floor, span = _group_floor(frame.loc[index], *key, rule)
            frame.loc[index, "launch_bound"] = marked
            record.update(floor_ms=floor, flat_span=span, flat=bool(span >= rule.min_span),
                          launch_bound=int(marked.sum()))
        report.launch_floors.append(record)
    return frame


def _group_floor(part: pd.DataFrame, gpu: str, op: str, precision: str, phase: str,
                 rule: LaunchRule) -> tuple[np.ndarray, float, float]:
    """(launch-bound mask, floor in ms, roofline span of the band) of one group."""
    times = part["time_ms"].to_numpy(dtype=float)
    roofline = features.roofline_ms(op, part[list(schema.OP_CONFIG_COLUMNS[op])], gpu, precision, phase)
    floor = float(np.quantile(times, rule.quantile))
    band = times <= rule.factor * floor
    span = float(roofline[band].max() / roofline[band].min())
    if span < rule.min_span:
        return np.zeros(len(part), dtype=bool), floor, span
    return band & (roofline < floor), floor, span


def floor_metadata(report: Report, source: str, rule: LaunchRule, gpu_time: bool):
    """``launch_meta(gpu, op)`` for ``write_source``: the rule and the floors of one file's groups."""
    def launch_meta(gpu: str, op: str) -> dict:
        if gpu_time:
            return {"launch_bound_rule": "GPU time (no host launch overhead in the timing): launch_bound = False"}
        floors = [{k: r[k] for k in ("precision", "phase", "rows", "floor_ms", "flat_span", "flat", "launch_bound")}
                  for r in report.launch_floors if (r["source"], r["gpu"], r["op"]) == (source, gpu, op)]
        return {"launch_bound_rule": rule.describe(), "launch_floors": floors}
    return launch_meta


def floor_table(report: Report) -> str:
    """Per source/GPU/op/precision/phase: the floor, the band's roofline span and the launch-bound share."""
    if not report.launch_floors:
        return "no launch floors"
    table = pd.DataFrame(report.launch_floors)
    table["share"] = table["launch_bound"] / table["rows"]
    table["floor_ms"] = table["floor_ms"].map(lambda v: "GPU time" if v is None or pd.isna(v) else f"{v:.4f}")
    table["flat_span"] = table["flat_span"].map(lambda v: "" if v is None or pd.isna(v) else f"{v:.0f}x")
    table["share"] = table["share"].map(lambda v: f"{v:.1%}")
    cols = ["source", "gpu", "op", "precision", "phase", "rows", "floor_ms", "flat_span", "launch_bound", "share"]
    return table[cols].to_string(index=False)
