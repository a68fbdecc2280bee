"""The pool audit as the housekeeping task ``pool_audit``; ``ParamsError`` dead-letters the message."""

from __future__ import annotations

from pipelines.common.params import ParamsError
from pipelines.common.task import Task
from pipelines.fleet.context import FleetContext
from pipelines.fleet.messages import HousekeepingRequest
from pipelines.fleet.pool_audit.audit import AuditMessageParams, AuditRun, run_pool_audit


def pool_audit_task(ctx: FleetContext, request: HousekeepingRequest, params: AuditMessageParams) -> AuditRun:
    """A what-if clock (``now``) is only allowed with a dry run, so that no snapshot is written at a made-up time."""
    what_if = "now" in request.params
    if what_if and not request.dry_run:
        raise ParamsError("pool_audit: params.now is only allowed with dryRun (a snapshot would be misdated)")
    if not ctx.pools_table:
        raise RuntimeError("pool_audit: no pools table is configured (RUNS_FLEET_POOLS_TABLE)")
    return run_pool_audit(ctx, params, dry_run=request.dry_run, now=request.now() if what_if else None)


TASK = Task(
    name="pool_audit", params=AuditMessageParams, run=pool_audit_task, clients=("dynamodb", "ec2", "cloudwatch", "s3")
)
