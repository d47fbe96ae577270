"""What a checkpoint's card and weights must hold: checked on publish and again on load (``pipeline.checkpoint``).

numpy and the standard library only.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

import numpy as np

ACTIVATIONS = ("relu", "gelu", "silu")
REQUIRED_CARD_KEYS = ("features", "target", "architecture", "training_data", "metrics", "ranges")
_LAYER_RE = re.compile(r"^layers\.(0|[1-9][0-9]*)\.(weight|bias)$")
_MEMBER_RE = re.compile(r"^members\.(0|[1-9][0-9]*)\.(layers\..*)$")


class ChecksumError(ValueError):
    """A checkpoint file is missing, modified, or not listed in its card; the message names the file."""


class CheckpointError(ValueError):
    """A checkpoint argument or folder is invalid; the message names the field and what is allowed."""


def jsonable(value, path: str):
    """Plain-JSON copy of ``value`` (numpy scalars/arrays become Python); non-finite floats are refused."""
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise CheckpointError(f"card{path}: keys must be strings, got {k!r}")
            out[k] = jsonable(v, f"{path}.{k}")
        return out
    if isinstance(value, (list, tuple)):
        return [jsonable(v, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist(), path)
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(float(value)):
            raise CheckpointError(f"card{path}: must be a finite number, got {value!r}")
        return float(value)
    if value is None or isinstance(value, str):
        return value
    raise CheckpointError(f"card{path}: {type(value).__name__} is not JSON-serialisable "
                          "(allowed: dict, list, str, int, float, bool, None, numpy arrays/scalars)")


def layer_count(weights: Mapping[str, np.ndarray]) -> int:
    """Validate the ``layers.<i>.weight/bias`` structure and return L; raises CheckpointError naming the tensor."""
    if not isinstance(weights, Mapping) or not weights:
        raise CheckpointError("weights: must be a non-empty dict of layers.<i>.weight / layers.<i>.bias arrays")
    indices = set()
    for name in weights:
        m = _LAYER_RE.match(name) if isinstance(name, str) else None
        if not m:
            raise CheckpointError(f"weights: unexpected tensor {name!r}; allowed names: layers.<i>.weight, "
                                  "layers.<i>.bias with i = 0..L-1")
        indices.add(int(m.group(1)))
    n = len(indices)
    if indices != set(range(n)):
        raise CheckpointError(f"weights: layer indices must be 0..L-1 without gaps, got {sorted(indices)}")
    prev_out = None
    for i in range(n):
        for part in ("weight", "bias"):
            if f"layers.{i}.{part}" not in weights:
                raise CheckpointError(f"weights: missing tensor 'layers.{i}.{part}'")
        w, b = weights[f"layers.{i}.weight"], weights[f"layers.{i}.bias"]
        for name, arr, ndim in ((f"layers.{i}.weight", w, 2), (f"layers.{i}.bias", b, 1)):
            if not isinstance(arr, np.ndarray) or arr.dtype != np.float32 or arr.ndim != ndim:
                raise CheckpointError(f"weights: {name!r} must be a {ndim}-D float32 numpy array, got "
                                      f"{getattr(arr, 'dtype', type(arr).__name__)} with shape "
                                      f"{getattr(arr, 'shape', None)}")
            if not np.all(np.isfinite(arr)):
                raise CheckpointError(f"weights: {name!r} contains NaN or inf")
        if b.shape[0] != w.shape[0]:
            raise CheckpointError(f"weights: 'layers.{i}.bias' has {b.shape[0]} entries, "
                                  f"'layers.{i}.weight' has {w.shape[0]} outputs")
        if prev_out is not None and w.shape[1] != prev_out:
            raise CheckpointError(f"weights: 'layers.{i}.weight' takes {w.shape[1]} inputs but layer {i - 1} "
                                  f"gives {prev_out}")
        prev_out = w.shape[0]
    return n


def split_members(weights: Mapping[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """The member MLPs of a checkpoint's weights, each as ``layers.<i>.weight/bias``: one model's tensors are
    named ``layers.<i>.*``; an ensemble's ``members.<j>.layers.<i>.*`` (j = 0..K-1, every member the same
    shapes). Raises CheckpointError naming the tensor."""
    if not isinstance(weights, Mapping) or not weights:
        raise CheckpointError("weights: must be a non-empty dict of layers.<i>.weight / layers.<i>.bias arrays")
    if not any(isinstance(k, str) and k.startswith("members.") for k in weights):
        layer_count(weights)
        return [dict(weights)]
    grouped: dict[int, dict[str, np.ndarray]] = {}
    for name, arr in weights.items():
        m = _MEMBER_RE.match(name) if isinstance(name, str) else None
        if not m:
            raise CheckpointError(f"weights: unexpected tensor {name!r} in an ensemble; allowed names: "
                                  "members.<j>.layers.<i>.weight, members.<j>.layers.<i>.bias")
        grouped.setdefault(int(m.group(1)), {})[m.group(2)] = arr
    if set(grouped) != set(range(len(grouped))):
        raise CheckpointError(f"weights: member indices must be 0..K-1 without gaps, got {sorted(grouped)}")
    members = [grouped[j] for j in range(len(grouped))]
    for j, member in enumerate(members):
        try:
            layer_count(member)
        except CheckpointError as exc:
            raise CheckpointError(f"weights: member {j}: {exc}") from None
        shapes = {k: v.shape for k, v in member.items()}
        if shapes != {k: v.shape for k, v in members[0].items()}:
            raise CheckpointError(f"weights: member {j}'s tensors differ in names or shapes from member 0's")
    return members


def join_members(members: list[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """An ensemble's weights from its members' ``layers.<i>.*`` tensors: ``split_members``'s inverse."""
    return {f"members.{j}.{name}": arr for j, member in enumerate(members) for name, arr in member.items()}


