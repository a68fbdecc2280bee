"""Dagster wiring of the pool audit: the ``pool_audit`` snapshot asset with its checks and 10-minute
schedule, and the daily partitioned ``pool_cost_report`` with its chart.

The logic lives in ``audit.py`` / ``compute.py``; this module reads config, calls it, and turns the
result into metadata and check results. The housekeeping processor (``task_type: pool_audit``)
runs ``housekeeping.pool_audit_task``; its ops call :func:`record_housekeeping_audits`, which records
the same materialization and checks.
"""

import datetime as dt
from typing import Any

import dagster as dg

from pipelines.pool_audit.audit import (
    DEFAULT_IDLE_COST_THRESHOLD,
    AuditRun,
    DailyReport,
    build_daily_report,
    run_pool_audit,
)
from pipelines.pool_audit.housekeeping import AUDIT_RUN_KEY
from pipelines.pool_audit.render import markdown_table, svg_markdown_image
from resources import CloudWatchResource, DynamoDBResource, EC2Resource, FleetSettings, S3Resource, clear_aws_errors

ASSET_KEY = dg.AssetKey("pool_audit")
REPORT_START = "2026-11-01"
MAX_LISTED = 50
CAPABILITY_TAGS = {"groundskeeper/capability": "pool_audit"}

CHECK_IDLE_COST = "idle_cost_below_threshold"
CHECK_DESIRED_IDLE = "pools_with_desired_idle_have_running_instances"
CHECK_KNOWN_POOLS = "instances_tag_known_pools"
CHECK_DESCRIPTIONS = {
    CHECK_IDLE_COST: "Warns when the fleet's idle cost (USD per hour) is above the configured threshold.",
    CHECK_DESIRED_IDLE: "Warns about pools with desired_idle > 0 and no running instance.",
    CHECK_KNOWN_POOLS: "Warns about managed instances whose runs-fleet:pool tag names no pool, and lists them.",
}

POOL_COLUMNS = {
    "pool": "pool",
    "kind": "kind",
    "instance_type": "type",
    "spot": "spot",
    "desired_idle": "desired idle",
    "running": "running",
    "pending": "pending",
    "stopped": "stopped",
    "busy": "busy",
    "idle": "idle",
    "idle_excess": "idle excess",
    "hourly_price_usd": "USD/h each",
    "compute_cost_usd_per_hour": "compute USD/h",
    "idle_cost_usd_per_hour": "idle USD/h",
    "utilization_pct": "util %",
    "problem": "problem",
}
REPORT_COLUMNS = {
    "pool": "pool",
    "cost_usd": "USD",
    "busy_cost_usd": "busy USD",
    "idle_cost_usd": "idle USD",
    "idle_share_pct": "idle %",
    "avg_running": "avg running",
    "avg_idle": "avg idle",
    "hours_covered": "hours covered",
    "snapshots": "snapshots",
}


class PoolAuditConfig(dg.Config):
    """``dry_run`` computes and reports without writing metrics or the snapshot."""

    idle_cost_threshold_usd_per_hour: float = DEFAULT_IDLE_COST_THRESHOLD
    dry_run: bool = False


class PoolCostReportConfig(dg.Config):
    """A snapshot stands for the time until the next one, but at most ``max_gap_minutes``."""

    max_gap_minutes: int = 30


# ---------------------------------------------------------------- metadata and checks


