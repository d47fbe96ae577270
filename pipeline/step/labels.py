"""Whole-model validation on NeuSight's measured training steps of BERT-Large and GPT-2-Large across GPUs.

NeuSight's ``label/<GPU>/<model>-train-<seq>-<batch>.csv`` is a torch.fx node table of one transformer layer
plus the layers outside the repeated block, each node timed alone (forward ``fw_latency``, backward
``bw_latency``, gradient accumulation of its parameters ``acc_latency``, ms; fp32, TF32 off). The ``.json``
next to it holds the measured whole step (``e2e_latency``) and ``num_layer``, the number of repeats of the block.

``node_ops`` turns a table into trace ops (``pipeline.step.TRACE_COLUMNS``):

- ``Linear`` modules and ``addmm`` calls (GPT-2's Conv1D) -> ``linear`` (batch = rows, in/out features),
  ``matmul`` of >= 3-D operands and ``bmm`` -> ``bmm`` (batch = product of the leading dims), a 2-D ``matmul``
  -> ``linear`` without bias. Their backward row is the module's whole backward (``scaler_phase="backward"``).
  FLOPs, bytes and thread blocks come from ``pipeline.physics``, as for a tracked step.
- every other node -> ``other``, FLOPs and bytes estimated from its shapes (fp32, ~1 FLOP per element, bytes of
  inputs + output; backward: the same FLOPs, twice the bytes); the ``acc_latency`` of a node with parameters is
  an ``other`` backward row without counters (scaled by the bandwidth ratio).
- the repeated block: nodes whose module path (fx ``nn_module_stack``, or a ``get_attr`` target) contains
  ``.layer.0`` / ``.h.0`` / ``.layers.0`` / ``.blocks.0`` get ``count = num_layer``; the rest count once.
- ``kernel_only=True`` (default) drops nodes that launch no GPU kernel in a real run -- placeholders, outputs,
  attribute reads, Python scalar arithmetic on sizes, and views (view, permute, transpose, getitem, expand,
  split, unsqueeze, no-op ``to``/``type``) -- whose isolated timing is only the CUDA-event floor (~0.01 ms).

``validate`` composes each GPU's step from its own table (sum of time x count) and compares it with the measured
``e2e_latency`` (the composition gap), then predicts every other NVIDIA GPU's step from each origin with
``predict_trace`` and reports the origin x destination mean absolute % error against the destination's measured
step. It runs with wave/roofline scaling only (mode ``wave``), and again with the published linear and bmm scalers
that load (the report names any that do not, and why), in each of ``predict_trace``'s scaler modes: the cards'
calibrated transfer (``scalers``, its default), the direct prediction of the destination (``scalers-direct``) and
Habitat's ratio from the origin's time (``scalers-ratio``).

    python -m pipeline.step.labels --extdata ../shared/extdata --out reports/
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from pipeline import physics
from pipeline.ingest.neusight_nodes import _STACK, node_config, read_node_table
from pipeline.step.classify import conform, gemm_blocks
from pipeline.step.labels_report import error_matrix, write_report
from pipeline.step.predict import SCALER_LOAD_ERRORS, predict_trace, published_scaler

__all__ = ["TRAIN_CONFIGS", "MODES", "trace_kwargs", "label_gpus", "read_node_table", "block_mask", "node_ops",
           "compose", "validate", "error_matrix", "write_report", "main"]

TRAIN_CONFIGS = ("bert_large-train-512-2", "bert_large-train-512-8", "gpt2_large-train-1024-1",
                 "gpt2_large-train-1024-4")
_BLOCK = re.compile(r"(?:^|\.)(?:layer|layers|h|blocks|block)\.0(?:\.|'|$)")
_VIEWS = frozenset({"view", "permute", "transpose", "size", "expand", "split", "unsqueeze", "squeeze", "reshape",
                    "dim", "getattr", "getitem", "finfo", "t", "chunk", "flatten", "unflatten", "narrow", "select"})
_NOOP_CASTS = frozenset({"to", "type", "float"})
_FP32 = physics.BYTES_PER_ELEMENT["fp32"]
_SCALED = ("linear", "bmm")  # the op kinds of a node table's GEMM nodes
MODES = {"wave": {"scalers": False}, "scalers": {"scaler_mode": "calibrated"},
         "scalers-direct": {"scaler_mode": "direct"}, "scalers-ratio": {"scaler_mode": "ratio"}}
"""The validation's modes: ``predict_trace`` arguments of each."""