def check_card(card: Mapping, weights: Mapping[str, np.ndarray], op: str) -> None:
    missing = [k for k in REQUIRED_CARD_KEYS if k not in card]
    if missing:
        raise CheckpointError(f"card: missing keys {missing}; required: {list(REQUIRED_CARD_KEYS)}")
    feats = card["features"]
    if not isinstance(feats, Mapping) or any(k not in feats for k in ("names", "mean", "std")):
        raise CheckpointError("card.features: must be a dict with 'names', 'mean' and 'std'")
    names = list(feats["names"])
    if not names or not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
        raise CheckpointError("card.features.names: must be a non-empty list of distinct strings")
    for key in ("mean", "std"):
        if len(feats[key]) != len(names):
            raise CheckpointError(f"card.features.{key}: has {len(feats[key])} entries, features.names has "
                                  f"{len(names)}")
    if not all(float(s) > 0 for s in feats["std"]):
        raise CheckpointError("card.features.std: every entry must be > 0")
    target = card["target"]
    if not isinstance(target, Mapping) or not isinstance(target.get("kind"), str) or not target["kind"]:
        raise CheckpointError("card.target: must be a dict with a non-empty string 'kind'")
    arch = card["architecture"]
    if not isinstance(arch, Mapping) or "hidden" not in arch or "activation" not in arch:
        raise CheckpointError("card.architecture: must be a dict with 'hidden' and 'activation'")
    if arch["activation"] not in ACTIVATIONS:
        raise CheckpointError(f"card.architecture.activation: {arch['activation']!r} is not one of {ACTIVATIONS}")
    members = split_members(weights)
    if int(arch.get("members", 1)) != len(members):
        raise CheckpointError(f"card.architecture.members: {arch.get('members', 1)!r}, but the weights hold "
                              f"{len(members)} member MLP(s)")
    weights = members[0]
    n = layer_count(weights)
    hidden = [int(h) for h in arch["hidden"]]
    actual_hidden = [int(weights[f"layers.{i}.weight"].shape[0]) for i in range(n - 1)]
    if hidden != actual_hidden:
        raise CheckpointError(f"card.architecture.hidden: {hidden} does not match the weights' hidden sizes "
                              f"{actual_hidden}")
    if weights["layers.0.weight"].shape[1] != len(names):
        raise CheckpointError(f"card.features.names: {len(names)} features but 'layers.0.weight' takes "
                              f"{weights['layers.0.weight'].shape[1]} inputs")
    ranges = card["ranges"]
    if not isinstance(ranges, Mapping):
        raise CheckpointError("card.ranges: must be a dict {feature_name: [min, max]}")
    for key, bounds in ranges.items():
        if key not in names:
            raise CheckpointError(f"card.ranges: {key!r} is not a feature name; allowed: {names}")
        if len(bounds) != 2 or not float(bounds[0]) <= float(bounds[1]):
            raise CheckpointError(f"card.ranges.{key}: must be [min, max] with min <= max, got {bounds!r}")
    if "op" in card and card["op"] != op:
        raise CheckpointError(f"card.op: {card['op']!r} does not match op {op!r}")