def audit_metadata(run: AuditRun) -> dict[str, Any]:
    audit, totals = run.audit, run.audit.totals
    metadata: dict[str, Any] = {
        "per_pool": dg.MetadataValue.md(markdown_table(audit.table, POOL_COLUMNS)),
        "total_compute_cost_usd_per_hour": dg.MetadataValue.float(totals["compute_cost_usd_per_hour"]),
        "total_idle_cost_usd_per_hour": dg.MetadataValue.float(totals["idle_cost_usd_per_hour"]),
        "utilization_pct": dg.MetadataValue.float(totals["utilization_pct"]),
        **{
            key: dg.MetadataValue.int(int(totals[key]))
            for key in (
                "running",
                "pending",
                "stopped",
                "busy",
                "idle",
                "idle_excess",
                "pools",
                "pools_in_totals",
                "pools_with_problems",
                "untagged_instances",
                "unknown_pool_instances",
                "running_left_out_of_totals",
            )
        },
        "instances_audited": dg.MetadataValue.int(run.instances),
        "instances_with_running_jobs": dg.MetadataValue.int(run.running_jobs),
        "compute_seconds": dg.MetadataValue.float(round(run.compute_seconds, 4)),
        "price_list": dg.MetadataValue.text(f"{run.prices.source} (as of {run.prices.as_of})"),
        "taken_at": dg.MetadataValue.timestamp(run.taken_at),
        "dry_run": dg.MetadataValue.bool(run.dry_run),
        "cloudwatch_datums": dg.MetadataValue.int(run.metric_datums),
        "cloudwatch_calls": dg.MetadataValue.int(run.metric_calls),
    }
    problems = audit.problems
    if not problems.empty:
        metadata["problems"] = dg.MetadataValue.md(
            markdown_table(problems, {"pool": "pool", "kind": "kind", "problem": "left out of the totals because"})
        )
    if run.snapshot_key:
        metadata["snapshot"] = dg.MetadataValue.path(f"s3://{run.archive_bucket}/{run.snapshot_key}")
    if run.metrics_skipped:
        metadata["metrics_skipped_pools"] = dg.MetadataValue.json(run.metrics_skipped)
    return metadata


def audit_checks(run: AuditRun, idle_cost_threshold: float) -> list[dict[str, Any]]:
    """The three WARN checks as plain dicts (``check_name``, ``passed``, ``description``, ``metadata``)."""
    table, totals = run.audit.table, run.audit.totals
    idle = totals["idle_cost_usd_per_hour"]
    priced = table.loc[table["in_totals"] & (table["idle_cost_usd_per_hour"] > 0)]
    top_idle = priced.sort_values("idle_cost_usd_per_hour", ascending=False).head(MAX_LISTED)
    starving = table.loc[(table["kind"] == "pool") & (table["desired_idle"] > 0) & (table["running"] == 0)]
    unknown = run.audit.unknown_pool_instances
    return [
        {
            "check_name": CHECK_IDLE_COST,
            "passed": idle <= idle_cost_threshold,
            "description": f"idle cost {idle:.4f} USD/h, threshold {idle_cost_threshold:g} USD/h",
            "metadata": {
                "idle_cost_usd_per_hour": dg.MetadataValue.float(idle),
                "threshold_usd_per_hour": dg.MetadataValue.float(float(idle_cost_threshold)),
                "idle_pools": dg.MetadataValue.md(
                    markdown_table(top_idle, {"pool": "pool", "idle": "idle", "idle_cost_usd_per_hour": "idle USD/h"})
                ),
            },
        },
        {
            "check_name": CHECK_DESIRED_IDLE,
            "passed": starving.empty,
            "description": f"{len(starving)} pools want idle capacity and run nothing",
            "metadata": {
                "pools": dg.MetadataValue.json(starving["pool"].head(MAX_LISTED).tolist()),
                "count": dg.MetadataValue.int(len(starving)),
            },
        },
        {
            "check_name": CHECK_KNOWN_POOLS,
            "passed": unknown.empty,
            "description": f"{len(unknown)} managed instances are tagged with a pool that does not exist",
            "metadata": {
                "count": dg.MetadataValue.int(len(unknown)),
                "instances": dg.MetadataValue.md(
                    markdown_table(
                        unknown,
                        {"instance_id": "instance", "pool": "pool tag", "state": "state", "instance_type": "type"},
                        max_rows=MAX_LISTED,
                    )
                ),
            },
        },
    ]


def _log_run(log, run: AuditRun) -> None:
    log.info(_summary(run))
    for row in run.audit.problems.itertuples(index=False):
        log.warning(f"pool {row.pool!r} ({row.kind}) left out of the totals: {row.problem}")


