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
    if op not in schema.OPS:
        raise ValueError(f"op: unknown {op!r}; allowed: {', '.join(schema.OPS)}")
    folder = Path(root) / f"gpu={gpu}" / f"op={op}"
    files = [p for p in schema.dataset_files(Path(root)) if p.parent == folder]
    if not files:
        raise ValueError(f"gpu/op: no dataset files under {folder}")
    if before is not None:
        files = [p for p in files if (sweep_start(p) or "99999999999999") < before]
        if not files:
            raise ValueError(f"before: no dataset file under {folder} is from a sweep begun before {before}")
    if screened_only:
        files = [p for p in files if screened(p)]
        if not files:
            raise ValueError(f"screened: no dataset file under {folder} is from a sweep run with the first screen")
    target = Path(dest) / f"gpu={gpu}" / f"op={op}"
    clashes = [p.name for p in files if (target / p.name).exists()]
    if clashes:
        raise ValueError(f"to: {target} already holds {clashes[:3]}: give a new retired root")
    tables = [pq.read_table(path) for path in files]
    tasks = tasks_with_status(tables, statuses)
    rows = touched = 0
    for path, table in zip(files, tables):
        keys = zip(table["config_id"].to_pylist(), table["precision"].to_pylist())
        mask = pa.array([key in tasks for key in keys], type=pa.bool_())
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
    return {"tasks": len(tasks), "rows": rows, "files": touched}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default="datasets")
    ap.add_argument("--gpu", required=True, help="dataset label, e.g. h200")
    ap.add_argument("--op", required=True, choices=schema.OPS)
    ap.add_argument("--status", required=True, help=f"comma-separated, of {', '.join(schema.STATUSES)}")
    ap.add_argument("--to", required=True, help="retired root, e.g. datasets/_retired/<name>")
    ap.add_argument("--before", help="only files of sweeps begun before this UTC time, YYYYmmddHHMMSS")
    ap.add_argument("--screened", action="store_true",
                    help="only files of sweeps run with the first screen_ms screen (no screen_key in their metadata)")
    args = ap.parse_args(argv)
    try:
        counts = retire_tasks(args.root, args.gpu, args.op, args.status.split(","), args.to, args.before,
                              args.screened)
    except ValueError as exc:
        print(f"retire: {exc}", file=sys.stderr)
        return 2
    print(f"retired {counts['tasks']} tasks: {counts['rows']} rows from {counts['files']} files to {args.to}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
