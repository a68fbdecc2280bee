"""The pool audit as a housekeeping task (``pool_audit``) of the fleet's dispatcher. No Dagster.
Bad parameters raise ``ParamsError`` (the dispatcher dead-letters the message)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipelines.common.params import ParamsError, param
from pipelines.common.task import Task
from pipelines.fleet.context import FleetContext
from pipelines.fleet.messages import HousekeepingRequest
from pipelines.fleet.pool_audit.audit import AuditRun, run_pool_audit


@dataclass(frozen=True)
class AuditMessageParams:
    """A housekeeping ``pool_audit`` message's ``params`` (besides the fleet's ``dryRun`` and ``now``)."""

    idle_cost_threshold_usd_per_hour: float = param(
        5.0,
        description="The idle_cost_below_threshold check warns when the fleet's idle capacity costs more "
        "than this, in USD per hour.",
        minimum=0,
        maximum=100_000,
    )


@dataclass(frozen=True)
class PoolAuditParams(AuditMessageParams):
    dry_run: bool = param(False, description="Compute and report, but publish no metrics and store no snapshot.")


@dataclass(frozen=True)
class HousekeepingAudit:
    """One audit run with the threshold its checks use (the asset's config or a housekeeping message's)."""

    run: AuditRun
    idle_cost_threshold_usd_per_hour: float

    def summary(self) -> dict[str, Any]:
        """The small, JSON-friendly part: what the run's output and log show."""
        run, totals = self.run, self.run.audit.totals
        return {
            "pools": int(totals["pools"]),
            "instances": run.instances,
            **{key: int(totals[key]) for key in ("running", "busy", "idle")},
            **{key: round(float(totals[key]), 4) for key in ("compute_cost_usd_per_hour", "idle_cost_usd_per_hour")},
            "snapshot_key": run.snapshot_key or "(dry run: none)",
            "dry_run": run.dry_run,
        }


def pool_audit_task(ctx: FleetContext, request: HousekeepingRequest, params: AuditMessageParams) -> HousekeepingAudit:
    """A what-if clock (``now``) is only allowed with a dry run, so that no snapshot is written at a made-up time."""
    what_if = "now" in request.params
    if what_if and not request.dry_run:
        raise ParamsError("pool_audit: params.now is only allowed with dryRun (a snapshot would be misdated)")
    if not ctx.pools_table:
        raise RuntimeError("pool_audit: no pools table is configured (RUNS_FLEET_POOLS_TABLE)")
    run = run_pool_audit(ctx, dry_run=request.dry_run, now=request.now() if what_if else None)
    return HousekeepingAudit(run=run, idle_cost_threshold_usd_per_hour=params.idle_cost_threshold_usd_per_hour)


TASK = Task(
    name="pool_audit", params=AuditMessageParams, run=pool_audit_task, clients=("dynamodb", "ec2", "cloudwatch", "s3")
)
