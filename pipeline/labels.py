"""Whole-model validation on NeuSight's measured training steps of BERT-Large and GPT-2-Large across GPUs.

NeuSight's ``label/<GPU>/<model>-train-<seq>-<batch>.csv`` is a torch.fx node table of one transformer layer
plus the layers outside the repeated block, each node timed alone (forward ``fw_latency``, backward
``bw_latency``, gradient accumulation of its parameters ``acc_latency``, ms; fp32, TF32 off). The ``.json``
next to it holds the measured whole step (``e2e_latency``) and ``num_layer``, the number of repeats of the block.

``node_ops`` turns a table into trace ops (``pipeline.track`` columns):

- ``Linear`` modules and ``addmm`` calls (GPT-2's Conv1D) -> ``linear`` (batch = rows, in/out features),
  ``matmul`` of >= 3-D operands and ``bmm`` -> ``bmm`` (batch = product of the leading dims), a 2-D ``matmul``
  -> ``linear`` without bias. Their backward row is the module's whole backward (``scaler_phase="backward"``).
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
step. It runs with wave/roofline scaling only, and again with the published scalers when ``load_scaler`` works.

    python -m pipeline.labels --extdata ../shared/extdata --out reports/
"""

from __future__ import annotations

import argparse
import ast
import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

__all__ = ["TRAIN_CONFIGS", "label_gpus", "read_node_table", "block_mask", "node_ops", "compose", "validate",
           "error_matrix", "write_report", "main"]

TRAIN_CONFIGS = ("bert_large-train-512-2", "bert_large-train-512-8", "gpt2_large-train-1024-1",
                 "gpt2_large-train-1024-4")
_BLOCK = re.compile(r"(?:^|\.)(?:layer|layers|h|blocks|block)\.0(?:\.|'|$)")
_STACK = re.compile(r"\('([^']*)', <class '([^']*)'>\)")
_FUNC = re.compile(r"<(?:built-in )?(?:function|method) (\w+)")
_VIEWS = frozenset({"view", "permute", "transpose", "size", "expand", "split", "unsqueeze", "squeeze", "reshape",
                    "dim", "getattr", "getitem", "finfo", "t", "chunk", "flatten", "unflatten", "narrow", "select"})
_NOOP_CASTS = frozenset({"to", "type", "float"})
_FP32 = 4


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


def read_node_table(path) -> pd.DataFrame:
    """A NeuSight node table with parsed shapes: ``in_shapes`` (list of lists), ``out_shape`` (list or None),
    ``fn`` (what the node computes: function/method name or module class), ``module`` (innermost module path)."""
    nodes = pd.read_csv(path)
    need = {"op", "target", "input_shapes", "output_shape", "fw_latency", "bw_latency", "acc_latency", "meta"}
    missing = sorted(need - set(nodes.columns))
    if missing:
        raise ValueError(f"{path}: not a NeuSight node table (missing columns {missing})")

    def shapes(text):
        try:
            v = ast.literal_eval(str(text))
        except (ValueError, SyntaxError):
            return []
        return [list(s) for s in v] if isinstance(v, (list, tuple)) else []

    def out_shape(text):
        try:
            v = ast.literal_eval(str(text))
        except (ValueError, SyntaxError):
            return None
        return list(v) if isinstance(v, (list, tuple)) else None

    fns, modules = [], []
    for row in nodes.itertuples(index=False):
        stack = _STACK.findall(str(row.meta))
        module = stack[-1][0] if stack else ""
        target = str(row.target)
        if row.op == "call_module":
            cls = next((c for p, c in stack if p == target), stack[-1][1] if stack else "")
            fn = cls.rsplit(".", 1)[-1]
        elif row.op == "call_function":
            m = _FUNC.search(target)
            fn = m.group(1) if m else target.strip("<>").rsplit(".", 1)[-1].strip("'")
        else:
            fn = target
        fns.append(fn)
        modules.append(module)
    nodes["in_shapes"] = nodes["input_shapes"].map(shapes)
    nodes["out_shape"] = nodes["output_shape"].map(out_shape)
    nodes["fn"] = fns
    nodes["module"] = modules
    return nodes


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
    if row.fn in _NOOP_CASTS and row.out_shape is not None and row.in_shapes and \
            list(row.in_shapes[0]) == list(row.out_shape):
        return False
    return True


