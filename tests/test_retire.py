"""Retiring whole tasks from an own dataset (``pipeline.collect.retire``), on synthetic fixtures."""

from __future__ import annotations

import pytest
from synthetic import synthetic_rows

from pipeline import schema
from pipeline.collect.plan import completed
from pipeline.collect.retire import main, retire_repeats, retire_tasks


def _dataset(tmp_path):
    rows = synthetic_rows(gpus=("h200",), n_configs=6, precisions=("fp32", "bf16"))
    paced = (rows["config_id"] == rows["config_id"].iloc[0]) & (rows["precision"] == "fp32") \
        & (rows["phase"] == "forward")
    rows.loc[paced, "status"] = "host_paced"            # one phase of one task
    note = {"note": "synthetic test fixture"}
    schema.write_partition(rows.iloc[:12], tmp_path / "ds", "part-a", metadata=note)
    schema.write_partition(rows.iloc[12:], tmp_path / "ds", "part-b", metadata=note)
    return rows, tmp_path / "ds", tmp_path / "ds" / "_retired" / "x"


def test_retiring_moves_both_phases_of_each_flagged_task_and_keeps_metadata(tmp_path):
    rows, root, dest = _dataset(tmp_path)
    task = (rows["config_id"].iloc[0], "fp32")
    counts = retire_tasks(root, "h200", "bmm", ["host_paced"], dest)
    assert counts == {"tasks": 1, "rows": 2, "files": 1}
    left = schema.read_dataset(root)
    gone = schema.read_dataset(dest)
    assert len(left) + len(gone) == len(rows)                           # nothing lost
    assert set(zip(gone["config_id"], gone["precision"])) == {task}     # the whole task, both phases
    assert sorted(gone["status"]) == ["host_paced", "ok"]
    assert task not in set(zip(left["config_id"], left["precision"]))
    assert (task[0], "bf16") in set(zip(left["config_id"], left["precision"]))   # its other precision stays
    retired_file = schema.dataset_files(dest)[0]
    assert schema.file_metadata(retired_file)["note"] == "synthetic test fixture"
    # a resumed sweep no longer counts the task as measured
    done = completed(root, "h200")
    assert ("bmm", task[0], "fp32") not in done and ("bmm", task[0], "bf16") in done


def test_retiring_refuses_bad_input_and_overwriting(tmp_path, capsys):
    _, root, dest = _dataset(tmp_path)
    with pytest.raises(ValueError, match="^statuses:"):
        retire_tasks(root, "h200", "bmm", ["slow"], dest)
    with pytest.raises(ValueError, match="^op:"):
        retire_tasks(root, "h200", "conv3d", ["host_paced"], dest)
    with pytest.raises(ValueError, match="^gpu/op:"):
        retire_tasks(root, "t4", "bmm", ["host_paced"], dest)
    assert main(["--root", str(root), "--gpu", "h200", "--op", "bmm", "--status", "host_paced", "--to",
                 str(dest)]) == 0
    assert "retired 1 tasks: 2 rows" in capsys.readouterr().out
    schema.write_partition(synthetic_rows(gpus=("h200",), n_configs=2).assign(status="host_paced"), root, "part-a")
    assert main(["--root", str(root), "--gpu", "h200", "--op", "bmm", "--status", "host_paced", "--to",
                 str(dest)]) == 2                                        # part-a is already retired there
    assert "already holds" in capsys.readouterr().err


def test_retiring_before_a_sweep_leaves_the_newer_sweeps_rows(tmp_path, capsys):
    rows = synthetic_rows(gpus=("h200",), n_configs=4, precisions=("fp32",)).sort_values(["config_id", "phase"])
    rows["status"] = "host_paced"                       # every task flagged, in both sweeps
    root, dest = tmp_path / "ds", tmp_path / "ds" / "_retired" / "x"
    schema.write_partition(rows.iloc[:4], root, "part-20261201063507-7dddb4-00000")
    schema.write_partition(rows.iloc[4:], root, "part-20261201105853-a43be5-00000")
    counts = retire_tasks(root, "h200", "bmm", ["host_paced"], dest, before="20261201105853")
    assert counts == {"tasks": 2, "rows": 4, "files": 1}
    left = schema.read_dataset(root)
    assert len(left) == len(rows) - 4                   # the newer sweep's rows stay
    assert set(left["config_id"]) == set(rows.iloc[4:]["config_id"])
    with pytest.raises(ValueError, match="^before:"):
        retire_tasks(root, "h200", "bmm", ["host_paced"], dest, before="2026-12-01")
    assert main(["--root", str(root), "--gpu", "h200", "--op", "bmm", "--status", "host_paced", "--to",
                 str(tmp_path / "y"), "--before", "20261201000000"]) == 2    # nothing that old
    assert "before:" in capsys.readouterr().err