def _summary(run: AuditRun) -> str:
    t = run.audit.totals
    return (
        f"pool audit: {t['pools']} pools, {run.instances} instances, running={t['running']} busy={t['busy']} "
        f"idle={t['idle']}, compute {t['compute_cost_usd_per_hour']:.4f} USD/h, idle {t['idle_cost_usd_per_hour']:.4f}"
        f" USD/h, {t['pools_with_problems']} pools with problems"
        + (" (dry run: nothing written)" if run.dry_run else "")
    )


# ---------------------------------------------------------------- assets


@dg.asset(
    key=ASSET_KEY,
    group_name="fleet",
    kinds={"pandas", "s3", "cloudwatch"},
    description=(
        "Snapshot of every fleet pool: running, pending, stopped, busy and idle instances, what they cost "
        "per hour and what idle capacity costs. Publishes PoolComputeCost, PoolIdleCost and PoolUtilization "
        "and stores the table as CSV under s3://$RUNS_FLEET_ARCHIVE_BUCKET/pool-audit/snapshots/."
    ),
    check_specs=[dg.AssetCheckSpec(name, asset=ASSET_KEY, description=d) for name, d in CHECK_DESCRIPTIONS.items()],
    tags=CAPABILITY_TAGS,
)
def pool_audit(
    context: dg.AssetExecutionContext,
    config: PoolAuditConfig,
    dynamodb: DynamoDBResource,
    ec2: EC2Resource,
    cloudwatch: CloudWatchResource,
    s3: S3Resource,
    fleet: FleetSettings,
) -> dg.MaterializeResult:
    with clear_aws_errors():
        run = run_pool_audit(
            dynamodb=dynamodb.get_client(),
            ec2=ec2.get_client(),
            cloudwatch=cloudwatch.get_client(),
            s3=s3.get_client(),
            jobs_table=fleet.jobs_table,
            pools_table=fleet.pools_table,
            archive_bucket=fleet.archive_bucket,
            namespace=fleet.metrics_namespace,
            dry_run=config.dry_run,
            progress=context.log.info,
        )
    _log_run(context.log, run)
    checks = audit_checks(run, config.idle_cost_threshold_usd_per_hour)
    return dg.MaterializeResult(
        metadata=audit_metadata(run),
        check_results=[dg.AssetCheckResult(severity=dg.AssetCheckSeverity.WARN, **c) for c in checks],
    )


def record_housekeeping_audits(context: dg.OpExecutionContext, results: list[dict[str, Any]]) -> None:
    """For the housekeeping processor's ops: take each ``pool_audit`` task's audit out of its result
    (leaving the small JSON-friendly part) and record it as a ``pool_audit`` materialization of this
    run, with its check evaluations, exactly as the asset does."""
    for result in results:
        packed = result.pop(AUDIT_RUN_KEY, None)
        if packed is None:
            continue
        run, threshold = packed
        _log_run(context.log, run)
        metadata = audit_metadata(run)
        metadata["triggered_by"] = dg.MetadataValue.text("housekeeping message task_type=pool_audit")
        context.log_event(dg.AssetMaterialization(asset_key=ASSET_KEY, metadata=metadata))
        for check in audit_checks(run, threshold):
            context.log_event(
                dg.AssetCheckEvaluation(asset_key=ASSET_KEY, severity=dg.AssetCheckSeverity.WARN, **check)
            )


# end_offset=1: today's partition exists too, so an operator can look at the day so far (the report
# says how many hours its snapshots cover); the schedule builds yesterday's once the day is over.
daily_partitions = dg.DailyPartitionsDefinition(start_date=REPORT_START, timezone="UTC", end_offset=1)


