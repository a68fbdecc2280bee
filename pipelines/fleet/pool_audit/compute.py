"""The pool audit as pure pandas over plain lists and DataFrames (no AWS, no Dagster): prices, counts and figures
per pool, totals, and the daily report. The row kinds and the price rules are in docs/fleet.md."""

from __future__ import annotations

import datetime as dt
import json
import re
import sys
from dataclasses import dataclass, field
from numbers import Real
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

KINDS = ("pool", "untagged", "unknown_pool")
# Why the rows that are no pool are left out of the totals.
LEFT_OUT = {
    "untagged": "managed instances without a pool tag",
    "unknown_pool": "pool tag names no pool in the pools table",
}
POOL_COLUMNS = ["pool", "kind", "instance_type", "spot", "desired_idle"]
BUCKETS = ["running", "pending", "stopped"]
COUNT_COLUMNS = [*BUCKETS, "busy", "idle", "idle_excess"]
PRICE_COLUMNS = ["hourly_price_usd", "price_source"]
FIGURE_COLUMNS = ["compute_cost_usd_per_hour", "idle_cost_usd_per_hour", "utilization_pct"]
SNAPSHOT_COLUMNS = [*POOL_COLUMNS, *COUNT_COLUMNS, *PRICE_COLUMNS, *FIGURE_COLUMNS, "in_totals", "problem"]
# What the pools table gives per pool (:func:`pool_config`); the rest of a row is counted or derived.
# ``spot_factor``: applied to the pool's spot instances (1: the price is already the one of every instance).
CONFIG_COLUMNS = [*POOL_COLUMNS, *PRICE_COLUMNS, "spot_factor", "problem"]
INSTANCE_COLUMNS = ["instance_id", "state", "pool", "instance_type"]  # and ``spot``: EC2's InstanceLifecycle
# EC2 states -> the audit's buckets. shutting-down and terminated instances are not capacity.
STATE_BUCKET = {"pending": "pending", "running": "running", "stopping": "stopped", "stopped": "stopped"}
MAX_DESIRED_IDLE = 1_000_000  # beyond it a pool's desired_idle is a typo (and past 2**63 no count holds it)
PLAIN_POOL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
"""A pool name as runs-fleet's are (``linux-small``, ``gpu``): any other is its row's problem (docs/fleet.md)."""


@dataclass(frozen=True)
class PriceList:
    source: str
    as_of: str
    spot_factor: float
    on_demand_usd_per_hour: dict[str, float] = field(default_factory=dict)


def load_price_list(path: Path | str | None = None) -> PriceList:
    """Read and validate a price list file (default: ``prices.json``); a malformed one names the bad entry."""
    path = Path(path) if path else Path(__file__).with_name("prices.json")
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
    """A finite number a float can hold (not NaN, not JSON's 1e400)."""
    return isinstance(value, Real) and not isinstance(value, bool) and abs(value) <= sys.float_info.max


def pool_label(name: str) -> str:
    """A pool name (or a pool's instance type) as the audit's rows and CSVs show it: as it is when plain, else
    quoted (its ``repr``), so
    that no cell starts with what a spreadsheet takes for a formula (``=``, ``+``, ``-``, ``@``)."""
    return name if PLAIN_POOL_NAME.fullmatch(name) else repr(name)