def test_retiring_screened_sweeps_leaves_the_unscreened_rows(tmp_path, capsys):
    rows = synthetic_rows(gpus=("h200",), n_configs=4, precisions=("fp32",)).sort_values(["config_id", "phase"])
    root, dest = tmp_path / "ds", tmp_path / "ds" / "_retired" / "x"
    schema.write_partition(rows.iloc[:4], root, "part-20261201063507-7dddb4-00000", metadata={"screen_ms": None})
    schema.write_partition(rows.iloc[4:], root, "part-20261202071249-76851d-00000", metadata={"screen_ms": 250.0})
    later = synthetic_rows(gpus=("h200",), n_configs=2, precisions=("bf16",))     # the fixed screen's sweep stays
    schema.write_partition(later, root, "part-20261203010000-aaaaaa-00000",
                           metadata={"screen_ms": 250.0, "screen_key": "cudnn.deterministic"})
    counts = retire_tasks(root, "h200", "bmm", schema.STATUSES, dest, screened_only=True)
    assert counts == {"tasks": 2, "rows": 4, "files": 1}
    left, gone = schema.read_dataset(root), schema.read_dataset(dest)
    assert set(left["config_id"]) == set(rows.iloc[:4]["config_id"]) | set(later["config_id"])
    assert set(gone["config_id"]) == set(rows.iloc[4:]["config_id"])
    assert schema.file_metadata(schema.dataset_files(dest)[0])["screen_ms"] == 250.0
    assert main(["--root", str(root), "--gpu", "h200", "--op", "bmm", "--status", ",".join(schema.STATUSES),
                 "--to", str(tmp_path / "y"), "--screened"]) == 2       # no screened file is left
    assert "screened:" in capsys.readouterr().err


def test_retiring_repeats_keeps_the_first_sweeps_measurement_of_each_task(tmp_path, capsys):
    rows = synthetic_rows(gpus=("h200",), n_configs=4, precisions=("fp32",)).sort_values(["config_id", "phase"])
    root, dest = tmp_path / "ds", tmp_path / "ds" / "_checks" / "repeat"
    first, again = rows.iloc[:4], rows.iloc[2:8].copy()       # the second sweep repeats one task (rows 2-3)
    for col in ("time_ms", "time_p20_ms", "time_p80_ms"):
        again[col] *= 1.01
    schema.write_partition(first, root, "part-20261206223021-a1d1cd-00000", metadata={"note": "first"})
    schema.write_partition(again.iloc[:2], root, "part-20261206223851-a84a22-00000", metadata={"note": "again"})
    schema.write_partition(again.iloc[2:], root, "part-20261206223851-a84a22-00001", metadata={"note": "again"})
    counts = retire_repeats(root, "h200", "bmm", dest)
    assert counts == {"tasks": 1, "rows": 2, "files": 1}   # the one task both sweeps measured, both phases
    left, moved = schema.read_dataset(root), schema.read_dataset(dest)
    assert len(left) + len(moved) == len(first) + len(again)                       # nothing lost
    assert not left.duplicated(["config_id", "precision", "phase"]).any()
    repeated = rows.iloc[2]["config_id"]
    assert set(moved["config_id"]) == {repeated}
    kept = left[left["config_id"] == repeated].sort_values("phase")["time_ms"].to_numpy()
    assert kept.tolist() == first[first["config_id"] == repeated].sort_values("phase")["time_ms"].tolist()
    assert schema.file_metadata(schema.dataset_files(dest)[0])["note"] == "again"
    assert retire_repeats(root, "h200", "bmm", tmp_path / "y") == {"tasks": 0, "rows": 0, "files": 0}
    with pytest.raises(SystemExit):                                   # --repeated and --status are exclusive
        main(["--root", str(root), "--gpu", "h200", "--op", "bmm", "--repeated", "--status", "ok", "--to", "z"])
    with pytest.raises(SystemExit):                                   # one of them is needed
        main(["--root", str(root), "--gpu", "h200", "--op", "bmm", "--to", "z"])
    assert "either --status" in capsys.readouterr().err
