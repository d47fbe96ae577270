"""The committed reports were made with the champions shipped beside them: a new champion without regenerated
reports fails here (a cross-GPU step error once doubled unseen because its report still showed older scalers).

Regenerate with ``make evaluate`` (then ``python -m pipeline.evaluation.readme``), ``python -m pipeline.step.labels
--extdata ../shared/extdata --out reports/`` and ``python -m pipeline.step.labels_parallel --extdata
../shared/extdata --out reports/``."""

import json
import re
from pathlib import Path

import pytest

from pipeline import checkpoint as ck
from pipeline.schema import OPS

REPO = Path(__file__).resolve().parent.parent
REPORTS = REPO / "reports"
CHAMPIONS = {op: ck.champion_version(REPO / "checkpoints", op) for op in OPS}


def test_the_evaluation_report_is_of_the_shipped_champions():
    report = json.loads((REPORTS / "evaluation.json").read_text())
    used = {op: entry["champion"].get("version") for op, entry in report["ops"].items()}
    assert used == {op: v for op, v in CHAMPIONS.items() if op in used}, "regenerate reports/ with make evaluate"


@pytest.mark.parametrize("name", ["label_validation.md", "multigpu_neusight.md"])
def test_the_step_validations_are_of_the_shipped_champions(name):
    text = (REPORTS / name).read_text()
    marker = "Scalers: published scalers for "
    assert marker in text, f"{name} does not say which scalers it used: regenerate it"
    used = dict(re.findall(r"\b(linear|bmm) v(\d+)\b", text.split(marker, 1)[1][:200]))
    assert set(used) == {"linear", "bmm"}, f"{name} does not say which scalers it used"
    assert {op: int(v) for op, v in used.items()} == {op: CHAMPIONS[op] for op in used}, f"regenerate {name}"
