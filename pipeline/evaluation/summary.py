"""The headline numbers of each op (what the report's summary table, its JSON and MLflow carry)."""

from __future__ import annotations

from typing import Mapping

import numpy as np

from pipeline.evaluation.logo import ratio_matrix
from pipeline.evaluation.metrics import summarise
from pipeline.training.config import to_dict


def _mape(frame) -> float | None:
    return summarise(frame["ape"]).get("mape") if frame is not None and not frame.empty else None


def op_summary(cfg, result: Mapping) -> dict:
    """Mean leave-one-GPU-out MAPE, mean ratio-pair MAPE, test-split and H200 test MAPE, with their targets."""
    targets = to_dict(cfg.targets)
    entries = result["logo"]["gpus"]
    logo = [v["all"]["mape"] for v in entries.values() if v["all"].get("n")]
    mape, _ = ratio_matrix(result["logo"]["ratio"], int(cfg.ratio.min_rows))
    ratio = float(np.nanmean(mape.to_numpy())) if not mape.empty and np.isfinite(mape.to_numpy()).any() else None
    champion = result["champion"]
    test = (champion.get("frames") or {}).get("test")
    h200 = test[test["gpu"] == "h200"] if test is not None and not test.empty else None
    card_logo = [v["mape"] for v in (champion.get("card_leave_gpu_out") or {}).values() if v.get("mape") is not None]
    op = result["op"]
    return {"logo_mean_mape": float(np.mean(logo)) if logo else None, "logo_target": targets["logo"].get(op),
            "ratio_mean_mape": ratio, "ratio_target": targets["ratio"],
            "card_logo_mean_mape": float(np.mean(card_logo)) if card_logo and champion.get("published") else None,
            "card_logo_gpus": len(card_logo), "test_mape": _mape(test), "h200_test_mape": _mape(h200),
            "h200_target": targets["h200_heldout"],
            "neusight_unseen_gpu_mape": to_dict(cfg.neusight_unseen_gpu_mape).get(op)}
