"""Checkpoint publishing: version numbering, atomicity, no overwrite, concurrency, tamper refusal, champion."""

from __future__ import annotations

import json
import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import numpy as np
import pytest

from pipeline import checkpoint as ck


def make_weights(n_in=3, hidden=(4,), seed=0):
    rng = np.random.default_rng(seed)
    sizes = [n_in, *hidden, 1]
    return {**{f"layers.{i}.weight": rng.normal(size=(sizes[i + 1], sizes[i])).astype(np.float32)
               for i in range(len(sizes) - 1)},
            **{f"layers.{i}.bias": rng.normal(size=sizes[i + 1]).astype(np.float32)
               for i in range(len(sizes) - 1)}}


def make_card(n_in=3, hidden=(4,)):
    names = [f"f{i}" for i in range(n_in)]
    return {"features": {"names": names, "mean": [0.0] * n_in, "std": [1.0] * n_in},
            "target": {"kind": "log_ms"}, "architecture": {"hidden": list(hidden), "activation": "relu"},
            "training_data": {"rows": 10}, "metrics": {"mape": 0.1}, "ranges": {n: [-1.0, 1.0] for n in names},
            "git_commit": "abc", "mlflow_run_id": "run"}


def make_ensemble(k=3, n_in=3, hidden=(4,)):
    return ck.join_members([make_weights(n_in, hidden, seed=j) for j in range(k)])


def test_ensemble_roundtrip_and_checks(tmp_path):
    card = make_card()
    card["architecture"]["members"] = 3
    w = make_ensemble()
    assert ck.publish(tmp_path, "bmm", w, card) == 1
    loaded_card, loaded = ck.load(tmp_path, "bmm", 1)
    assert loaded_card["architecture"]["members"] == 3 and set(loaded) == set(w)
    members = ck.split_members(loaded)
    assert len(members) == 3 and set(members[2]) == set(make_weights())
    np.testing.assert_array_equal(members[1]["layers.0.bias"], make_weights(seed=1)["layers.0.bias"])
    with pytest.raises(ValueError, match=r"card.architecture.members: 2, but the weights hold 3"):
        ck.publish(tmp_path, "bmm", w, {**card, "architecture": {**card["architecture"], "members": 2}})
    with pytest.raises(ValueError, match=r"card.architecture.members: 1, but the weights hold 3"):
        ck.publish(tmp_path, "bmm", w, make_card())
    gap = {k: v for k, v in w.items() if not k.startswith("members.1.")}
    with pytest.raises(ValueError, match=r"member indices must be 0..K-1 without gaps, got \[0, 2\]"):
        ck.publish(tmp_path, "bmm", gap, card)
    with pytest.raises(ValueError, match=r"unexpected tensor 'layers.0.bias' in an ensemble"):
        ck.publish(tmp_path, "bmm", {**w, "layers.0.bias": w["members.0.layers.0.bias"]}, card)
    wide = {**w, **{f"members.2.{k}": v for k, v in make_weights(hidden=(5,)).items()}}
    with pytest.raises(ValueError, match=r"member 2's tensors differ in names or shapes from member 0's"):
        ck.publish(tmp_path, "bmm", wide, card)
    broken = {k: v for k, v in w.items() if k != "members.1.layers.1.bias"}
    with pytest.raises(ValueError, match=r"member 1: weights: missing tensor 'layers.1.bias'"):
        ck.publish(tmp_path, "bmm", broken, card)
    assert ck.list_versions(tmp_path, "bmm") == [1]


def _publish_one(root: str) -> int:  # module level: picklable for the process pool
    return ck.publish(root, "bmm", make_weights(), make_card())


def test_version_numbering_and_roundtrip(tmp_path):
    assert ck.list_versions(tmp_path, "bmm") == []
    w = make_weights()
    assert ck.publish(tmp_path, "bmm", w, make_card(), {"report.png": b"png"}) == 1
    assert ck.publish(tmp_path, "bmm", w, make_card()) == 2
    assert ck.publish(tmp_path, "conv2d", w, make_card()) == 1
    assert ck.list_versions(tmp_path, "bmm") == [1, 2]
    card, loaded = ck.load(tmp_path, "bmm", 1)
    assert card["op"] == "bmm" and card["version"] == 1
    assert set(card["files"]) == {"weights.safetensors", "report.png"}
    assert set(loaded) == set(w)
    for k in w:
        np.testing.assert_array_equal(loaded[k], w[k])
        assert loaded[k].dtype == np.float32
    d = tmp_path / "bmm" / "v1"
    assert sorted(p.name for p in d.iterdir()) == ["card.json", "card.sha256", "report.png", "weights.safetensors"]
    assert (d / "card.sha256").read_text() == f"{ck.sha256_bytes((d / 'card.json').read_bytes())}  card.json\n"
    # numbering continues after gaps; temp folders never count
    (tmp_path / "bmm" / ".tmp-stale").mkdir()
    assert ck.publish(tmp_path, "bmm", w, make_card()) == 3


