"""NeuSight's node tables, ``neusight/label/<GPU>/<model>-<train|inf>-<seq>-<batch>.csv``: the one parser.

Each table is a torch.fx node table of BERT-Large or GPT-2-Large (one transformer layer plus the layers
outside the repeated block; fp32, TF32 off), every node timed alone: ``fw_latency``, ``bw_latency``,
``acc_latency`` (ms). ``read_node_table`` reads one table with parsed shapes; ``node_config`` maps one node to
the op config of a GEMM it runs (or None). The ``neusight-label`` source imports those GEMM nodes: forward
rows from ``fw_latency``, backward rows from ``bw_latency`` (train tables only).

GEMM nodes (``node_config``):

- ``call_module`` ``nn.Linear`` / HF ``Conv1D`` -> linear: batch = product of the input's leading dims,
  in_features = its last dim, out_features = the output's last dim. Bias as the models build it: HF's
  ``lm_head`` is ``nn.Linear(n_embd, vocab_size, bias=False)`` (GPT-2) -> no bias; BERT's MLM decoder
  ``cls.predictions.decoder`` is built ``bias=False`` but its ``bias`` is then set to the head's separate
  bias parameter (``self.decoder.bias = self.bias``), so its forward adds a bias -> bias; Conv1D and every
  other Linear of these models -> bias.
- ``addmm(bias, x[rows, in], w[in, out])`` (GPT-2's Conv1D traced through) -> linear with bias.
- ``torch.nn.functional.linear(x, w[out, in], bias?)`` -> linear, bias when a third input is given.
- ``matmul``/``bmm``/``baddbmm``/``mm``: both operands >= 3-D -> bmm (batch = product of the output's leading
  dims, m = a[-2], k = a[-1], n = b[-1]; operands may be non-contiguous views); a >= 2-D operand times a 2-D
  weight -> one GEMM over all rows: linear without bias (batch = product of a's leading dims).
"""

from __future__ import annotations

import ast
import logging
import math
import re
from pathlib import Path

import pandas as pd

from pipeline.ingest.common import META_PREFIX, IngestError, Options, Report, Source, Task, gpu_label_or_none, need_dir
from pipeline.ingest.neusight import NEUSIGHT_CITATION, NEUSIGHT_LIBRARIES, NEUSIGHT_LICENSE

__all__ = ["NODE_TABLE_COLUMNS", "BIAS_FREE_MODULES", "read_node_table", "node_config", "read_label_table",
           "SOURCE"]

log = logging.getLogger(__name__)

NODE_TABLE_COLUMNS = ("op", "target", "meta", "input_shapes", "output_shape", "fw_latency", "bw_latency",
                      "acc_latency")
"""Columns a node table must have."""
BIAS_FREE_MODULES = ("lm_head",)
"""Last path segments of Linear modules built without a bias (HF's ``lm_head``)."""
_LATENCIES = ("fw_latency", "bw_latency", "acc_latency")
_STACK = re.compile(r"\('([^']*)', <class '([^']*)'>\)")
_FUNC = re.compile(r"<(?:built-in )?(?:function|method) (\w+)")
_LINEAR_MODULES = ("Linear", "Conv1D")
_MATMULS = ("matmul", "bmm", "baddbmm", "mm")
_TABLE_NAME = re.compile(r"^[^-]+-(train|inf)-\d+-\d+\.csv$")


