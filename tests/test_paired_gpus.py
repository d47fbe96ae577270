"""benchmarks/paired_gpus.py on two small own-label datasets written here: rows pair by config, precision and
phase (only rows ok on both GPUs), and the table's errors are those of the pairs."""

from __future__ import annotations

import sys

import pandas as pd
import pytest
from conftest import ROOT

from pipeline import schema

sys.path.insert(0, str(ROOT / "benchmarks"))
import paired_gpus  # noqa: E402

CONFIGS = [{"batch": 4096, "in_features": 4096, "out_features": 4096, "bias": True},
           {"batch": 1024, "in_features": 8192, "out_features": 2048, "bias": False},
           {"batch": 256, "in_features": 1024, "out_features": 1024, "bias": True}]


def _write(root, gpu, times, statuses):
    rows = []
    for config, ms, status in zip(CONFIGS, times, statuses):
        for phase, scale in (("forward", 1.0), ("backward", 2.0)):
            rows.append({"config_id": schema.config_id("linear", config), "precision": "bf16", "phase": phase,
                         "time_ms": ms * scale, "status": status, **config})
    path = root / f"gpu={gpu}" / "op=linear"
    path.mkdir(parents=True)
    pd.DataFrame(rows).to_parquet(path / "part-0.parquet")


def test_pairs_only_rows_ok_on_both_and_reports_their_errors(tmp_path):
    _write(tmp_path, "h200", [1.0, 0.5, 0.02], ["ok", "ok", "ok"])
    _write(tmp_path, "h100-sxm", [1.1, 0.5, 0.03], ["ok", "ok", "timeout"])
    pairs = paired_gpus.paired(tmp_path, "h200", "h100-sxm", "linear")
    assert len(pairs) == 4 and set(pairs["phase"]) == {"forward", "backward"}   # the third config failed on one
    frame = paired_gpus.carried(pairs, "linear", "h200", "h100-sxm")
    assert (frame["origin"] == frame["origin_ms"]).all() and (frame[["model", "transfer", "scale"]] > 0).all().all()
    table = paired_gpus.summary(frame, ["precision"])
    assert table.loc[0, "pairs"] == 4
    assert table.loc[0, "origin mean %"] == "4.5"        # |1.0 - 1.1| / 1.1 twice, 0 twice: 4.5 %
    assert table.loc[0, "measured dest/origin (median)"] == "1.050"
    out = tmp_path / "report"
    paired_gpus.main(["--root", str(tmp_path), "--ops", "linear", "--out", str(out)])
    text = out.with_suffix(".md").read_text()
    assert "| linear | bf16 | 4 |" in text and "memory bandwidth 0.70" in text
    assert out.with_suffix(".png").stat().st_size > 0


def test_a_label_without_rows_is_a_clear_error(tmp_path):
    _write(tmp_path, "h200", [1.0, 0.5, 0.02], ["ok", "ok", "ok"])
    with pytest.raises(ValueError, match=r"^--origin/--dest: no rows of linear under .*gpu=h100-sxm"):
        paired_gpus.paired(tmp_path, "h200", "h100-sxm", "linear")


def test_versions_pick_a_published_scaler_and_bad_ones_are_named(tmp_path):
    from pipeline import load_scaler

    assert paired_gpus.parse_versions("lstm=18, conv2d=30") == {"lstm": 18, "conv2d": 30}
    assert paired_gpus.parse_versions("") == {}
    for bad in ("lstm", "lstm=x", "gemm=3", "lstm=-1"):
        with pytest.raises(ValueError, match=r"^--versions: expected op=version pairs"):
            paired_gpus.parse_versions(bad)
    _write(tmp_path, "h200", [1.0, 0.5, 0.02], ["ok", "ok", "ok"])
    _write(tmp_path, "h100-sxm", [1.1, 0.5, 0.03], ["ok", "ok", "ok"])
    older = load_scaler("linear").version - 1
    out = tmp_path / "report"
    paired_gpus.main(["--root", str(tmp_path), "--ops", "linear", "--versions", f"linear={older}", "--out", str(out)])
    assert f"--versions linear={older}` (scalers linear v{older})" in out.with_suffix(".md").read_text()