def test_publish_rejects_bad_input(tmp_path):
    with pytest.raises(ValueError, match="op"):
        ck.publish(tmp_path, "../evil", make_weights(), make_card())
    bad = make_weights()
    bad["layers.0.weight"] = bad["layers.0.weight"].astype(np.float64)
    with pytest.raises(ValueError, match="float32"):
        ck.publish(tmp_path, "bmm", bad, make_card())
    with pytest.raises(ValueError, match="hidden"):
        ck.publish(tmp_path, "bmm", make_weights(), make_card(hidden=(5,)))
    with pytest.raises(ValueError, match="activation"):
        card = make_card()
        card["architecture"]["activation"] = "tanh"
        ck.publish(tmp_path, "bmm", make_weights(), card)
    with pytest.raises(ValueError, match="extra_files"):
        ck.publish(tmp_path, "bmm", make_weights(), make_card(), {"card.json": b"x"})
    with pytest.raises(ValueError, match="finite"):
        card = make_card()
        card["metrics"]["mape"] = float("nan")
        ck.publish(tmp_path, "bmm", make_weights(), card)
    with pytest.raises(ValueError, match="limit"):
        ck.publish(tmp_path, "bmm", make_weights(3, (600, 600)), make_card(3, (600, 600)))
    assert ck.list_versions(tmp_path, "bmm") == []
    assert not any((tmp_path / "bmm").iterdir()) if (tmp_path / "bmm").exists() else True


def test_no_partial_version_visible_and_failure_leaves_nothing(tmp_path, monkeypatch):
    ck.publish(tmp_path, "bmm", make_weights(), make_card())
    real_write = ck.atomic_write
    seen = []

    def watching_write(path, data):
        seen.append(ck.list_versions(tmp_path, "bmm"))
        real_write(path, data)

    monkeypatch.setattr(ck, "atomic_write", watching_write)
    assert ck.publish(tmp_path, "bmm", make_weights(), make_card()) == 2
    assert seen and all(v == [1] for v in seen)  # v2 was invisible while being written

    calls = {"n": 0}

    def failing_write(path, data):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError("disk full")
        real_write(path, data)

    monkeypatch.setattr(ck, "atomic_write", failing_write)
    with pytest.raises(OSError, match="disk full"):
        ck.publish(tmp_path, "bmm", make_weights(), make_card(), {"report.png": b"x"})
    monkeypatch.setattr(ck, "atomic_write", real_write)

    def failing_rename(src, dst):
        raise PermissionError("no")

    monkeypatch.setattr(ck.os, "rename", failing_rename)
    with pytest.raises(PermissionError):
        ck.publish(tmp_path, "bmm", make_weights(), make_card())
    monkeypatch.undo()
    assert ck.list_versions(tmp_path, "bmm") == [1, 2]
    assert sorted(p.name for p in (tmp_path / "bmm").iterdir()) == ["v1", "v2"]


def test_never_overwrites_an_existing_version(tmp_path, monkeypatch):
    ck.publish(tmp_path, "bmm", make_weights(seed=1), make_card())
    before = {p.name: p.read_bytes() for p in (tmp_path / "bmm" / "v1").iterdir()}
    (tmp_path / "bmm" / "v2").mkdir()  # a foreign empty folder: rename() would replace it, publish must not
    real_list = ck.list_versions
    stale = {"first": True}

    def stale_list(root, op):  # first look sees nothing, as if another run published meanwhile
        if stale["first"]:
            stale["first"] = False
            return []
        return real_list(root, op)

    monkeypatch.setattr(ck, "list_versions", stale_list)
    assert ck.publish(tmp_path, "bmm", make_weights(seed=2), make_card()) == 3
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in (tmp_path / "bmm" / "v1").iterdir()} == before
    assert not any((tmp_path / "bmm" / "v2").iterdir())


def test_concurrent_publishes_get_distinct_versions(tmp_path):
    barrier = threading.Barrier(6)

    def go(_):
        barrier.wait()
        return ck.publish(tmp_path, "bmm", make_weights(), make_card())

    with ThreadPoolExecutor(6) as pool:
        versions = list(pool.map(go, range(6)))
    assert sorted(versions) == [1, 2, 3, 4, 5, 6]
    with ProcessPoolExecutor(3, mp_context=multiprocessing.get_context("fork")) as pool:
        more = list(pool.map(_publish_one, [str(tmp_path)] * 3))
    assert sorted(more) == [7, 8, 9]
    assert ck.list_versions(tmp_path, "bmm") == list(range(1, 10))
    for v in range(1, 10):
        assert ck.load(tmp_path, "bmm", v)[0]["version"] == v
    assert not [p for p in (tmp_path / "bmm").iterdir() if p.name.startswith(".")]


