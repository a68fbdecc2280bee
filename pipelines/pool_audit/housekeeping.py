"""The housekeeping ``pool_audit`` task, as the fleet dispatcher runs it (``pipelines.fleet.housekeeping.TASKS``).

A plain function ``(FleetContext, HousekeepingRequest) -> result`` like the other tasks. Its result
carries the whole audit under ``AUDIT_RUN_KEY`` for the Dagster layer, which takes it out
(``pipelines.pool_audit.defs.record_housekeeping_audits``) and records a ``pool_audit``
materialization with its checks; the rest of the result is small and JSON-friendly.
"""

from __future__ import annotations

from typing import Any

from pipelines.fleet.messages import HousekeepingRequest, InvalidMessage
from pipelines.pool_audit.audit import MESSAGE_PARAMS, housekeeping_options, run_pool_audit

AUDIT_RUN_KEY = "_pool_audit_run"


def pool_audit_task(ctx, req: HousekeepingRequest) -> dict[str, Any]:
    """Run the pool audit for a housekeeping message; bad params raise ``InvalidMessage`` (dead letter)."""
    try:
        options = housekeeping_options(req.params)
    except ValueError as exc:
        raise InvalidMessage(str(exc)) from None
    if not ctx.pools_table:
        raise RuntimeError("pool_audit: the fleet context has no pools table (RUNS_FLEET_POOLS_TABLE)")
    run = run_pool_audit(
        dynamodb=ctx.dynamodb,
        ec2=ctx.ec2,
        cloudwatch=ctx.cloudwatch,
        s3=ctx.s3,
        jobs_table=ctx.jobs_table,
        pools_table=ctx.pools_table,
        archive_bucket=ctx.archive_bucket,
        namespace=ctx.namespace,
        dry_run=req.dry_run,
        now=req.now() if "now" in req.params else None,
        progress=ctx.log.info,
    )
    totals = run.audit.totals
    return {
        "pools": totals["pools"],
        "instances": run.instances,
        "running": totals["running"],
        "busy": totals["busy"],
        "idle": totals["idle"],
        "compute_cost_usd_per_hour": round(totals["compute_cost_usd_per_hour"], 4),
        "idle_cost_usd_per_hour": round(totals["idle_cost_usd_per_hour"], 4),
        "snapshot_key": run.snapshot_key or "(dry run: none)",
        "dry_run": run.dry_run,
        AUDIT_RUN_KEY: (run, options["idle_cost_threshold_usd_per_hour"]),
    }


pool_audit_task.params = set(MESSAGE_PARAMS)  # type: ignore[attr-defined]
