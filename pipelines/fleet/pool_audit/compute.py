"""The pool audit as pure pandas: counts, prices and figures per pool, totals, and the daily report.

No AWS and no Dagster here: the inputs are plain lists and DataFrames, so every figure can be
checked against values computed by hand.

Snapshot columns (one row per pool, plus ``untagged`` and one row per unknown pool tag):

``pool, kind, instance_type, spot, desired_idle, running, pending, stopped, busy, idle,
idle_excess, hourly_price_usd, price_source, compute_cost_usd_per_hour, idle_cost_usd_per_hour,
utilization_pct, in_totals, problem``

``kind`` is ``pool`` (in the pools table), ``untagged`` (managed instances without a pool tag) or
``unknown_pool`` (a pool tag that names no pool). Only ``pool`` rows without problems are priced and
``in_totals``; the others are reported, counted, and kept out of the totals.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

from pipelines.fleet.pool_audit.prices import PriceList, pool_config

UNTAGGED = "untagged"
KINDS = ("pool", "untagged", "unknown_pool")
COUNT_COLUMNS = ["running", "pending", "stopped", "busy", "idle", "idle_excess"]
SNAPSHOT_COLUMNS = [
    "pool",
    "kind",
    "instance_type",
    "spot",
    "desired_idle",
    *COUNT_COLUMNS,
    "hourly_price_usd",
    "price_source",
    "compute_cost_usd_per_hour",
    "idle_cost_usd_per_hour",
    "utilization_pct",
    "in_totals",
    "problem",
]
# What the pools table gives per pool (the rest of a snapshot row is counted or derived).
CONFIG_COLUMNS = [c for c in SNAPSHOT_COLUMNS if c in {"pool", "kind", "instance_type", "spot", "desired_idle"}] + [
    "hourly_price_usd",
    "price_source",
    "problem",
]
INSTANCE_COLUMNS = ["instance_id", "state", "pool", "instance_type"]
# EC2 states -> the audit's buckets. shutting-down and terminated instances are not capacity.
STATE_BUCKET = {"pending": "pending", "running": "running", "stopping": "stopped", "stopped": "stopped"}


@dataclass
class PoolAudit:
    """One audit: the per-pool table, the totals, and what an operator must look at."""

    table: pd.DataFrame
    totals: dict[str, float | int]
    unknown_pool_instances: pd.DataFrame = field(default_factory=lambda: _empty_instances())

    @property
    def problems(self) -> pd.DataFrame:
        return problem_rows(self.table)


def problem_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The rows left out of the totals for a problem (pools, the untagged instances, unknown pool tags):
    what the asset's ``problems`` table shows and ``pools_with_problems`` counts."""
    return table.loc[table["problem"] != "", ["pool", "kind", "problem"]]


def _empty_instances() -> pd.DataFrame:
    import pandas as pd  # lazy: keeps pandas out of the code location's load time

    return pd.DataFrame(columns=INSTANCE_COLUMNS)