@dg.asset(
    group_name="fleet",
    kinds={"pandas", "s3"},
    partitions_def=daily_partitions,
    deps=[ASSET_KEY],
    description=(
        "USD per pool for one UTC day, time-weighted over that day's pool_audit snapshots, with the idle share "
        "and a chart (cost per pool, idle part highlighted) shown on this page and stored under "
        "s3://$RUNS_FLEET_ARCHIVE_BUCKET/pool-audit/reports/<day>/."
    ),
    tags=CAPABILITY_TAGS,
)
def pool_cost_report(
    context: dg.AssetExecutionContext,
    config: PoolCostReportConfig,
    s3: S3Resource,
    fleet: FleetSettings,
) -> dg.MaterializeResult:
    day = dt.date.fromisoformat(context.partition_key)
    if config.max_gap_minutes <= 0:
        raise dg.Failure(f"max_gap_minutes must be positive, got {config.max_gap_minutes}", allow_retries=False)
    with clear_aws_errors():
        result = build_daily_report(
            s3=s3.get_client(),
            archive_bucket=fleet.archive_bucket,
            day=day,
            max_gap=dt.timedelta(minutes=config.max_gap_minutes),
            progress=context.log.info,
        )
    t = result.totals
    context.log.info(
        f"pool cost report {day}: {len(result.snapshot_keys)} snapshots, {t['hours_covered']:.2f} h covered, "
        f"{t['cost_usd']:.2f} USD of which idle {t['idle_cost_usd']:.2f} USD ({t['idle_share_pct']:.1f}%)"
    )
    if t["hours_covered"] < 23.5:
        context.log.warning(
            f"snapshots cover {t['hours_covered']:.2f} of 24 hours on {day}: figures are for the covered hours only"
        )
    return dg.MaterializeResult(metadata=report_metadata(result, fleet.archive_bucket))


def report_metadata(result: DailyReport, bucket: str) -> dict[str, Any]:
    t = result.totals
    metadata: dict[str, Any] = {
        "chart": dg.MetadataValue.md(svg_markdown_image(result.svg, f"pool cost {result.day}")),
        "per_pool": dg.MetadataValue.md(markdown_table(result.report, REPORT_COLUMNS)),
        "cost_usd": dg.MetadataValue.float(t["cost_usd"]),
        "idle_cost_usd": dg.MetadataValue.float(t["idle_cost_usd"]),
        "idle_share_pct": dg.MetadataValue.float(t["idle_share_pct"]),
        "hours_covered": dg.MetadataValue.float(t["hours_covered"]),
        "snapshots": dg.MetadataValue.int(int(t["snapshots"])),
    }
    if result.csv_key:
        metadata["report_csv"] = dg.MetadataValue.path(f"s3://{bucket}/{result.csv_key}")
    if result.svg_key:
        metadata["chart_svg"] = dg.MetadataValue.path(f"s3://{bucket}/{result.svg_key}")
    return metadata


# ---------------------------------------------------------------- jobs and schedules

pool_audit_job = dg.define_asset_job(
    "pool_audit_job",
    selection=dg.AssetSelection.assets(ASSET_KEY),
    description="Audit every fleet pool now (also run by pool_audit_schedule every 10 minutes).",
    tags=CAPABILITY_TAGS,
)
pool_cost_report_job = dg.define_asset_job(
    "pool_cost_report_job",
    selection=dg.AssetSelection.assets(pool_cost_report),
    partitions_def=daily_partitions,
    description="Build the daily pool cost report for one UTC day (backfill for a range of days).",
    tags=CAPABILITY_TAGS,
)


def build_defs(deployment: str) -> dg.Definitions:
    """The same in every deployment: both schedules are on by default."""
    audit_schedule = dg.ScheduleDefinition(
        name="pool_audit_schedule",
        job=pool_audit_job,
        cron_schedule="*/10 * * * *",
        execution_timezone="UTC",
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description="Every 10 minutes: a pool_audit snapshot (metrics, CSV, checks).",
    )

    @dg.schedule(
        name="pool_cost_report_schedule",
        job=pool_cost_report_job,
        cron_schedule="20 0 * * *",
        execution_timezone="UTC",
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description="00:20 UTC: the previous (complete) day's pool_cost_report.",
    )
    def report_schedule(context: dg.ScheduleEvaluationContext):
        day = (context.scheduled_execution_time - dt.timedelta(days=1)).date().isoformat()
        return dg.RunRequest(run_key=day, partition_key=day)

    return dg.Definitions(
        assets=[pool_audit, pool_cost_report],
        jobs=[pool_audit_job, pool_cost_report_job],
        schedules=[audit_schedule, report_schedule],
    )
