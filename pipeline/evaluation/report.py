"""The Markdown report (``evaluation.md``) and its figures; every number comes from the results it is given."""

from __future__ import annotations

import datetime as dt
import os
import platform
from collections.abc import Mapping

import numpy as np

from pipeline.evaluation import plots, sections
from pipeline.evaluation.analysis import coverage_by_gpu, gpu_rows, per_gpu_mape, precision_phase_size_rows
from pipeline.evaluation.logo import pair_means, ratio_matrix
from pipeline.evaluation.metrics import ERROR_DEFINITION, md_table, num, pct, summarise, summary_rows
from pipeline.provenance import git_describe
from pipeline.training.config import to_dict

BY_PRECISION_PHASE = ["precision", "phase", "rows", "MAPE %", "median %", "p90 %"]


def _header(cfg, results: Mapping, seconds: float) -> list[str]:
    now = dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat()
    excluded = ", ".join(to_dict(cfg.data).get("exclude_sources") or []) or "none"
    md = ["# Evaluation report", "",
          f"Generated {now} by `python -m pipeline.evaluation` at commit {git_describe()}, in {seconds / 60:.1f} min "
          f"on {os.cpu_count()} CPU cores ({platform.machine()}). Data: every dataset under `{cfg.data.root}/` "
          f"(sources excluded from training: {excluded}). Error: {ERROR_DEFINITION}.", ""]
    skipped = {op: r["skipped"] for op, r in results.items() if "skipped" in r}
    if skipped:
        md += ["Ops without data (not evaluated): " + "; ".join(f"{op}: {why}" for op, why in skipped.items()), ""]
    return md


def _how(cfg) -> list[str]:
    logo, model = cfg.eval.logo, to_dict(cfg.model)
    epochs = logo.max_epochs or cfg.trainer.max_epochs
    stopping = (f"early stopping after {logo.patience} epochs without validation improvement" if logo.patience
                else "no early stopping")
    return [
        "## How these numbers were made", "",
        f"- **Model**: `{model.get('target')}` (`pipeline.targets`), hidden {model.get('hidden')} "
        f"{model.get('activation')}, {model.get('loss')} loss on the log error, rows weighted per source/GPU/"
        f"precision/phase group by n^-{cfg.data.get('balance')}.",
        f"- **Leave-one-GPU-out**: for every training GPU with at least {logo.min_rows} rows of the op, a model is "
        f"retrained without that GPU and predicts all of its rows. The retrains are *reduced* so that the report "
        f"runs on a small CPU machine: at most {epochs} epochs ({stopping}), and at most "
        f"{logo.max_train_rows or 'all'} training rows (a GPU-balanced random subsample: every GPU keeps min(its "
        "rows, a common cap)). The training run makes the same passes (same settings) for its card and its interval.",
        "- **Launch floors**: a host-timed source (NeuSight, DeepBench) measures `max(GPU time, its host's launch "
        "floor)`; where its launch-bound rows show the floor, every prediction compared with its rows is `max(predicted"
        " GPU time, floor)` too, and the launch-bound rows themselves (their time is the floor) are counted apart.",
        "- **80 % intervals on held-out GPUs**: for each held-out GPU, the interval is calibrated on the other GPUs' "
        "leave-out errors only and applied to it; the coverage is the share of its measurements inside.",
        "- **Ratio (Habitat-style) scaling**: for every origin -> destination pair, on the (config, precision, phase) "
        "rows both GPUs measured (median over duplicate measurements), the prediction is `measured(origin) x "
        "model(dest) / model(origin)`, using the model retrained *without the destination*; pairs with fewer than "
        f"{cfg.ratio.min_rows} common rows are left blank.",
        "- **In-distribution**: the published champion (`checkpoints/<op>/champion.json`) on the configs hashed into "
        "the test split (never trained on, on GPUs it trained on), and on the excluded source (BERT-Large / "
        "GPT-2-Large layers, partly on GPUs absent from training: H100, L4, A100 80GB).",
        "- All predictions run through the prediction API (`pipeline.api.Scaler`); rows of precisions a GPU cannot "
        "run (per `conf/gpus.yaml`) are not in the data; *roofline alone* is the model-free baseline "
        "`max(flops / peak, bytes / bandwidth)` (or its ratio).", ""]


