"""Published per-op scaler checkpoints: versioned, checksummed, never pickled.

Layout (``root`` is normally the repo's ``checkpoints/``)::

    <root>/<op>/v<N>/weights.safetensors   float32 tensors layers.<i>.weight [out, in] and layers.<i>.bias [out],
                                           i = 0..L-1, applied in order; the card's activation sits between
                                           layers, nothing after the last
    <root>/<op>/v<N>/card.json             the model card (keys below); card["files"] = {filename: sha256}
                                           of every file in the folder except card.json and card.sha256
    <root>/<op>/v<N>/card.sha256           "<sha256 of card.json>  card.json\\n" (``sha256sum -c`` format)
    <root>/<op>/v<N>/<extra>               optional extra files (e.g. report.png), listed in card["files"]
    <root>/<op>/champion.json              {"version": N, "promoted": ISO time, "reason": "...",
                                            "card_sha256": sha256 of that version's card.json}

Checksum scheme: ``card.sha256`` pins ``card.json``; ``card.json`` pins every other file. ``load`` verifies all
of them, and refuses a file that is missing, changed, or present in the folder but not listed (hidden files,
starting with ".", are ignored). Loading the champion also checks the card hash recorded in champion.json.

What this guards against: corruption, truncated or partial copies, a file swapped from another version, and an
edit to one file that is not carried through the hashes. What it does not: the hashes are stored next to the
files, unsigned, so a version whose files, card hashes and ``card.sha256`` are all rewritten consistently
loads (for the champion, ``champion.json`` too); integrity against deliberate tampering needs a trusted copy of
the hashes (e.g. the git history of ``checkpoints/``).

card.json keys: ``op, version, created (ISO), git_commit, mlflow_run_id, features: {names, mean, std},
target: {kind, ...}, architecture: {hidden: [...], activation: relu|gelu|silu}, training_data, metrics,
ranges: {feature_name: [min, max]}, files``. ``publish`` fills ``op``, ``version`` and ``files`` (and
``created``/``git_commit``/``mlflow_run_id`` when absent).

A version folder is built under ``<root>/<op>/.tmp-<uuid>`` and renamed into place: readers never see a
partial version, a failure leaves nothing behind, and an existing version is never overwritten (a concurrent
publisher that took N makes this one retry with N+1). Published versions are immutable.

What a card and weights must hold is checked on publish and on load by ``pipeline.checkpoint_checks``.
numpy, the standard library and safetensors only.
"""

from __future__ import annotations

import datetime as _dt
import errno
import hashlib
import json
import os
import re
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from pipeline.atomic import atomic_write, fsync_dir
from pipeline.checkpoint_checks import (  # noqa: F401
    ACTIVATIONS,
    REQUIRED_CARD_KEYS,
    CheckpointError,
    ChecksumError,
    check_card,
    join_members,
    jsonable,
    layer_count,
    split_members,
)
from pipeline.provenance import git_commit

WEIGHTS_FILE = "weights.safetensors"
CARD_FILE = "card.json"
CARD_HASH_FILE = "card.sha256"
CHAMPION_FILE = "champion.json"
RESERVED_FILES = (WEIGHTS_FILE, CARD_FILE, CARD_HASH_FILE)
MAX_WEIGHTS_BYTES = 1 << 20
"""Published weights stay small (1 MiB per op): the API loads them on every ``load_scaler``."""

_OP_RE = re.compile(r"^[a-z0-9][a-z0-9_]*$")
_VERSION_RE = re.compile(r"^v([1-9][0-9]*)$")
_FILE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_MAX_PUBLISH_ATTEMPTS = 1000


# ----------------------------------------------------------------------------------------------- helpers

def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _check_op(op) -> str:
    if not isinstance(op, str) or not _OP_RE.match(op):
        raise CheckpointError(f"op: must be a lower-case name of letters, digits and '_', got {op!r}")
    return op


def _check_version(version) -> int:
    if isinstance(version, (bool, np.bool_)) or not isinstance(version, (int, np.integer)) or version < 1:
        raise CheckpointError(f"version: must be an integer >= 1, got {version!r}")
    return int(version)


def now_iso() -> str:
    """The current UTC time, ISO 8601 to the second (cards, champion records)."""
    return _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat()


def _dump_json(obj) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n").encode()


# ---------------------------------------------------------------------------------------------- public API

def list_versions(root, op: str) -> list[int]:
    """Published versions of ``op`` under ``root``, ascending (temp folders are never listed)."""
    directory = Path(root) / _check_op(op)
    if not directory.is_dir():
        return []
    versions = []
    for entry in directory.iterdir():
        m = _VERSION_RE.match(entry.name)
        if m and entry.is_dir():
            versions.append(int(m.group(1)))
    return sorted(versions)


