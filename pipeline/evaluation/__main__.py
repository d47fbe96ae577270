"""``python -m pipeline.evaluation [op=bmm] [overrides]`` (``make evaluate``): the evaluation report.

A Hydra app over ``conf/evaluate.yaml``. Without any data it exits with code 2 and says what to run.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig


@hydra.main(version_base=None, config_path="../../conf", config_name="evaluate")
def main(cfg: DictConfig) -> None:
    from pipeline.evaluation.run import run
    from pipeline.training.config import run_or_exit

    run_or_exit(run, cfg, "pipeline.evaluation")


if __name__ == "__main__":
    main()
