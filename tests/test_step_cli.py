"""The step CLI (python -m pipeline.step), predict_step, and the price table (conf/prices.yaml)."""

import pytest

from pipeline import gpus
from pipeline.step import PRICES_PATH, load_prices, main, price_for

torch = pytest.importorskip("torch")


def test_price_table_entries_are_complete():
    prices = load_prices()
    assert {"a100-sxm4-40gb", "h100-sxm", "l4", "t4"} <= set(prices)
    for label, entry in prices.items():
        assert gpus.gpu_label(label) == label
        assert entry["price_usd_per_hour"] > 0
        assert entry["date"][:2] == "20" and entry["source"]


def test_unknown_or_unpriced_gpu_is_a_clear_error():
    with pytest.raises(ValueError, match="no price for GPU 'h200'.*conf/prices.yaml"):
        price_for("h200")
    with pytest.raises(ValueError, match="unknown GPU"):
        price_for("not-a-gpu")
    assert price_for("NVIDIA L4")["price_usd_per_hour"] == load_prices()["l4"]["price_usd_per_hour"]


@pytest.mark.parametrize("entry, message", [
    ("  price_usd_per_hour: 1.0\n    date: '2024'\n", "missing \\['source'\\]"),
    ("  price_usd_per_hour: -1\n    date: '2024'\n    source: x\n", "must be a number > 0"),
    ("  price_usd_per_hour: 1.0\n    date: 'last year'\n    source: x\n", "date must be"),
])
def test_bad_price_entries_are_rejected(tmp_path, entry, message):
    path = tmp_path / "prices.yaml"
    path.write_text("prices:\n  l4:\n  " + entry)
    with pytest.raises(ValueError, match=message):
        load_prices(path)
    path.write_text("prices:\n  nope-gpu:\n    price_usd_per_hour: 1\n    date: '2024'\n    source: x\n")
    with pytest.raises(ValueError, match="unknown GPU"):
        load_prices(path)


def test_repo_price_table_is_the_default():
    assert PRICES_PATH.name == "prices.yaml" and PRICES_PATH.parent.name == "conf"


def test_cli_refuses_cpu_origin(capsys):
    rc = main(["--model", "bert", "--tiny", "--batch", "2", "--gpus", "a100", "--device", "cpu"])
    assert rc == 2
    assert "--origin-gpu" in capsys.readouterr().err


def test_cli_tiny_model_table_and_plot(tmp_path, capsys):
    plot, csv = tmp_path / "step.png", tmp_path / "step.csv"
    rc = main(["--model", "bert", "--tiny", "--batch", "2", "--precision", "fp32", "--gpus", "l4,h100,h200",
               "--device", "cpu", "--origin-gpu", "a100", "--warmup", "1", "--repeats", "1",
               "--plot", str(plot), "--csv", str(csv), "--no-scalers"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "DEMO" in out and "h100-sxm" in out and "l4" in out and "(none: --no-scalers)" in out
    assert plot.exists() and plot.stat().st_size > 1000
    import pandas as pd
    table = pd.read_csv(csv)
    assert list(table["step_ms"]) == sorted(table["step_ms"])  # sorted by predicted time
    row = table.set_index("gpu").loc["h100-sxm"]
    assert row["usd_per_1k_steps"] == pytest.approx(row["step_ms"] * row["usd_per_hour"] / 3600)
    assert row["steps_per_s"] == pytest.approx(1000 / row["step_ms"])
    assert "no price" in str(table.set_index("gpu").loc["h200", "note"])


def test_predict_step_python_entry_point_marks_unsupported_precision():
    from pipeline.step import predict_step
    from pipeline.step.models import make_step
    step = make_step("bert", 2, "bf16", "cpu", tiny=True)
    res = predict_step(step, ["a100", "t4"], origin_gpu="h100", warmup=1, repeats=1, scalers=False)
    t = res.table.set_index("gpu")
    assert res.demo and res.origin == "h100-sxm"
    assert t.loc["a100-sxm4-40gb", "step_ms"] > 0
    assert pd_isna(t.loc["t4", "step_ms"]) and "bf16" in t.loc["t4", "note"]


def pd_isna(v):
    import math
    return v is None or (isinstance(v, float) and math.isnan(v))


def test_cli_scaler_mode_defaults_to_the_calibrated_transfer_and_takes_the_others():
    from pipeline.step.cli import _parser

    assert _parser().parse_args([]).scaler_mode == "calibrated"
    assert _parser().parse_args(["--scaler-mode", "ratio"]).scaler_mode == "ratio"
    with pytest.raises(SystemExit):
        _parser().parse_args(["--scaler-mode", "habitat"])


def test_built_in_steps_autotune_cudnn_as_training_scripts_do(monkeypatch):
    """The conv2d scalers predict autotuned algorithms, so a built-in step turns cuDNN's autotuning on."""
    import torch

    from pipeline.step.models import make_step

    monkeypatch.setattr(torch.backends.cudnn, "benchmark", False)
    make_step("dcgan", 1, "fp32", "cpu", tiny=True)()
    assert torch.backends.cudnn.benchmark is True
