"""GPU prices for the cost of a step: ``conf/prices.yaml``, list prices as of a date, with their source.

Cost per 1,000 steps = predicted step time x 1,000 x price per hour / 3,600 s. Edit the table to what you pay.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path

from pipeline import gpus

__all__ = ["PRICES_PATH", "load_prices", "price_for"]

PRICES_PATH = Path(__file__).resolve().parents[2] / "conf" / "prices.yaml"
_DATE = re.compile(r"^\d{4}(-\d{2}(-\d{2})?)?$")


def load_prices(path=None) -> dict[str, dict]:
    """The price table, validated: ``{gpu label: {price_usd_per_hour, date, source[, note], key}}``.

    Raises ValueError naming the entry and field for a missing or bad price, date or source, a key the GPU
    registry does not know, or two keys naming one GPU.
    """
    path = Path(path) if path is not None else PRICES_PATH
    prices = gpus.read_yaml_section(path, "prices", Mapping, "price table")
    out: dict[str, dict] = {}
    for key, entry in prices.items():
        where = f"{path.name} entry {key!r}"
        try:
            label = gpus.gpu_label(str(key))
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        if label in out:
            raise ValueError(f"{where}: names the same GPU ({label}) as entry {out[label]['key']!r}")
        if not isinstance(entry, Mapping):
            raise ValueError(f"{where}: expected a mapping with price_usd_per_hour, date and source")
        missing = [f for f in ("price_usd_per_hour", "date", "source") if f not in entry]
        if missing:
            raise ValueError(f"{where}: missing {missing}; every entry needs price_usd_per_hour, date, source")
        unknown = sorted(set(entry) - {"price_usd_per_hour", "date", "source", "note"})
        if unknown:
            raise ValueError(f"{where}: unknown fields {unknown} (allowed: price_usd_per_hour, date, source, note)")
        price = entry["price_usd_per_hour"]
        if isinstance(price, bool) or not isinstance(price, (int, float)) or not math.isfinite(price) or price <= 0:
            raise ValueError(f"{where}: price_usd_per_hour must be a number > 0, got {price!r}")
        date = str(entry["date"])
        if not _DATE.match(date):
            raise ValueError(f"{where}: date must be 'YYYY', 'YYYY-MM' or 'YYYY-MM-DD' (quoted), got {entry['date']!r}")
        source = entry["source"]
        if not isinstance(source, str) or not source.strip():
            raise ValueError(f"{where}: source must name where the price comes from, got {source!r}")
        out[label] = {"key": str(key), "price_usd_per_hour": float(price), "date": date, "source": source.strip(),
                      "note": str(entry.get("note", "") or "")}
    return out


def price_for(gpu, prices: Mapping | None = None) -> dict:
    """The price entry of ``gpu`` (any registry name); ValueError if it has none."""
    prices = load_prices() if prices is None else prices
    label = gpus.gpu_label(gpu)
    if label not in prices:
        raise ValueError(f"no price for GPU {gpu!r} ({label}) in the price table; add an entry with "
                         f"price_usd_per_hour, date and source to conf/prices.yaml "
                         f"(priced: {', '.join(sorted(prices)) or 'none'})")
    return dict(prices[label])