def trace_kwargs(mode: str, scalers: dict) -> dict:
    """``predict_trace`` keyword arguments of validation ``mode`` (``MODES``) with the loaded ``scalers``."""
    if mode not in MODES:
        raise ValueError(f"modes: {mode!r} is not one of {', '.join(MODES)}")
    return {"scalers": scalers, **MODES[mode]}


def label_gpus(extdata) -> dict[str, Path]:
    """{registry label: folder} of the NVIDIA GPUs under ``<extdata>/neusight/label`` the registry knows."""
    from pipeline import gpus
    root = Path(extdata) / "neusight" / "label"
    out = {}
    for d in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        if d.name.upper().startswith("AMD"):
            continue
        try:
            out[gpus.gpu_label(d.name)] = d
        except ValueError:
            continue
    return out


def block_mask(nodes: pd.DataFrame) -> np.ndarray:
    """True for the nodes of the repeated block (module path ``...layer.0...``, ``...h.0...``, ...)."""
    meta = nodes["meta"].astype(str)
    in_stack = meta.map(lambda m: any(_BLOCK.search(p + "'") for p, _ in _STACK.findall(m)))
    attr = (nodes["op"] == "get_attr") & nodes["target"].astype(str).map(lambda t: bool(_BLOCK.search(t)))
    return (in_stack | attr).to_numpy()


def _numel(shape) -> int:
    n = 1
    for s in shape or []:
        n *= int(s)
    return n


def _is_kernel(row) -> bool:
    if row.op in ("placeholder", "output", "get_attr"):
        return False
    if not isinstance(row.dtype, str) or not row.dtype.startswith("torch."):
        return False  # Python scalars: sizes, shapes, dtype lookups
    if row.fn in _VIEWS:
        return False
    return not (row.fn in _NOOP_CASTS and row.out_shape is not None and row.in_shapes
                and list(row.in_shapes[0]) == list(row.out_shape))


def _gemm_rows(row, base: dict, kind: str, cfg: dict) -> list[dict]:
    """Forward and backward rows of a GEMM node (physics counters of its canonical config)."""
    rows = []
    for phase, t in (("forward", row.fw_latency), ("backward", row.bw_latency)):
        if t > 0:
            rows.append({**base, **cfg, "op": kind, "phase": phase, "scaler_phase": phase, "time_ms": float(t),
                         "flops": float(physics.flops(kind, cfg, phase)),
                         "bytes": float(physics.bytes_moved(kind, cfg, "fp32", phase)),
                         "blocks": gemm_blocks(kind, cfg), "tensor_core": False})
    return rows


def _other_rows(row, base: dict) -> list[dict]:
    """Forward and backward rows of any other node (~1 FLOP per element, bytes of its tensors)."""
    tensors = [s for s in row.in_shapes if s != [1]] if row.in_shapes else []
    out_n = _numel(row.out_shape) if row.out_shape is not None else 0
    elements = float(max([_numel(s) for s in tensors] + [out_n]))
    nbytes = _FP32 * float(sum(_numel(s) for s in tensors) + out_n)
    return [{**base, "op": "other", "phase": phase, "scaler_phase": phase, "time_ms": float(t), "flops": elements,
             "bytes": b, "elements": elements, "tensor_core": False}
            for phase, t, b in (("forward", row.fw_latency, nbytes), ("backward", row.bw_latency, 2 * nbytes))
            if t > 0]


