"""GPU registry: datasheet specs of NVIDIA GPUs, looked up by name.

Predicting an op's time on a GPU we do not have needs that GPU's peak rates
(FLOP/s per precision, memory bandwidth, SMs, L2). They live in
``conf/gpus.yaml``; this module loads them once, resolves the many names a GPU
goes by (``torch.cuda.get_device_name()``, DeepBench and NeuSight labels, short
names) and validates user-supplied specs for GPUs not in the registry.

Part of the light prediction API: PyYAML and numpy level code (pipeline.physics, pipeline.schema) only.
"""

from __future__ import annotations

import copy
import difflib
import functools
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from pipeline import physics
from pipeline.gpu_checks import INTERCONNECT_FIELDS, SPEC_FIELDS, validate_spec
from pipeline.schema import PRECISIONS, normalize_precision

__all__ = [
    "SPEC_FIELDS",
    "PRECISIONS",
    "REGISTRY_PATH",
    "gpu_spec",
    "gpu_label",
    "known_gpus",
    "supports_precision",
    "peak_tflops",
    "INTERCONNECT_FIELDS",
]

#: Where the registry lives: next to the package, in the repository's conf/.
REGISTRY_PATH = Path(__file__).resolve().parent.parent / "conf" / "gpus.yaml"

# Vendor words that device names carry in front ("NVIDIA GeForce RTX 3090").
_VENDOR_PREFIXES = ("nvidia", "tesla", "geforce")


def _norm(name: str) -> str:
    """Lookup key: lowercase, without spaces, underscores, hyphens, parentheses.

    So that ``A100_80GB``, ``a100-80gb`` and ``A100 80GB`` are one name.
    """
    return re.sub(r"[\s_\-()]+", "", name.lower())


def _strip_vendor(key: str) -> str:
    """A normalised key without leading vendor words (nvidia, tesla, geforce)."""
    changed = True
    while changed:
        changed = False
        for prefix in _VENDOR_PREFIXES:
            if key.startswith(prefix) and len(key) > len(prefix):
                key = key[len(prefix):]
                changed = True
    return key


class _Registry:
    """The loaded registry: specs by label, and a lookup index of all names."""

    def __init__(self, entries: list[dict[str, Any]], index: dict[str, str], display: dict[str, str]):
        self.entries = entries  # in file order
        self.by_label = {e["label"]: e for e in entries}
        self.index = index  # normalised name -> label
        self.display = display  # normalised name -> a name as written


def read_yaml_section(path: Path, key: str, kind: type, what: str):
    """The top-level ``key`` of the YAML file at ``path``, which must be a ``kind`` (list or Mapping); errors
    name the file (``what`` it is) and what was expected."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} not found at {path}") from None
    if not isinstance(raw, Mapping) or not isinstance(raw.get(key), kind):
        raise ValueError(f"{Path(path).name}: expected a top-level {key!r} {kind.__name__}")
    return raw[key]


@functools.lru_cache(maxsize=1)
def _registry() -> _Registry:
    """Load and validate conf/gpus.yaml once (cached for the process)."""
    gpus = read_yaml_section(REGISTRY_PATH, "gpus", list, "GPU registry")

    entries: list[dict[str, Any]] = []
    index: dict[str, str] = {}
    display: dict[str, str] = {}
    for i, item in enumerate(gpus):
        where = f"{REGISTRY_PATH.name} entry {i}"
        if not isinstance(item, dict):
            raise ValueError(f"{where}: expected a mapping, got {type(item).__name__}")
        if "label" not in item or "aliases" not in item:
            raise ValueError(f"{where}: registry entries need 'label' and 'aliases'")
        spec = validate_spec(item, where=f"{where} ({item.get('name')!r})")
        _inherit_interconnect(spec, entries, where)
        label = spec["label"]
        if any(e["label"] == label for e in entries):
            raise ValueError(f"{where}: duplicate label {label!r}")
        entries.append(spec)

        names = [spec["name"], label, *item["aliases"]]
        for written in names:
            key = _norm(str(written))
            for k in {key, _strip_vendor(key)}:
                other = index.get(k)
                if other is not None and other != label:
                    raise ValueError(
                        f"{where}: name {written!r} is ambiguous: it also names {other!r} "
                        f"(aliases must be unique across GPUs, ignoring case, spaces, '_', '-')"
                    )
                index[k] = label
            display.setdefault(key, str(written))
    return _Registry(entries, index, display)


def _inherit_interconnect(spec: dict[str, Any], entries: list[dict[str, Any]], where: str) -> None:
    """Registry entries need ``interconnect``; an SM partition without one takes its full GPU's."""
    if "interconnect" in spec:
        return
    parent = next((e for e in entries if e["label"] == spec.get("partition_of")), None)
    if parent is None:
        raise ValueError(f"{where} ({spec.get('name')!r}): registry entries need 'interconnect' "
                         f"({list(INTERCONNECT_FIELDS)}); an SM partition inherits it from an earlier "
                         f"'partition_of' entry")
    spec["interconnect"] = dict(parent["interconnect"])


