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
import math
import numbers
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from pipeline import physics
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

#: The fields of a GPU spec, in order (the contract with ``conf/gpus.yaml``).
SPEC_FIELDS: tuple[str, ...] = (
    "name",
    "compute_capability",
    "sm_count",
    "boost_clock_mhz",
    "memory_gb",
    "memory_bandwidth_gbps",
    "l2_cache_mb",
    "fp32_tflops",
    "tf32_tflops",
    "fp16_tflops",
    "bf16_tflops",
)

#: Where the registry lives: next to the package, in the repository's conf/.
REGISTRY_PATH = Path(__file__).resolve().parent.parent / "conf" / "gpus.yaml"

_NUMERIC_FIELDS = SPEC_FIELDS[2:]
# Tensor Core rates: None where the GPU has no such path.
_OPTIONAL_FIELDS = frozenset({"tf32_tflops", "fp16_tflops", "bf16_tflops"})
# Keys a spec dict may carry besides SPEC_FIELDS ("aliases" is accepted, and
# dropped, so that an entry copied from conf/gpus.yaml validates as is).
_EXTRA_KEYS = frozenset({"label", "aliases", "partition_of", "measured", "interconnect"})

#: How a GPU talks to its peers (``interconnect``, a mapping): required for registry entries (an SM partition
#: inherits its full GPU's), optional in a spec dict (without it, only one-GPU predictions).
INTERCONNECT_FIELDS: tuple[str, ...] = (
    "nvlink_gen",      # NVLink generation (1-5), null without NVLink
    "nvlink_gbps",     # NVLink bandwidth per GPU and direction, all links together (GB/s), null without NVLink
    "nvlink_gpus",     # GPUs one NVLink domain joins (a bridge: 2; an HGX board: 8; GB200 NVL72: 72)
    "nvswitch",        # whether the NVLink domain is switched (every GPU reaches every other at full rate)
    "pcie_gen",        # PCIe generation of the GPU's host link (1-6)
    "pcie_lanes",      # PCIe lanes of that link
    "gpus_per_node",   # GPUs a collective reaches without the inter-node network (a server; GB200: the NVL72 rack)
)
_CC_RE = re.compile(r"^\d+\.\d+$")
_LABEL_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
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


def _slug(name: str) -> str:
    """Default label of a GPU given by dict: its name as a lowercase slug."""
    return re.sub(r"[^a-z0-9.]+", "-", name.lower()).strip("-.")


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _validate(spec: Mapping[str, Any], *, where: str) -> dict[str, Any]:
    """Check a spec mapping and return it normalised (11 fields plus ``label``).

    Raises ValueError naming every problem found, so that one fix-up round is
    enough.
    """
    missing = [f for f in SPEC_FIELDS if f not in spec]
    unknown = sorted(str(k) for k in spec if k not in SPEC_FIELDS and k not in _EXTRA_KEYS)
    if missing or unknown:
        parts = []
        if missing:
            parts.append(f"missing spec fields {missing} (all of {list(SPEC_FIELDS)} are required)")
        if unknown:
            parts.append(f"unknown spec fields {unknown} (allowed: {list(SPEC_FIELDS)} and 'label')")
        raise ValueError(f"{where}: " + "; ".join(parts))

    problems: list[str] = []
    out: dict[str, Any] = {}

    name = spec["name"]
    if not isinstance(name, str) or not name.strip():
        problems.append(f"name must be a non-empty string, got {name!r}")
    else:
        out["name"] = name.strip()

    cc = spec["compute_capability"]
    if _is_number(cc) and math.isfinite(cc) and cc > 0:
        cc = f"{float(cc):.1f}" if float(cc) == round(float(cc), 1) else str(cc)
    if isinstance(cc, str) and _CC_RE.match(cc.strip()):
        out["compute_capability"] = cc.strip()
    else:
        problems.append("compute_capability must be a string like '8.6' (or a number), got "
                        f"{spec['compute_capability']!r}")

    for field in _NUMERIC_FIELDS:
        value = spec[field]
        if value is None and field in _OPTIONAL_FIELDS:
            out[field] = None
            continue
        if not _is_number(value) or not math.isfinite(value) or value <= 0:
            allowed = " (or null)" if field in _OPTIONAL_FIELDS else ""
            problems.append(f"{field} must be a finite positive number{allowed}, got {value!r}")
            continue
        if field == "sm_count":
            if float(value) != int(value):
                problems.append(f"sm_count must be a whole number, got {value!r}")
                continue
            out[field] = int(value)
        else:
            out[field] = float(value)

    label = spec.get("label")
    if label is None:
        if "name" in out:
            label = _slug(out["name"])
            if not _LABEL_RE.match(label):
                problems.append(f"name {out['name']!r} gives no usable label; pass 'label'")
    elif not isinstance(label, str) or not _LABEL_RE.match(label):
        problems.append(f"label must be a lowercase slug ([a-z0-9._-]), got {label!r}")
        label = None

    aliases = spec.get("aliases", [])
    if not isinstance(aliases, (list, tuple)) or not all(isinstance(a, str) and a.strip() for a in aliases):
        problems.append(f"aliases must be a list of non-empty strings, got {aliases!r}")
    problems += _partition_problems(spec, out)
    if spec.get("interconnect") is not None:
        problems += _interconnect_problems(spec["interconnect"], out)

    if problems:
        raise ValueError(f"{where}: invalid GPU spec: " + "; ".join(problems))
    out["label"] = label
    return out


