"""The targets the report checks (``targets`` in ``conf/evaluate.yaml``), each measured from the results it holds.

Every check returns ``{"target", "goal", "measured", "met", "detail"}``; ``met`` is None where the data to check it
are missing (then ``detail`` says what is missing).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from pipeline.evaluation.analysis import LARGE, coverage_by_gpu, gpu_rows, mean_of, per_gpu_mape
from pipeline.evaluation.metrics import pct


def _check(target: str, goal: str, measured: str, met: bool | None, detail: str) -> dict:
    return {"target": target, "goal": goal, "measured": measured, "met": met, "detail": detail}


def _listing(values: Mapping[str, float]) -> str:
    return ", ".join(f"{k} {v:.1f}" for k, v in values.items()) or "no rows"


def logo_fp32(results: Mapping, goal: Mapping) -> list[dict]:
    out = []
    for op in goal["ops"]:
        if op not in results or "logo" not in results[op]:
            out.append(_check(f"{op} fp32 leave-one-GPU-out", "", "n/a", None, "op not evaluated"))
            continue
        per = per_gpu_mape(results[op]["logo"]["errors"], ["fp32"])
        mean, worst = mean_of(per), max(per.values(), default=None)
        met = None if mean is None else bool(mean <= goal["mean"] and worst <= goal["max_gpu"])
        out.append(_check(f"{op} fp32 leave-one-GPU-out", f"mean <= {goal['mean']:g} %, every GPU <= "
                          f"{goal['max_gpu']:g} %", f"mean {pct(mean)}, worst {pct(worst)}", met, _listing(per)))
    return out


def h200_heldout(results: Mapping, goal: Mapping) -> list[dict]:
    out = []
    for op, r in results.items():
        test = ((r.get("champion") or {}).get("frames") or {}).get("test")
        rows = gpu_rows(test)
        rows = rows[(rows["gpu"] == goal["gpu"]) & (rows["size"] == LARGE)] if len(rows) else rows
        if rows.empty:
            continue
        per = {f"{p}/{ph}": float(part["ape"].mean()) for (p, ph), part in rows.groupby(["precision", "phase"])}
        worst = max(per.values())
        out.append(_check(f"{op} {goal['gpu']} held-out configs >= 50 us", f"every precision/phase <= "
                          f"{goal['max']:g} %", f"worst {pct(worst)}", bool(worst <= goal["max"]), _listing(per)))
    return out


def low_precision_logo(results: Mapping, goal: Mapping) -> list[dict]:
    out = []
    for op, r in results.items():
        if "logo" not in r:
            continue
        per = per_gpu_mape(r["logo"]["errors"], goal["precisions"])
        per = {g: v for g, v in per.items() if g in goal["gpus"]}
        if not per:
            continue
        worst = max(per.values())
        out.append(_check(f"{op} fp16/bf16 on a GPU left out", f"every GPU <= {goal['max']:g} %",
                          f"worst {pct(worst)}, mean {pct(mean_of(per))}", bool(worst <= goal["max"]), _listing(per)))
    return out


def unseen_layers(results: Mapping, goal: Mapping) -> list[dict]:
    out = []
    for op, r in results.items():
        unseen = gpu_rows(((r.get("champion") or {}).get("frames") or {}).get("unseen"))
        per = {g: float(unseen.loc[unseen["gpu"] == g, "ape"].mean()) for g in goal["gpus"]
               if (unseen["gpu"] == g).any()} if len(unseen) else {}
        if not per:
            continue
        worst = max(per.values())
        out.append(_check(f"{op} neusight-label layers", f"every GPU <= {goal['max']:g} %", f"worst {pct(worst)}",
                          bool(worst <= goal["max"]), _listing(per)))
    return out


def interval_coverage(results: Mapping, goal) -> list[dict]:
    out = []
    lo, hi = (float(v) for v in goal)
    for op, r in results.items():
        if "logo" not in r:
            continue
        cov = coverage_by_gpu(r["logo"]["errors"])
        if not cov:
            continue
        per = {g: 100.0 * v["coverage"] for g, v in cov.items()}
        mean = mean_of(per)
        out.append(_check(f"{op} 80 % interval on held-out GPUs", f"{lo:g}-{hi:g} % of measurements inside",
                          f"mean {pct(mean)}", bool(lo <= mean <= hi), _listing(per)))
    return out


def api_speed(speed: Mapping, goal: Mapping) -> list[dict]:
    out = []
    for op, s in speed.items():
        if "error" in s:
            out.append(_check(f"{op} prediction API", "", "failed", False, s["error"]))
            continue
        met = bool(s["import_load_predict_s"] <= goal["import_s"]
                   and s["predictions_per_s"] >= goal["predictions_per_s"]
                   and s["weights_bytes"] <= goal["weights_bytes"])
        out.append(_check(f"{op} prediction API", f"import+load+predict <= {goal['import_s']:g} s over numpy/pandas, "
                          f">= {goal['predictions_per_s'] / 1e6:g} M predictions/s, <= "
                          f"{goal['weights_bytes'] / 2 ** 20:g} MiB", f"{s['import_load_predict_s']:.2f} s, "
                          f"{s['predictions_per_s'] / 1e6:.2f} M/s, {s['weights_bytes'] / 1024:.0f} KiB", met,
                          "measured on this machine"))
    return out


def check_all(targets: Mapping[str, Any], results: Mapping, speed: Mapping) -> list[dict]:
    """Every target's check, in the order of the issue that set them."""
    done = {k: v for k, v in results.items() if "skipped" not in v}
    checks = (logo_fp32(done, targets["logo_fp32"]) + h200_heldout(done, targets["h200_heldout"])
              + low_precision_logo(done, targets["low_precision_logo"])
              + unseen_layers(done, targets["unseen_layers"])
              + interval_coverage(done, targets["interval_coverage"]) + api_speed(speed, targets["api"]))
    return [{k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in c.items()} for c in checks]
