"""The price list shipped with the repo (``prices.json``) and how one pool gets its hourly price:
its own ``hourly_price_usd``, else the list's on-demand price (times ``spot_factor`` for spot
pools). A pool that cannot be priced gets a problem text, never a price of 0."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from numbers import Real
from pathlib import Path
from typing import Any

PRICES_PATH = Path(__file__).with_name("prices.json")


@dataclass(frozen=True)
class PriceList:
    source: str
    as_of: str
    spot_factor: float
    on_demand_usd_per_hour: dict[str, float] = field(default_factory=dict)


def load_price_list(path: Path | str | None = None) -> PriceList:
    """Read and validate a price list file; a malformed file is an error naming the bad entry."""
    path = Path(path) if path else PRICES_PATH
    raw = json.loads(path.read_text())
    for key in ("source", "as_of", "spot_factor", "on_demand_usd_per_hour"):
        if key not in raw:
            raise ValueError(f"{path}: missing {key!r}")
    factor = raw["spot_factor"]
    if not _is_number(factor) or not 0 < factor <= 1:
        raise ValueError(f"{path}: spot_factor must be a number in (0, 1], got {factor!r}")
    for instance_type, price in raw["on_demand_usd_per_hour"].items():
        if not _is_number(price) or price <= 0:
            raise ValueError(f"{path}: price of {instance_type!r} must be a positive number, got {price!r}")
    prices = {instance_type: float(price) for instance_type, price in raw["on_demand_usd_per_hour"].items()}
    return PriceList(source=raw["source"], as_of=raw["as_of"], spot_factor=float(factor), on_demand_usd_per_hour=prices)


def _is_number(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


def pool_config(item: dict[str, Any], prices: PriceList) -> dict[str, Any]:
    """A plain pools-table item (``pipelines.common.from_item``), validated and priced, as a snapshot
    row's pool columns. A non-empty ``problem`` means: report it, keep it out of the totals."""
    problems: list[str] = []
    instance_type = item.get("instance_type")
    if not isinstance(instance_type, str) or not instance_type.strip():
        problems.append("missing instance_type")
        instance_type = None

    desired_idle = item.get("desired_idle", 0)
    if not _is_number(desired_idle) or desired_idle < 0 or int(desired_idle) != desired_idle:
        problems.append(f"invalid desired_idle {desired_idle!r}")
        desired_idle = 0

    spot = item.get("spot", False)
    if not isinstance(spot, bool):
        problems.append(f"invalid spot {spot!r} (must be a boolean)")
        spot = False

    price, source = None, ""
    if item.get("hourly_price_usd") is not None:
        own = item["hourly_price_usd"]
        if not _is_number(own):
            problems.append(f"invalid hourly_price_usd {own!r}")
        elif own < 0:
            problems.append(f"negative hourly_price_usd {own}")
        else:
            price, source = float(own), "pool item"
    elif instance_type is not None:
        listed, label = prices.on_demand_usd_per_hour.get(instance_type), f"price list {prices.as_of}"
        if listed is None:
            problems.append(f"instance type {instance_type} is not in the {label} and the pool has no price")
        elif spot:
            price, source = listed * prices.spot_factor, f"{label} x spot {prices.spot_factor:g}"
        else:
            price, source = listed, label
    return {
        "pool": str(item.get("pool_name", "")),
        "kind": "pool",
        "instance_type": instance_type,
        "spot": spot,
        "desired_idle": int(desired_idle),
        "hourly_price_usd": price,
        "price_source": source,
        "problem": "; ".join(problems),
    }