def _partition_problems(spec: Mapping[str, Any], out: dict[str, Any]) -> list[str]:
    """An SM partition of a GPU (``partition_of``: the full GPU's label) carries its measured characterisation
    (``measured``: a mapping of positive numbers, nested one level for the full GPU's)."""
    problems: list[str] = []
    parent = spec.get("partition_of")
    if parent is not None:
        if not isinstance(parent, str) or not _LABEL_RE.match(parent):
            problems.append(f"partition_of must be the registry label of the full GPU, got {parent!r}")
        else:
            out["partition_of"] = parent
    measured = spec.get("measured")
    if measured is not None:
        def positive(v):
            return _is_number(v) and math.isfinite(v) and v > 0

        flat = [v for v in measured.values() if not isinstance(v, Mapping)] if isinstance(measured, Mapping) else None
        nested = ([v for m in measured.values() if isinstance(m, Mapping) for v in m.values()]
                  if flat is not None else [])
        if flat is None or not all(positive(v) for v in flat + nested):
            problems.append(f"measured must map names to positive numbers, got {measured!r}")
        else:
            out["measured"] = dict(measured)
    return problems


def _whole(value, low: int, high: int | None = None) -> bool:
    return (isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= low
            and (high is None or value <= high))


def _interconnect_problems(ic: Any, out: dict[str, Any]) -> list[str]:
    """Check an ``interconnect`` mapping (``INTERCONNECT_FIELDS``); on success store it in ``out``.

    NVLink fields are all null (no NVLink) or all set; an NVLink domain never exceeds the node; NVSwitch needs
    NVLink."""
    if not isinstance(ic, Mapping):
        return [f"interconnect must be a mapping of {list(INTERCONNECT_FIELDS)}, got {ic!r}"]
    missing = [f for f in INTERCONNECT_FIELDS if f not in ic]
    unknown = sorted(str(k) for k in ic if k not in INTERCONNECT_FIELDS)
    if missing or unknown:
        return [f"interconnect: missing {missing}, unknown {unknown} (fields: {list(INTERCONNECT_FIELDS)})"]
    problems = []
    if not _whole(ic["pcie_gen"], 1, 6):
        problems.append(f"interconnect.pcie_gen must be a whole number 1-6, got {ic['pcie_gen']!r}")
    if ic["pcie_lanes"] not in (1, 2, 4, 8, 16) or isinstance(ic["pcie_lanes"], bool):
        problems.append(f"interconnect.pcie_lanes must be 1, 2, 4, 8 or 16, got {ic['pcie_lanes']!r}")
    if not _whole(ic["gpus_per_node"], 1):
        problems.append(f"interconnect.gpus_per_node must be a whole number >= 1, got {ic['gpus_per_node']!r}")
    if not isinstance(ic["nvswitch"], bool):
        problems.append(f"interconnect.nvswitch must be true or false, got {ic['nvswitch']!r}")
    nvlink = [ic[f] for f in ("nvlink_gen", "nvlink_gbps", "nvlink_gpus")]
    if all(v is None for v in nvlink):
        if ic["nvswitch"] is True:
            problems.append("interconnect.nvswitch is true but the GPU has no NVLink (nvlink_gen is null)")
    elif any(v is None for v in nvlink):
        problems.append(f"interconnect: nvlink_gen, nvlink_gbps and nvlink_gpus are all null (no NVLink) or all "
                        f"set, got {nvlink}")
    else:
        gen, gbps, domain = nvlink
        if not _whole(gen, 1, 5):
            problems.append(f"interconnect.nvlink_gen must be a whole number 1-5 or null, got {gen!r}")
        if not (_is_number(gbps) and math.isfinite(gbps) and gbps > 0):
            problems.append(f"interconnect.nvlink_gbps must be a positive number or null, got {gbps!r}")
        if not _whole(domain, 2):
            problems.append(f"interconnect.nvlink_gpus must be a whole number >= 2 or null, got {domain!r}")
        elif _whole(ic["gpus_per_node"], 1) and domain > ic["gpus_per_node"]:
            problems.append(f"interconnect.nvlink_gpus ({domain}) exceeds gpus_per_node ({ic['gpus_per_node']})")
    if not problems:
        out["interconnect"] = {f: (float(ic[f]) if f == "nvlink_gbps" and ic[f] is not None else ic[f])
                               for f in INTERCONNECT_FIELDS}
    return problems


class _Registry:
    """The loaded registry: specs by label, and a lookup index of all names."""

    def __init__(self, entries: list[dict[str, Any]], index: dict[str, str], display: dict[str, str]):
        self.entries = entries  # in file order
        self.by_label = {e["label"]: e for e in entries}
        self.index = index  # normalised name -> label
        self.display = display  # normalised name -> a name as written


@functools.lru_cache(maxsize=1)
def _registry() -> _Registry:
    """Load and validate conf/gpus.yaml once (cached for the process)."""
    try:
        raw = yaml.safe_load(REGISTRY_PATH.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"GPU registry not found at {REGISTRY_PATH}") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("gpus"), list):
        raise ValueError(f"{REGISTRY_PATH.name}: expected a top-level 'gpus' list")

    entries: list[dict[str, Any]] = []
    index: dict[str, str] = {}
    display: dict[str, str] = {}
    for i, item in enumerate(raw["gpus"]):
        where = f"{REGISTRY_PATH.name} entry {i}"
        if not isinstance(item, dict):
            raise ValueError(f"{where}: expected a mapping, got {type(item).__name__}")
        if "label" not in item or "aliases" not in item:
            raise ValueError(f"{where}: registry entries need 'label' and 'aliases'")
        spec = _validate(item, where=f"{where} ({item.get('name')!r})")
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
        spec = _validate(name_or_dict, where="gpu spec dict")
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