def read_node_table(path) -> pd.DataFrame:
    """One NeuSight node table with parsed shapes.

    Returns the CSV's columns (latencies as floats, ms) plus ``in_shapes`` (list of lists; [] where the
    cell does not parse), ``out_shape`` (list, or None), ``fn`` (what the node computes: the function or
    method name, or the module's class name for ``call_module``) and ``module`` (the innermost module path
    of the node's ``nn_module_stack``). Raises ValueError (IngestError) naming the file and missing columns.
    """
    nodes = pd.read_csv(path)
    missing = [c for c in NODE_TABLE_COLUMNS if c not in nodes.columns]
    if missing:
        raise IngestError(f"{path}: not a NeuSight node table (missing columns {missing})")
    for col in _LATENCIES:
        nodes[col] = pd.to_numeric(nodes[col], errors="coerce").astype(float)
    fns, modules = [], []
    for op, target, meta in zip(nodes["op"].astype(str), nodes["target"].astype(str), nodes["meta"].astype(str)):
        fn, module = _node_callable(op, target, meta)
        fns.append(fn)
        modules.append(module)
    nodes["in_shapes"] = nodes["input_shapes"].map(_shapes)
    nodes["out_shape"] = nodes["output_shape"].map(_shape_or_none)
    nodes["fn"] = fns
    nodes["module"] = modules
    return nodes


def _node_callable(op: str, target: str, meta: str) -> tuple[str, str]:
    """(fn, module) of a node: see ``read_node_table``."""
    stack = _STACK.findall(meta)
    module = stack[-1][0] if stack else ""
    if op == "call_module":
        cls = next((c for p, c in stack if p == target), stack[-1][1] if stack else "")
        return cls.rsplit(".", 1)[-1], module
    if op == "call_function":
        match = _FUNC.search(target)
        return (match.group(1) if match else target.strip("<>").rsplit(".", 1)[-1].strip("'")), module
    return target, module


def _literal(text):
    try:
        return ast.literal_eval(str(text))
    except (ValueError, SyntaxError):
        return None


def _shapes(text) -> list:
    value = _literal(text)
    if not isinstance(value, (list, tuple)):
        return []
    return [list(s) for s in value if isinstance(s, (list, tuple))]


def _shape_or_none(text):
    value = _literal(text)
    return list(value) if isinstance(value, (list, tuple)) else None


def _dims_ok(*dims) -> bool:
    return all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in dims)


def node_config(node) -> tuple[str, dict] | None:
    """``(op, config)`` of the GEMM a node runs (``linear`` or ``bmm``), or None for any other node.

    ``node`` is a row of ``read_node_table`` (an ``itertuples`` namedtuple or a Series): it needs ``op``,
    ``target``, ``fn``, ``in_shapes`` and ``out_shape``. The rules are in the module docstring.
    """
    ins, out = node.in_shapes or [], node.out_shape
    if node.op == "call_module":
        if node.fn not in _LINEAR_MODULES or not ins or not ins[0] or not out:
            return None
        x = ins[0]
        bias = str(node.target).split(".")[-1] not in BIAS_FREE_MODULES
        return _linear(math.prod(x[:-1]), x[-1], out[-1], bias)
    if node.op != "call_function":
        return None
    if node.fn == "addmm":  # addmm(bias[out], x[rows, in], w[in, out]): y = x @ w + b
        if len(ins) == 3 and [len(s) for s in ins] == [1, 2, 2] and ins[1][1] == ins[2][0] \
                and ins[0][0] == ins[2][1]:
            return _linear(ins[1][0], ins[1][1], ins[2][1], True)
        return None
    if node.fn == "linear":  # F.linear(x[..., in], w[out, in], bias?)
        if len(ins) >= 2 and ins[0] and len(ins[1]) == 2 and ins[0][-1] == ins[1][1]:
            return _linear(math.prod(ins[0][:-1]), ins[0][-1], ins[1][0], len(ins) >= 3)
        return None
    if node.fn in _MATMULS and len(ins) >= 2:
        return _matmul(*(ins[1:3] if node.fn == "baddbmm" else ins[:2]), out)
    return None


def _linear(batch, in_features, out_features, bias: bool) -> tuple[str, dict] | None:
    if not _dims_ok(batch, in_features, out_features):
        return None
    return "linear", {"batch": batch, "in_features": in_features, "out_features": out_features, "bias": bias}


