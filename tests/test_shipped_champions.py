"""Each shipped champion (checkpoints/<op>/champion.json) reproduces its card's test metrics on the measurements
shipped in the repository, through the prediction API.

The card records, per source/GPU, the fingerprint of the rows it was trained on, and test-split metrics per GPU.
For every source/GPU of our own measurements (public sources are imported, not shipped, and may be absent), the
rows are looked up by fingerprint under datasets/, each datasets/_retired/* and datasets/ together with each of
those (rows retired after training) -- all of their files, or those of the sweeps that started before the card
was created (file names carry the sweep's UTC start), so that rows landed after training do not hide the card's
--, with the row filters of
``conf/data/default.yaml`` (the rows a training run drops as mismeasured); the test-split error is recomputed with
``load_scaler`` and must match the card (per GPU, and per precision and phase; where a public source was tested
on the same GPU, only the precisions and phases it lacks, since those metrics mix the two). Tolerance: the card's
numbers and the API's come from the same float32 forward pass; 1e-4 relative leaves room for summation order only.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest
import yaml

from pipeline import api
from pipeline.collect.retire import sweep_start
from pipeline.evaluation.metrics import grouped, summarise
from pipeline.evaluation.predictions import error_frame, predict_rows
from pipeline.schema import OPS, conform, dataset_files, read_file
from pipeline.training.card import CITATIONS
from pipeline.training.data import HEURISTIC_SOURCE, OpTable, fingerprint

REPO = Path(__file__).resolve().parent.parent
DATASETS = REPO / "datasets"
REL_TOL = 1e-4
CHAMPIONS = [op for op in OPS if (api.DEFAULT_ROOT / op / "champion.json").exists()]


def shipped_roots() -> list[tuple[Path, ...]]:
    """datasets/ (read as the pipeline reads it), each retired sweep under datasets/_retired/, and datasets/ with
    each retired sweep: a retirement after training splits a card's rows between the two."""
    retired = DATASETS / "_retired"
    parts = sorted(p for p in retired.iterdir() if p.is_dir()) if retired.is_dir() else []
    return [(DATASETS,)] + [(p,) for p in parts] + [(DATASETS, p) for p in parts]


def sweep_started(path: Path) -> datetime | None:
    """The UTC start of the sweep that wrote ``path`` (``part-<YYYYmmddHHMMSS>-<id>-<shard>.parquet``)."""
    start = sweep_start(path)
    return datetime.strptime(start, "%Y%m%d%H%M%S").replace(tzinfo=UTC) if start else None


def root_frames(roots: tuple[Path, ...], op: str, gpu: str, created: datetime):
    """The ok rows of ``op`` on ``gpu`` under ``roots``: every file, then only the files older than ``created``."""
    paths = [p for root in roots for p in dataset_files(root)
             if p.parent.name == f"op={op}" and p.parent.parent.name == f"gpu={gpu}"]
    older = [p for p in paths if (sweep_started(p) or created) < created]
    for chosen in (paths, older) if len(older) < len(paths) else (paths,):
        if chosen:
            frame = conform(pd.concat([read_file(p) for p in chosen], ignore_index=True))
            yield frame[frame["status"] == "ok"]


def shipped_rows(op: str, source: str, gpu: str, entry: dict, split: dict, created: str) -> OpTable | None:
    """The card's training rows of ``source``/``gpu``, where a shipped root holds exactly them."""
    filters = yaml.safe_load((REPO / "conf" / "data" / "default.yaml").read_text())
    data_cfg = {"sources": [source], "exclude_sources": [], "split_salt": split["salt"],
                "train_fraction": split["train"], "val_fraction": split["val"],
                "exclude_rows": filters.get("exclude_rows"), "min_bound_ratio": filters.get("min_bound_ratio")}
    when = datetime.fromisoformat(created).astimezone(UTC)
    for root in shipped_roots():
        for frame in root_frames(root, op, gpu, when):
            if source == HEURISTIC_SOURCE:   # read as data.heuristic_roots are: relabelled, train-split rows only
                frame = frame.assign(source=HEURISTIC_SOURCE)
            table = OpTable.from_frame(frame, op, data_cfg)
            if source == HEURISTIC_SOURCE:
                table = table.subset(table.masks()["train"])
            if len(table.frame) == entry["rows"] and fingerprint(table.frame) == entry["fingerprint"]:
                return table
    return None


def test_there_are_shipped_champions():
    assert CHAMPIONS, "checkpoints/ ships no champion"


@pytest.mark.parametrize("op", CHAMPIONS)
def test_champion_reproduces_its_card_on_shipped_data(op):
    scaler = api.load_scaler(op)
    card = scaler.card
    assert json.loads((api.DEFAULT_ROOT / op / "champion.json").read_text())["version"] == scaler.version
    data = card["training_data"]
    own = {k: v for k, v in data["by_source_gpu"].items() if v["source"] not in CITATIONS}
    assert own, f"{op} v{scaler.version} was trained on public data only: nothing shipped to check"
    for key, entry in own.items():
        table = shipped_rows(op, entry["source"], entry["gpu"], entry, data["split"], card["created"])
        assert table is not None, f"{key}: no shipped rows match the card's fingerprint"
        assert {s: int((table.frame["split"] == s).sum()) for s in entry["rows_by_split"]} == entry["rows_by_split"]
        if entry["source"] == HEURISTIC_SOURCE:   # trained on, never tested on: no error of its own to check
            continue
        test = table.frame["split"].to_numpy() == "test"
        pred, _ = predict_rows(scaler, table, test)
        errors = error_frame(table, test, pred)
        expected = card["metrics"]["test"]
        if not errors["ape"].size:  # a GPU with few configs may have none in the test split: nothing to check
            assert entry["gpu"] not in expected["by_gpu"]
            continue
        # the card's metrics are per GPU: where a public source tested on the same GPU shares a precision and
        # phase, that group mixes both sources' rows, so only the groups of this source alone are checked
        others = [v for v in data["by_source_gpu"].values() if v["gpu"] == entry["gpu"]
                  and v["source"] not in (entry["source"], HEURISTIC_SOURCE)]
        shared = {(p, ph) for v in others for p in v["precisions"] for ph in v["phases"]}
        checks = {} if others else {
            f"by_gpu/{entry['gpu']}": (summarise(errors["ape"]), expected["by_gpu"][entry["gpu"]])}
        for group, got in grouped(errors.assign(g=entry["gpu"]), ["g", "precision", "phase"]).items():
            if tuple(group.split("/")[1:]) not in shared:
                checks[f"by_gpu_precision_phase/{group}"] = (got, expected["by_gpu_precision_phase"][group])
        assert checks, f"{key}: every group of the card mixes in another source's rows: nothing to check"
        for where, (got, want) in checks.items():
            assert got["n"] == want["n"] > 0, where
            for metric in ("mape", "median_ape", "p90_ape"):
                assert got[metric] == pytest.approx(want[metric], rel=REL_TOL), f"{op} {where} {metric}"
