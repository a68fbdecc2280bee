"""The pool audit's three WARN checks (docs/fleet.md, "Checks"), evaluated on an audit; no Dagster."""

from dataclasses import dataclass
from typing import Any

from pipelines.fleet.pool_audit.audit import AuditRun
from pipelines.fleet.pool_audit.render import markdown_table

MAX_LISTED = 50

CHECK_IDLE_COST = "idle_cost_below_threshold"
CHECK_DESIRED_IDLE = "pools_with_desired_idle_have_running_instances"
CHECK_KNOWN_POOLS = "instances_tag_known_pools"
CHECK_DESCRIPTIONS = {
    CHECK_IDLE_COST: "Warns when the fleet's idle cost (USD per hour) is above the configured threshold.",
    CHECK_DESIRED_IDLE: "Warns about pools that want idle instances (desired_idle, else runs-fleet's "
    "effective_desired_running, else desired_running, > 0) and have none running.",
    CHECK_KNOWN_POOLS: "Warns about managed instances whose runs-fleet:pool tag names no pool, and lists them.",
}
IDLE_COLUMNS = {"pool": "pool", "idle": "idle", "idle_cost_usd_per_hour": "idle USD/h"}
UNKNOWN_COLUMNS = {"instance_id": "instance", "pool": "pool tag", "state": "state", "instance_type": "type"}


@dataclass(frozen=True)
class CheckOutcome:
    """One check's evaluation; its ``metadata`` values are numbers, markdown tables (text) or lists of names."""

    check_name: str
    passed: bool
    description: str
    metadata: dict[str, int | float | str | list[Any]]


def evaluate_checks(run: AuditRun) -> list[CheckOutcome]:
    table, totals = run.audit.table, run.audit.totals
    idle_cost_threshold = run.idle_cost_threshold_usd_per_hour
    idle = float(totals["idle_cost_usd_per_hour"])
    priced = table.loc[table["in_totals"] & (table["idle_cost_usd_per_hour"] > 0)]
    top_idle = priced.sort_values("idle_cost_usd_per_hour", ascending=False).head(MAX_LISTED)
    starving = table.loc[(table["kind"] == "pool") & (table["desired_idle"] > 0) & (table["running"] == 0)]
    unknown = run.audit.unknown_pool_instances
    return [
        CheckOutcome(
            CHECK_IDLE_COST,
            idle <= idle_cost_threshold,
            f"idle cost {idle:.4f} USD/h, threshold {idle_cost_threshold:g} USD/h",
            {
                "idle_cost_usd_per_hour": idle,
                "threshold_usd_per_hour": float(idle_cost_threshold),
                "idle_pools": markdown_table(top_idle, IDLE_COLUMNS),
            },
        ),
        CheckOutcome(
            CHECK_DESIRED_IDLE,
            starving.empty,
            f"{len(starving)} pools want idle capacity and run nothing",
            {"count": len(starving), "pools": starving["pool"].head(MAX_LISTED).tolist()},
        ),
        CheckOutcome(
            CHECK_KNOWN_POOLS,
            unknown.empty,
            f"{len(unknown)} managed instances are tagged with a pool that does not exist",
            {"count": len(unknown), "instances": markdown_table(unknown, UNKNOWN_COLUMNS, max_rows=MAX_LISTED)},
        ),
    ]