def publish(root, op: str, weights: Mapping[str, np.ndarray], card: Mapping,
            extra_files: Mapping[str, bytes] | None = None) -> int:
    """Publish a new version of ``op`` under ``root`` and return its number (max existing + 1).

    ``card`` gets ``op``, ``version`` and ``files`` filled in (``created``, ``git_commit`` and
    ``mlflow_run_id`` too when absent); the caller's dict is not modified. ``extra_files`` maps plain file
    names (e.g. ``report.png``) to their bytes. Nothing becomes visible until the whole folder is written.
    """
    op = _check_op(op)
    extra_files = _check_extra_files(extra_files)
    if not isinstance(card, Mapping):
        raise CheckpointError(f"card: must be a dict, got {type(card).__name__}")
    check_card(card, weights, op)
    tensors = {k: np.ascontiguousarray(v) for k, v in weights.items()}
    from safetensors.numpy import save

    weight_bytes = save(tensors, metadata={"format": "pipeline-mlp", "op": op})
    if len(weight_bytes) > MAX_WEIGHTS_BYTES:
        raise CheckpointError(f"weights: {len(weight_bytes)} bytes serialised, the limit is {MAX_WEIGHTS_BYTES} "
                              "bytes per op; use a smaller network")
    card = jsonable(dict(card), "")
    card["op"] = op
    card.setdefault("created", now_iso())
    if "git_commit" not in card:
        card["git_commit"] = git_commit()
    card.setdefault("mlflow_run_id", None)
    files = {WEIGHTS_FILE: weight_bytes, **{k: bytes(v) for k, v in extra_files.items()}}
    card["files"] = {name: sha256_bytes(data) for name, data in sorted(files.items())}

    op_dir = Path(root) / op
    op_dir.mkdir(parents=True, exist_ok=True)
    tmp = op_dir / f".tmp-{uuid.uuid4().hex}"
    tmp.mkdir()
    try:
        for name, data in files.items():
            atomic_write(tmp / name, data)
        return _claim_version(root, op, tmp, card)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _check_extra_files(extra_files: Mapping[str, bytes] | None) -> dict[str, bytes]:
    extra_files = dict(extra_files or {})
    for name, data in extra_files.items():
        if not isinstance(name, str) or not _FILE_RE.match(name) or name in RESERVED_FILES:
            raise CheckpointError(f"extra_files: {name!r} must be a plain file name (letters, digits, '_', '-', "
                                  f"'.'; not hidden) other than {list(RESERVED_FILES)}")
        if not isinstance(data, (bytes, bytearray)):
            raise CheckpointError(f"extra_files[{name!r}]: must be bytes, got {type(data).__name__}")
    return extra_files


def _claim_version(root, op: str, tmp: Path, card: dict) -> int:
    """Write the card of the next free version into ``tmp`` and rename ``tmp`` to that version; retry with a
    higher number when another publisher took it. Returns the version."""
    op_dir = Path(root) / op
    version = (max(list_versions(root, op), default=0)) + 1
    for _ in range(_MAX_PUBLISH_ATTEMPTS):
        card["version"] = version
        card_bytes = _dump_json(card)
        atomic_write(tmp / CARD_FILE, card_bytes)
        atomic_write(tmp / CARD_HASH_FILE, f"{sha256_bytes(card_bytes)}  {CARD_FILE}\n")
        target = op_dir / f"v{version}"
        if not target.exists():  # rename() replaces an empty folder: never hand over an existing name
            try:
                os.rename(tmp, target)
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR, errno.ENOTDIR):
                    raise
            else:
                fsync_dir(op_dir)
                return version
        version = max(version, max(list_versions(root, op), default=0)) + 1
    raise CheckpointError(f"publish: gave up after {_MAX_PUBLISH_ATTEMPTS} attempts to claim a version "
                          f"number under {op_dir}")


def _version_dir(root, op: str, version: int) -> Path:
    version = _check_version(version)
    available = list_versions(root, op)
    if version not in available:
        raise CheckpointError(f"version: {op} has no version {version} under {root}; available: "
                              f"{available or 'none'}")
    return Path(root) / op / f"v{version}"


def _read_champion(root, op: str) -> dict | None:
    path = Path(root) / _check_op(op) / CHAMPION_FILE
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        _check_version(data["version"])
        if not re.fullmatch(r"[0-9a-f]{64}", data["card_sha256"]):
            raise ValueError("card_sha256 is not a sha256 hex digest")
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{CHAMPION_FILE} of {op}: malformed ({exc}); expected "
                              '{"version": N, "promoted": ISO time, "reason": "...", "card_sha256": "..."}') from exc
    return data


def champion_version(root, op: str) -> int | None:
    """The promoted (default) version of ``op``, or None when none was promoted."""
    data = _read_champion(root, op)
    return None if data is None else int(data["version"])


