"""Retire whole tasks from an own dataset, so that a resumed sweep measures them again.

A sweep skips every (op, config, precision) task that has any row (``plan.completed``): its rows land together.
To measure tasks again -- rows a timing fix showed to be wrong, or a status whose test changed -- their rows, both
phases, move to a retired root (``datasets/_retired/<name>/``, skipped by every reader), where they stay
reproducible. The files keep their names and metadata; each write is atomic, and the retired copy is written
before the source file is rewritten, so an interruption can leave a row in both places but never in neither.

    python -m pipeline.collect.retire --gpu h200 --op lstm --status host_paced --to datasets/_retired/lstm-x \
        [--before 20261201105853]

``--before`` limits it to files of sweeps begun before that UTC time (a run id's leading ``YYYYmmddHHMMSS``):
rows that an older test flagged, not those a newer one confirmed. ``--screened`` limits it to files of sweeps run
with the first ``screen_ms`` screen, whose untuned call shared the task's cuDNN cache key (their metadata has a
``screen_ms`` and no ``screen_key``).

``--repeated`` (no ``--status``) moves instead the tasks a later sweep measured again: a sweep launched from a
checkout that lacked an earlier sweep's rows repeats its tasks, and the later copy goes to a check root (for
example ``datasets/_checks/<name>/``, where ``benchmarks/sweep_diff.py`` compares the two), leaving one
measurement per task in the training data.

    python -m pipeline.collect.retire --gpu h200 --op conv2d --repeated --to datasets/_checks/<name>
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline import schema
from pipeline.atomic import atomic_write_with, fsync_dir


def tasks_with_status(tables: Iterable[pa.Table], statuses: Iterable[str]) -> set[tuple[str, str]]:
    """(config_id, precision) of every task with a row in one of ``statuses``."""
    wanted = set(statuses)
    found = set()
    for table in tables:
        for config_id, precision, status in zip(*(table[c].to_pylist() for c in ("config_id", "precision", "status"))):
            if status in wanted:
                found.add((config_id, precision))
    return found


def sweep_start(path: Path) -> str | None:
    """The UTC start (``YYYYmmddHHMMSS``) of the sweep that wrote ``path`` (``part-<start>-<id>-<n>.parquet``)."""
    match = re.match(r"part-(\d{14})-", path.name)
    return match.group(1) if match else None


def screened(path: Path) -> bool:
    """Whether the sweep that wrote ``path`` ran the first screen: ``screen_ms`` set in the file's metadata and no
    ``screen_key`` (the screen that keeps its pick under another cuDNN cache key records one)."""
    meta = schema.file_metadata(path)
    return meta.get("screen_ms") is not None and meta.get("screen_key") is None


def _files(root, gpu: str, op: str) -> list[Path]:
    if op not in schema.OPS:
        raise ValueError(f"op: unknown {op!r}; allowed: {', '.join(schema.OPS)}")
    folder = Path(root) / f"gpu={gpu}" / f"op={op}"
    files = [p for p in schema.dataset_files(Path(root)) if p.parent == folder]
    if not files:
        raise ValueError(f"gpu/op: no dataset files under {folder}")
    return files


def _move(files: list[Path], tables: list[pa.Table], masks: list[pa.Array], target: Path) -> tuple[int, int]:
    """Move each table's masked rows to ``target`` (same file name), the retired copy written before the source is
    rewritten. Returns rows and files touched."""
    clashes = [p.name for p, m in zip(files, masks) if pc.any(m).as_py() and (target / p.name).exists()]
    if clashes:
        raise ValueError(f"to: {target} already holds {clashes[:3]}: give a new retired root")
    rows = touched = 0
    for path, table, mask in zip(files, tables, masks):
        retired = table.filter(mask)
        if not retired.num_rows:
            continue
        target.mkdir(parents=True, exist_ok=True)
        atomic_write_with(target / path.name, lambda tmp, t=retired: pq.write_table(t, tmp, compression="zstd"))
        kept = table.filter(pc.invert(mask))
        if kept.num_rows:
            atomic_write_with(path, lambda tmp, t=kept: pq.write_table(t, tmp, compression="zstd"))
        else:
            path.unlink()
            fsync_dir(path.parent)
        rows, touched = rows + retired.num_rows, touched + 1
    return rows, touched


def _task_keys(table: pa.Table) -> list[tuple[str, str]]:
    return list(zip(table["config_id"].to_pylist(), table["precision"].to_pylist()))


def retire_tasks(root: str | os.PathLike, gpu: str, op: str, statuses: Iterable[str],
                 dest: str | os.PathLike, before: str | None = None, screened_only: bool = False) -> dict[str, int]:
    """Move every row of the ``op`` tasks on ``gpu`` under ``root`` that have a row in ``statuses`` to ``dest``
    (same ``gpu=``/``op=`` layout and file names); with ``before``, only from files of sweeps begun before that
    ``YYYYmmddHHMMSS``; with ``screened_only``, only from files of sweeps run with the first screen. Returns counts
    of tasks, rows and files touched."""
    if before is not None and not re.fullmatch(r"\d{14}", before):
        raise ValueError(f"before: {before!r} is not a UTC time as YYYYmmddHHMMSS (a run id's first part)")
    statuses = list(statuses)
    bad = [s for s in statuses if s not in schema.STATUSES]
    if bad or not statuses:
        raise ValueError(f"statuses: {bad or 'none given'}; allowed: {', '.join(schema.STATUSES)}")
    files = _files(root, gpu, op)
    folder = files[0].parent
    if before is not None:
        files = [p for p in files if (sweep_start(p) or "99999999999999") < before]
        if not files:
            raise ValueError(f"before: no dataset file under {folder} is from a sweep begun before {before}")
    if screened_only:
        files = [p for p in files if screened(p)]
        if not files:
            raise ValueError(f"screened: no dataset file under {folder} is from a sweep run with the first screen")
    tables = [pq.read_table(path) for path in files]
    tasks = tasks_with_status(tables, statuses)
    masks = [pa.array([key in tasks for key in _task_keys(t)], type=pa.bool_()) for t in tables]
    rows, touched = _move(files, tables, masks, Path(dest) / f"gpu={gpu}" / f"op={op}")
    return {"tasks": len(tasks), "rows": rows, "files": touched}


def retire_repeats(root: str | os.PathLike, gpu: str, op: str, dest: str | os.PathLike) -> dict[str, int]:
    """Move the rows of every ``op`` task on ``gpu`` that an earlier sweep had already measured to ``dest``: the
    first sweep's rows stay (sweeps ordered by start time, then run id, from the file names). Returns counts of
    tasks, rows and files touched."""
    files = sorted(_files(root, gpu, op), key=lambda p: (sweep_start(p) or "", p.name))
    tables = [pq.read_table(path) for path in files]
    run_of = [p.name.rsplit("-", 1)[0] for p in files]          # part-<start>-<id>
    keys = [_task_keys(table) for table in tables]
    first_run: dict[tuple[str, str], str] = {}
    for run, file_keys in zip(run_of, keys):
        for key in file_keys:
            first_run.setdefault(key, run)
    later = [[first_run[key] != run for key in file_keys] for run, file_keys in zip(run_of, keys)]
    masks = [pa.array(flags, type=pa.bool_()) for flags in later]
    repeated = {key for file_keys, flags in zip(keys, later) for key, flag in zip(file_keys, flags) if flag}
    rows, touched = _move(files, tables, masks, Path(dest) / f"gpu={gpu}" / f"op={op}")
    return {"tasks": len(repeated), "rows": rows, "files": touched}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="datasets")
    ap.add_argument("--gpu", required=True, help="dataset label, e.g. h200")
    ap.add_argument("--op", required=True, choices=schema.OPS)
    ap.add_argument("--status", help=f"comma-separated, of {', '.join(schema.STATUSES)}")
    ap.add_argument("--repeated", action="store_true",
                    help="instead of --status: the tasks a later sweep measured again (the first sweep's rows stay)")
    ap.add_argument("--to", required=True, help="retired root, e.g. datasets/_retired/<name>")
    ap.add_argument("--before", help="only files of sweeps begun before this UTC time, YYYYmmddHHMMSS")
    ap.add_argument("--screened", action="store_true",
                    help="only files of sweeps run with the first screen_ms screen (no screen_key in their metadata)")
    args = ap.parse_args(argv)
    if args.repeated == (args.status is not None) or (args.repeated and (args.before or args.screened)):
        ap.error("give either --status (with --before/--screened if wanted) or --repeated alone")
    try:
        if args.repeated:
            counts = retire_repeats(args.root, args.gpu, args.op, args.to)
        else:
            counts = retire_tasks(args.root, args.gpu, args.op, args.status.split(","), args.to, args.before,
                                  args.screened)
    except ValueError as exc:
        print(f"retire: {exc}", file=sys.stderr)
        return 2
    print(f"retired {counts['tasks']} tasks: {counts['rows']} rows from {counts['files']} files to {args.to}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
