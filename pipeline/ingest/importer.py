"""Run an import: find each source's files, read them, finalize and mark the rows, write them, report."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from pipeline import schema
from pipeline.ingest import aiconfigurator, deepbench, neusight, neusight_nodes, vidur
from pipeline.ingest.common import LABEL_KINDS, IngestError, Options, Report, Source, Task, finalize, write_source
from pipeline.ingest.launch import LaunchRule, floor_metadata, mark_launch_bound

log = logging.getLogger(__name__)

REGISTRY: dict[str, Source] = {s.name: s for s in (neusight.SOURCE, neusight_nodes.SOURCE, deepbench.SOURCE,
                                                     vidur.SOURCE, aiconfigurator.SOURCE)}
SOURCES = tuple(REGISTRY)


def check_extdata(extdata: str | Path) -> Path:
    path = Path(extdata)
    if not path.is_dir():
        raise IngestError(f"extdata folder not found: {path} (config key `extdata`; "
                          f"run `make import EXTDATA=<dir>` or `python -m pipeline.ingest extdata=<dir>`)")
    return path


def check_settings(sources: Iterable[str], label_kinds: Iterable[str]) -> tuple[list[str], Options]:
    """The sources to import (in order, without repeats) and the options, or an error naming the key."""
    sources = list(dict.fromkeys(sources))
    unknown = [s for s in sources if s not in REGISTRY]
    if unknown:
        raise IngestError(f"config key `sources`: unknown {unknown}; allowed: {', '.join(SOURCES)}")
    if not sources:
        raise IngestError("config key `sources` is empty: nothing to import")
    label_kinds = tuple(label_kinds)
    bad_kinds = [k for k in label_kinds if k not in LABEL_KINDS]
    if bad_kinds:
        raise IngestError(f"config key `label_kinds`: unknown {bad_kinds}; allowed: {', '.join(LABEL_KINDS)}")
    return sources, Options(label_kinds=label_kinds)


def discover(extdata: Path, sources: Iterable[str], options: Options, report: Report) -> list[Task]:
    """The files to read for ``sources``, in a fixed order."""
    tasks: list[Task] = []
    for name in sources:
        found = REGISTRY[name].tasks(extdata, options, report)
        if not found:
            raise IngestError(f"source {name!r}: no input files found under {extdata} (config key `extdata`)")
        tasks += found
    return tasks


def read_all(tasks: list[Task], progress: bool) -> dict[str, list[pd.DataFrame]]:
    """Reader rows per source; a reader's failure becomes an error naming the file."""
    raw: dict[str, list[pd.DataFrame]] = {}
    iterator = tasks
    if progress:
        from tqdm import tqdm
        iterator = tqdm(tasks, desc="import", unit="file", file=sys.stderr)
    for task in iterator:
        try:
            frame = task.reader(task)
        except IngestError:
            raise
        except Exception as exc:  # name the file
            raise IngestError(f"{task.rel}: cannot read ({type(exc).__name__}: {exc})") from exc
        raw.setdefault(task.source, []).append(frame)
    return raw


def run(extdata: str | Path, out: str | Path, sources: Iterable[str] = SOURCES,
        label_kinds: Iterable[str] = LABEL_KINDS, launch_rule: LaunchRule | None = None, progress: bool = False,
        report: Report | None = None) -> pd.DataFrame:
    """Import ``sources`` from ``extdata`` into ``out``; returns the rows written (schema columns).

    Files of a source are replaced atomically; its files that this run did not produce are removed; files of
    other sources and writers are left alone."""
    sources, options = check_settings(sources, label_kinds)
    extdata = check_extdata(extdata)
    out = Path(out)
    rule = launch_rule or LaunchRule()
    report = report if report is not None else Report()
    raw = read_all(discover(extdata, sources, options, report), progress)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for name in sources:
        source = REGISTRY[name]
        frames = [f for f in raw.get(name, []) if not f.empty]
        frame = finalize(pd.concat(frames, ignore_index=True), source, report) if frames else pd.DataFrame()
        if not frame.empty:
            frame = mark_launch_bound(frame, source, rule, report)
        write_source(frame, out, source, report, floor_metadata(report, name, rule, source.gpu_time))
        if not frame.empty:
            results.append(schema.conform(frame))
    _log_skipped(report)
    if not results:
        return schema.conform(pd.DataFrame(columns=list(schema.COLUMNS)))
    return pd.concat(results, ignore_index=True)


def _log_skipped(report: Report) -> None:
    for (source, gpu, op, phase), count in sorted(report.bad_times.items()):
        log.warning("%s %s %s %s: dropped %d rows with a missing or non-positive time", source, gpu, op, phase,
                    count)
    if report.unknown_gpus:
        log.warning("skipped %d rows on GPUs not in the registry: %s", sum(report.unknown_gpus.values()),
                    dict(sorted(report.unknown_gpus.items())))


def summary_table(frame: pd.DataFrame) -> str:
    """Rows per source x GPU (one column per op) with totals."""
    if frame.empty:
        return "no rows"
    table = frame.groupby(["source", "gpu", "op"]).size().unstack("op", fill_value=0)
    table["total"] = table.sum(axis=1)
    table.loc[("all", ""), :] = table.sum(axis=0)
    table = table.astype(int)
    return f"{table.to_string()}\n{len(frame)} rows on {frame['gpu'].nunique()} GPU labels"


def skipped_table(report: Report) -> str:
    """Rows the readers left out on purpose (e.g. AIConfigurator's fp8 kernels), per source and reason."""
    if not report.skipped_rows:
        return "skipped rows: none"
    lines = [f"  {source}: {reason}: {count}" for (source, reason), count in sorted(report.skipped_rows.items())]
    return "skipped rows (not imported):\n" + "\n".join(lines)