def _transfer_cell(s: Mapping) -> str:
    if s.get("ratio_direct_mean_mape") is None:
        return "-"
    weight = "" if s.get("transfer_weight") is None else f" ({s['transfer_weight']:g})"
    return f"{pct(s['ratio_direct_mean_mape'])} / {pct(s.get('transfer_mean_mape'))}{weight}"


def _summary_section(results: Mapping, summary: Mapping, checks: list[dict]) -> list[str]:
    rows = []
    for op, s in summary.items():
        ch = results[op]["champion"]
        which = f" (v{ch['version']})" if ch.get("published") else " (reduced fit, no champion)"
        unseen = ", ".join(f"{g} {num(v)}" for g, v in s["unseen_mape"].items() if g in ("h100-sxm", "l4")) or "-"
        rows.append([op, pct(s["logo_mean_mape"]), pct(s["logo_large_mean_mape"]), pct(s["logo_fp32_mean_mape"]),
                     pct(s["ratio_mean_mape"]), _transfer_cell(s), pct(s["test_mape"]) + which,
                     pct(s["h200_test_large_mape"]), unseen,
                     pct(None if s["interval_coverage_mean"] is None else 100 * s["interval_coverage_mean"]),
                     pct(s["neusight_unseen_gpu_mape"]) if s["neusight_unseen_gpu_mape"] is not None else "-"])
    md = ["## Summary", "",
          "Mean absolute % error on rows that measure the GPU (a host-timed source's launch-floor rows are counted "
          "apart, per op below). Leave-one-GPU-out columns are means over the held-out GPUs.", "",
          md_table(["op", "leave-one-GPU-out", "... >= 50 us", "... fp32", "ratio scaling",
                    "same pairs: direct / calibrated (weight)", "held-out configs",
                    "H200 held-out >= 50 us", "neusight-label H100 / L4 (%)", "80 % interval coverage (held-out GPUs)",
                    "NeuSight unseen-GPU (paper)"], rows),
          "NeuSight's figures are from its paper (ASPLOS'25) on its own unseen-GPU set; ours are on the GPUs in this "
          "dataset, so the comparison is indicative, not like-for-like.", ""]
    return md + sections.targets_section(checks)


def _logo_section(cfg, op: str, r: Mapping, files: dict) -> list[str]:
    logo = r["logo"]
    md = ["### Leave-one-GPU-out", ""]
    if not logo["gpus"]:
        return md + ["Not run: the op has fewer than two training GPUs with enough rows.", ""]
    cached = " (reused from the cache: same data, settings and code)" if logo.get("reused_from_cache") else ""
    md += [f"{len(logo['gpus'])} retrains, computed {logo.get('computed')} in {logo.get('seconds', 0) / 60:.1f} min"
           f"{cached}.", ""]
    large = per_gpu_mape(logo["errors"], large_only=True)
    coverage = coverage_by_gpu(logo["errors"])
    rows = []
    for g, v in logo["gpus"].items():
        if not v["all"].get("n"):
            continue
        mine = gpu_rows(logo["errors"][logo["errors"]["gpu"] == g])
        cov = coverage.get(g, {}).get("coverage")
        rows.append([g, len(mine), mine["ape"].mean() if len(mine) else float("nan"), large.get(g, float("nan")),
                     summarise(mine["ape"]).get("p90_ape", float("nan")), summarise(mine["roof_ape"]).get("mape",
                                                                                                        float("nan")),
                     "-" if cov is None else f"{100 * cov:.0f} %", f"{100 * v['out_of_range_fraction']:.0f} %",
                     v["train_rows"], v["epochs"]])
    header = ["held-out GPU", "rows", "MAPE %", ">= 50 us MAPE %", "p90 %", "roofline alone MAPE %",
              "80 % interval coverage", "rows outside training ranges", "training rows", "epochs"]
    name = f"{op}_leave_one_gpu_out.png"
    files[name] = plots.logo_png(op, logo["gpus"], to_dict(cfg.targets)["logo_fp32"]["mean"],
                                 to_dict(cfg.neusight_unseen_gpu_mape).get(op))
    return md + [md_table(header, rows), f"![{op} leave-one-GPU-out]({name})", ""]


