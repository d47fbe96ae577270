"""Helpers shared by the tests: the repository's paths, its config groups, and composing its Hydra apps."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = ROOT / "conf"


def config_group(group: str) -> dict[str, dict]:
    """Every option of a plain-YAML config group (``conf/<group>/<option>.yaml``), by option name."""
    return {p.stem: yaml.safe_load(p.read_text()) for p in sorted((CONF_DIR / group).glob("*.yaml"))}


def compose_app(app: str, overrides=()):
    """The composed config of Hydra app ``app`` (collect, ingest, train, evaluate) with ``overrides``."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return compose(app, overrides=list(overrides))


def run_module(args: list[str], **kwargs) -> subprocess.CompletedProcess:
    """``python -m <args>`` from the repository root, with the repository importable."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, **kwargs)


@pytest.fixture(scope="session")
def spaces() -> dict[str, dict]:
    return config_group("space")


@pytest.fixture(scope="session")
def catalogs() -> dict[str, dict]:
    return config_group("catalog")
