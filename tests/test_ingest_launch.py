"""Launch-bound marking of imported rows (``pipeline.ingest.launch``)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pipeline import ingest
from pipeline.ingest.common import Report
from pipeline.ingest.launch import LaunchRule, mark_launch_bound

NEUSIGHT = ingest.REGISTRY["neusight"]


def _bmm_rows(shapes_times, gpu="Tesla T4") -> pd.DataFrame:
    rows = pd.DataFrame([{"batch": b, "m": m, "k": k, "n": n, "time_ms": t} for (b, m, k, n), t in shapes_times])
    rows[["op", "gpu", "precision", "phase"]] = ["bmm", gpu, "fp32", "forward"]
    return ingest.finalize(rows, NEUSIGHT, Report())


def test_flat_floor_marks_the_tiny_ops():
    tiny = [((1, 2, 2, 2), 0.030), ((2, 16, 16, 16), 0.031), ((8, 64, 32, 64), 0.032), ((16, 64, 64, 64), 0.033)]
    big = [((8, 512, 512, 512), 0.6), ((32, 1024, 1024, 1024), 17.0), ((4, 256, 256, 256), 0.05)]
    report = Report()
    marked = mark_launch_bound(_bmm_rows(tiny + big), NEUSIGHT, LaunchRule(), report)
    assert sorted(marked.loc[marked["launch_bound"], "batch"]) == [1, 2, 8, 16]
    assert marked["host_ms"].isna().all()
    (floor,) = report.launch_floors
    assert floor["flat"] and floor["flat_span"] >= 16 and floor["launch_bound"] == 4
    assert floor["floor_ms"] == pytest.approx(np.quantile([0.03, 0.031, 0.032, 0.033, 0.6, 17.0, 0.05], 0.01))


def test_no_flat_region_marks_nothing():
    """Fastest rows whose time follows their work (here 2x the work, 2x the time) are GPU-bound."""
    rows = [((1, 512, 512, 512), 0.20), ((2, 512, 512, 512), 0.40), ((4, 512, 512, 512), 0.80)]
    report = Report()
    marked = mark_launch_bound(_bmm_rows(rows), NEUSIGHT, LaunchRule(), report)
    assert not marked["launch_bound"].any()
    assert not report.launch_floors[0]["flat"] and report.launch_floors[0]["flat_span"] < 16


def test_rows_an_ideal_gpu_needs_the_floor_for_are_not_launch_bound():
    """Within the band, a row whose roofline time exceeds the floor is GPU work, not launch overhead."""
    rows = [((1, 2, 2, 2), 0.030), ((4, 16, 16, 16), 0.031), ((64, 512, 512, 512), 0.040)]  # ~0.03 ms of T4 work
    marked = mark_launch_bound(_bmm_rows(rows), NEUSIGHT, LaunchRule(min_span=2), Report())
    assert list(marked.sort_values("batch")["launch_bound"]) == [True, True, False]


def test_gpu_time_sources_are_never_launch_bound():
    rows = _bmm_rows([((1, 2, 2, 2), 0.003), ((2, 16, 16, 16), 0.003), ((16, 64, 64, 64), 0.003)])
    report = Report()
    marked = mark_launch_bound(rows, ingest.REGISTRY["aiconfigurator"], LaunchRule(), report)
    assert not marked["launch_bound"].any() and report.launch_floors[0]["floor_ms"] is None


def test_launch_rule_settings_are_checked():
    assert LaunchRule.from_config({"factor": 2}).factor == 2.0
    with pytest.raises(ingest.IngestError, match=r"launch_bound.*unknown keys \['slack'\]"):
        LaunchRule.from_config({"slack": 1})
    with pytest.raises(ingest.IngestError, match="launch_bound.factor"):
        LaunchRule(factor=0.5)
    with pytest.raises(ingest.IngestError, match="launch_bound.quantile"):
        LaunchRule(quantile=0.7)