def _ratio_section(cfg, op: str, logo: Mapping, files: dict) -> list[str]:
    ratio, min_rows = logo["ratio"], int(cfg.ratio.min_rows)
    md = ["### Ratio scaling (origin -> destination)", ""]
    mape, _ = ratio_matrix(ratio, min_rows)
    means = pair_means(ratio, min_rows)
    if means.empty:
        return md + [f"No origin/destination pair shares {min_rows} or more measured rows.", ""]
    name = f"{op}_ratio_matrix.png"
    files[name] = plots.ratio_png(op, mape)
    vals = means["ape"]
    best, worst = vals.idxmin(), vals.idxmax()
    cells = [[o, *["" if not np.isfinite(v) else num(float(v)) for v in mape.loc[o]]] for o in mape.index]
    md += [
        f"Mean over {len(vals)} pairs: {pct(float(vals.mean()))} (median pair {pct(float(vals.median()))}; "
        f"roofline-ratio alone on the same pairs: {pct(float(means['roof_ape'].mean()))}). Best pair "
        f"{best[0]} -> {best[1]} {pct(float(vals.min()))}, worst {worst[0]} -> {worst[1]} "
        f"{pct(float(vals.max()))}. Rows where either GPU's measurement is a host's launch floor are left out.", ""]
    card = logo.get("transfer")
    if card and "transfer_ape" in means:
        tried = ", ".join(f"{w} {v:.1f}" for w, v in card["mean_pair_mape"].items())
        md += [f"The same pairs and rows without the full ratio: the direct prediction of the destination errs "
               f"{pct(float(means['direct_ape'].mean()))}; `pipeline.transfer` with ratio weight "
               f"{card['ratio_weight']:g} (the lowest mean over pairs of these passes; 0 is direct, 1 Habitat's "
               f"ratio; mean over pairs per weight: {tried}) {pct(float(means['transfer_ape'].mean()))}. The "
               "published card carries its own weight, calibrated the same way on its training run's passes.", "",
               "By the sources of the two measurements (mean over their pairs of "
               f"{min_rows} or more rows; one source on both sides means one timing method and software stack):", "",
               md_table(["origin source -> destination source", "pairs", "ratio", "direct", "calibrated"],
                        _by_source_pair(ratio, min_rows)), ""]
    return md + [
        f"![{op} ratio matrix]({name})", "",
        "MAPE % per pair (rows: origin, columns: destination; blank: too few common rows):", "",
        md_table(["origin \\ dest", *mape.columns], cells), "By precision and phase (all pairs pooled):", "",
        md_table(BY_PRECISION_PHASE, summary_rows(ratio, ["precision", "phase"]))]


def _by_source_pair(ratio, min_rows: int) -> list[list]:
    """[sources, pairs, mean over pairs of the ratio / direct / calibrated MAPE] per origin -> destination source."""
    means = pair_means(ratio, min_rows, by=["origin_source", "dest_source"])
    return [[f"{o} -> {d}", len(part), *(float(part[c].mean()) for c in ("ape", "direct_ape", "transfer_ape"))]
            for (o, d), part in means.groupby(level=[0, 1], sort=True)]


