"""Where a result came from: the git commit of the code that made it (cards, reports, MLflow tags)."""

from __future__ import annotations

import subprocess
from pathlib import Path

_HERE = Path(__file__).resolve().parent


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], cwd=_HERE, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_commit() -> str | None:
    """The full sha of HEAD of the repository holding this package, or None outside a git checkout."""
    return _git("rev-parse", "HEAD") or None


def git_describe() -> str:
    """``<12-char sha>``, with " (with uncommitted changes)" when tracked files differ from HEAD; "unknown"
    outside a git checkout. For reports, where a reader needs to know whether the commit alone reproduces them."""
    sha = git_commit()
    if sha is None:
        return "unknown"
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return sha[:12] + (" (with uncommitted changes)" if dirty else "")
