"""The committed reports were made with the champions shipped beside them: a new champion without regenerated
reports fails here (a cross-GPU step error once doubled unseen because its report still showed older scalers).

Regenerate with ``make evaluate`` (then ``python -m pipeline.evaluation.readme``), ``python -m pipeline.step.labels
--extdata ../shared/extdata --out reports/`` and ``python -m pipeline.step.labels_parallel --extdata
../shared/extdata --out reports/``; the README quotes the last two (its step and data-parallel validations)."""

import json
import re
from pathlib import Path

import pytest

from pipeline import checkpoint as ck
from pipeline.schema import OPS

REPO = Path(__file__).resolve().parent.parent
REPORTS = REPO / "reports"
CHAMPIONS = {op: ck.champion_version(REPO / "checkpoints", op) for op in OPS}


SCALERS_MARKER = "Scalers: published scalers for "


def _scalers_used(text: str) -> dict[str, int]:
    """{op: version} of the linear and bmm scalers a step-validation report names after its marker."""
    tail = text.split(SCALERS_MARKER, 1)[1][:200] if SCALERS_MARKER in text else ""
    return {op: int(v) for op, v in re.findall(r"\b(linear|bmm) v(\d+)\b", tail)}


def test_the_evaluation_report_is_of_the_shipped_champions():
    report = json.loads((REPORTS / "evaluation.json").read_text())
    used = {op: entry["champion"].get("version") for op, entry in report["ops"].items()}
    assert used == {op: v for op, v in CHAMPIONS.items() if op in used}, "regenerate reports/ with make evaluate"


@pytest.mark.parametrize("name", ["label_validation.md", "multigpu_neusight.md"])
def test_the_step_validations_are_of_the_shipped_champions(name):
    text = (REPORTS / name).read_text()
    assert SCALERS_MARKER in text, f"{name} does not say which scalers it used: regenerate it"
    used = _scalers_used(text)
    assert set(used) == {"linear", "bmm"}, f"{name} does not say which scalers it used"
    assert used == {op: CHAMPIONS[op] for op in used}, f"regenerate {name}"


def _readme() -> str:
    return " ".join((REPO / "README.md").read_text().split())   # whitespace collapsed: quotes span line breaks


def _versions(text: str) -> str:
    used = _scalers_used(text)
    return f"linear v{used['linear']}, bmm v{used['bmm']}"


def test_the_readme_quotes_the_step_validation_of_the_shipped_scalers():
    text = (REPORTS / "label_validation.md").read_text()
    errors = dict(re.findall(r"## Mode `([\w-]+)`.*?Off-diagonal mean \|error\|: ([\d.]+) %", text, re.S))
    quote = (f"({_versions(text)}): {errors['scalers']} % with the calibrated transfer (the default), "
             f"{errors['scalers-direct']} % direct, {errors['scalers-ratio']} % by Habitat's full ratio, "
             f"{errors['wave']} % by wave scaling alone")
    assert quote in _readme(), f"README's step validation should read: {quote}"


def test_the_readme_quotes_the_data_parallel_validation_of_the_shipped_scalers():
    text = (REPORTS / "multigpu_neusight.md").read_text()
    errors = {(mode, dest, int(batch)): err for mode, dest, batch, err in
              re.findall(r"^\| ([\w-]+) \| ([\w-]+) \| (\d+) \| \d+ \| ([\d.]+) \|", text, re.M)}
    modes = ("scalers", "scalers-direct", "scalers-ratio", "wave")
    a100 = {mode: errors[(mode, "a100-sxm4-40gb", 1)] for mode in modes}
    quote = (f"within {a100['scalers']} % mean absolute error with the scalers' calibrated transfer "
             f"({a100['scalers-direct']} % direct, {a100['scalers-ratio']} % by the full ratio, {a100['wave']} % "
             f"wave-only; {_versions(text)}); the H100's within {errors[('scalers', 'h100-sxm', 1)]} % (per-GPU "
             f"batch 1) and {errors[('scalers', 'h100-sxm', 4)]} % (batch 4")
    assert quote in _readme(), f"README's data-parallel validation should read: {quote}"
