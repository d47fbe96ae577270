"""Tracking a training step on the CPU (pipeline.step.track) and predicting it (predict_trace, Trace.to)."""

import math

import numpy as np
import pandas as pd
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

from pipeline import schema  # noqa: E402
from pipeline.schema import OP_CONFIG_COLUMNS  # noqa: E402
from pipeline.step import Trace, predict_trace, track  # noqa: E402


class _Net(nn.Module):
    """Small model with one op of each kind: conv2d, linear (3-D input), LSTM (2 layers, bidirectional), bmm."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, kernel_size=3, stride=2, padding=1)
        self.fc = nn.Linear(8, 5)
        self.rnn = nn.LSTM(5, 6, num_layers=2, bidirectional=True, batch_first=True)

    def forward(self, x):
        y = self.conv(x).mean((2, 3))                               # [2, 8]
        y = self.fc(y.unsqueeze(1).expand(-1, 4, -1).contiguous())  # [2, 4, 5]
        z, _ = self.rnn(y)                                          # [2, 4, 12]
        return torch.bmm(z, z.transpose(1, 2)).sum()


def _step_fn(autocast_dtype=None):
    torch.manual_seed(0)
    net = _Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(2, 3, 10, 10)

    def step():
        opt.zero_grad(set_to_none=True)
        if autocast_dtype is None:
            loss = net(x)
        else:
            with torch.autocast("cpu", dtype=autocast_dtype):
                loss = net(x)
        loss.backward()
        opt.step()

    return step


@pytest.fixture(scope="module")
def fp32_trace():
    torch.backends.cudnn.allow_tf32 = False
    return track(_step_fn(), warmup=1, repeats=1)


def test_trace_columns_phases_and_times(fp32_trace):
    ops = fp32_trace.ops
    for col in ("name", "op", "phase", "precision", "time_ms", "flops", "bytes", *schema.CONFIG_COLUMNS):
        assert col in ops
    assert set(ops["phase"]) == {"forward", "backward", "optimizer"}
    assert set(ops["op"]) == {"conv2d", "linear", "bmm", "lstm", "other"}
    # the optimizer's momentum update runs under optimizer.step, nothing of the model's ops does
    assert ops.loc[ops["phase"] == "optimizer", "op"].eq("other").all()
    assert ops["name"][ops["phase"] == "optimizer"].str.contains("add|mul|lerp|_foreach").any()
    assert (ops["time_ms"] >= 0).all() and fp32_trace.total_ms > 0 and fp32_trace.tracked_ms > 0
    assert math.isfinite(fp32_trace.coverage) and fp32_trace.overhead > 0
    b = fp32_trace.breakdown()
    assert b.loc["total", "total"] == pytest.approx(fp32_trace.tracked_ms)
    assert set(ops["precision"]) == {"fp32"}


def test_trace_records_the_cudnn_benchmark_flag(fp32_trace, monkeypatch):
    """conv2d scalers predict autotuned algorithms: the trace says whether the step autotuned (on a GPU with the
    flag off, track warns; tests/test_gpu.py)."""
    assert fp32_trace.meta["cudnn_benchmark"] is bool(torch.backends.cudnn.benchmark)
    assert f"cudnn.benchmark {bool(torch.backends.cudnn.benchmark)}" in fp32_trace.summary()
    flipped = not torch.backends.cudnn.benchmark
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", flipped)
    assert track(_step_fn(), warmup=0, repeats=1).meta["cudnn_benchmark"] is flipped


def test_ops_map_to_canonical_configs(fp32_trace):
    ops = fp32_trace.ops
    conv = ops[(ops["op"] == "conv2d") & (ops["phase"] == "forward")].iloc[0]
    shape = (conv["batch"], conv["in_channels"], conv["out_channels"], conv["height"], conv["width"])
    assert shape == (2, 3, 8, 10, 10)
    assert (conv["kernel_h"], conv["stride_h"], conv["pad_w"], conv["groups"], bool(conv["bias"])) == (3, 2, 1, 1, True)
    assert conv["flops"] == 2 * 2 * 8 * 5 * 5 * 3 * 3 * 3
    convb = ops[(ops["op"] == "conv2d") & (ops["phase"] == "backward")]
    assert len(convb) == 1 and convb.iloc[0]["scaler_phase"] == "backward"

    lin = ops[ops["op"] == "linear"]
    fwd = lin[lin["phase"] == "forward"].iloc[0]  # 3-D input [2, 4, 8] -> an addmm of 8 rows
    assert (fwd["batch"], fwd["in_features"], fwd["out_features"], bool(fwd["bias"])) == (8, 8, 5, True)
    bwd = lin[lin["phase"] == "backward"]      # the two GEMMs of its backward, each with its own shape
    shapes = {(r.batch, r.in_features, r.out_features) for r in bwd.itertuples()}
    assert shapes == {(8, 5, 8), (5, 8, 8)}
    assert set(bwd["scaler_phase"]) == {"forward"}

    bmm = ops[(ops["op"] == "bmm") & (ops["phase"] == "forward")].iloc[0]
    assert (bmm["batch"], bmm["m"], bmm["k"], bmm["n"]) == (2, 4, 12, 4)
    assert (ops[ops["op"] == "bmm"]["phase"] == "backward").sum() == 2

    lstm = ops[(ops["op"] == "lstm") & (ops["phase"] == "forward")]
    first = lstm.iloc[0]  # the CPU runs one mkldnn layer per layer and direction
    assert (first["batch"], first["seq_len"], first["input_size"], first["hidden_size"]) == (2, 4, 5, 6)
    assert len(lstm) == 4 and set(lstm["input_size"]) == {5, 12}
    assert (ops[ops["op"] == "lstm"]["phase"] == "backward").sum() == 4


def test_autocast_bf16_precision_on_cpu():
    trace = track(_step_fn(torch.bfloat16), warmup=1, repeats=1)
    ops = trace.ops
    for kind in ("conv2d", "linear", "bmm"):
        assert set(ops.loc[ops["op"] == kind, "precision"]) == {"bf16"}, kind
    assert ops["name"].str.contains("_to_copy").any()  # autocast's casts are tracked too


def test_tf32_flag_marks_fp32_matmuls(monkeypatch):
    prev = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("high")
        trace = track(_step_fn(), warmup=0, repeats=1)
    finally:
        torch.set_float32_matmul_precision(prev)
    ops = trace.ops
    assert set(ops.loc[ops["op"].isin(["linear", "bmm"]), "precision"]) == {"tf32"}
    assert set(ops.loc[ops["op"] == "other", "precision"]) == {"fp32"}


class _StubScaler:
    """TEST DOUBLE, not a model: scales every config by a fixed factor and records its calls."""

    def __init__(self, factor):
        self.factor, self.calls = factor, []

    def scale(self, configs, measured_ms, origin, dest, precision="fp32", phase="forward"):
        self.calls.append((list(configs.columns), len(configs), precision, phase))
        return np.asarray(measured_ms, dtype=float) * self.factor


def test_predict_trace_uses_injected_scalers_and_wave_for_the_rest(fp32_trace):
    stubs = {op: _StubScaler(0.5) for op in ("conv2d", "linear", "bmm", "lstm")}
    pred = fp32_trace.to("h100", origin="a100", scalers=stubs, scaler_mode="ratio")
    ops = pred.ops
    mapped = ops[ops["op"] != "other"]
    timed = mapped["time_ms"] > 0
    assert (mapped.loc[timed, "method"] == "scaler").all()
    np.testing.assert_allclose(mapped.loc[timed, "pred_ms"], mapped.loc[timed, "time_ms"] * 0.5)
    assert set(ops.loc[ops["op"] == "other", "method"]) <= {"wave-launch", "wave-gamma", "wave-bandwidth", "zero"}
    conv_phases = {c[3] for c in stubs["conv2d"].calls}
    assert conv_phases == {"forward", "backward"}          # convolution_backward uses the backward scaler
    assert {c[3] for c in stubs["linear"].calls} == {"forward"}  # GEMMs of the backward are GEMMs
    assert stubs["linear"].calls[0][0] == list(OP_CONFIG_COLUMNS["linear"])
    assert pred.total_ms == pytest.approx(ops["pred_ms"].sum())
    assert pred.breakdown().loc["total", "total"] == pytest.approx(pred.total_ms)


def test_predict_trace_wave_only_fallback_and_notes(fp32_trace):
    pred = predict_trace(fp32_trace.ops, "a100", "h100", scalers=False)
    assert (pred["method"] != "scaler").all() and pred["pred_ms"].notna().all()
    assert (pred.loc[pred["op"] == "conv2d", "note"] == "scalers disabled").all()
    same = predict_trace(fp32_trace.ops, "h100", "h100", scalers=False)
    np.testing.assert_allclose(same["pred_ms"], same["time_ms"])


def test_cpu_origin_is_refused_with_the_way_out(fp32_trace):
    assert fp32_trace.origin == "cpu"
    with pytest.raises(ValueError, match="CPU"):
        fp32_trace.to("h100")


def test_ops_from_elsewhere_and_unsupported_precision():
    ops = pd.DataFrame({"op": ["linear", "other", "other"], "phase": ["forward", "backward", "forward"],
                        "precision": ["bf16", "bf16", "fp32"], "time_ms": [1.0, 0.2, 0.001],
                        "flops": [2e9, 1e6, 1e3], "bytes": [1e7, 1e7, 1e3], "batch": [64, None, None],
                        "in_features": [1024, None, None], "out_features": [1024, None, None],
                        "bias": [True, None, None]})
    pred = predict_trace(ops, "h100", "v100", scalers=False)  # V100 has no bf16
    assert list(pred["method"]) == ["unsupported", "unsupported", "wave-launch"]
    assert pred["pred_ms"].isna().sum() == 2
    with pytest.raises(ValueError, match="op kinds"):
        predict_trace(ops.assign(op=["conv3d", "other", "other"]), "h100", "a100")


def test_trace_save_and_load_roundtrip(tmp_path, fp32_trace):
    fp32_trace.save(tmp_path / "t")
    back = Trace.load(tmp_path / "t")
    assert back.total_ms == pytest.approx(fp32_trace.total_ms)
    assert len(back.ops) == len(fp32_trace.ops)
    assert back.tracked_ms == pytest.approx(fp32_trace.tracked_ms)
