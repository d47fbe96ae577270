"""Train, evaluate, track (MLflow) and publish the per-op scalers: ``python -m pipeline.train [overrides]``.

Configuration: ``conf/train.yaml`` and its groups (data, model, optimizer, trainer, logger, eval). Examples::

    python -m pipeline.train                      # all ops on every dataset under datasets/
    python -m pipeline.train op=bmm eval.logo.gpus=[]
    python -m pipeline.train op=linear eval.holdout_gpus=[t4]    # leave-GPU-out mode
    python -m pipeline.train op=conv2d promote=true              # override the champion rules
    python -m pipeline.train op=linear recalibrate=true          # no fit: the champion with transfer calibrated anew

``op=<name>`` (or ``op=[a,b]``) picks the ops. Without any data it exits with code 2 and says what to run.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig


@hydra.main(version_base=None, config_path="../conf", config_name="train")
def main(cfg: DictConfig) -> None:
    from pipeline.training.config import run_or_exit
    from pipeline.training.runner import run

    run_or_exit(run, cfg, "pipeline.train")


if __name__ == "__main__":
    main()