def pool_config(item: dict[str, Any], prices: PriceList) -> dict[str, Any]:
    """A plain pools-table item (``pipelines.common.from_item``), validated and priced, as a snapshot
    row's pool columns. A non-empty ``problem`` means: report it, keep it out of the totals."""
    problems: list[str] = []
    name = str(item.get("pool_name", ""))
    if pool_label(name) != name:
        problems.append("pool_name is not a plain name (a letter or digit, then letters, digits, '.', '_' or '-')")
    instance_type = item.get("instance_type")
    if not isinstance(instance_type, str) or not instance_type.strip():
        problems.append("missing instance_type")
        instance_type = None
    elif pool_label(instance_type) != instance_type:
        problems.append("instance_type is not a plain name (an EC2 instance type such as m5.large)")
        instance_type = pool_label(instance_type)

    # runs-fleet's PoolConfig has no desired_idle: the target its reconcile set now (a schedule's), else its base
    wanted = next(
        (k for k in ("desired_idle", "effective_desired_running") if item.get(k) is not None), "desired_running"
    )
    desired_idle = item.get(wanted, 0)
    if not _is_number(desired_idle) or not 0 <= desired_idle <= MAX_DESIRED_IDLE or int(desired_idle) != desired_idle:
        problems.append(f"invalid {wanted} {desired_idle!r} (a whole number from 0 to {MAX_DESIRED_IDLE})")
        desired_idle = 0

    spot = item.get("spot")  # absent (runs-fleet's pools): each instance's own, as runs-fleet launches it
    if spot is not None and not isinstance(spot, bool):
        problems.append(f"invalid spot {spot!r} (must be a boolean)")
        spot = False

    price, source, factor = None, "", 1.0
    if (own := item.get("hourly_price_usd")) is not None:
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
        elif spot is None:
            price, source, factor = listed, f"{label}, spot instances x {prices.spot_factor:g}", prices.spot_factor
        else:
            price, source = listed, label
    return {
        "pool": pool_label(name),
        "kind": "pool",
        "instance_type": instance_type,
        "spot": spot,
        "desired_idle": int(desired_idle),
        "hourly_price_usd": price,
        "price_source": source,
        "spot_factor": factor,
        "problem": "; ".join(problems),
    }


@dataclass
class PoolAudit:
    """One audit: the per-pool table, the totals, and what an operator must look at."""

    table: pd.DataFrame
    totals: dict[str, float | int]
    unknown_pool_instances: pd.DataFrame

    @property
    def problems(self) -> pd.DataFrame:
        """The rows left out of the totals for a problem: what ``pools_with_problems`` counts."""
        return self.table.loc[self.table["problem"] != "", ["pool", "kind", "problem"]]