def _champion_section(cfg, op: str, ch: Mapping) -> list[str]:
    md = ["### In-distribution: held-out configs, and the never-trained-on source", ""]
    if ch.get("published"):
        md += [f"Champion v{ch['version']} (created {ch.get('created')}), trained on: "
               f"{', '.join(ch['trained_gpus']) or 'n/a'}.", ""]
    else:
        md += [f"No champion was published under `{cfg.checkpoints_dir}/{op}` when this report ran, so a model fitted "
               f"here with the reduced settings above ({ch['train_rows']} training rows, {ch['epochs']} epochs) "
               f"stands in; trained on: {', '.join(ch['trained_gpus'])}.", ""]
    coverage = ch.get("interval_coverage") or {}
    test = gpu_rows(ch["frames"].get("test"))
    if "why_no_test" in ch:
        md += [f"Held-out configs: not evaluated ({ch['why_no_test']}).", ""]
    elif len(test):
        cov = coverage.get("test", {})
        rows = [[*r, "-" if g not in cov else f"{100 * cov[g]['coverage']:.0f} %"]
                for g, r in zip(sorted(test["gpu"].unique()), summary_rows(test, ["gpu"]))]
        md += ["Held-out configs (test split) per GPU, with the card's 80 % interval coverage:", "",
               md_table(["gpu", "rows", "MAPE %", "median %", "p90 %", "80 % interval coverage"], rows),
               "By precision, phase and size:", "",
               md_table(sections.SIZE_HEADER[:-1], precision_phase_size_rows(test, roof=False))]
    unseen = gpu_rows(ch["frames"].get("unseen"))
    if len(unseen):
        cov = coverage.get("unseen", {})
        rows = []
        for g, part in unseen.groupby("gpu", sort=True):
            s = summarise(part["ape"])
            rows.append([g, "yes" if g in ch["trained_gpus"] else "no (unseen GPU)", s["n"], s["mape"],
                         s["median_ape"], summarise(part["roof_ape"])["mape"],
                         "-" if g not in cov else f"{100 * cov[g]['coverage']:.0f} %"])
        md += ["Never-trained-on source (BERT-Large / GPT-2-Large layers, NeuSight's label set) per GPU:", "",
               md_table(["gpu", "GPU in training", "rows", "MAPE %", "median %", "roofline alone MAPE %",
                         "80 % interval coverage"], rows)]
    return md


def _op_section(cfg, op: str, r: Mapping, files: dict) -> list[str]:
    cached = " (retrains reused from the cache)" if r["logo"].get("reused_from_cache") else ""
    md = [f"## {op}", "",
          f"{r['rows']} rows ({', '.join(f'{k}: {v}' for k, v in r['rows_by_domain'].items())}); training GPUs "
          f"(rows): {', '.join(f'{g} ({n})' for g, n in r['rows_by_gpu'].items())}. Evaluated in "
          f"{r['seconds'] / 60:.1f} min{cached}.", ""]
    if r.get("dropped"):
        md += ["Rows not used: " + "; ".join(f"{why}: {n}" for why, n in r["dropped"].items()) + ".", ""]
    md += _logo_section(cfg, op, r, files)
    md += sections.precision_phase_section(op, r["logo"]["errors"], files)
    md += sections.device_section(r["table"], list(r["logo"]["gpus"]))
    md += _ratio_section(cfg, op, r["logo"], files)
    md += _champion_section(cfg, op, r["champion"])
    return md + sections.comparison_section(op, r.get("comparison") or {})


def _speed_section(speed: Mapping) -> list[str]:
    if not speed:
        return []
    rows = []
    for op, s in speed.items():
        if "error" in s:
            rows.append([op, "failed: " + s["error"], "", "", "", ""])
            continue
        rows.append([op, f"{1000 * s['import_load_predict_s']:.0f} ms", f"{1000 * s['numpy_pandas_import_s']:.0f} ms",
                     f"{s['predictions_per_s'] / 1e6:.2f} M/s", f"{s['hidden']} {s['activation']}",
                     f"{s['n_parameters']} ({s['weights_bytes'] / 1024:.0f} KiB)"])
    return ["## Prediction API speed (measured here)", "",
            f"Measured on this machine ({os.cpu_count()} CPU cores, shared), with each published champion. Latency: a "
            "fresh Python process, `import pipeline` + `load_scaler` (sha256 checks included) + one prediction, after "
            "`import numpy, pandas` (best of 3). Throughput: one `predict` call on a batch of configs (best of 3).", "",
            md_table(["op", "import + load + predict", "(numpy + pandas import)", "batch predictions/s",
                      "hidden layers", "parameters (weights file)"], rows)]


def markdown(cfg, results: Mapping, summary: Mapping, speed: Mapping, seconds: float, checks: list[dict]
             ) -> dict[str, bytes]:
    """{file name: bytes}: ``evaluation.md`` and the PNGs it links."""
    files: dict[str, bytes] = {}
    md = _header(cfg, results, seconds) + _how(cfg) + _summary_section(results, summary, checks)
    for op in summary:
        md += _op_section(cfg, op, results[op], files)
    md += _speed_section(speed)
    files["evaluation.md"] = ("\n".join(md).rstrip() + "\n").encode()
    return files
