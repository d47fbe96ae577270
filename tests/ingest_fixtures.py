"""Tiny extdata folders in the layout of the public sources, written by the tests (made-up numbers).

Each writer puts one source's files under ``root`` exactly where ``pipeline.ingest`` looks for them, with
the source's column names, so that every reader runs without the public data.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

UNKNOWN_GPU = "Imaginary GPU 9000"
LAUNCH_FLOOR_MS = 0.03
NEUSIGHT_VERSIONS = {"Torch Version": "p2.1.0", "CUDNN Version": "8902", "CUDA Version": "cu121"}


def _csv(path: Path, rows) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def neusight_bmm_rows(device: str = "Tesla T4") -> list[dict]:
    """A flat launch floor (tiny bmm of very different sizes, all ~0.03 ms) and large bmm whose time grows."""
    rows = []
    tiny = [(1, 2, 2, 2), (1, 8, 4, 8), (2, 16, 16, 16), (4, 32, 16, 32), (8, 64, 32, 64), (16, 64, 64, 64)]
    for i, (b, m, n, k) in enumerate(tiny):
        rows.append({"B": b, "M": m, "N": n, "K": k, "Latency": LAUNCH_FLOOR_MS * (1 + 0.01 * i)})
    for b, m, n, k in [(8, 512, 512, 512), (16, 1024, 512, 1024), (32, 1024, 1024, 1024), (64, 2048, 512, 512)]:
        rows.append({"B": b, "M": m, "N": n, "K": k, "Latency": LAUNCH_FLOOR_MS + 2.0 * b * m * n * k / 4e9})
    return [{"OPName": "bmm", "Device": device, **NEUSIGHT_VERSIONS, **r} for r in rows]


def write_neusight(root: Path) -> None:
    train = root / "neusight" / "train"
    _csv(train / "bmm" / "Tesla T4.csv", neusight_bmm_rows())
    _csv(train / "bmm" / f"{UNKNOWN_GPU}.csv", neusight_bmm_rows(UNKNOWN_GPU)[:5])
    _csv(train / "linear" / "Tesla T4.csv",
         [{"OPName": "linear", "Device": "Tesla T4", **NEUSIGHT_VERSIONS, "B": 1, "M": m, "N": n, "K": k,
           "Latency": 0.05 + m * n * k / 1e9} for m, n, k in [(3, 5, 7), (64, 128, 256), (512, 1024, 2048)]])
    _csv(train / "conv" / "NVIDIA A100 80GB PCIe.csv",
         [{"OPName": "conv", "Device": "NVIDIA A100 80GB PCIe", **NEUSIGHT_VERSIONS, "B": b, "Input_Channel": c,
           "Output_Channel": o, "Kernel_Szie": 3, "Input_Size": s, "Stride": 1, "Padding": 1, "Latency": t}
          for b, c, o, s, t in [(2, 16, 32, 28, 0.11), (8, 64, 64, 56, 0.4)]])


def node(op, target, stack, ins, out, fw, bw=0.0, name="", dtype="torch.float32") -> dict:
    """One torch.fx node-table row as NeuSight writes it; ``stack`` is [(module path, class path), ...]."""
    entries = ", ".join(f"('{p}', <class '{c}'>)" for p, c in stack)
    return {"op": op, "target": target, "meta": "{'nn_module_stack': OrderedDict([" + entries + "])}",
            "input_shapes": json.dumps(ins), "output_shape": str(tuple(out)) if out is not None else "",
            "fw_latency": fw, "bw_latency": bw, "acc_latency": 0.0, "dtype": dtype, "Name": name or target}


LINEAR = "torch.nn.modules.linear.Linear"
GPT2 = [("transformer", "transformers.models.gpt2.modeling_gpt2.GPT2Model")]
BERT_HEAD = [("cls", "transformers.models.bert.modeling_bert.BertPreTrainingHeads"),
             ("cls.predictions", "transformers.models.bert.modeling_bert.BertLMPredictionHead")]


def gpt2_nodes() -> list[dict]:
    """A GPT-2 slice: a view, the traced Conv1D (addmm), the attention matmul, lm_head, the output."""
    return [
        node("placeholder", "input_ids", [], [], [4, 1024], 0.0, dtype="torch.int64"),
        node("call_method", "view", GPT2, [[4, 1024, 1280], [1]], [4096, 1280], 0.008, name="view_1"),
        node("call_function", "<built-in method addmm of type object at 0x1>", GPT2,
             [[3840], [4096, 1280], [1280, 3840]], [4096, 3840], 0.9, 1.8, name="addmm"),
        node("call_function", "<built-in method matmul of type object at 0x1>", GPT2,
             [[4, 20, 1024, 64], [4, 20, 64, 1024]], [4, 20, 1024, 1024], 0.5, 1.0, name="matmul"),
        node("call_module", "lm_head", [("lm_head", LINEAR)], [[4, 1024, 1280]], [4, 1024, 50257], 10.0, 20.0),
        node("output", "output", [], [[4, 1024, 50257]], [4, 1024, 50257], 0.0),
    ]


def bert_nodes() -> list[dict]:
    """A BERT slice: a Linear of the block, the MLM decoder (its bias is the head's), the NSP head."""
    query = "bert.encoder.layer.0.attention.self.query"
    return [
        node("call_module", query, [("bert", "x.BertModel"), (query, LINEAR)], [[8, 512, 1024]], [8, 512, 1024],
             0.2),
        node("call_module", "cls.predictions.decoder", BERT_HEAD + [("cls.predictions.decoder", LINEAR)],
             [[8, 512, 1024]], [8, 512, 30522], 3.0),
        node("call_module", "cls.seq_relationship", [("cls", "x"), ("cls.seq_relationship", LINEAR)],
             [[8, 1024]], [8, 2], 0.02),
    ]


def write_neusight_label(root: Path) -> None:
    label = root / "neusight" / "label"
    _csv(label / "NVIDIA_H100_80GB_HBM3" / "gpt2_large-train-1024-4.csv", gpt2_nodes())
    (label / "NVIDIA_H100_80GB_HBM3" / "gpt2_large-train-1024-4.json").write_text(json.dumps({"num_layer": 36}))
    _csv(label / "NVIDIA_L4" / "bert_large-inf-512-8.csv", bert_nodes())
    _csv(label / "AMD_Instinct_MI100" / "bert_large-train-512-2.csv", bert_nodes())


def _deepbench(device, precision, **cols) -> dict:
    sheet = "Results - FP32" if precision == "Float" else "Results - FP16"
    return {"file": f"results/train/DeepBench_{device}.xlsx", "device": device, "suite": "train", "sheet": sheet,
            "precision": precision, "app": "", **cols}


FP16_MODE = "16 bit inputs, 32 bit multiplication, 32 bit addition"


def write_deepbench(root: Path) -> None:
    db = root / "deepbench"
    gemm = [("NV_1080Ti", "Float", 1760, 16, 1760, "T", "N", 0.058), ("NV_1080Ti", "Float", 1760, 32, 1760, "N", "N",
             0.039), ("NV_T4", FP16_MODE, 2048, 64, 2048, "T", "N", 0.04), ("NV_T4", "Float", 512, 8, 256, "N", "T",
             0.02), ("NV_T4", "Odd mode", 512, 8, 256, "T", "N", 0.02)]
    _csv(db / "gemm.csv", [_deepbench(d, p, M=m, N=n, K=k, transA=a, transB=b, time_ms=t, padded_kernels="")
                           for d, p, m, n, k, a, b, t in gemm])
    conv = [("NV_1080Ti", "0.47", "0.25"), ("NV_M40", "N/A*", "0.30")]
    dims = dict(W=56, H=56, C=64, N=8, K=64, S_filter_w=3, R_filter_h=3, pad_w=1, pad_h=1, stride_w=1, stride_h=1)
    _csv(db / "conv.csv", [_deepbench(d, "Float", **dims, fwd_ms=0.12, P_out=56, Q_out=56, padded_kernels="",
                                      bwd_data_ms=bd, bwd_weight_ms=bw, total_ms="", fwd_algo="")
                           for d, bd, bw in conv])
    lstm = [("NV_1080Ti", "1.259", "", "1.447", "0.174"), ("NV_T4", "", "", "", "")]
    _csv(db / "lstm.csv", [_deepbench(d, "Float", hidden=512, N=16, timesteps=25, fwd_ms=f, bwd_ms=b, bwd_data_ms=bd,
                                      bwd_weight_ms=bw, total_ms="") for d, f, b, bd, bw in lstm])


VIDUR_MODULES = ("emb", "input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "mlp_up_proj", "mlp_act",
                 "mlp_down_proj", "add")


def vidur_row(n_head, n_kv_head, n_embd, n_expanded, gated, tokens, tp, base_ms=0.1) -> dict:
    row = {}
    for i, module in enumerate(VIDUR_MODULES):
        median = base_ms * (i + 1)
        row.update({f"time_stats.{module}.min": median * 0.9, f"time_stats.{module}.max": median * 1.2,
                    f"time_stats.{module}.mean": median * 1.01, f"time_stats.{module}.median": median,
                    f"time_stats.{module}.std": median * 0.05})
    row.update({"n_head": n_head, "n_kv_head": n_kv_head, "n_embd": n_embd, "n_expanded_embd": n_expanded,
                "vocab_size": 32000, "use_gated_mlp": gated, "num_tokens": tokens,
                "num_tensor_parallel_workers": tp})
    return row


def write_vidur(root: Path) -> None:
    a100 = root / "vidur" / "a100"
    _csv(a100 / "meta-llama" / "Tiny-Llama" / "mlp.csv",
         [vidur_row(32, 8, 4096, 14336, True, 16, 1), vidur_row(32, 8, 4096, 14336, True, 16, 2, 0.05),
          vidur_row(32, 8, 4096, 14336, True, 16, 2, 0.07)])  # the last repeats the second: merged
    _csv(a100 / "microsoft" / "tiny-phi" / "mlp.csv", [vidur_row(32, 32, 2560, 10240, False, 4, 1)])


AICONF_GPUS = {"h100_sxm": "NVIDIA H100 80GB HBM3", "gb200": "NVIDIA GB200", "a100_sxm": "NVIDIA A100-SXM4-80GB"}


def aiconfigurator_rows(device: str) -> pd.DataFrame:
    """bf16 F.linear rows (the A100 names the kernel vllm_default) plus fp8 and nvfp4 rows of the same GEMMs."""
    kernel = "vllm_default" if "A100" in device else "torch.nn.functional.linear"
    shapes = [(1, 4096, 4096), (16, 14336, 4096), (4096, 4096, 14336)]
    rows = []
    for dtype, source in (("bfloat16", kernel), ("fp8", "CutlassFP8ScaledMMLinearKernel"),
                          ("nvfp4", "FlashInferCuteDslNvFp4LinearKernel")):
        for m, n, k in shapes:
            rows.append({"framework": "VLLM", "version": "0.24.0", "device": device, "op_name": "gemm",
                         "kernel_source": source, "gemm_dtype": dtype, "m": m, "n": n, "k": k,
                         "latency": float(np.float64(2.0 * m * n * k / 4e11 + 0.004))})
    return pd.DataFrame(rows)


def write_aiconfigurator(root: Path) -> None:
    for folder, device in AICONF_GPUS.items():
        path = root / "aiconfigurator" / folder / "gemm_perf.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        aiconfigurator_rows(device).to_parquet(path, index=False)


def write_extdata(root: Path) -> Path:
    """Every source's files under ``root``."""
    for write in (write_neusight, write_neusight_label, write_deepbench, write_vidur, write_aiconfigurator):
        write(root)
    return root
