"""benchmarks/shape_errors.py: held-out errors split by real-model (catalog) against random shapes and by the
alignment of the dimensions that set the operands' row strides."""

from __future__ import annotations

import importlib.util

import pandas as pd
import pytest
import yaml
from conftest import ROOT

from pipeline import schema
from pipeline.ops import get_op

spec = importlib.util.spec_from_file_location("shape_errors", ROOT / "benchmarks" / "shape_errors.py")
shape_errors = importlib.util.module_from_spec(spec)
spec.loader.exec_module(shape_errors)


def _bmm(batch, m, k, n, precision, ape, phase="forward"):
    cfg = {"batch": batch, "m": m, "k": k, "n": n}
    return {**cfg, "config_id": schema.config_id("bmm", cfg), "precision": precision, "phase": phase, "ape": ape}


def test_catalog_ids_are_the_collectors_real_shapes(tmp_path):
    (tmp_path / "catalog").mkdir()
    (tmp_path / "space").mkdir()
    space = yaml.safe_load((ROOT / "conf" / "space" / "bmm.yaml").read_text())
    (tmp_path / "space" / "bmm.yaml").write_text(yaml.safe_dump(space))
    catalog = yaml.safe_load((ROOT / "conf" / "catalog" / "bmm.yaml").read_text())
    (tmp_path / "catalog" / "bmm.yaml").write_text(yaml.safe_dump(catalog))
    ids = shape_errors.catalog_ids("bmm", tmp_path)
    real = get_op("bmm").real_shapes(catalog, space["gpu"])
    assert ids and ids == {schema.config_id("bmm", c) for c in real}
    assert schema.config_id("bmm", {"batch": 3, "m": 7, "k": 13, "n": 11}) not in ids


def test_rows_are_labelled_by_origin_and_alignment():
    rows = pd.DataFrame([_bmm(8, 128, 64, 128, "bf16", 2.0),    # 16-byte rows in bf16
                         _bmm(8, 128, 60, 128, "bf16", 20.0),   # k = 60: 8-byte rows in bf16
                         _bmm(8, 128, 60, 128, "fp32", 4.0),    # the same k is 16-byte aligned in fp32
                         _bmm(2, 5, 7, 9, "fp32", 40.0)])
    catalog = {rows.loc[0, "config_id"]}
    out = shape_errors.label_rows(rows, "bmm", catalog)
    assert out["shape"].tolist() == ["catalog", "random", "random", "random"]
    assert out["alignment"].tolist() == ["aligned", "unaligned", "aligned", "unaligned"]


def test_summary_has_cells_and_a_total_per_group():
    rows = pd.DataFrame([_bmm(8, 128, 64, 128, "bf16", 2.0), _bmm(8, 256, 64, 128, "bf16", 4.0),
                         _bmm(2, 5, 7, 9, "bf16", 30.0), _bmm(2, 5, 7, 9, "fp32", 50.0, "backward")])
    out = shape_errors.label_rows(rows, "bmm", set(rows["config_id"][:2]))
    table = shape_errors.summary(out, "shape").set_index(["precision", "phase", "shape"])
    assert table.loc[("bf16", "forward", "catalog"), "rows"] == 2
    assert table.loc[("bf16", "forward", "catalog"), "mape"] == pytest.approx(3.0)
    assert table.loc[("all", "all", "random"), "mape"] == pytest.approx(40.0)
    text = shape_errors.markdown("bmm", 13, "h200", 0.05, out)
    assert "| fp32 | backward | 0 | - | 1 | 50.0 |" in text
    assert "| all | all | 2 | 3.0 | 2 | 40.0 |" in text