def node_ops(csv_path, json_path=None, *, kernel_only: bool = True) -> tuple[pd.DataFrame, dict]:
    """Trace ops (``pipeline.step.TRACE_COLUMNS`` + ``count``, ``node``) of one node table, and its JSON info."""
    csv_path = Path(csv_path)
    json_path = Path(json_path) if json_path is not None else csv_path.with_suffix(".json")
    info = json.loads(json_path.read_text())
    num_layer = int(info["num_layer"])
    nodes = read_node_table(csv_path)
    blocks = block_mask(nodes)
    rows = []
    for i, row in enumerate(nodes.itertuples(index=False)):
        if kernel_only and not _is_kernel(row):
            continue
        base = {"name": f"{row.op}:{row.fn}", "node": row.Name if hasattr(row, "Name") else str(row.target),
                "precision": "fp32", "dtype": "float32", "count": num_layer if blocks[i] else 1,
                "input_shapes": json.dumps(row.in_shapes)}
        gemm = node_config(row)
        rows += _gemm_rows(row, base, *gemm) if gemm is not None else _other_rows(row, base)
        if row.acc_latency > 0:  # gradient accumulation of the node's parameters: memory-bound, no counters
            rows.append({**base, "name": f"{row.op}:{row.fn}:grad_accumulate", "op": "other", "phase": "backward",
                         "scaler_phase": "backward", "time_ms": float(row.acc_latency), "flops": math.nan,
                         "bytes": math.nan, "tensor_core": False})
    ops = conform(pd.DataFrame(rows))
    ops["seq"] = np.arange(len(ops))
    info = {**info, "csv": csv_path.name, "block_nodes": int(blocks.sum()), "nodes": int(len(nodes))}
    return ops, info


def compose(ops: pd.DataFrame, column: str = "time_ms") -> dict:
    """Composed step from a node table's ops: total, forward and backward (ms, rows weighted by ``count``)."""
    w = ops[column].to_numpy(dtype=float) * ops["count"].to_numpy(dtype=float)
    fwd = ops["phase"].to_numpy() == "forward"
    return {"total": float(np.nansum(w)), "forward": float(np.nansum(w[fwd])), "backward": float(np.nansum(w[~fwd]))}


def _published_scalers() -> tuple[dict, str]:
    """({op: scaler} of the published linear/bmm scalers that load, what loaded and why the others did not).
    The validation reports this; ops without a scaler are wave-scaled in the ``scalers`` mode."""
    loaded, why = {}, []
    for op in _SCALED:
        try:
            loaded[op] = published_scaler(op)
        except SCALER_LOAD_ERRORS as exc:
            why.append(f"no {op} scaler ({type(exc).__name__}: {str(exc)[:160]})")
    text = (f"published scalers for {', '.join(f'{op} v{s.version}' for op, s in loaded.items())}" if loaded
            else "no published scalers")
    return loaded, "; ".join([text] + why)


def _gap(config: str, gpu: str, ops: pd.DataFrame, all_ops: pd.DataFrame, info: dict) -> dict:
    """Composed node sums (kernel nodes, all nodes) against the measured step of one table."""
    comp, comp_all = compose(ops), compose(all_ops)
    return {"config": config, "gpu": gpu, "num_layer": info["num_layer"], "e2e_ms": info["e2e_latency"],
            "composed_ms": comp["total"], "composed_all_nodes_ms": comp_all["total"],
            "gap_pct": 100 * (comp["total"] / info["e2e_latency"] - 1),
            "gap_all_nodes_pct": 100 * (comp_all["total"] / info["e2e_latency"] - 1),
            "fw_ms": info["fw_latency"], "composed_fw_ms": comp["forward"],
            "bw_ms": info["bwall_latency"], "composed_bw_ms": comp["backward"]}