def instances_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Instance rows (``instance_id, state, pool, instance_type``; ``pool`` None when untagged)."""
    import pandas as pd  # lazy: keeps pandas out of the code location's load time

    return pd.DataFrame(rows, columns=INSTANCE_COLUMNS)


def audit_pools(
    pools: list[dict[str, Any]],
    instances: pd.DataFrame,
    busy_instance_ids: set[str] | frozenset[str],
    prices: PriceList,
) -> PoolAudit:
    """Count, price and total every pool. ``pools`` are plain pools-table items."""
    import pandas as pd  # lazy: keeps pandas out of the code location's load time

    configs = [pool_config(item, prices) for item in pools]
    known = {c.pool_name for c in configs}

    inst = instances.loc[instances["state"].isin(list(STATE_BUCKET))].copy()
    inst["bucket"] = inst["state"].map(STATE_BUCKET)
    tag = inst["pool"].fillna("").astype(str)
    untagged = tag.str.strip() == ""
    inst["label"] = tag.where(~untagged, UNTAGGED)
    inst["kind"] = "pool"
    inst.loc[untagged, "kind"] = "untagged"
    inst.loc[~untagged & ~inst["label"].isin(known), "kind"] = "unknown_pool"
    inst["busy"] = (inst["bucket"] == "running") & inst["instance_id"].isin(busy_instance_ids)

    counts = pd.crosstab([inst["label"], inst["kind"]], inst["bucket"])
    counts = counts.reindex(columns=["running", "pending", "stopped"], fill_value=0)
    counts["busy"] = inst.groupby(["label", "kind"])["busy"].sum()
    types = inst.groupby(["label", "kind"])["instance_type"].agg(lambda s: ",".join(sorted(set(s.dropna()))))
    counts = counts.reset_index().rename(columns={"label": "pool"})
    counts["ec2_types"] = counts.set_index(["pool", "kind"]).index.map(types)

    config_frame = pd.DataFrame(
        [
            {
                "pool": c.pool_name,
                "kind": "pool",
                "instance_type": c.instance_type,
                "spot": c.spot,
                "desired_idle": c.desired_idle,
                "hourly_price_usd": c.hourly_price_usd,
                "price_source": c.price_source,
                "problem": "; ".join(c.problems),
            }
            for c in configs
        ],
        columns=CONFIG_COLUMNS,
    )
    table = config_frame.merge(counts, on=["pool", "kind"], how="outer")
    for column in ["running", "pending", "stopped", "busy", "desired_idle"]:
        table[column] = table[column].fillna(0).astype("int64")
    table["spot"] = table["spot"].fillna(False).astype(bool)
    table["instance_type"] = table["instance_type"].fillna(table["ec2_types"]).fillna("")
    table["price_source"] = table["price_source"].fillna("")
    table["problem"] = table["problem"].fillna("")
    table["hourly_price_usd"] = table["hourly_price_usd"].astype("float64")
    table.loc[table["kind"] == "untagged", "problem"] = "managed instances without a pool tag"
    table.loc[table["kind"] == "unknown_pool", "problem"] = "pool tag names no pool in the pools table"

    table["idle"] = table["running"] - table["busy"]
    table["idle_excess"] = (table["idle"] - table["desired_idle"]).clip(lower=0)
    table["in_totals"] = (table["kind"] == "pool") & (table["problem"] == "")
    price = table["hourly_price_usd"].where(table["in_totals"])
    table["compute_cost_usd_per_hour"] = table["running"] * price
    table["idle_cost_usd_per_hour"] = table["idle"] * price
    running = table["running"].where(table["running"] > 0)
    table["utilization_pct"] = (100.0 * table["busy"] / running).fillna(0.0)

    kind_order = table["kind"].map({k: n for n, k in enumerate(KINDS)})
    table = table.assign(_k=kind_order).sort_values(["_k", "pool"]).drop(columns=["_k", "ec2_types"])
    table = table[SNAPSHOT_COLUMNS].reset_index(drop=True)

    unknown = inst.loc[inst["kind"] == "unknown_pool", INSTANCE_COLUMNS].sort_values(["pool", "instance_id"])
    return PoolAudit(table=table, totals=totals_of(table), unknown_pool_instances=unknown.reset_index(drop=True))


def totals_of(table: pd.DataFrame) -> dict[str, float | int]:
    """Totals over the rows ``in_totals``, plus what was left out (so nothing disappears)."""
    valid = table.loc[table["in_totals"]]
    left_out = table.loc[~table["in_totals"]]
    running, busy = int(valid["running"].sum()), int(valid["busy"].sum())
    return {
        "pools": int((table["kind"] == "pool").sum()),
        "pools_in_totals": len(valid),
        "running": running,
        "pending": int(valid["pending"].sum()),
        "stopped": int(valid["stopped"].sum()),
        "busy": busy,
        "idle": int(valid["idle"].sum()),
        "idle_excess": int(valid["idle_excess"].sum()),
        "compute_cost_usd_per_hour": float(valid["compute_cost_usd_per_hour"].sum()),
        "idle_cost_usd_per_hour": float(valid["idle_cost_usd_per_hour"].sum()),
        "utilization_pct": 100.0 * busy / running if running else 0.0,
        "pools_with_problems": len(problem_rows(table)),
        "untagged_instances": int(
            table.loc[table["kind"] == "untagged", ["running", "pending", "stopped"]].to_numpy().sum()
        ),
        "unknown_pool_instances": int(
            table.loc[table["kind"] == "unknown_pool", ["running", "pending", "stopped"]].to_numpy().sum()
        ),
        "running_left_out_of_totals": int(left_out["running"].sum()),
    }


# ---------------------------------------------------------------- daily report


def snapshot_weights(
    times: list[pd.Timestamp], day_start: dt.datetime, max_gap: dt.timedelta, now: dt.datetime | None = None
) -> pd.Series:
    """Hours of ``[day_start, day_start + 1 day)`` each snapshot time stands for.

    A snapshot holds until the next one, but never longer than ``max_gap`` (a missed schedule
    is a gap, not an extrapolation), never past the day and never past ``now`` (today so far).
    A snapshot from before the day covers its start. Returns a Series indexed by the snapshot times.
    """
    import pandas as pd  # lazy: keeps pandas out of the code location's load time

    start = pd.Timestamp(day_start)
    end = start + pd.Timedelta(days=1)
    if now is not None:
        end = min(end, pd.Timestamp(now))
    ordered = sorted(set(times))
    weights = {}
    for n, t in enumerate(ordered):
        until = min(t + pd.Timedelta(max_gap), end)
        if n + 1 < len(ordered):
            until = min(until, ordered[n + 1])
        seconds = (until - max(t, start)).total_seconds()
        weights[t] = max(0.0, seconds) / 3600.0
    return pd.Series(weights, dtype="float64")


REPORT_COLUMNS = [
    "pool",
    "cost_usd",
    "idle_cost_usd",
    "busy_cost_usd",
    "idle_share_pct",
    "avg_running",
    "avg_idle",
    "hours_covered",
    "snapshots",
]


def daily_report(
    snapshots: pd.DataFrame,
    day_start: dt.datetime,
    max_gap: dt.timedelta = dt.timedelta(minutes=30),
    now: dt.datetime | None = None,
) -> tuple[pd.DataFrame, dict[str, float | int]]:
    """Time-weighted USD per pool for one UTC day from the snapshot rows (``snapshot_at`` + columns).

    Each snapshot's USD-per-hour figures count for the hours it stands for (``snapshot_weights``).
    Only rows ``in_totals`` are priced; ``idle_share_pct`` = 100 x idle USD / compute USD.
    """
    import pandas as pd  # lazy: keeps pandas out of the code location's load time

    if snapshots.empty:
        empty = pd.DataFrame(columns=REPORT_COLUMNS)
        nothing = {"cost_usd": 0.0, "idle_cost_usd": 0.0, "idle_share_pct": 0.0, "hours_covered": 0.0, "snapshots": 0}
        return empty, nothing
    frame = snapshots.copy()
    frame["snapshot_at"] = pd.to_datetime(frame["snapshot_at"], utc=True)
    weights = snapshot_weights(list(frame["snapshot_at"].unique()), day_start, max_gap, now)
    frame["hours"] = frame["snapshot_at"].map(weights).fillna(0.0)
    in_totals = frame["in_totals"].astype(str).str.lower().isin(["true", "1"])
    priced = frame.loc[in_totals & (frame["hours"] > 0)].copy()
    priced["cost_usd"] = priced["compute_cost_usd_per_hour"].astype(float) * priced["hours"]
    priced["idle_cost_usd"] = priced["idle_cost_usd_per_hour"].astype(float) * priced["hours"]
    priced["running_hours"] = priced["running"].astype(float) * priced["hours"]
    priced["idle_hours"] = priced["idle"].astype(float) * priced["hours"]
    grouped = priced.groupby("pool").agg(
        cost_usd=("cost_usd", "sum"),
        idle_cost_usd=("idle_cost_usd", "sum"),
        running_hours=("running_hours", "sum"),
        idle_hours=("idle_hours", "sum"),
        hours_covered=("hours", "sum"),
        snapshots=("snapshot_at", "nunique"),
    )
    grouped["busy_cost_usd"] = grouped["cost_usd"] - grouped["idle_cost_usd"]
    grouped["idle_share_pct"] = _share(grouped["idle_cost_usd"], grouped["cost_usd"])
    covered = grouped["hours_covered"].where(grouped["hours_covered"] > 0)
    grouped["avg_running"] = (grouped["running_hours"] / covered).fillna(0.0)
    grouped["avg_idle"] = (grouped["idle_hours"] / covered).fillna(0.0)
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


def _share(part: pd.Series, whole: pd.Series) -> pd.Series:
    return (100.0 * part / whole.where(whole > 0)).fillna(0.0)