def audit_pools(
    pools: list[dict[str, Any]],
    instances: list[dict[str, Any]],
    busy_instance_ids: set[str] | frozenset[str],
    prices: PriceList,
) -> PoolAudit:
    """Count, price and total every pool. ``pools`` are plain pools-table items, ``instances`` rows of
    ``instance_id, state, pool, instance_type`` (``pool`` None when untagged)."""
    import pandas as pd  # lazy: keeps pandas out of the code location's load time

    configs = pd.DataFrame([pool_config(item, prices) for item in pools], columns=CONFIG_COLUMNS)

    inst = pd.DataFrame(instances, columns=[*INSTANCE_COLUMNS, "spot"])
    inst = inst.assign(bucket=inst["state"].map(STATE_BUCKET)).dropna(subset=["bucket"])
    tag = inst["pool"].fillna("").astype(str)
    untagged = tag.str.strip() == ""
    inst["label"] = tag.map(pool_label).where(~untagged, "untagged")
    inst["kind"] = "pool"
    inst.loc[untagged, "kind"] = "untagged"
    inst.loc[~untagged & ~inst["label"].isin(set(configs["pool"])), "kind"] = "unknown_pool"
    inst["busy"] = (inst["bucket"] == "running") & inst["instance_id"].isin(busy_instance_ids)
    inst["spot_running"] = (inst["bucket"] == "running") & inst["spot"].eq(True)
    inst["spot_idle"] = inst["spot_running"] & ~inst["busy"]

    groups = inst.groupby(["label", "kind"])
    counts = pd.crosstab([inst["label"], inst["kind"]], inst["bucket"]).reindex(columns=BUCKETS, fill_value=0)
    for column in ("busy", "spot_running", "spot_idle"):
        counts[column] = groups[column].sum()
    counts["ec2_types"] = groups["instance_type"].agg(lambda s: ",".join(sorted(set(s.dropna()))))
    counts = counts.reset_index().rename(columns={"label": "pool"})

    table = configs.merge(counts, on=["pool", "kind"], how="outer")
    for column in [*BUCKETS, "busy", "desired_idle", "spot_running", "spot_idle"]:
        table[column] = table[column].fillna(0).astype("int64")
    table["instance_type"] = table["instance_type"].fillna(table["ec2_types"]).fillna("")
    table["price_source"] = table["price_source"].fillna("")
    table["problem"] = table["kind"].map(LEFT_OUT).fillna(table["problem"]).fillna("")
    table["hourly_price_usd"] = table["hourly_price_usd"].astype("float64")

    table["idle"] = table["running"] - table["busy"]
    table["idle_excess"] = (table["idle"] - table["desired_idle"]).clip(lower=0)
    table["in_totals"] = (table["kind"] == "pool") & (table["problem"] == "")
    # The pool item's spot (true or false) is every instance's; else EC2 says which instances are spot.
    given = table["spot"].notna()
    table["spot"] = table["spot_running"].where(~given, table["running"].where(table["spot"].eq(True), 0))
    price = table["hourly_price_usd"].where(table["in_totals"])
    spot_off = price * (1 - table["spot_factor"].fillna(1.0))  # what a spot instance costs less than the price
    table["compute_cost_usd_per_hour"] = table["running"] * price - table["spot_running"] * spot_off
    table["idle_cost_usd_per_hour"] = table["idle"] * price - table["spot_idle"] * spot_off
    running = table["running"].where(table["running"] > 0)
    table["utilization_pct"] = (100.0 * table["busy"] / running).fillna(0.0)
    table = table.assign(_k=table["kind"].map(KINDS.index)).sort_values(["_k", "pool"])
    table = table[SNAPSHOT_COLUMNS].reset_index(drop=True)

    unknown = inst.loc[inst["kind"] == "unknown_pool"].assign(pool=lambda rows: rows["label"])  # as its row shows it
    unknown = unknown[INSTANCE_COLUMNS].sort_values(["pool", "instance_id"])
    return PoolAudit(table=table, totals=totals_of(table), unknown_pool_instances=unknown.reset_index(drop=True))


def totals_of(table: pd.DataFrame) -> dict[str, float | int]:
    """Totals over the rows ``in_totals``, plus what was left out (so nothing disappears)."""
    valid = table.loc[table["in_totals"]]
    counts = {column: int(valid[column].sum()) for column in COUNT_COLUMNS}
    instances = table[BUCKETS].sum(axis=1)
    return {
        "pools": int((table["kind"] == "pool").sum()),
        "pools_in_totals": len(valid),
        **counts,
        "compute_cost_usd_per_hour": float(valid["compute_cost_usd_per_hour"].sum()),
        "idle_cost_usd_per_hour": float(valid["idle_cost_usd_per_hour"].sum()),
        "utilization_pct": 100.0 * counts["busy"] / counts["running"] if counts["running"] else 0.0,
        "pools_with_problems": int((table["problem"] != "").sum()),
        "untagged_instances": int(instances[table["kind"] == "untagged"].sum()),
        "unknown_pool_instances": int(instances[table["kind"] == "unknown_pool"].sum()),
        "running_left_out_of_totals": int(table.loc[~table["in_totals"], "running"].sum()),
    }