def _prediction(mode: str, config: str, origin: str, dest: str, pred: pd.DataFrame, ops_d: pd.DataFrame,
                info_d: dict) -> dict:
    """One predicted step against the destination's measured step and composed node sum."""
    w = pred["pred_ms"].to_numpy(dtype=float) * pred["count"].to_numpy(dtype=float)
    total = float(np.sum(w))
    scaled = float(w[pred["method"].to_numpy() == "scaler"].sum() / w.sum()) if w.sum() > 0 else 0.0
    e2e, composed_d = float(info_d["e2e_latency"]), compose(ops_d)["total"]
    return {"mode": mode, "config": config, "model": config.split("-")[0], "origin": origin, "dest": dest,
            "pred_ms": total, "e2e_ms": e2e, "composed_dest_ms": composed_d, "err_pct": 100 * (total / e2e - 1),
            "err_vs_composed_pct": 100 * (total / composed_d - 1), "scaler_share": scaled}


def validate(extdata, configs=TRAIN_CONFIGS, *, modes=None, kernel_only: bool = True) -> tuple[pd.DataFrame,
                                                                                                pd.DataFrame, dict]:
    """Cross-GPU validation: ``(predictions, gaps, meta)``.

    ``predictions``: one row per (mode, config, origin, dest) with the predicted step, the destination's measured
    ``e2e_ms`` and composed node sum, and the signed % errors against both. ``gaps``: per (config, GPU) the
    composed node sum vs the measured step. ``modes``: ``("wave",)`` and, when a scaler loads, the scaler modes
    too (``MODES``).
    """
    folders = label_gpus(extdata)
    if not folders:
        raise FileNotFoundError(f"no NeuSight label folders of registry GPUs under {Path(extdata) / 'neusight/label'}")
    scalers, why = _published_scalers()
    if modes is None:
        modes = tuple(MODES) if scalers else ("wave",)
    tables: dict[tuple[str, str], tuple[pd.DataFrame, dict]] = {}
    gaps = []
    for config in configs:
        for gpu, folder in folders.items():
            csv = folder / f"{config}.csv"
            if csv.exists() and csv.with_suffix(".json").exists():
                ops, info = node_ops(csv, kernel_only=kernel_only)
                tables[(config, gpu)] = (ops, info)
                gaps.append(_gap(config, gpu, ops, node_ops(csv, kernel_only=False)[0], info))
    rows = [_prediction(mode, config, origin, dest,
                        predict_trace(ops, origin, dest, **trace_kwargs(mode, scalers)), ops_d, info_d)
            for mode in modes
            for (config, origin), (ops, _) in tables.items()
            for (config_d, dest), (ops_d, info_d) in tables.items() if config_d == config]
    meta = {"scalers": why, "modes": list(modes), "kernel_only": kernel_only, "gpus": sorted(folders)}
    return pd.DataFrame(rows), pd.DataFrame(gaps), meta


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.step.labels",
                                 description="Validate whole-step prediction on NeuSight's measured BERT-Large and "
                                             "GPT-2-Large training steps across NVIDIA GPUs.")
    ap.add_argument("--extdata", default="../shared/extdata", help="folder holding neusight/label/")
    ap.add_argument("--out", default="reports", help="output folder for label_validation.{md,png,csv}")
    ap.add_argument("--configs", default=",".join(TRAIN_CONFIGS), help="comma-separated <model>-train-<seq>-<batch>")
    ap.add_argument("--all-nodes", action="store_true", help="keep non-kernel nodes (views, Python scalars)")
    ap.add_argument("--wave-only", action="store_true", help="skip the scaler modes even if scalers load")
    args = ap.parse_args(argv)
    try:
        pred, gaps, meta = validate(args.extdata, [c for c in args.configs.split(",") if c],
                                    modes=("wave",) if args.wave_only else None, kernel_only=not args.all_nodes)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    paths = write_report(pred, gaps, meta, args.out)
    print(f"GPUs: {', '.join(meta['gpus'])}; modes: {', '.join(meta['modes'])} ({meta['scalers']})")
    for mode in meta["modes"]:
        print(f"\n{mode}: origin x destination mean |error| % vs measured step")
        print(error_matrix(pred, mode).round(1).to_string())
    print("\ncomposition gap (composed / measured - 1, %):")
    print(gaps[["config", "gpu", "gap_pct", "gap_all_nodes_pct"]].round(1).to_string(index=False))
    print("\nwrote " + ", ".join(str(p) for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