def _matmul(a: list, b: list, out) -> tuple[str, dict] | None:
    """``a @ b``: bmm when both are batched, one GEMM (linear, no bias) when ``b`` is a 2-D weight."""
    if len(a) < 2 or len(b) < 2 or a[-1] != b[-2]:
        return None
    if len(b) == 2:
        return _linear(math.prod(a[:-1]), a[-1], b[-1], False)
    if len(a) < 3:
        return None
    lead = out[:-2] if out and len(out) >= 3 else a[:-2]
    batch, m, k, n = math.prod(lead), a[-2], a[-1], b[-1]
    return ("bmm", {"batch": batch, "m": m, "k": k, "n": n}) if _dims_ok(batch, m, k, n) else None


def read_label_table(task: Task) -> pd.DataFrame:
    """One node table -> linear/bmm rows: forward from ``fw_latency``, backward (train tables) from
    ``bw_latency``; ``gpu`` holds the table's folder name."""
    nodes = read_node_table(task.path)
    phases = [("forward", "fw_latency")] + ([("backward", "bw_latency")] if task.kind == "train" else [])
    has_name = "Name" in nodes.columns
    records = []
    for row in nodes.itertuples(index=False):
        gemm = node_config(row)
        if gemm is None:
            continue
        op, config = gemm
        name = row.target if row.op == "call_module" else (row.Name if has_name and isinstance(row.Name, str)
                                                           else str(row.target).split(" at ")[0])
        for phase, column in phases:
            records.append({**config, "op": op, "phase": phase, "time_ms": getattr(row, column),
                            META_PREFIX + "nodes": f"{Path(task.rel).stem}:{name}"})
    frame = pd.DataFrame.from_records(records) if records else pd.DataFrame(columns=["op", "phase", "time_ms"])
    frame["gpu"] = task.path.parent.name
    frame["precision"] = "fp32"
    frame[META_PREFIX + "files"] = task.rel
    return frame


def table_kind(filename: str) -> str:
    """``train`` or ``inf`` for a node table's file name, '' for any other file."""
    match = _TABLE_NAME.match(filename)
    return match.group(1) if match else ""


def tasks(extdata: Path, options: Options, report: Report) -> list[Task]:
    """Node tables of the wanted kinds in GPU folders the registry knows (others skipped with a warning)."""
    root = need_dir(extdata / "neusight" / "label", SOURCE.name)
    found = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        if gpu_label_or_none(folder.name) is None:
            if folder.name not in report.skipped_gpu_folders:
                report.skipped_gpu_folders.append(folder.name)
                log.warning("%s: GPU folder %r is not in the GPU registry (conf/gpus.yaml): skipping it",
                            SOURCE.name, folder.name)
            continue
        for path in sorted(folder.glob("*.csv")):
            kind = table_kind(path.name)
            if kind in options.label_kinds:
                found.append(Task(SOURCE.name, path, read_label_table, path.relative_to(extdata).as_posix(), kind))
    return found


SOURCE = Source(
    name="neusight-label",
    license=NEUSIGHT_LICENSE,
    citation=NEUSIGHT_CITATION,
    timing_method="Host-timed: per-node fw_latency/bw_latency (ms) of a torch.fx node table of BERT-Large / "
                  "GPT-2-Large (one transformer layer plus the layers outside the repeated block), PyTorch fp32, "
                  "each node timed alone with CUDA events (includes launch overhead). The number of runs behind "
                  "each value is not recorded (reps = 1). No spread published: time_p20_ms = time_p80_ms = time_ms.",
    reps=1,
    mappings={
        "linear": "call_module nn.Linear / HF Conv1D, addmm(bias, x, w), F.linear nodes and matmuls of a 2-D "
                  "weight -> batch = product of the input's leading dims, in_features = its last dim, "
                  "out_features = the output's last dim; bias as built (lm_head: none; matmul: none)",
        "bmm": "matmul/bmm/baddbmm nodes with both operands >= 3-D -> batch = product of the output's leading "
               "dims, m = a[-2], k = a[-1], n = b[-1] (operands may be non-contiguous views)",
    },
    library_versions=NEUSIGHT_LIBRARIES,
    gpu_time=False,
    tasks=tasks,
)
