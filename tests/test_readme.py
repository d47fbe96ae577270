"""The README's examples run as printed: the API block and the `python -m pipeline.predict` commands."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT

README = (ROOT / "README.md").read_text()


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, re.S)


def test_api_example_runs_as_printed():
    [block] = [b for b in _blocks("python") if b.startswith("from pipeline import load_scaler")]
    scope: dict = {}
    exec(compile(block, "README.md", "exec"), scope)
    assert scope["s"].op == "conv2d"
    for name in ("ms", "h100_ms", "l4_ms", "low", "high"):
        values = np.asarray(scope[name], dtype=float)
        assert values.size and np.all(np.isfinite(values)) and np.all(values > 0), name
    assert np.all(scope["low"] <= scope["high"])


def _predict_commands() -> list[str]:
    commands, lines = [], "\n".join(_blocks("bash")).replace("\\\n", " ").splitlines()
    for line in lines:
        line = line.split(" #")[0].strip()
        if line.startswith("python -m pipeline.predict "):
            commands.append(line)
    return commands


def test_readme_shows_predict_commands():
    assert len(_predict_commands()) >= 2


@pytest.mark.parametrize("command", _predict_commands())
def test_predict_command_runs_as_printed(command):
    argv = [sys.executable, *shlex.split(command)[1:]]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "H100" in done.stdout