def promote(root, op: str, version: int, reason: str) -> None:
    """Make ``version`` the default of ``op`` (verifies it first); champion.json is replaced atomically."""
    op = _check_op(op)
    if not isinstance(reason, str) or not reason.strip():
        raise CheckpointError("reason: must be a non-empty string saying why this version is promoted")
    card, _ = load(root, op, version)
    card_sha = sha256_bytes((_version_dir(root, op, version) / CARD_FILE).read_bytes())
    data = {"version": int(card["version"]), "promoted": now_iso(), "reason": reason, "card_sha256": card_sha}
    atomic_write(Path(root) / op / CHAMPION_FILE, _dump_json(data))


def load(root, op: str, version: int | None = None) -> tuple[dict, dict[str, np.ndarray]]:
    """Verify and load ``(card, weights)`` of ``op``; ``version=None`` loads the champion.

    Every file is checked against its sha256 (``card.sha256`` for the card, the card's ``files`` for the
    rest); a missing, modified or unlisted file raises ChecksumError naming it.
    """
    op = _check_op(op)
    champion = None
    if version is None:
        champion = _read_champion(root, op)
        if champion is None:
            raise CheckpointError(f"version: {op} has no champion under {root} (none promoted); pass a version; "
                                  f"available: {list_versions(root, op) or 'none'}")
        version = int(champion["version"])
    directory = _version_dir(root, op, version)
    card = _verified_card(directory, op, version, champion)
    contents = _verified_files(directory, op, version, card)
    from safetensors.numpy import load as st_load

    try:
        weights = st_load(contents[WEIGHTS_FILE])
    except Exception as exc:  # a hash-valid but unreadable file: a publishing bug, still name it
        raise CheckpointError(f"{op} v{version}: {WEIGHTS_FILE} is unreadable ({exc})") from exc
    check_card(card, weights, op)
    return card, weights


def _read(directory: Path, op: str, version: int, name: str) -> bytes:
    try:
        return (directory / name).read_bytes()
    except FileNotFoundError:
        raise ChecksumError(f"{op} v{version}: {name} is missing") from None


def _verified_card(directory: Path, op: str, version: int, champion: dict | None) -> dict:
    """card.json, checked against card.sha256 (and the champion's card_sha256)."""
    hash_line = _read(directory, op, version, CARD_HASH_FILE).decode(errors="replace").split()
    if len(hash_line) != 2 or hash_line[1] != CARD_FILE or not re.fullmatch(r"[0-9a-f]{64}", hash_line[0]):
        raise ChecksumError(f"{op} v{version}: {CARD_HASH_FILE} is malformed (expected '<sha256>  {CARD_FILE}')")
    card_bytes = _read(directory, op, version, CARD_FILE)
    if sha256_bytes(card_bytes) != hash_line[0]:
        raise ChecksumError(f"{op} v{version}: {CARD_FILE} does not match its sha256 in {CARD_HASH_FILE} "
                            "(modified or corrupt)")
    if champion is not None and champion["card_sha256"] != hash_line[0]:
        raise ChecksumError(f"{op} v{version}: {CARD_FILE} does not match the card_sha256 in {CHAMPION_FILE}")
    try:
        card = json.loads(card_bytes)
    except ValueError as exc:
        raise ChecksumError(f"{op} v{version}: {CARD_FILE} is not valid JSON ({exc})") from exc
    if card.get("op") != op or card.get("version") != version:
        raise ChecksumError(f"{op} v{version}: {CARD_FILE} says op={card.get('op')!r}, "
                            f"version={card.get('version')!r}")
    return card


def _verified_files(directory: Path, op: str, version: int, card: dict) -> dict[str, bytes]:
    """{name: bytes} of every file the card lists, each matching its sha256; no unlisted file in the folder."""
    files = card.get("files")
    if not isinstance(files, dict) or WEIGHTS_FILE not in files:
        raise ChecksumError(f"{op} v{version}: {CARD_FILE} has no 'files' entry for {WEIGHTS_FILE}")
    listed = set(files) | {CARD_FILE, CARD_HASH_FILE}
    for entry in sorted(directory.iterdir()):
        if not entry.name.startswith(".") and entry.name not in listed:
            raise ChecksumError(f"{op} v{version}: {entry.name} is not listed in {CARD_FILE}")
    contents = {}
    for name, digest in sorted(files.items()):
        if not isinstance(name, str) or not _FILE_RE.match(name) or name in (CARD_FILE, CARD_HASH_FILE):
            raise ChecksumError(f"{op} v{version}: {CARD_FILE} lists an invalid file name {name!r}")
        data = _read(directory, op, version, name)
        if sha256_bytes(data) != digest:
            raise ChecksumError(f"{op} v{version}: {name} does not match its sha256 in {CARD_FILE} "
                                "(modified or corrupt)")
        contents[name] = data
    return contents
