"""Atomic, durable file writes: the one way the pipeline writes a file that a reader may see.

A file is written under a hidden temporary name beside its destination, fsynced, renamed over the
destination, and the folder is fsynced, so a reader sees the old file or the new one, never a partial one,
and a crash right after the rename cannot lose it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename inside ``path`` durable (best effort: some filesystems refuse to fsync a folder)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def temp_path(path: str | os.PathLike) -> Path:
    """A hidden, unique temporary name beside ``path`` (readers skip names starting with '.')."""
    path = Path(path)
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")


def atomic_write(path: str | os.PathLike, data: bytes | str) -> Path:
    """Write ``data`` (text is UTF-8 encoded) to ``path`` atomically; returns the path."""
    payload = data.encode() if isinstance(data, str) else bytes(data)

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as fh:
            fh.write(payload)

    return atomic_write_with(path, write)


def atomic_write_with(path: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Call ``write(tmp)`` to produce the file under a temporary name, then move it to ``path`` atomically.

    For writers that need a path of their own (Parquet, images). The temporary file is removed on failure.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    try:
        write(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path
