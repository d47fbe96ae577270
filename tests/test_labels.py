"""NeuSight node tables -> trace ops and the composed whole step (pipeline.step.labels), on one real label file."""

import json
from pathlib import Path

import numpy as np
import pytest

from pipeline.step import labels, predict_trace

EXTDATA = Path(__file__).resolve().parents[1].parent / "shared" / "extdata"
LABEL = EXTDATA / "neusight" / "label" / "NVIDIA_A100_80GB_PCIe" / "bert_large-train-512-8.csv"
GPT2 = EXTDATA / "neusight" / "label" / "NVIDIA_H100_80GB_HBM3" / "gpt2_large-train-1024-1.csv"

pytestmark = pytest.mark.skipif(not LABEL.exists(), reason="the shared NeuSight label data is not next to the repo")


@pytest.fixture(scope="module")
def bert():
    return labels.node_ops(LABEL)


def test_linear_and_bmm_nodes_map_to_canonical_configs(bert):
    ops, info = bert
    assert info["num_layer"] == 24
    lin = ops[(ops["op"] == "linear") & (ops["phase"] == "forward")]
    # per layer: q, k, v, attention output (1024 -> 1024), FFN up (1024 -> 4096) and down; outside: pooler,
    # transform, decoder (1024 -> 30522), seq_relationship
    assert set(zip(lin["batch"], lin["in_features"], lin["out_features"])) >= {
        (4096, 1024, 1024), (4096, 1024, 4096), (4096, 4096, 1024), (4096, 1024, 30522), (8, 1024, 2)}
    bmm = ops[(ops["op"] == "bmm") & (ops["phase"] == "forward")]
    assert set(zip(bmm["batch"], bmm["m"], bmm["k"], bmm["n"])) == {(128, 512, 64, 512), (128, 512, 512, 64)}
    assert set(ops.loc[ops["op"].isin(["linear", "bmm"]) & (ops["phase"] == "backward"), "scaler_phase"]) == \
        {"backward"}
    assert set(ops["precision"]) == {"fp32"}


def test_repeated_block_is_counted_num_layer_times(bert):
    ops, info = bert
    q = ops[ops["node"].str.contains("layer_0_attention_self_query")]
    assert set(q["count"]) == {24}
    decoder = ops[ops["node"] == "cls_predictions_decoder"]
    assert set(decoder["count"]) == {1}
    nodes = labels.read_node_table(LABEL)
    mask = labels.block_mask(nodes)
    assert mask.sum() == info["block_nodes"] and 0 < mask.sum() < len(nodes)
    assert not mask[nodes["Name"] == "bert_pooler_dense"].any()


def test_composed_step_is_near_the_measured_step(bert):
    ops, info = bert
    comp = labels.compose(ops)
    raw = labels.read_node_table(LABEL)
    mask = labels.block_mask(raw)
    cols = ["fw_latency", "bw_latency", "acc_latency"]
    by_hand = raw.loc[~mask, cols].to_numpy().sum() + 24 * raw.loc[mask, cols].to_numpy().sum()
    all_ops, _ = labels.node_ops(LABEL, kernel_only=False)
    assert labels.compose(all_ops)["total"] == pytest.approx(by_hand)
    assert comp["total"] < by_hand  # views and Python scalar nodes dropped
    assert abs(comp["total"] / json.loads(LABEL.with_suffix(".json").read_text())["e2e_latency"] - 1) < 0.25


def test_prediction_from_a_node_table_runs_wave_only(bert):
    ops, _ = bert
    same = predict_trace(ops, "a100-80gb-pcie", "a100-80gb-pcie", scalers=False)
    w = same["count"].to_numpy()
    assert np.sum(same["pred_ms"] * w) == pytest.approx(labels.compose(ops)["total"])
    h100 = predict_trace(ops, "a100-80gb-pcie", "h100", scalers=False)
    assert np.sum(h100["pred_ms"] * w) < np.sum(same["pred_ms"] * w)


@pytest.mark.skipif(not GPT2.exists(), reason="GPT-2 label file missing")
def test_gpt2_addmm_and_block_detection():
    ops, info = labels.node_ops(GPT2)
    assert info["num_layer"] == 36
    lin = ops[(ops["op"] == "linear") & (ops["phase"] == "forward")]
    assert (1024, 1280, 3840) in set(zip(lin["batch"], lin["in_features"], lin["out_features"]))
    attn = lin[lin["out_features"] == 3840]
    assert set(attn["count"]) == {36}
    head = lin[lin["out_features"] == 50257]
    assert set(head["count"]) == {1}


def test_validation_modes_and_their_predict_trace_arguments(bert):
    assert labels.trace_kwargs("wave", {"x": 1}) == {"scalers": False}
    assert labels.trace_kwargs("scalers", {"x": 1}) == {"scalers": {"x": 1}, "scaler_mode": "calibrated"}
    assert labels.trace_kwargs("scalers-direct", {"x": 1}) == {"scalers": {"x": 1}, "scaler_mode": "direct"}
    assert labels.trace_kwargs("scalers-ratio", {"x": 1}) == {"scalers": {"x": 1}, "scaler_mode": "ratio"}
    with pytest.raises(ValueError, match="modes: 'habitat' is not one of wave, scalers, scalers-direct, scalers-ratio"):
        labels.trace_kwargs("habitat", {})
    # one origin table, two destinations, both scaler modes: the same table on its own GPU gives its own sum back
    ops, _ = bert
    w = ops["count"].to_numpy()
    for mode in ("scalers-direct", "scalers-ratio"):
        same = predict_trace(ops, "a100-80gb-pcie", "a100-80gb-pcie", **labels.trace_kwargs(mode, None))
        assert np.sum(same["pred_ms"] * w) == pytest.approx(labels.compose(ops)["total"])
    direct = predict_trace(ops, "a100-80gb-pcie", "h100", **labels.trace_kwargs("scalers-direct", None))
    ratio = predict_trace(ops, "a100-80gb-pcie", "h100", **labels.trace_kwargs("scalers-ratio", None))
    gemm = direct["method"].to_numpy() == "scaler"
    assert gemm.any() and (ratio["method"].to_numpy()[gemm] == "scaler").all()
    assert not np.allclose(direct["pred_ms"][gemm], ratio["pred_ms"][gemm])