def known_gpus() -> list[str]:
    """Names of the GPUs in the registry, in file order."""
    return [e["name"] for e in _registry().entries]


def _close_matches(name: str) -> list[str]:
    reg = _registry()
    key = _norm(name)
    hits = difflib.get_close_matches(key, list(reg.display), n=6, cutoff=0.6)
    hits += difflib.get_close_matches(_strip_vendor(key), list(reg.display), n=6, cutoff=0.6)
    out: list[str] = []
    for h in hits:
        written, name = reg.display[h], reg.by_label[reg.index[h]]["name"]
        shown = repr(written) if written == name else f"{written!r} ({name})"
        if shown not in out:
            out.append(shown)
    return out[:6]


def gpu_spec(name_or_dict: str | Mapping[str, Any]) -> dict[str, Any]:
    """The spec of a GPU: the 11 ``SPEC_FIELDS`` plus its ``label`` (and, for registry GPUs, ``interconnect``:
    the ``INTERCONNECT_FIELDS`` mapping; a spec dict may give one too).

    A string is looked up in the registry by name, label or alias, ignoring
    case, spaces, underscores, hyphens and parentheses (``'a100_80gb'``,
    ``'NVIDIA A100-SXM4-80GB'``). A dict describes a GPU not in the registry and
    is validated: all 11 fields, no others (``label`` optional, default a slug
    of the name). Returns a new dict each call.
    """
    if isinstance(name_or_dict, str):
        reg = _registry()
        key = _norm(name_or_dict)
        label = reg.index.get(key) or reg.index.get(_strip_vendor(key))
        if label is None or not key:
            close = _close_matches(name_or_dict)
            hint = f" Close matches: {', '.join(close)}." if close else ""
            raise ValueError(
                f"unknown GPU {name_or_dict!r}.{hint} known_gpus() lists all; "
                f"for another GPU pass a spec dict with the fields in SPEC_FIELDS."
            )
        return _copy(reg.by_label[label])
    if isinstance(name_or_dict, Mapping):
        spec = validate_spec(name_or_dict, where="gpu spec dict")
        known = _registry().by_label.get(spec["label"])
        if known is not None and any(known[f] != spec[f] for f in SPEC_FIELDS):
            # The label names a dataset partition: two different GPUs under one
            # label would mix their measurements.
            raise ValueError(
                f"gpu spec dict: label {spec['label']!r} belongs to the registry's {known['name']!r}, "
                f"whose specs differ; give this GPU another label"
            )
        return spec
    raise TypeError(
        f"name_or_dict must be a GPU name (str) or a spec dict, got {type(name_or_dict).__name__}"
    )


def _copy(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A copy a caller may edit without changing the registry (nested mappings too)."""
    return copy.deepcopy(dict(spec))


def gpu_label(name_or_dict: str | Mapping[str, Any]) -> str:
    """The GPU's short stable label (the dataset partition name)."""
    return gpu_spec(name_or_dict)["label"]


def _precision(precision: str) -> str:
    return normalize_precision(precision)


def supports_precision(spec: str | Mapping[str, Any], precision: str) -> bool:
    """Whether the GPU can run ``precision`` at all: it has a fast path for it (``physics.has_fast_path``;
    fp32 always). The prediction API refuses the precisions this says no to."""
    return physics.has_fast_path(gpu_spec(spec), _precision(precision))


def peak_tflops(spec: str | Mapping[str, Any], precision: str) -> float:
    """Peak dense TFLOP/s of the GPU at ``precision`` (Tensor Core rate for
    tf32/fp16/bf16, plain FMA rate for fp32), from ``physics.peak_tflops``.

    Raises ValueError where the GPU cannot run the precision (``supports_precision``, e.g. bf16 on a V100):
    a prediction needs a rate the GPU really has.
    """
    p = _precision(precision)
    s = gpu_spec(spec)
    if not physics.has_fast_path(s, p):
        raise ValueError(f"GPU {s['name']!r} has no {p} path (its {p}_tflops is null)")
    return physics.peak_tflops(s, p)
