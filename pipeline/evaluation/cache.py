"""The leave-one-GPU-out cache: retrains are the slow part of the report and do not depend on the champion.

Results are kept under ``cache_dir/<op>-<key>/``, the key a sha256 of the data fingerprint, every setting that
shapes a retrain and the source of the code it runs, so a report re-run after a new champion is published
skips them. Every file is written atomically and ``SHA256SUMS`` last; a load verifies the sums, so a cache
left half-written (or edited) is recomputed, never used.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

from pipeline import atomic
from pipeline import features as F
from pipeline.training.config import to_dict

FRAMES = ("errors", "ratio")
SUMS_FILE = "SHA256SUMS"
_PACKAGE = Path(__file__).resolve().parent.parent
_CODE = ("features.py", "physics.py", "targets.py", "mlp.py", "intervals.py", "api.py", "gpus.py", "transfer.py",
         "training/*.py", "evaluation/logo.py", "evaluation/predictions.py", "evaluation/metrics.py")


def code_digest() -> str:
    """sha256 over the source of the modules a retrain's result depends on."""
    h = hashlib.sha256()
    for pattern in _CODE:
        for path in sorted(_PACKAGE.glob(pattern)):
            h.update(path.relative_to(_PACKAGE).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def cache_dir(cfg, op: str, table) -> Path | None:
    """Where the results of ``op``'s retrains on ``table`` under ``cfg`` live; None without ``cache_dir``."""
    where = cfg.get("cache_dir")
    if not where:
        return None
    from pipeline.training.data import TRAINED_DOMAINS, fingerprint

    domain = table.frame[table.frame["domain"].isin(TRAINED_DOMAINS)]
    data = {f"{d}/{g}": fingerprint(part) for (d, g), part in domain.groupby(["domain", "gpu"], sort=True)}
    key = {"op": op, "data": data, "gpus": sorted(domain["gpu"].unique()), "seed": int(cfg.seed),
           "logo": to_dict(cfg.eval.logo), "model": to_dict(cfg.model), "optimizer": to_dict(cfg.optimizer),
           "trainer": to_dict(cfg.trainer), "data_config": to_dict(cfg.data), "threads": cfg.get("threads"),
           "ratio": to_dict(cfg.ratio) if "ratio" in cfg else None,
           "features_version": F.features_version(op), "code": code_digest()}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]
    return Path(where) / f"{op}-{digest}"


def save(directory: Path, logo: Mapping) -> None:
    """Store ``run_logo``'s result: its frames as Parquet, the rest as JSON, then the checksums."""
    blobs = {"logo.json": json.dumps({k: v for k, v in logo.items() if k not in FRAMES}, sort_keys=True).encode()}
    for name in FRAMES:
        buf = io.BytesIO()
        logo[name].to_parquet(buf, index=False)
        blobs[f"{name}.parquet"] = buf.getvalue()
    for name, data in blobs.items():
        atomic.atomic_write(directory / name, data)
    atomic.atomic_write(directory / SUMS_FILE,
                        "".join(f"{hashlib.sha256(d).hexdigest()}  {n}\n" for n, d in sorted(blobs.items())))


def load(directory: Path) -> dict | None:
    """The stored result, or None when absent, incomplete or not matching its checksums."""
    try:
        sums = dict(reversed(line.split("  ", 1)) for line in (directory / SUMS_FILE).read_text().splitlines())
        blobs = {name: (directory / name).read_bytes() for name in sums}
    except (OSError, ValueError):
        return None
    wanted = {"logo.json", *(f"{name}.parquet" for name in FRAMES)}
    if set(blobs) != wanted or any(sums[n] != hashlib.sha256(d).hexdigest() for n, d in blobs.items()):
        print(f"{directory}: incomplete or checksum mismatch, recomputing", flush=True)
        return None
    logo = json.loads(blobs["logo.json"])
    for name in FRAMES:
        logo[name] = pd.read_parquet(io.BytesIO(blobs[f"{name}.parquet"]))
    return logo