def _gemm(row) -> tuple[str, dict] | None:
    ins, out = row.in_shapes, row.out_shape
    if row.op == "call_module" and row.fn == "Linear" and ins and out:
        x = ins[0]
        return "linear", {"batch": _numel(x[:-1]), "in_features": int(x[-1]), "out_features": int(out[-1]),
                          "bias": True}
    if row.fn == "addmm" and len(ins) == 3 and len(ins[1]) == 2 and len(ins[2]) == 2:
        (m, k), (_, n) = ins[1], ins[2]
        return "linear", {"batch": int(m), "in_features": int(k), "out_features": int(n), "bias": True}
    if row.fn in ("matmul", "bmm", "baddbmm", "mm") and len(ins) >= 2:
        a, b = (ins[1], ins[2]) if row.fn == "baddbmm" else (ins[0], ins[1])
        if len(a) >= 3 and len(b) >= 2:
            return "bmm", {"batch": _numel(a[:-2]), "m": int(a[-2]), "k": int(a[-1]), "n": int(b[-1])}
        if len(a) == 2 and len(b) == 2:
            return "linear", {"batch": int(a[0]), "in_features": int(a[1]), "out_features": int(b[1]),
                              "bias": False}
    return None


def node_ops(csv_path, json_path=None, *, kernel_only: bool = True) -> tuple[pd.DataFrame, dict]:
    """Trace ops (``pipeline.track.TRACE_COLUMNS`` + ``count``, ``node``) of one node table, and its JSON info."""
    from pipeline.track import _conform, _gemm_blocks

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
        count = num_layer if blocks[i] else 1
        gemm = _gemm(row)
        base = {"name": f"{row.op}:{row.fn}", "node": row.Name if hasattr(row, "Name") else str(row.target),
                "precision": "fp32", "dtype": "float32", "count": count,
                "input_shapes": json.dumps(row.in_shapes)}
        if gemm is not None:
            kind, cfg = gemm
            flops = 2.0 * (cfg["batch"] * cfg["m"] * cfg["k"] * cfg["n"] if kind == "bmm"
                           else cfg["batch"] * cfg["in_features"] * cfg["out_features"])
            nbytes = _FP32 * float(sum(_numel(s) for s in row.in_shapes) + _numel(row.out_shape))
            blk = _gemm_blocks(kind, cfg)
            for phase, t, f, b in (("forward", row.fw_latency, flops, nbytes),
                                   ("backward", row.bw_latency, 2 * flops, 2 * nbytes)):
                if t > 0:
                    rows.append({**base, **cfg, "op": kind, "phase": phase, "scaler_phase": phase,
                                 "time_ms": float(t), "flops": f, "bytes": b, "blocks": blk, "tensor_core": False})
        else:
            tensors = [s for s in row.in_shapes if s != [1]] if row.in_shapes else []
            out_n = _numel(row.out_shape) if row.out_shape is not None else 0
            elements = float(max([_numel(s) for s in tensors] + [out_n]))
            nbytes = _FP32 * float(sum(_numel(s) for s in tensors) + out_n)
            for phase, t, b in (("forward", row.fw_latency, nbytes), ("backward", row.bw_latency, 2 * nbytes)):
                if t > 0:
                    rows.append({**base, "op": "other", "phase": phase, "scaler_phase": phase, "time_ms": float(t),
                                 "flops": elements, "bytes": b, "elements": elements, "tensor_core": False})
        if row.acc_latency > 0:  # gradient accumulation of the node's parameters: memory-bound, no counters
            rows.append({**base, "name": f"{row.op}:{row.fn}:grad_accumulate", "op": "other", "phase": "backward",
                         "scaler_phase": "backward", "time_ms": float(row.acc_latency), "flops": math.nan,
                         "bytes": math.nan, "tensor_core": False})
    ops = _conform(pd.DataFrame(rows))
    ops["seq"] = np.arange(len(ops))
    info = {**info, "csv": csv_path.name, "block_nodes": int(blocks.sum()), "nodes": int(len(nodes))}
    return ops, info


def compose(ops: pd.DataFrame, column: str = "time_ms") -> dict:
    """Composed step from a node table's ops: total, forward and backward (ms, rows weighted by ``count``)."""
    w = ops[column].to_numpy(dtype=float) * ops["count"].to_numpy(dtype=float)
    fwd = ops["phase"].to_numpy() == "forward"
    return {"total": float(np.nansum(w)), "forward": float(np.nansum(w[fwd])), "backward": float(np.nansum(w[~fwd]))}


def _scalers_available() -> tuple[bool, str]:
    from pipeline.track import _published_scaler
    got = {op: _published_scaler(op) for op in ("linear", "bmm")}
    ok = [op for op, (s, _) in got.items() if s is not None]
    if ok:
        return True, f"published scalers for {', '.join(ok)}"
    return False, "; ".join(why for _, why in got.values())


