"""Validation of GPU specs: the registry's entries and the spec dicts users pass for GPUs it lacks.

Errors name every problem of a spec at once (the field, what is allowed, what was given), so one fix-up round
is enough. Part of the light prediction API (standard library only).
"""

from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping
from typing import Any

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


def _slug(name: str) -> str:
    """Default label of a GPU given by dict: its name as a lowercase slug."""
    return re.sub(r"[^a-z0-9.]+", "-", name.lower()).strip("-.")


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def validate_spec(spec: Mapping[str, Any], *, where: str) -> dict[str, Any]:
    """Check a spec mapping and return it normalised (11 fields plus ``label``, and the optional
    ``partition_of``, ``measured`` and ``interconnect``). Raises ValueError naming every problem found."""
    missing = [f for f in SPEC_FIELDS if f not in spec]
    unknown = sorted(str(k) for k in spec if k not in SPEC_FIELDS and k not in _EXTRA_KEYS)
    if missing or unknown:
        parts = []
        if missing:
            parts.append(f"missing spec fields {missing} (all of {list(SPEC_FIELDS)} are required)")
        if unknown:
            parts.append(f"unknown spec fields {unknown} (allowed: {list(SPEC_FIELDS)} and 'label')")
        raise ValueError(f"{where}: " + "; ".join(parts))
    out: dict[str, Any] = {}
    problems = _identity_problems(spec, out) + _number_problems(spec, out) + _partition_problems(spec, out)
    if spec.get("interconnect") is not None:
        problems += _interconnect_problems(spec["interconnect"], out)
    if problems:
        raise ValueError(f"{where}: invalid GPU spec: " + "; ".join(problems))
    out["label"] = out.pop("label")  # last, after the fields of the contract
    return out


def _identity_problems(spec: Mapping[str, Any], out: dict[str, Any]) -> list[str]:
    """name, compute capability, label (derived from the name when absent) and aliases."""
    problems = []
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
    label = spec.get("label")
    if label is None:
        if "name" in out:
            label = _slug(out["name"])
            if not _LABEL_RE.match(label):
                problems.append(f"name {out['name']!r} gives no usable label; pass 'label'")
    elif not isinstance(label, str) or not _LABEL_RE.match(label):
        problems.append(f"label must be a lowercase slug ([a-z0-9._-]), got {label!r}")
        label = None
    out["label"] = label
    aliases = spec.get("aliases", [])
    if not isinstance(aliases, (list, tuple)) or not all(isinstance(a, str) and a.strip() for a in aliases):
        problems.append(f"aliases must be a list of non-empty strings, got {aliases!r}")
    return problems


def _number_problems(spec: Mapping[str, Any], out: dict[str, Any]) -> list[str]:
    """The numeric fields: finite and positive (the Tensor Core rates may be null), sm_count whole."""
    problems = []
    for field in _NUMERIC_FIELDS:
        value = spec[field]
        if value is None and field in _OPTIONAL_FIELDS:
            out[field] = None
        elif not _is_number(value) or not math.isfinite(value) or value <= 0:
            allowed = " (or null)" if field in _OPTIONAL_FIELDS else ""
            problems.append(f"{field} must be a finite positive number{allowed}, got {value!r}")
        elif field == "sm_count" and float(value) != int(value):
            problems.append(f"sm_count must be a whole number, got {value!r}")
        else:
            out[field] = int(value) if field == "sm_count" else float(value)
    return problems


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


