"""benchmarks/sweep_diff.py: two sweeps of the same configs compared row by row (run-to-run repeatability, what a
collection setting changes)."""

from __future__ import annotations

import importlib.util

import pandas as pd
import pytest
from conftest import ROOT

spec = importlib.util.spec_from_file_location("sweep_diff", ROOT / "benchmarks" / "sweep_diff.py")
sweep_diff = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sweep_diff)


def _rows(times, ids=("a", "b", "c", "d")):
    return pd.DataFrame({"op": "bmm", "config_id": list(ids), "precision": "bf16", "phase": "forward",
                         "time_ms": times})


def test_ratios_on_the_rows_both_measured():
    first = _rows([1.0, 2.0, 4.0, 8.0])
    second = _rows([1.0, 2.2, 4.0, 8.0, 9.9], ids=("a", "b", "c", "d", "only-in-b"))
    out = sweep_diff.compare(first, second)
    total = out[out["op"] == "all"].iloc[0]
    assert total["rows"] == 4  # the row only one sweep measured is left out
    assert total["max_ratio"] == pytest.approx(1.1)
    assert total["median_ratio"] == pytest.approx(1.0)
    assert total["median_abs_diff_pct"] == pytest.approx(0.0)


def test_no_common_rows_is_a_clear_error():
    with pytest.raises(SystemExit, match="share no"):
        sweep_diff.compare(_rows([1.0] * 4), _rows([1.0] * 4, ids=("e", "f", "g", "h")))


def test_missing_files_name_the_label(tmp_path):
    with pytest.raises(SystemExit, match="gpu=h200"):
        sweep_diff.read_sweep(str(tmp_path), "h200", None)