def snapshot_weights(
    times: list[pd.Timestamp], day_start: dt.datetime, max_gap: dt.timedelta, now: dt.datetime | None = None
) -> pd.Series:
    """Hours of ``[day_start, day_start + 1 day)`` each snapshot time stands for (a Series by time): until the
    next one, but at most ``max_gap`` (a missed schedule is a gap, not an extrapolation) and not past ``now``."""
    import pandas as pd  # lazy: keeps pandas out of the code location's load time

    start = pd.Timestamp(day_start)
    end = start + pd.Timedelta(days=1)
    if now is not None:
        end = min(end, pd.Timestamp(now))
    ordered = sorted(set(times))
    weights = {}
    for t, following in zip(ordered, [*ordered[1:], end], strict=True):
        until = min(t + pd.Timedelta(max_gap), end, following)
        weights[t] = max(0.0, (until - max(t, start)).total_seconds()) / 3600.0
    return pd.Series(weights, dtype="float64")


USD_COLUMNS = ["cost_usd", "idle_cost_usd", "busy_cost_usd", "idle_share_pct"]
REPORT_COLUMNS = ["pool", *USD_COLUMNS, "avg_running", "avg_idle", "hours_covered", "snapshots"]


def daily_report(
    snapshots: pd.DataFrame, day_start: dt.datetime, max_gap: dt.timedelta, now: dt.datetime | None = None
) -> tuple[pd.DataFrame, dict[str, float | int]]:
    """Time-weighted USD per pool for one UTC day from the snapshot rows (``snapshot_at`` + columns):
    each row ``in_totals`` counts for the hours its snapshot stands for (:func:`snapshot_weights`)."""
    import pandas as pd  # lazy: keeps pandas out of the code location's load time

    if snapshots.empty:
        nothing = {"cost_usd": 0.0, "idle_cost_usd": 0.0, "idle_share_pct": 0.0, "hours_covered": 0.0, "snapshots": 0}
        return pd.DataFrame(columns=REPORT_COLUMNS), nothing
    frame = snapshots.assign(snapshot_at=pd.to_datetime(snapshots["snapshot_at"], utc=True))
    weights = snapshot_weights(list(frame["snapshot_at"].unique()), day_start, max_gap, now)
    frame["hours"] = frame["snapshot_at"].map(weights).fillna(0.0)
    in_totals = frame["in_totals"].astype(str).str.lower().isin(["true", "1"])
    priced = frame.loc[in_totals & (frame["hours"] > 0)]
    by_pool = priced.assign(
        pool=priced["pool"].map(pool_label, na_action="ignore"),  # an older snapshot's names may not be plain
        cost_usd=priced["compute_cost_usd_per_hour"].astype(float) * priced["hours"],
        idle_cost_usd=priced["idle_cost_usd_per_hour"].astype(float) * priced["hours"],
        running_hours=priced["running"].astype(float) * priced["hours"],
        idle_hours=priced["idle"].astype(float) * priced["hours"],
        hours_covered=priced["hours"],
    ).groupby("pool")
    grouped = by_pool[["cost_usd", "idle_cost_usd", "running_hours", "idle_hours", "hours_covered"]].sum()
    grouped["snapshots"] = by_pool["snapshot_at"].nunique()
    grouped["busy_cost_usd"] = grouped["cost_usd"] - grouped["idle_cost_usd"]
    spent = grouped["cost_usd"].where(grouped["cost_usd"] > 0)
    grouped["idle_share_pct"] = (100.0 * grouped["idle_cost_usd"] / spent).fillna(0.0)
    # Every priced row covers some hours, so every pool's hours_covered is positive.
    grouped["avg_running"] = grouped["running_hours"] / grouped["hours_covered"]
    grouped["avg_idle"] = grouped["idle_hours"] / grouped["hours_covered"]
    report = grouped.reset_index().sort_values(["cost_usd", "pool"], ascending=[False, True])[REPORT_COLUMNS]
    cost, idle = float(report["cost_usd"].sum()), float(report["idle_cost_usd"].sum())
    totals = {
        "cost_usd": cost,
        "idle_cost_usd": idle,
        "idle_share_pct": 100.0 * idle / cost if cost else 0.0,
        "hours_covered": float(weights.sum()),
        "snapshots": int((weights > 0).sum()),
    }
    return report.reset_index(drop=True), totals