def validate(extdata, configs=TRAIN_CONFIGS, *, modes=None, kernel_only: bool = True) -> tuple[pd.DataFrame,
                                                                                                pd.DataFrame, dict]:
    """Cross-GPU validation: ``(predictions, gaps, meta)``.

    ``predictions``: one row per (mode, config, origin, dest) with the predicted step, the destination's measured
    ``e2e_ms`` and composed node sum, and the signed % errors against both. ``gaps``: per (config, GPU) the
    composed node sum vs the measured step. ``modes``: ``("wave",)`` and, when scalers load, ``"scalers"``.
    """
    from pipeline.track import predict_trace

    folders = label_gpus(extdata)
    if not folders:
        raise FileNotFoundError(f"no NeuSight label folders of registry GPUs under {Path(extdata) / 'neusight/label'}")
    avail, why = _scalers_available()
    if modes is None:
        modes = ("wave", "scalers") if avail else ("wave",)
    tables: dict[tuple[str, str], tuple[pd.DataFrame, dict]] = {}
    gaps = []
    for config in configs:
        for gpu, folder in folders.items():
            csv = folder / f"{config}.csv"
            if not csv.exists() or not csv.with_suffix(".json").exists():
                continue
            ops, info = node_ops(csv, kernel_only=kernel_only)
            all_ops, _ = node_ops(csv, kernel_only=False)
            tables[(config, gpu)] = (ops, info)
            comp, comp_all = compose(ops), compose(all_ops)
            gaps.append({"config": config, "gpu": gpu, "num_layer": info["num_layer"], "e2e_ms": info["e2e_latency"],
                         "composed_ms": comp["total"], "composed_all_nodes_ms": comp_all["total"],
                         "gap_pct": 100 * (comp["total"] / info["e2e_latency"] - 1),
                         "gap_all_nodes_pct": 100 * (comp_all["total"] / info["e2e_latency"] - 1),
                         "fw_ms": info["fw_latency"], "composed_fw_ms": comp["forward"],
                         "bw_ms": info["bwall_latency"], "composed_bw_ms": comp["backward"]})
    rows = []
    for mode in modes:
        scalers = False if mode == "wave" else None
        for (config, origin), (ops, _) in tables.items():
            for (config_d, dest), (ops_d, info_d) in tables.items():
                if config_d != config:
                    continue
                pred = predict_trace(ops, origin, dest, scalers=scalers)
                total = float(np.sum(pred["pred_ms"].to_numpy(dtype=float) * pred["count"].to_numpy(dtype=float)))
                w = pred["pred_ms"].to_numpy(dtype=float) * pred["count"].to_numpy(dtype=float)
                scaled = float(w[pred["method"].to_numpy() == "scaler"].sum() / w.sum()) if w.sum() > 0 else 0.0
                e2e, composed_d = float(info_d["e2e_latency"]), compose(ops_d)["total"]
                rows.append({"mode": mode, "config": config, "model": config.split("-")[0], "origin": origin,
                             "dest": dest, "pred_ms": total, "e2e_ms": e2e, "composed_dest_ms": composed_d,
                             "err_pct": 100 * (total / e2e - 1), "err_vs_composed_pct": 100 * (total / composed_d - 1),
                             "scaler_share": scaled})
    meta = {"scalers": why, "modes": list(modes), "kernel_only": kernel_only, "gpus": sorted(folders)}
    return pd.DataFrame(rows), pd.DataFrame(gaps), meta


def error_matrix(pred: pd.DataFrame, mode: str = "wave", column: str = "err_pct", model: str | None = None):
    """Origin x destination mean absolute % error (over the configs both GPUs have)."""
    sub = pred[(pred["mode"] == mode)]
    if model is not None:
        sub = sub[sub["model"] == model]
    return sub.assign(abs_err=sub[column].abs()).pivot_table(index="origin", columns="dest", values="abs_err",
                                                            aggfunc="mean")


