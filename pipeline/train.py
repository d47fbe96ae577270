"""Train, evaluate, track (MLflow) and publish the per-op scalers: ``python -m pipeline.train [overrides]``.

Configuration: ``conf/train.yaml`` and its groups (data, model, optimizer, trainer, logger). Examples::

    python -m pipeline.train                      # all ops on every dataset under datasets/
    python -m pipeline.train op=bmm eval.logo_gpus=[]
    python -m pipeline.train op=linear eval.holdout_gpus=[t4]    # leave-GPU-out mode
    python -m pipeline.train op=conv2d promote=true              # override the champion rules

``op=<name>`` (or ``op=a,b``) picks the ops. ``conf/op/`` is also a config group (the collector's op spaces),
which Hydra would take ``op=...`` for; so this entry point takes ``op=`` off the command line itself and sets
the config's ``op`` key after composition (``split_op_override``).
"""

from __future__ import annotations

import sys

import hydra
from omegaconf import DictConfig

_OP_OVERRIDE: str | None = None


def split_op_override(args: list[str]) -> tuple[list[str], str | None]:
    """``(overrides without op=..., the op value or None)``."""
    rest, op = [], None
    for arg in args:
        if arg.startswith("op="):
            op = arg[len("op="):].strip("'\"")
        else:
            rest.append(arg)
    return rest, op


@hydra.main(version_base=None, config_path="../conf", config_name="train")
def main(cfg: DictConfig) -> None:
    from pipeline.training.runner import run

    if _OP_OVERRIDE is not None:
        cfg.op = _OP_OVERRIDE
    run(cfg)


if __name__ == "__main__":
    rest, _OP_OVERRIDE = split_op_override(sys.argv[1:])
    sys.argv = sys.argv[:1] + rest
    main()
