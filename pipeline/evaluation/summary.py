"""The headline numbers of each op (what the report's summary table, its JSON and MLflow carry)."""

from __future__ import annotations

from collections.abc import Mapping

from pipeline.evaluation.analysis import LARGE, coverage_by_gpu, gpu_rows, mean_of, per_gpu_mape
from pipeline.evaluation.logo import pair_means
from pipeline.training.config import to_dict


def _mape(frame) -> float | None:
    rows = gpu_rows(frame)
    return float(rows["ape"].mean()) if len(rows) else None


def op_summary(cfg, result: Mapping) -> dict:
    """Leave-one-GPU-out (mean over GPUs: all rows, >= 50 us, fp32), ratio scaling (and, on the same pairs and rows,
    the direct prediction and the calibrated transfer weight), the champion's held-out configs
    (all, H200 >= 50 us) and never-trained-on layers, the interval's coverage on held-out GPUs; on rows that
    measure the GPU (not a host's launch floor)."""
    errors = result["logo"]["errors"]
    pairs = result["logo"]["ratio"]
    means = pair_means(pairs, int(cfg.ratio.min_rows))

    def over_pairs(column: str) -> float | None:
        return float(means[column].mean()) if len(means) and column in means else None

    card = result["logo"].get("transfer") or {}
    frames = result["champion"].get("frames") or {}
    test = gpu_rows(frames.get("test"))
    h200 = test[(test["gpu"] == "h200") & (test["size"] == LARGE)] if len(test) else test
    unseen = gpu_rows(frames.get("unseen"))
    coverage = coverage_by_gpu(errors)
    return {"logo_mean_mape": mean_of(per_gpu_mape(errors)),
            "logo_large_mean_mape": mean_of(per_gpu_mape(errors, large_only=True)),
            "logo_fp32_mean_mape": mean_of(per_gpu_mape(errors, ["fp32"])),
            "ratio_mean_mape": over_pairs("ape"), "ratio_direct_mean_mape": over_pairs("direct_ape"),
            "transfer_mean_mape": over_pairs("transfer_ape"), "transfer_weight": card.get("ratio_weight"),
            "test_mape": _mape(frames.get("test")),
            "h200_test_large_mape": float(h200["ape"].mean()) if len(h200) else None,
            "unseen_mape": {g: float(p["ape"].mean()) for g, p in unseen.groupby("gpu")} if len(unseen) else {},
            "interval_coverage_mean": mean_of({g: v["coverage"] for g, v in coverage.items()}),
            "neusight_unseen_gpu_mape": to_dict(cfg.neusight_unseen_gpu_mape).get(result["op"])}
