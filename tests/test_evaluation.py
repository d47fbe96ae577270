"""The evaluation report end to end, composed from conf/evaluate.yaml, on a tiny SYNTHETIC fixture (a datasets/
tree written here: a few hundred rows of made-up bmm times on 3 GPUs; not measurements)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from synthetic import SOURCE, synthetic_conv2d_rows, write_datasets
from test_train import compose

from pipeline import atomic
from pipeline.evaluation import metrics
from pipeline.transfer import WEIGHTS

pytestmark = pytest.mark.filterwarnings("ignore:.*noload.*")  # sqlalchemy 2.1 vs MLflow's store
GPUS = ("h200", "t4", "a100-pcie-40gb")


def evaluate_cfg(tmp: Path, datasets: Path, extra=()):
    return compose([f"data.root={datasets}", "op=all", "model=mlp_small", "trainer.max_epochs=2",
                    "eval.logo.max_epochs=2", "eval.logo.patience=null", f"checkpoints_dir={tmp / 'checkpoints'}",
                    f"report_dir={tmp / 'reports'}", f"cache_dir={tmp / 'cache'}", "speed.batch_rows=2000",
                    f"logger.tracking_uri=sqlite:///{tmp / 'mlflow.db'}", f"logger.artifact_location={tmp / 'mlruns'}",
                    *extra], config_name="evaluate")


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """A report without a published champion (a reduced fit stands in), every write recorded."""
    from pipeline.evaluation.run import run

    tmp = tmp_path_factory.mktemp("evaluate")
    datasets = write_datasets(tmp / "datasets", n_configs=40, gpus=GPUS)
    written = []
    real = atomic.atomic_write
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(atomic, "atomic_write", lambda path, data: written.append(Path(path)) or real(path, data))
        out = run(evaluate_cfg(tmp, datasets, ["compare.ops=[]"]))
    return {"tmp": tmp, "datasets": datasets, "out": out, "written": written}


def report(tmp: Path) -> tuple[str, dict]:
    reports = tmp / "reports"
    return (reports / "evaluation.md").read_text(), json.loads((reports / "evaluation.json").read_text())


def test_report_holds_each_gpus_leave_out_error(first_run):
    md, blob = report(first_run["tmp"])
    logo = blob["ops"]["bmm"]["leave_one_gpu_out"]
    assert set(logo) == set(GPUS)
    cache = next((first_run["tmp"] / "cache").iterdir())
    errors = pd.read_parquet(cache / "errors.parquet")
    for gpu in GPUS:
        entry = logo[gpu]
        rows = errors[errors["gpu"] == gpu]
        assert entry["all"]["n"] == len(rows) > 0 and gpu not in entry["trained_on"]
        # the reported error is the mean of that GPU's per-row errors, and the table prints it
        assert entry["all"]["mape"] == pytest.approx(float(rows["ape"].mean()), rel=1e-12)
        line = f"| {gpu} | {entry['all']['n']} | {metrics.num(entry['all']['mape'])} |"
        assert line in md
    summary = blob["summary"]["bmm"]
    assert summary["logo_mean_mape"] == pytest.approx(np.mean([logo[g]["all"]["mape"] for g in GPUS]))
    ratio = blob["ops"]["bmm"]["ratio_matrix_mape"]
    assert ratio["h200"]["a100-pcie-40gb"] is not None and ratio["h200"]["h200"] is None
    # no champion was published: a reduced fit stands in, and the report says so
    assert "No champion was published" in md and blob["ops"]["bmm"]["champion"]["published"] is False
    assert "Ops without data (not evaluated)" in md and "skipped" in blob["ops"]["conv2d"]


def test_report_files_are_written_atomically(first_run):
    reports = first_run["tmp"] / "reports"
    files = set(reports.iterdir())
    assert {p.name for p in files} >= {"evaluation.md", "evaluation.json", "bmm_leave_one_gpu_out.png",
                                       "bmm_ratio_matrix.png"}
    assert files <= set(first_run["written"])  # every report file went through atomic_write
    leftovers = [p for p in first_run["tmp"].rglob(".*") if p.is_file()]
    assert not leftovers
    cache = next((first_run["tmp"] / "cache").iterdir())
    assert {p.name for p in cache.iterdir()} == {"logo.json", "errors.parquet", "ratio.parquet", "SHA256SUMS"}
    assert set(cache.iterdir()) <= set(first_run["written"])


def test_second_run_reuses_the_cache_after_a_champion_is_published(first_run, monkeypatch, capsys):
    """Publishing a champion changes nothing the retrains depend on: they come from the cache (run_logo is not
    called), and the champion is now evaluated (and timed) instead of the stand-in."""
    from pipeline.evaluation import run as evaluation_run
    from pipeline.training.runner import run as train

    tmp, datasets = first_run["tmp"], first_run["datasets"]
    train_cfg = compose([f"data.root={datasets}", "op=bmm", "model=mlp_small", "trainer.max_epochs=2",
                         "eval.logo.gpus=[]", f"checkpoints_dir={tmp / 'checkpoints'}", "~logger"])
    train(train_cfg)
    _, before = report(tmp)

    def no_retrain(*args, **kwargs):
        raise AssertionError("the leave-one-GPU-out retrains should come from the cache")

    monkeypatch.setattr(evaluation_run, "run_logo", no_retrain)
    evaluation_run.run(evaluate_cfg(tmp, datasets, ["op=bmm", "compare.ops=[]"]))
    assert "reused from" in capsys.readouterr().out
    md, blob = report(tmp)
    assert blob["ops"]["bmm"]["leave_one_gpu_out_reused_from_cache"] is True
    assert blob["ops"]["bmm"]["leave_one_gpu_out"] == before["ops"]["bmm"]["leave_one_gpu_out"]
    assert "reused from the cache" in md
    champion = blob["ops"]["bmm"]["champion"]
    assert champion["published"] is True and champion["version"] == 1 and champion["test"]["all"]["n"] > 0
    assert re.search(r"Champion v1 \(created .*\), trained on: a100-pcie-40gb, h200, t4", md)
    speed = blob["speed"]["bmm"]
    assert speed["heavy_modules"] == [] and speed["predictions_per_s"] > 0


def test_a_damaged_cache_is_recomputed(first_run, tmp_path):
    from pipeline.evaluation import cache

    source = next((first_run["tmp"] / "cache").iterdir())
    copy = tmp_path / source.name
    copy.mkdir()
    for p in source.iterdir():
        (copy / p.name).write_bytes(p.read_bytes())
    assert cache.load(copy)["gpus"].keys() == set(GPUS)
    (copy / "errors.parquet").write_bytes(b"not parquet")
    assert cache.load(copy) is None
    (copy / "SHA256SUMS").unlink()
    assert cache.load(copy) is None


def test_no_data_says_what_to_run(tmp_path):
    from pipeline.evaluation.run import run
    from pipeline.training.config import NoTrainingData

    with pytest.raises(NoTrainingData, match=r"make import.*make collect"):
        run(evaluate_cfg(tmp_path, tmp_path / "empty"))


def test_report_checks_the_targets_and_splits_by_size(first_run):
    md, blob = report(first_run["tmp"])
    checks = {c["target"]: c for c in blob["targets"]}
    fp32 = checks["bmm fp32 leave-one-GPU-out"]
    per_gpu = {g: v["by_precision_phase"] for g, v in blob["ops"]["bmm"]["leave_one_gpu_out"].items()}
    assert fp32["met"] is False and fp32["goal"] == "mean <= 12 %, every GPU <= 25 %"  # a 2-epoch fit on a fixture
    assert set(per_gpu) == set(GPUS)
    assert "## Targets" in md and "| bmm fp32 leave-one-GPU-out |" in md
    assert "By precision, phase and op size" in md and "bmm_error_vs_size.png" in md
    assert (first_run["tmp"] / "reports" / "bmm_error_vs_size.png").stat().st_size > 1000
    coverage = checks["bmm 80 % interval on held-out GPUs"]
    assert coverage["met"] in (True, False) and "h200" in coverage["detail"]
    # device features of each held-out GPU against the other training GPUs (t4 and the l4 have no bf16 rows here)
    assert "Device features of each held-out GPU" in md and "| l4 | fp32 |" in md


def test_model_configs_are_compared_on_the_same_passes(tmp_path):
    from pipeline.evaluation.run import run

    datasets = write_datasets(tmp_path / "datasets", n_configs=30, gpus=GPUS)
    run(evaluate_cfg(tmp_path, datasets, ["op=bmm", "compare.models=[mlp]", "mlflow=false"]))
    md, blob = report(tmp_path)
    comparison = blob["ops"]["bmm"]["comparison"]
    assert list(comparison) == ["bounded_utilisation (this report)", "mlp"]
    assert comparison["mlp"]["target"] == "log_roofline_ratio"
    main = comparison["bounded_utilisation (this report)"]
    assert main["logo_mean_mape"] == pytest.approx(blob["summary"]["bmm"]["logo_mean_mape"])
    assert "### Model configs compared (bmm" in md and len(list((tmp_path / "cache").iterdir())) == 2


def test_readme_accuracy_section_is_regenerated_from_the_report(first_run):
    from pipeline.evaluation.readme import HEADING, replace_section, section

    _, blob = report(first_run["tmp"])
    new = section(blob)
    s = blob["summary"]["bmm"]
    assert new.startswith(HEADING) and metrics.pct(s["logo_mean_mape"]) in new and "Targets met:" in new
    # the ratio pairs of the synthetic passes: Habitat's ratio, the direct prediction and the calibrated transfer
    assert s["transfer_weight"] in WEIGHTS and s["ratio_mean_mape"] is not None
    assert f"calibrated transfer (weight {s['transfer_weight']:g}) {metrics.pct(s['transfer_mean_mape'])}" in new
    assert f"the direct prediction {metrics.pct(s['ratio_direct_mean_mape'])}" in new
    readme = f"# x\n\n{HEADING}\n\nold numbers\n\n## Next\n\ntext\n"
    out = replace_section(readme, new)
    assert "old numbers" not in out and out.endswith("## Next\n\ntext\n") and out.count(HEADING) == 1


def test_a_gpus_pass_holds_out_its_sm_partitions_too():
    """The H200's pass must not train on its SM partitions (the same chip); a partition's pass holds out only
    itself; with_partitions=false restores one GPU per pass."""
    from synthetic import synthetic_rows

    from pipeline.evaluation.logo import held_out_with
    from pipeline.training.data import OpTable

    rows = synthetic_rows(gpus=("h200", "h200-sm32", "h200-sm16", "t4"), n_configs=30)
    table = OpTable.from_frame(rows, "bmm", {})
    assert set(table.training_gpus()) == {"h200", "h200-sm32", "h200-sm16", "t4"}
    assert sorted(held_out_with("h200", table, {})) == ["h200", "h200-sm16", "h200-sm32"]
    assert held_out_with("h200-sm32", table, {}) == ["h200-sm32"]
    assert held_out_with("t4", table, {"with_partitions": True}) == ["t4"]
    assert held_out_with("h200", table, {"with_partitions": False}) == ["h200"]
    conv = synthetic_conv2d_rows(gpus=("h200", "h200-sm32", "h200-sm16", "t4"), n_configs=10)
    heuristic_parts = conv.assign(source=np.where(conv["gpu"].str.startswith("h200-"), "own-heuristic", SOURCE))
    table = OpTable.from_frame(heuristic_parts, "conv2d", {})   # partitions with heuristic rows only leave too
    assert set(table.training_gpus()) == {"h200", "t4"}
    assert sorted(held_out_with("h200", table, {})) == ["h200", "h200-sm16", "h200-sm32"]


def test_balanced_subsample_caps_each_gpu_and_domain_so_heuristic_rows_never_crowd_out_autotuned_ones():
    from pipeline.evaluation.logo import balanced_subsample
    from pipeline.training.data import OpTable

    autotuned = synthetic_conv2d_rows(gpus=("h200", "t4"), n_configs=20)
    heuristic = synthetic_conv2d_rows(gpus=("h200",), n_configs=200, seed=3, source="own-heuristic")
    table = OpTable.from_frame(pd.concat([autotuned, heuristic], ignore_index=True), "conv2d", {})
    counts = table.frame.groupby(["gpu", "domain"]).size().to_dict()
    assert counts == {("h200", "train"): 40, ("t4", "train"): 40, ("h200", "heuristic"): 400}
    sub = balanced_subsample(table, exclude=["t4"], max_rows=200, seed=0)
    kept = sub.frame.groupby(["gpu", "domain"]).size().to_dict()
    assert kept == {("h200", "train"): 40, ("t4", "train"): 40, ("h200", "heuristic"): 160}
    assert balanced_subsample(table, exclude=[], max_rows=1000, seed=0) is table
