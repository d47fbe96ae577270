"""benchmarks/shape_errors.py: held-out errors split by real-model (catalog) against random shapes and by the
alignment of the dimensions that set the operands' row strides."""

from __future__ import annotations

import importlib.util

import pandas as pd
import pytest
import yaml
from conftest import ROOT

from pipeline import schema

spec = importlib.util.spec_from_file_location("shape_errors", ROOT / "benchmarks" / "shape_errors.py")
shape_errors = importlib.util.module_from_spec(spec)
spec.loader.exec_module(shape_errors)


def _bmm(batch, m, k, n, precision, ape, phase="forward"):
    cfg = {"batch": batch, "m": m, "k": k, "n": n}
    return {**cfg, "config_id": schema.config_id("bmm", cfg), "precision": precision, "phase": phase, "ape": ape}


def _conv(cin, cout, groups, precision, ape, size=56, batch=32, k=3, stride=1, pad=1, bias=False):
    cfg = {"batch": batch, "in_channels": cin, "out_channels": cout, "height": size, "width": size, "kernel_h": k,
           "kernel_w": k, "stride_h": stride, "stride_w": stride, "pad_h": pad, "pad_w": pad, "dilation_h": 1,
           "dilation_w": 1, "groups": groups, "bias": bias}
    return {**cfg, "config_id": schema.config_id("conv2d", cfg), "precision": precision, "phase": "forward",
            "ape": ape}


def test_catalog_ids_are_the_catalog_layers_within_the_space(tmp_path):
    (tmp_path / "catalog").mkdir()
    (tmp_path / "space").mkdir()
    (tmp_path / "catalog" / "conv2d.yaml").write_text(yaml.safe_dump({"batch": [32, 512], "models": {"net": [
        [56, 64, 64, 3, 1, 1, 1, False],
        [1024, 3, 64, 7, 2, 3, 1, False]]}}))   # input larger than the space's max_size: never drawn
    (tmp_path / "space" / "conv2d.yaml").write_text(yaml.safe_dump(
        {"gpu": {"max_batch": 256, "max_channels": 2048, "min_size": 1, "max_size": 512}}))
    ids = shape_errors.catalog_ids("conv2d", tmp_path)
    assert ids == {_conv(64, 64, 1, "fp32", 0.0)["config_id"]}   # batch 512 is over max_batch as well


def test_rows_are_labelled_by_origin_and_alignment():
    rows = pd.DataFrame([_bmm(8, 128, 64, 128, "bf16", 2.0),    # 16-byte rows in bf16
                         _bmm(8, 128, 60, 128, "bf16", 20.0),   # k = 60: 8-byte rows in bf16
                         _bmm(8, 128, 60, 128, "fp32", 4.0),    # the same k is 16-byte aligned in fp32
                         _bmm(2, 5, 7, 9, "fp32", 40.0)])
    catalog = {rows.loc[0, "config_id"]}
    out = shape_errors.label_rows(rows, "bmm", catalog)
    assert out["shape"].tolist() == ["catalog", "random", "random", "random"]
    assert out["alignment"].tolist() == ["aligned", "unaligned", "aligned", "unaligned"]


def test_conv2d_alignment_counts_channels_per_group():
    rows = pd.DataFrame([_conv(64, 64, 1, "bf16", 1.0),      # 64 channels: 128-byte rows
                         _conv(64, 64, 16, "bf16", 1.0),     # 4 channels per group: 8-byte rows in bf16
                         _conv(64, 64, 16, "fp32", 1.0),     # 16-byte rows in fp32
                         _conv(12, 64, 1, "bf16", 1.0)])     # 12 input channels: 8-byte rows in bf16
    out = shape_errors.label_rows(rows, "conv2d", set())
    assert out["alignment"].tolist() == ["aligned", "unaligned", "aligned", "unaligned"]
    assert set(out["shape"]) == {"random"}


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


def test_a_checkpoint_folder_without_the_op_fails_naming_it(tmp_path, monkeypatch):
    monkeypatch.setattr("sys.argv", ["shape_errors.py", "--op", "conv2d", "--checkpoints", str(tmp_path)])
    with pytest.raises(SystemExit) as e:
        shape_errors.main()
    assert "conv2d" in str(e.value) and str(tmp_path) in str(e.value)
