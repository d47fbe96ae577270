"""Helpers over the Hydra configs of ``pipeline.train`` and ``pipeline.evaluation`` (which share their groups)."""

from __future__ import annotations

from pathlib import Path

from pipeline.schema import OPS, dataset_files


class NoTrainingData(RuntimeError):
    """There is nothing to train or evaluate on; the message says what to run to get data."""


def to_dict(cfg) -> dict:
    """A plain, resolved dict of a (Hydra) config node or mapping."""
    from omegaconf import DictConfig, OmegaConf

    return OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)


def target_kind(cfg) -> str:
    """The target kind of the configured model (``model.target``; ``pipeline.targets.TARGET_KIND`` if unset)."""
    from pipeline.targets import TARGET_KIND

    return str(cfg.model.get("target") or TARGET_KIND)


def count_for(setting, op: str, name: str) -> int:
    """A per-op count setting (``fit.restarts``, ``fit.members``, ``eval.logo.members``, named by ``name``) for
    ``op``: an int for every op, or a mapping op -> int (ops not named: 1)."""
    from omegaconf import DictConfig

    if isinstance(setting, (dict, DictConfig)):
        unknown = sorted(set(setting) - set(OPS))
        if unknown:
            raise ValueError(f"{name}: unknown ops {unknown}; allowed: {', '.join(OPS)}")
        setting = setting.get(op, 1)
    if setting is None:
        return 1
    if isinstance(setting, bool) or not isinstance(setting, int) or setting < 1:
        raise ValueError(f"{name}: an integer >= 1 or a mapping op -> integer >= 1; got {setting!r}")
    return setting


def resolve_ops(op) -> list[str]:
    """``all``, an op name, ``a,b`` or a list -> op names; ValueError naming the allowed ones."""
    if op is None or op == "all":
        return list(OPS)
    ops = [op] if isinstance(op, str) else list(op)
    ops = [o for part in ops for o in str(part).split(",") if o]
    unknown = [o for o in ops if o not in OPS]
    if unknown:
        raise ValueError(f"op: unknown {unknown}; allowed: all, {', '.join(OPS)}")
    return ops


def _skipped_roots(root: Path) -> list[str]:
    """Dataset roots inside folders the readers skip (names starting with '_'), e.g. ``datasets/_retired/v1``."""
    found = set()
    for path in root.rglob("*.parquet") if root.is_dir() else []:
        parts = path.relative_to(root).parts
        if any(p.startswith("_") for p in parts) and any(p.startswith("gpu=") for p in parts):
            first_gpu = next(i for i, p in enumerate(parts) if p.startswith("gpu="))
            found.add((root / Path(*parts[:first_gpu])).as_posix())
    return sorted(found)


def require_datasets(root) -> None:
    """Raise NoTrainingData, saying how to get data, when no dataset file lies under ``root``."""
    root = Path(root)
    if root.is_dir() and dataset_files(root):
        return
    skipped = _skipped_roots(root)
    hint = (f" Rows under {', '.join(skipped)} are not read by default (folders starting with '_'); to use them, "
            f"set data.root={skipped[0]}." if skipped else "")
    raise NoTrainingData(
        f"no measurements under {root}/ (data.root). Get some first: `make import` converts the public data "
        f"(EXTDATA=<dir>, default ../shared/extdata) into {root}/external/, and `make collect GPU=<label>` "
        f"measures a GPU host.{hint}")


def run_or_exit(run, cfg, prog: str):
    """``run(cfg)`` for a command line app: NoTrainingData becomes its message on stderr and exit code 2."""
    import sys

    try:
        return run(cfg)
    except NoTrainingData as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        sys.exit(2)