def test_tamper_refusal(tmp_path):
    for _ in range(5):
        ck.publish(tmp_path, "bmm", make_weights(), make_card(), {"report.png": b"png"})
    root = tmp_path / "bmm"
    # 1: a weights byte flipped
    w = root / "v1" / "weights.safetensors"
    data = bytearray(w.read_bytes())
    data[-1] ^= 0xFF
    w.write_bytes(bytes(data))
    with pytest.raises(ck.ChecksumError, match="weights.safetensors"):
        ck.load(tmp_path, "bmm", 1)
    # 2: the card edited
    c = root / "v2" / "card.json"
    c.write_text(c.read_text().replace('"relu"', '"gelu"'))
    with pytest.raises(ck.ChecksumError, match="card.json"):
        ck.load(tmp_path, "bmm", 2)
    # 3: a listed file missing; 4: an unlisted file added
    (root / "v3" / "report.png").unlink()
    with pytest.raises(ck.ChecksumError, match="report.png"):
        ck.load(tmp_path, "bmm", 3)
    (root / "v4" / "notes.txt").write_text("hi")
    with pytest.raises(ck.ChecksumError, match="notes.txt"):
        ck.load(tmp_path, "bmm", 4)
    # 5: card and card.sha256 both rewritten consistently: caught through the card's file hashes
    card = json.loads((root / "v5" / "card.json").read_text())
    card["files"]["weights.safetensors"] = "0" * 64
    raw = (json.dumps(card) + "\n").encode()
    (root / "v5" / "card.json").write_bytes(raw)
    (root / "v5" / "card.sha256").write_text(f"{ck.sha256_bytes(raw)}  card.json\n")
    with pytest.raises(ck.ChecksumError, match="weights.safetensors"):
        ck.load(tmp_path, "bmm", 5)
    assert issubclass(ck.ChecksumError, ValueError)


def test_champion_read_write(tmp_path):
    assert ck.champion_version(tmp_path, "bmm") is None
    with pytest.raises(ValueError, match="no champion"):
        ck.load(tmp_path, "bmm")
    ck.publish(tmp_path, "bmm", make_weights(seed=1), make_card())
    ck.publish(tmp_path, "bmm", make_weights(seed=2), make_card())
    with pytest.raises(ValueError, match=r"available: \[1, 2\]"):
        ck.load(tmp_path, "bmm")
    with pytest.raises(ValueError, match="version"):
        ck.promote(tmp_path, "bmm", 7, "nope")
    with pytest.raises(ValueError, match="reason"):
        ck.promote(tmp_path, "bmm", 1, "")
    ck.promote(tmp_path, "bmm", 2, "lower error")
    assert ck.champion_version(tmp_path, "bmm") == 2
    data = json.loads((tmp_path / "bmm" / "champion.json").read_text())
    assert data["version"] == 2 and data["reason"] == "lower error" and "promoted" in data
    card, w = ck.load(tmp_path, "bmm")
    assert card["version"] == 2
    np.testing.assert_array_equal(w["layers.0.bias"], make_weights(seed=2)["layers.0.bias"])
    ck.promote(tmp_path, "bmm", 1, "rollback")
    assert ck.load(tmp_path, "bmm")[0]["version"] == 1
    assert sorted(p.name for p in (tmp_path / "bmm").iterdir()) == ["champion.json", "v1", "v2"]
    (tmp_path / "bmm" / "champion.json").write_text("{not json")
    with pytest.raises(ValueError, match="champion.json"):
        ck.champion_version(tmp_path, "bmm")


def test_champion_pin_is_required_and_checked(tmp_path):
    ck.publish(tmp_path, "bmm", make_weights(seed=1), make_card())
    ck.promote(tmp_path, "bmm", 1, "first")
    path = tmp_path / "bmm" / "champion.json"
    pinned = json.loads(path.read_text())
    path.write_text(json.dumps({k: v for k, v in pinned.items() if k != "card_sha256"}))
    with pytest.raises(ValueError, match="card_sha256"):
        ck.load(tmp_path, "bmm")
    path.write_text(json.dumps({**pinned, "card_sha256": "0" * 64}))
    with pytest.raises(ValueError, match="card_sha256"):
        ck.load(tmp_path, "bmm")


def test_what_the_hashes_guard_against(tmp_path):
    """The sha256 chain catches an edit not carried through the hashes; it is not a signature: a version whose
    card, card.sha256 and champion.json are all rewritten consistently loads (as the docs say)."""
    ck.publish(tmp_path, "bmm", make_weights(), make_card())
    ck.promote(tmp_path, "bmm", 1, "test")
    d = tmp_path / "bmm" / "v1"
    card = json.loads((d / "card.json").read_text())
    card["metrics"]["mape"] = 0.0001
    edited = (json.dumps(card, indent=2, sort_keys=True) + "\n").encode()
    (d / "card.json").write_bytes(edited)
    with pytest.raises(ck.ChecksumError, match="card.json"):
        ck.load(tmp_path, "bmm")
    (d / "card.sha256").write_text(f"{ck.sha256_bytes(edited)}  card.json\n")
    with pytest.raises(ck.ChecksumError, match="champion.json"):
        ck.load(tmp_path, "bmm")
    champion = json.loads((tmp_path / "bmm" / "champion.json").read_text())
    champion["card_sha256"] = ck.sha256_bytes(edited)
    (tmp_path / "bmm" / "champion.json").write_text(json.dumps(champion))
    assert ck.load(tmp_path, "bmm")[0]["metrics"]["mape"] == 0.0001