def _md(frame: pd.DataFrame, fmt: str = "{:.1f}") -> str:
    cols = [frame.index.name or ""] + [str(c) for c in frame.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for idx, row in frame.iterrows():
        cells = [fmt.format(v) if isinstance(v, (float, np.floating)) and np.isfinite(v) else
                 ("" if isinstance(v, (float, np.floating)) else str(v)) for v in row.to_numpy()]
        lines.append("| " + " | ".join([str(idx)] + cells) + " |")
    return "\n".join(lines)


def _heatmaps(pred: pd.DataFrame, path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(m, c) for m in pred["mode"].unique() for c in ("err_pct", "err_vs_composed_pct")]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4.2), squeeze=False)
    for ax, (mode, col) in zip(axes[0], panels):
        mat = error_matrix(pred, mode, col)
        im = ax.imshow(mat.to_numpy(dtype=float), cmap="viridis_r", vmin=0,
                       vmax=max(30.0, float(np.nanmax(mat.to_numpy(dtype=float)))))
        ax.set_xticks(range(len(mat.columns)), mat.columns, rotation=45, ha="right", fontsize=8)
        ax.set_yticks(range(len(mat.index)), mat.index, fontsize=8)
        for (i, j), v in np.ndenumerate(mat.to_numpy(dtype=float)):
            if np.isfinite(v):
                ax.text(j, i, f"{v:.1f}", ha="center", va="center", fontsize=8,
                        color="white" if v > 15 else "black")
        ax.set_xlabel("destination")
        ax.set_ylabel("origin")
        ref = "measured step" if col == "err_pct" else "dest. composed nodes"
        ax.set_title(f"{mode}: mean |err| % vs {ref}", fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_report(pred: pd.DataFrame, gaps: pd.DataFrame, meta: dict, out) -> list[Path]:
    """``label_validation.md``, ``label_validation.png`` (heatmaps) and ``label_validation.csv`` under ``out``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    png = _heatmaps(pred, out / "label_validation.png")
    pred.to_csv(out / "label_validation.csv", index=False)
    lines = ["# Whole-step validation on NeuSight's measured BERT-Large / GPT-2-Large training steps", "",
             "Generated by `python -m pipeline.labels` from NeuSight's `label/` node tables (fp32, TF32 off, one "
             "GPU). Each GPU's step is composed from its own node table (one transformer layer x `num_layer` + "
             "the rest); predictions scale the origin GPU's node times to the destination "
             f"(`pipeline.track.predict_trace`). Modes: {', '.join(meta['modes'])}. Scalers: {meta['scalers']}. "
             f"Kernel nodes only: {meta['kernel_only']}.", "",
             "## Composition gap: composed node sum vs measured step, same GPU", "",
             "`gap` = composed / measured - 1 with kernel nodes only; `gap all` with every node (Python scalar ops "
             "and views too, each timed at the CUDA-event floor).", ""]
    g = gaps.set_index(["config", "gpu"])[["num_layer", "e2e_ms", "composed_ms", "gap_pct", "composed_all_nodes_ms",
                                            "gap_all_nodes_pct", "fw_ms", "composed_fw_ms", "bw_ms",
                                            "composed_bw_ms"]]
    g["num_layer"] = g["num_layer"].astype(int).astype(str)
    g.index = [f"{c} @ {gpu}" for c, gpu in g.index]
    g.index.name = "config @ GPU"
    lines += [_md(g), "", f"Mean |gap|: {gaps['gap_pct'].abs().mean():.1f} % (kernel nodes), "
                          f"{gaps['gap_all_nodes_pct'].abs().mean():.1f} % (all nodes).", ""]
    for mode in pred["mode"].unique():
        sub = pred[pred["mode"] == mode]
        off = sub[sub["origin"] != sub["dest"]]
        lines += [f"## Mode `{mode}`: origin x destination mean |error| % vs the destination's measured step", "",
                  "Mean over the train configs both GPUs have (BERT-Large seq 512 batch 2/8, GPT-2-Large seq 1024 "
                  "batch 1/4). The diagonal is the composition gap.", "",
                  _md(error_matrix(pred, mode, "err_pct")), "",
                  f"Off-diagonal mean |error|: {off['err_pct'].abs().mean():.1f} % vs measured step, "
                  f"{off['err_vs_composed_pct'].abs().mean():.1f} % vs the destination's composed node sum "
                  f"(scaling error alone); share of predicted time from scalers: "
                  f"{100 * off['scaler_share'].mean():.0f} %.", ""]
        for model in sorted(sub["model"].unique()):
            lines += [f"### `{mode}`, {model}: mean |error| % vs measured step", "",
                      _md(error_matrix(pred, mode, "err_pct", model)), ""]
        lines += [f"### `{mode}`: mean |error| % vs the destination's composed node sum (scaling only)", "",
                  _md(error_matrix(pred, mode, "err_vs_composed_pct")), ""]
    lines += ["## Every prediction", "", "See `label_validation.csv` (signed errors).", ""]
    md = out / "label_validation.md"
    md.write_text("\n".join(lines))
    return [md, png, out / "label_validation.csv"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.labels",
                                 description="Validate whole-step prediction on NeuSight's measured BERT-Large and "
                                             "GPT-2-Large training steps across NVIDIA GPUs.")
    ap.add_argument("--extdata", default="../shared/extdata", help="folder holding neusight/label/")
    ap.add_argument("--out", default="reports", help="output folder for label_validation.{md,png,csv}")
    ap.add_argument("--configs", default=",".join(TRAIN_CONFIGS), help="comma-separated <model>-train-<seq>-<batch>")
    ap.add_argument("--all-nodes", action="store_true", help="keep non-kernel nodes (views, Python scalars)")
    ap.add_argument("--wave-only", action="store_true", help="skip the scaler mode even if scalers load")
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
