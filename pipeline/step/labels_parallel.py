"""Data-parallel validation on NeuSight's measured 4-GPU steps (``label/<GPU>/<model>-train-<seq>-<B>-dp4.json``).

A ``-dp4`` step trains a global batch ``B`` on 4 GPUs (``B/4`` each; the H100's ``gpt2_large-train-1024-4-dp4``,
195 ms, sits beside its one-GPU batch-1 step, 184 ms, not its batch-4 step, 639 ms). Its prediction: the one-GPU
step of batch ``B/4`` predicted on the destination from each origin's node table (``pipeline.step.labels``), plus
DDP's gradient copies and the part of its gradient all-reduce (4 GPUs, the destination's NVLink, the collective
model) that backward does not hide (``pipeline.step.parallel``).

Gradients come from the node table: the nodes with parameters (``acc_latency > 0``) -- Linear / Conv1D (``addmm``)
weight and bias, LayerNorm weight and bias, Embedding rows x width (rows from the models' published configs,
``EMBEDDING_ROWS``; they are not in the shapes) -- fp32, the repeated block ``num_layer`` times. Tied output
layers (GPT-2's ``lm_head``, BERT's MLM decoder weight) share the word embedding's parameter, whose gradient is
ready when the embedding's backward has run (last): they add no parameters of their own. Backward runs the nodes
in reverse order; a node's gradients are ready once its predicted backward (and gradient accumulation) has run.

    python -m pipeline.step.labels_parallel --extdata ../shared/extdata --out reports/
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline import gpus
from pipeline.atomic import atomic_write
from pipeline.ingest.neusight_nodes import read_node_table
from pipeline.step.labels import _FP32, MODES, _published_scalers, block_mask, label_gpus, node_ops, trace_kwargs
from pipeline.step.parallel import data_parallel_step
from pipeline.step.predict import predict_trace

__all__ = ["EMBEDDING_ROWS", "TIED", "dp_labels", "node_params", "dp_timeline", "validate_dp", "main"]

EMBEDDING_ROWS = {"transformer.wte": 50257, "transformer.wpe": 1024, "bert.embeddings.word_embeddings": 30522,
                  "bert.embeddings.position_embeddings": 512, "bert.embeddings.token_type_embeddings": 2}
"""Rows of the embeddings (Hugging Face configs: GPT-2 ``vocab_size`` 50257, ``n_positions`` 1024; BERT-Large
``vocab_size`` 30522, ``max_position_embeddings`` 512, ``type_vocab_size`` 2)."""
TIED = {"lm_head": "transformer.wte", "cls.predictions.decoder": "bert.embeddings.word_embeddings"}
"""Output layers whose weight is the word embedding's (their bias, if any, is their own)."""
_DP = re.compile(r"^(?P<model>.+)-train-(?P<seq>\d+)-(?P<batch>\d+)-dp(?P<world>\d+)\.json$")


def dp_labels(extdata) -> list[dict]:
    """Every measured data-parallel step of a registry GPU: dest, model, seq, global batch, world, e2e_ms."""
    import json

    out = []
    for gpu, folder in label_gpus(extdata).items():
        for path in sorted(folder.glob("*-dp*.json")):
            m = _DP.match(path.name)
            if m:
                out.append({"dest": gpu, "model": m["model"], "seq": int(m["seq"]), "batch": int(m["batch"]),
                            "world": int(m["world"]), "e2e_ms": float(json.loads(path.read_text())["e2e_latency"])})
    return out


def node_params(row) -> float:
    """Parameter elements a node of ``read_node_table`` owns (a tied output layer: only its own bias)."""
    out = row.out_shape or []
    target = str(row.target)
    if row.fn == "Embedding":
        return float(EMBEDDING_ROWS[target] * out[-1])
    if row.fn == "LayerNorm":
        return float(2 * out[-1])
    if row.fn == "addmm" and len(row.in_shapes) == 3:
        return float(math.prod(row.in_shapes[2]) + row.in_shapes[0][0])
    if row.fn in ("Linear", "Conv1D"):
        if target in TIED:  # the weight is the embedding's; BERT's decoder has a bias of its own
            return float(out[-1] if target == "cls.predictions.decoder" else 0)
        return float(row.in_shapes[0][-1] * out[-1] + out[-1])
    raise ValueError(f"node {target!r} ({row.fn}) has parameters this validation does not size")


