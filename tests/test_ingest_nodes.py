"""The NeuSight node-table parser (``read_node_table``, ``node_config``) and the ``neusight-label`` reader."""

from __future__ import annotations

from pathlib import Path

import ingest_fixtures as fx
import pandas as pd
import pytest
import yaml

from pipeline import ingest
from pipeline.ingest import neusight_nodes
from pipeline.ingest.common import Options, Report

REPO = Path(__file__).resolve().parents[1]
EXTDATA = (REPO / yaml.safe_load((REPO / "conf" / "ingest.yaml").read_text())["extdata"]).resolve()
REAL_GPT2 = EXTDATA / "neusight" / "label" / "NVIDIA_H100_80GB_HBM3" / "gpt2_large-train-1024-4.csv"


@pytest.fixture()
def gpt2_table(tmp_path) -> Path:
    path = tmp_path / "gpt2_large-train-1024-4.csv"
    pd.DataFrame(fx.gpt2_nodes()).to_csv(path, index=False)
    return path


def _configs(nodes: pd.DataFrame) -> dict:
    return {row.Name: ingest.node_config(row) for row in nodes.itertuples(index=False)}


def test_read_node_table_parses_shapes_and_callables(gpt2_table):
    nodes = ingest.read_node_table(gpt2_table)
    assert {"in_shapes", "out_shape", "fn", "module"} <= set(nodes.columns)
    addmm = nodes[nodes["Name"] == "addmm"].iloc[0]
    assert addmm["in_shapes"] == [[3840], [4096, 1280], [1280, 3840]] and addmm["out_shape"] == [4096, 3840]
    assert addmm["fn"] == "addmm" and addmm["module"] == "transformer"
    head = nodes[nodes["Name"] == "lm_head"].iloc[0]
    assert head["fn"] == "Linear" and head["module"] == "lm_head"
    assert nodes["fw_latency"].dtype == float
    assert nodes[nodes["op"] == "call_method"].iloc[0]["fn"] == "view"


def test_node_config_gemms(gpt2_table):
    configs = _configs(ingest.read_node_table(gpt2_table))
    assert configs["addmm"] == ("linear", {"batch": 4096, "in_features": 1280, "out_features": 3840, "bias": True})
    assert configs["matmul"] == ("bmm", {"batch": 80, "m": 1024, "k": 64, "n": 1024})
    assert configs["view_1"] is None and configs["input_ids"] is None and configs["output"] is None


def test_lm_head_has_no_bias_and_bert_decoder_has_one(gpt2_table, tmp_path):
    """GPT-2's lm_head is nn.Linear(n_embd, vocab, bias=False); BERT's MLM decoder gets the head's bias."""
    head = _configs(ingest.read_node_table(gpt2_table))["lm_head"]
    assert head == ("linear", {"batch": 4096, "in_features": 1280, "out_features": 50257, "bias": False})
    bert = tmp_path / "bert_large-inf-512-8.csv"
    pd.DataFrame(fx.bert_nodes()).to_csv(bert, index=False)
    configs = _configs(ingest.read_node_table(bert))
    assert configs["cls.predictions.decoder"] == ("linear", {"batch": 4096, "in_features": 1024,
                                                             "out_features": 30522, "bias": True})
    assert configs["cls.seq_relationship"][1] == {"batch": 8, "in_features": 1024, "out_features": 2, "bias": True}


@pytest.mark.parametrize("fn, ins, out, expected", [
    ("linear", [[2, 7, 16], [32, 16], [32]], [2, 7, 32],
     ("linear", {"batch": 14, "in_features": 16, "out_features": 32, "bias": True})),
    ("linear", [[5, 16], [32, 16]], [5, 32], ("linear", {"batch": 5, "in_features": 16, "out_features": 32,
                                                          "bias": False})),
    ("matmul", [[4, 9, 16], [16, 8]], [4, 9, 8],  # a 2-D weight: one GEMM over all 36 rows
     ("linear", {"batch": 36, "in_features": 16, "out_features": 8, "bias": False})),
    ("mm", [[9, 16], [16, 8]], [9, 8], ("linear", {"batch": 9, "in_features": 16, "out_features": 8, "bias": False})),
    ("baddbmm", [[3, 9, 8], [3, 9, 16], [3, 16, 8]], [3, 9, 8], ("bmm", {"batch": 3, "m": 9, "k": 16, "n": 8})),
    ("matmul", [[2, 1, 9, 16], [2, 4, 16, 8]], [2, 4, 9, 8], ("bmm", {"batch": 8, "m": 9, "k": 16, "n": 8})),
    ("matmul", [[4, 9, 16], [4, 15, 8]], [4, 9, 8], None),  # inner dims disagree
    ("addmm", [[8], [9, 16], [16, 7]], [9, 7], None),  # bias length is not the output width
    ("softmax", [[4, 9, 16]], [4, 9, 16], None),
])
def test_node_config_rules(fn, ins, out, expected):
    row = pd.Series({"op": "call_function", "target": f"<built-in method {fn} of type object at 0x1>", "fn": fn,
                     "in_shapes": ins, "out_shape": out})
    assert ingest.node_config(row) == expected


def test_missing_columns_name_the_file(tmp_path):
    path = tmp_path / "table.csv"
    pd.DataFrame(fx.gpt2_nodes()).drop(columns=["acc_latency"]).to_csv(path, index=False)
    with pytest.raises(ValueError, match=r"table.csv.*missing columns \['acc_latency'\]"):
        ingest.read_node_table(path)


def test_label_reader_phases_and_skipped_folders(tmp_path):
    fx.write_neusight_label(tmp_path)
    report = Report()
    tasks = neusight_nodes.SOURCE.tasks(tmp_path, Options(), report)
    assert report.skipped_gpu_folders == ["AMD_Instinct_MI100"]
    assert [t.kind for t in tasks] == ["train", "inf"]  # the .json beside a table is not a table
    train = tasks[0].reader(tasks[0])
    assert len(train) == 3 * 2 and set(train["phase"]) == {"forward", "backward"}
    head = train[(train["out_features"] == 50257) & (train["phase"] == "backward")].iloc[0]
    assert head["time_ms"] == 20.0 and head[ingest.META_PREFIX + "nodes"] == "gpt2_large-train-1024-4:lm_head"
    inf = tasks[1].reader(tasks[1])
    assert set(inf["phase"]) == {"forward"} and len(inf) == 3
    only_inf = neusight_nodes.SOURCE.tasks(tmp_path, Options(label_kinds=("inf",)), Report())
    assert [t.kind for t in only_inf] == ["inf"]


@pytest.mark.skipif(not REAL_GPT2.is_file(), reason="public NeuSight node tables not present beside the repo")
def test_real_gpt2_table_gemms():
    nodes = ingest.read_node_table(REAL_GPT2)
    gemms = [g for g in (ingest.node_config(r) for r in nodes.itertuples(index=False)) if g is not None]
    linear = {(c["batch"], c["in_features"], c["out_features"], c["bias"]) for op, c in gemms if op == "linear"}
    assert (4096, 1280, 3840, True) in linear and (4096, 1280, 50257, False) in linear
    assert {tuple(c.values()) for op, c in gemms if op == "bmm"} == {(80, 1024, 64, 1024), (80, 1024, 1024, 64)}
