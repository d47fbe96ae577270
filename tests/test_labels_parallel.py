"""Data-parallel validation on NeuSight's 4-GPU steps (pipeline.step.labels_parallel)."""

from pathlib import Path

import pandas as pd
import pytest
from ingest_fixtures import _csv, bert_nodes, gpt2_nodes

from pipeline.ingest import read_node_table
from pipeline.step import labels_parallel as lp

EXTDATA = Path(__file__).resolve().parents[1].parent / "shared" / "extdata"
GPT2 = EXTDATA / "neusight" / "label" / "NVIDIA_H100_80GB_HBM3" / "gpt2_large-train-1024-1.csv"


def test_parameters_of_nodes_tied_heads_own_only_their_bias(tmp_path):
    gpt2 = read_node_table(_csv(tmp_path / "g.csv", gpt2_nodes())).set_index("Name")
    assert lp.node_params(gpt2.loc["addmm"]) == 1280 * 3840 + 3840  # Conv1D through addmm: weight and bias
    assert lp.node_params(gpt2.loc["lm_head"]) == 0  # tied to the word embedding
    bert = read_node_table(_csv(tmp_path / "b.csv", bert_nodes())).set_index("Name", drop=False)
    assert lp.node_params(bert.loc["cls.predictions.decoder"]) == 30522  # tied weight, its own bias
    assert lp.node_params(bert.loc["cls.seq_relationship"]) == 1024 * 2 + 2


needs_data = pytest.mark.skipif(not GPT2.exists(), reason="the shared NeuSight label data is not next to the repo")


@needs_data
def test_gpt2_large_gradients_and_their_order():
    from pipeline.step.labels import node_ops
    from pipeline.step.predict import predict_trace
    ops, info = node_ops(GPT2)
    pred = predict_trace(ops, "h100", "h100", scalers=False)
    timeline, grads = lp.dp_timeline(GPT2, pred, info["num_layer"])
    assert int(grads["numel"].sum()) == 774_030_080  # GPT-2 Large, the published parameter count
    assert timeline["pred_ms"].sum() == pytest.approx((pred["pred_ms"] * pred["count"]).sum())
    wte = grads[grads["target"] == "transformer.wte"]
    assert wte["ready_seq"].item() == grads["ready_seq"].max()  # the embedding (and the tied lm_head): last


@needs_data
def test_dp_steps_are_found_and_predicted():
    labels = pd.DataFrame(lp.dp_labels(EXTDATA))
    a100 = labels[labels["dest"] == "a100-sxm4-40gb"]
    assert a100[["model", "batch", "world"]].values.tolist() == [["gpt2_large", 4, 4]]
    frame = lp.validate_dp(EXTDATA, modes=("wave",))
    row = frame[(frame["dest"] == "a100-sxm4-40gb") & (frame["origin"] == "a100-pcie-80gb")].iloc[0]
    assert row["gpu_batch"] == 1 and row["measured_dp_ms"] == pytest.approx(452.3, abs=0.1)
    assert row["pred_dp_ms"] == pytest.approx(row["pred_single_ms"] + row["ddp_copy_ms"] + row["exposed_ms"])
    assert 0 < row["exposed_ms"] < row["comm_ms"]  # most of the all-reduce hides behind backward
