"""benchmarks/graph_method_check.py without a GPU: ``--pick`` pairs AIConfigurator's configs with our own sweep's (bf16
forward, no bias, ok rows only) and adds random ones; the summary's ratios are those of the rows; bad input names
what is wrong."""

from __future__ import annotations

import sys

import pandas as pd
import pytest
from conftest import ROOT

from pipeline import schema

sys.path.insert(0, str(ROOT / "benchmarks"))
import graph_method_check  # noqa: E402

SHAPES = [(512, 4096, 4096), (2048, 8192, 1024), (64, 1024, 1024), (8192, 4096, 14336)]


def _rows(shapes, ms, gpu="h100-sxm", **fields):
    return [{"config_id": schema.config_id("linear", {"batch": m, "in_features": k, "out_features": n, "bias": False}),
             "op": "linear", "gpu": gpu, "precision": "bf16", "phase": "forward", "status": "ok", "time_ms": t,
             "time_p20_ms": t, "time_p80_ms": t, "reps": 10,
             "batch": m, "in_features": k, "out_features": n, "bias": False, **fields}
            for (m, k, n), t in zip(shapes, ms)]


def _write(root, rows):
    frame = schema.make_rows(rows)
    for col in ("time_ms", "time_p20_ms", "time_p80_ms"):   # failed rows carry no time
        frame.loc[frame["status"] != "ok", col] = None
    schema.write_partition(frame, root, "part-0")


def test_pick_pairs_shared_configs_and_adds_random_ones(tmp_path):
    _write(tmp_path / "external",
           _rows(SHAPES, [0.09, 0.18, 0.01, 1.5], source="aiconfigurator"))
    own = _rows(SHAPES[:2], [0.1, 0.2], source="own") + _rows(SHAPES[2:3], [0.02], source="own")
    own[2]["status"] = "timeout"   # not ok: not shared
    _write(tmp_path, own)
    configs = graph_method_check.pick(tmp_path, "h100-sxm", random_configs=5)
    shared = configs[configs["own_sweep_ms"].notna()].sort_values("m")
    assert shared[["m", "k", "n"]].values.tolist() == [[512, 4096, 4096], [2048, 8192, 1024]]
    assert shared["published_ms"].tolist() == [0.09, 0.18] and shared["own_sweep_ms"].tolist() == [0.1, 0.2]
    # the random part: only the unshared config inside 0.02-5 ms (the 0.01 ms one is out)
    assert configs[configs["own_sweep_ms"].isna()][["m", "k", "n"]].values.tolist() == [[8192, 4096, 14336]]


def test_summary_gives_median_ratios_per_band():
    result = pd.DataFrame({"ours_ms": [0.01, 0.02, 0.5, 0.6], "graph_cold_ms": [0.009, 0.018, 0.45, 0.6],
                           "graph_warm_ms": [0.01, 0.02, 0.5, 0.54], "published_ms": [0.008, 0.016, 0.4, 0.6]})
    table = graph_method_check.summary(result)
    assert table["configs"].tolist() == [2, 2]
    assert table["graph_cold/ours"].tolist() == [0.9, 0.95] and table["graph_warm/ours"].tolist() == [1.0, 0.95]
    assert table["published/ours"].tolist() == [0.8, 0.9]


def test_configs_without_a_shape_column_are_refused(tmp_path):
    path = tmp_path / "configs.csv"
    pd.DataFrame({"m": [1], "n": [2]}).to_csv(path, index=False)
    with pytest.raises(SystemExit, match=r"missing columns \['k'\]"):
        graph_method_check.main(["--configs", str(path)])
    with pytest.raises(SystemExit, match="no AIConfigurator rows"):
        _write(tmp_path / "external", _rows(SHAPES[:1], [0.1], gpu="l4", source="neusight"))
        _write(tmp_path, _rows(SHAPES[:1], [0.1], gpu="l4", source="own"))
        graph_method_check.main(["--pick", str(tmp_path / "x.csv"), "--gpu", "l4", "--root", str(tmp_path)])


def test_summarize_writes_the_report_with_an_overall_row(tmp_path):
    result = pd.DataFrame({"ours_ms": [0.01, 0.02, 0.5, 0.6], "graph_cold_ms": [0.009, 0.018, 0.45, 0.6],
                           "graph_warm_ms": [0.01, 0.02, 0.5, 0.54]})
    result.to_csv(tmp_path / "run.csv", index=False)
    with pytest.raises(SystemExit, match="--device"):
        graph_method_check.main(["--summarize", str(tmp_path / "run.csv"), "--out", str(tmp_path)])
    graph_method_check.main(["--summarize", str(tmp_path / "run.csv"), "--out", str(tmp_path), "--device", "GPU X"])
    text = (tmp_path / "graph_method_check.md").read_text()
    assert "on GPU X" in text and "| all | 4 | 0.900 | 1.000 |" in text   # medians over all four configs
