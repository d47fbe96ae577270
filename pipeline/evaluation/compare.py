"""The model configs compared inside the pipeline: the same leave-one-GPU-out passes (cached like the main ones)
for every config of ``compare.models`` (files of ``conf/model/``), on the ops of ``compare.ops``."""

from __future__ import annotations

from pathlib import Path

from pipeline.evaluation.analysis import mean_of, per_gpu_mape

MODEL_DIR = Path(__file__).resolve().parent.parent.parent / "conf" / "model"


def _numbers(logo: dict, kind: str) -> dict:
    errors = logo["errors"]
    per = per_gpu_mape(errors)
    return {"logo_mean_mape": mean_of(per), "logo_large_mean_mape": mean_of(per_gpu_mape(errors, large_only=True)),
            "logo_fp32_mean_mape": mean_of(per_gpu_mape(errors, ["fp32"])),
            "low_precision_mean_mape": mean_of(per_gpu_mape(errors, ["fp16", "bf16"])),
            "worst_gpu_mape": max(per.values(), default=None), "target": kind}


def compare_models(cfg, op: str, table, main_logo: dict) -> dict[str, dict]:
    """{model config name: leave-one-GPU-out numbers}; the configured model first (its passes are ``main_logo``)."""
    from omegaconf import OmegaConf

    from pipeline.evaluation.run import logo_results
    from pipeline.training.config import target_kind, to_dict
    from pipeline.training.data import OpTable

    spec = cfg.get("compare") or {}
    if op not in list(spec.get("ops") or []):
        return {}
    out = {f"{cfg.model.get('target')} (this report)": _numbers(main_logo, target_kind(cfg))}
    for name in spec.get("models") or []:
        variant = cfg.copy()
        OmegaConf.set_struct(variant, False)
        variant.model = OmegaConf.load(MODEL_DIR / f"{name}.yaml")
        kind = target_kind(variant)
        other = table if kind == table.target_kind else OpTable.load(Path(cfg.data.root), op, to_dict(cfg.data),
                                                                      target_kind=kind)
        print(f"{op}: leave-one-GPU-out passes of model={name} for the comparison", flush=True)
        out[name] = _numbers(logo_results(variant, op, other), kind)
    return out
