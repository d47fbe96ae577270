"""Markdown sections of the report built on ``analysis``: the targets, errors per precision/phase and size, where
each GPU's device features sit against the training range, launch-floor rows, and the model comparison."""

from __future__ import annotations

from collections.abc import Mapping

from pipeline.evaluation import plots
from pipeline.evaluation.analysis import device_range_rows, gpu_rows, launch_bound_check, precision_phase_size_rows
from pipeline.evaluation.metrics import md_table, pct

EXPERIMENTS = "reports/model_experiments.md"
SIZE_HEADER = ["precision", "phase", "size", "rows", "MAPE %", "median %", "p90 %", "roofline alone MAPE %"]


def targets_section(checks: list[dict]) -> list[str]:
    if not checks:
        return []
    verdict = {True: "met", False: "missed", None: "n/a"}
    rows = [[c["target"], c["goal"], c["measured"], verdict[c["met"]], c["detail"]] for c in checks]
    return ["## Targets", "", md_table(["target", "goal", "measured", "verdict", "per GPU / group"], rows), "",
            f"What was tried for the missed targets, and what each experiment showed: `{EXPERIMENTS}`."]


def precision_phase_section(op: str, errors, files: dict) -> list[str]:
    """Leave-one-GPU-out errors per precision, phase and size class, the error-vs-size figure, launch floors."""
    if errors is None or errors.empty:
        return []
    name = f"{op}_error_vs_size.png"
    files[name] = plots.size_png(op, gpu_rows(errors))
    md = ["By precision, phase and op size (all held-out GPUs pooled; ops under 50 us are launch-scale kernels):", "",
          md_table(SIZE_HEADER, precision_phase_size_rows(errors)), f"![{op} error vs op size]({name})", ""]
    check = launch_bound_check(errors)
    if check["n"]:
        md += [f"Rows whose measurement is a host-timed source's launch floor ({check['n']} rows; left out above): the "
               f"predicted GPU time is at most 1.1x the measured floor on "
               f"{pct(100 * check['gpu_time_at_most_measured'])} of them (it must be: the GPU time is what hides "
               "under the floor).", ""]
    return md


def device_section(table, gpus: list[str]) -> list[str]:
    """Where each evaluated GPU's device features sit against those of the other training GPUs."""
    unseen = sorted(set(table.frame.loc[table.frame["domain"] == "unseen", "gpu"]) - set(gpus))
    rows = device_range_rows(table, list(gpus) + unseen)
    if not rows:
        return []
    return ["Device features of each held-out GPU (and of the GPUs only the never-trained-on source has) against "
            "the range of the other training GPUs: the features outside it (value, training min..max); '-' where "
            "all lie inside, so the GPU is an interpolation.", "",
            md_table(["gpu", "precision", "device features outside the training range"], rows)]


def comparison_section(op: str, comparison: Mapping[str, Mapping]) -> list[str]:
    """The same leave-one-GPU-out passes for every compared model config."""
    if not comparison:
        return []
    rows = [[name, pct(c["logo_mean_mape"]), pct(c["logo_large_mean_mape"]), pct(c["logo_fp32_mean_mape"]),
             pct(c.get("low_precision_mean_mape")), pct(c.get("worst_gpu_mape")), c.get("target", "")]
            for name, c in comparison.items()]
    return [f"### Model configs compared ({op}, the same leave-one-GPU-out passes)", "",
            md_table(["model config", "mean over GPUs", ">= 50 us", "fp32", "fp16/bf16", "worst GPU", "target kind"],
                     rows)]