def dp_timeline(nodes, pred: pd.DataFrame, num_layer: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A node table's predicted step as ops for ``data_parallel_step``: one forward row, then each node's predicted
    backward in reverse order (the block ``num_layer`` times); and the gradient table (fp32 parameters, ready after
    their node's backward). ``nodes``: the table as ``read_node_table`` returns it, or its CSV path."""
    nodes = nodes if isinstance(nodes, pd.DataFrame) else read_node_table(nodes)
    blocks = block_mask(nodes)
    weights = pred["pred_ms"].to_numpy(dtype=float) * pred["count"].to_numpy(dtype=float)
    forward_ms = float(weights[pred["phase"].to_numpy() == "forward"].sum())
    backward = pred[pred["phase"] == "backward"]
    bw_by_node = backward.groupby("node", sort=False)["pred_ms"].sum()
    names = nodes["Name"].astype(str) if "Name" in nodes else nodes["target"].astype(str)
    first, last = np.flatnonzero(blocks).min(), np.flatnonzero(blocks).max()
    order = list(range(first)) + list(range(first, last + 1)) * num_layer + list(range(last + 1, len(nodes)))
    ops = [{"seq": 0, "phase": "forward", "pred_ms": forward_ms}]
    grads = []
    for i in reversed(order):
        ops.append({"seq": len(ops), "phase": "backward", "pred_ms": float(bw_by_node.get(names.iloc[i], 0.0))})
        row = nodes.iloc[i]
        own = node_params(row) if row["acc_latency"] > 0 else 0.0
        if own:
            grads.append({"elements": own, "ready_seq": len(ops), "target": str(row["target"])})
    grads = pd.DataFrame(grads)
    grads = grads.assign(param=np.arange(len(grads))[::-1], bytes=(grads["elements"] * _FP32).astype(np.int64),
                         dtype="float32", numel=grads["elements"].astype(np.int64))
    return pd.DataFrame(ops), grads


def _dp_row(mode, label, origin, info, nodes, pred, model, scalers_share) -> dict:
    timeline, grads = dp_timeline(nodes, pred, int(info["num_layer"]))

    def comm(nbytes, _dtype):
        return model.time_ms("all_reduce", nbytes, label["world"], label["dest"], None)

    bandwidth = float(gpus.gpu_spec(label["dest"])["memory_bandwidth_gbps"])
    dp = data_parallel_step(timeline, grads, comm, copy_gbps=bandwidth)
    single = float(np.sum(pred["pred_ms"].to_numpy(dtype=float) * pred["count"].to_numpy(dtype=float)))
    total = single + dp["copy_ms"] + dp["exposed_ms"]
    return {"mode": mode, "model": label["model"], "seq": label["seq"], "dest": label["dest"], "world": label["world"],
            "global_batch": label["batch"], "gpu_batch": label["batch"] // label["world"], "origin": origin,
            "pred_single_ms": single, "comm_ms": dp["comm_ms"], "exposed_ms": dp["exposed_ms"],
            "ddp_copy_ms": dp["copy_ms"], "pred_overhead_ms": dp["copy_ms"] + dp["exposed_ms"],
            "buckets": dp["buckets"], "grad_MB": dp["grad_bytes"] / 1e6, "pred_dp_ms": total,
            "measured_dp_ms": label["e2e_ms"], "err_pct": 100 * (total / label["e2e_ms"] - 1),
            "scaler_share": scalers_share, "collectives": model.describe(label["dest"], None, label["world"])}


def validate_dp(extdata, modes=None, collective_model=None) -> pd.DataFrame:
    """One row per (mode, measured dp step, origin with the per-GPU batch's node table)."""
    from pipeline.collectives.model import CollectiveModel

    model = collective_model or CollectiveModel.load()
    scalers, _ = _published_scalers()
    modes = modes or (tuple(MODES) if scalers else ("wave",))
    folders = label_gpus(extdata)
    rows = []
    for label in dp_labels(extdata):
        config = f"{label['model']}-train-{label['seq']}-{label['batch'] // label['world']}"
        for origin, folder in folders.items():
            csv = folder / f"{config}.csv"
            if not (csv.exists() and csv.with_suffix(".json").exists()):
                continue
            ops, info = node_ops(csv)
            nodes = read_node_table(csv)  # parsed once for every mode
            for mode in modes:
                pred = predict_trace(ops, origin, label["dest"], **trace_kwargs(mode, scalers))
                w = pred["pred_ms"].to_numpy(dtype=float) * pred["count"].to_numpy(dtype=float)
                share = float(w[pred["method"].to_numpy() == "scaler"].sum() / w.sum())
                rows.append(_dp_row(mode, label, origin, info, nodes, pred, model, share))
    return pd.DataFrame(rows)


def _measured_single(extdata, frame: pd.DataFrame) -> pd.DataFrame:
    """The destination's own measured one-GPU step of the per-GPU batch, where NeuSight has it."""
    import json

    folders = label_gpus(extdata)
    singles = {}
    keys = ["dest", "model", "seq", "gpu_batch"]
    for key in frame[keys].drop_duplicates().itertuples(index=False):
        path = folders[key.dest] / f"{key.model}-train-{key.seq}-{key.gpu_batch}.json"
        singles[tuple(key)] = float(json.loads(path.read_text())["e2e_latency"]) if path.exists() else math.nan
    single = [singles[tuple(r)] for r in frame[keys].itertuples(index=False)]
    return frame.assign(measured_single_ms=single, measured_overhead_ms=frame["measured_dp_ms"] - np.array(single))


def write_dp_report(frame: pd.DataFrame, out, scalers: str = "") -> list[Path]:
    """``<out>/multigpu_neusight.md`` and ``.csv``; ``scalers`` says which published scalers the modes used."""
    from pipeline.markdown import markdown_table

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    csv = out / "multigpu_neusight.csv"
    atomic_write(csv, frame.to_csv(index=False))
    cols = ["mode", "dest", "gpu_batch", "origin", "pred_single_ms", "exposed_ms", "ddp_copy_ms", "pred_dp_ms",
            "measured_dp_ms", "err_pct", "measured_single_ms", "pred_overhead_ms", "measured_overhead_ms"]
    cross = frame[frame["origin"] != frame["dest"]]
    summary = (cross.assign(abs_err=cross["err_pct"].abs())
               .groupby(["mode", "dest", "gpu_batch"]).agg(origins=("origin", "size"), mean_abs_err=("abs_err", "mean"),
                                                          measured_dp_ms=("measured_dp_ms", "first")).reset_index())
    overhead = (frame.groupby(["dest", "gpu_batch"]).agg(
        measured_single_ms=("measured_single_ms", "first"), measured_dp_ms=("measured_dp_ms", "first"),
        measured_overhead_ms=("measured_overhead_ms", "first"), comm_ms=("comm_ms", "first"),
        pred_exposed_ms=("exposed_ms", "first"), pred_copy_ms=("ddp_copy_ms", "first"),
        pred_overhead_ms=("pred_overhead_ms", "first"), grad_MB=("grad_MB", "first"), buckets=("buckets", "first"))
        .reset_index())
    text = "\n\n".join([
        "# Data parallel: NeuSight's measured 4-GPU GPT-2-Large steps",
        "Regenerate: `python -m pipeline.step.labels_parallel --extdata ../shared/extdata --out reports/`. "
        "Prediction = the one-GPU step of the per-GPU batch predicted on the destination from each origin's node "
        "table + DDP's gradient copies (into and out of the buckets, at the memory bandwidth) + the all-reduce of "
        "DDP's buckets that backward does not hide (4 GPUs, NVLink, the collective model: "
        + "; ".join(sorted(set(frame["collectives"]))) + ")." + (f" Scalers: {scalers}." if scalers else "")
        + " Modes: " + ", ".join(sorted(set(frame["mode"]))) + " (`pipeline.step.labels.MODES`).",
        "## The data-parallel overhead alone\n\nThe measured 4-GPU step minus the destination's own measured "
        "one-GPU step of the same per-GPU batch (where NeuSight has one), against the predicted overhead (copies + "
        "exposed all-reduce; times in ms):\n\n" + markdown_table(overhead),
        "## Mean absolute error of the 4-GPU step, other GPUs as origin\n\n" + markdown_table(summary),
        "## Every origin (the destination as its own origin included: its error is its node table's composition "
        "gap plus the overhead's)\n\n" + markdown_table(frame[cols])])
    md = out / "multigpu_neusight.md"
    atomic_write(md, text + "\n")
    return [md, csv]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.step.labels_parallel",
                                 description="Validate data-parallel step prediction on NeuSight's 4-GPU steps.")
    ap.add_argument("--extdata", default="../shared/extdata")
    ap.add_argument("--out", default="reports")
    args = ap.parse_args(argv)
    try:
        frame = _measured_single(args.extdata, validate_dp(args.extdata))
        scalers = _published_scalers()[1]
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(frame.round(2).to_string(index=False))
    print("wrote " + ", ".join(map(str, write_dp_report(frame, args.out, scalers))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
