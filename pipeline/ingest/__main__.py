"""``python -m pipeline.ingest`` (``make import``): the Hydra app over ``conf/ingest.yaml``."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import hydra
from hydra.utils import to_absolute_path
from omegaconf import DictConfig

from pipeline import schema
from pipeline.ingest import LABEL_KINDS, IngestError, LaunchRule, Report, floor_table, run, skipped_table, summary_table
from pipeline.ingest.collectives import collective_summary, import_collectives


@hydra.main(config_path="../../conf", config_name="ingest", version_base=None)
def main(cfg: DictConfig) -> None:
    extdata = Path(to_absolute_path(str(cfg.extdata)))
    out = Path(to_absolute_path(str(cfg.out)))
    report = Report()
    started = time.perf_counter()
    collective_sources = list(cfg.get("collective_sources") or [])
    try:
        rule = LaunchRule.from_config(cfg.get("launch_bound"))
        frame = run(extdata, out, sources=list(cfg.sources), label_kinds=list(cfg.get("label_kinds", LABEL_KINDS)),
                    launch_rule=rule, progress=bool(cfg.get("progress", True)), report=report)
        collectives = (import_collectives(extdata, Path(to_absolute_path(str(cfg.collectives_out))),
                                          collective_sources, report) if collective_sources else None)
    except IngestError as exc:
        # A short message naming the config key; paths as given on the command line (relative stays relative).
        print(f"error: {str(exc).replace(str(extdata), str(cfg.extdata))}", file=sys.stderr)
        raise SystemExit(2) from None
    print(summary_table(frame))
    print(skipped_table(report))
    print("launch floors (rule in each file's metadata):")
    print(floor_table(report))
    if collectives is not None:
        print(collective_summary(collectives))
    print(f"imported in {time.perf_counter() - started:.1f} s")
    if cfg.get("verify", True):
        checked = schema.read_dataset(out)
        print(f"verified: {len(checked)} rows under {cfg.out} read back through pipeline.schema.read_dataset")


if __name__ == "__main__":
    main()
