"""The ``pool_audit`` snapshot asset with its checks, the daily partitioned ``pool_cost_report``,
and :func:`housekeeping_audit_events`: the hook that records a housekeeping ``pool_audit`` task's
audit as the same materialization and check evaluations.

The logic lives in the plain layer (``audit``, ``checks``, ``compute``); this module reads config,
calls it, and turns the typed results into metadata and check results.
"""

import datetime as dt
from typing import Any

import dagster as dg

from pipelines.common.defs import aws_errors, config_schema, params_from_config
from pipelines.pool_audit.audit import AuditRun, DailyReport, build_daily_report, run_pool_audit
from pipelines.pool_audit.checks import CHECK_DESCRIPTIONS, CheckOutcome, evaluate_checks
from pipelines.pool_audit.housekeeping import HousekeepingAudit
from pipelines.pool_audit.params import PoolAuditParams, PoolCostReportParams
from pipelines.pool_audit.render import markdown_table, svg_markdown_image
from resources import CloudWatchResource, DynamoDBResource, EC2Resource, FleetSettings, S3Resource

ASSET_KEY = dg.AssetKey("pool_audit")
REPORT_START = "2026-11-01"
CAPABILITY_TAGS = {"groundskeeper/capability": "pool_audit"}

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
TOTAL_COUNTS = (
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


# ---------------------------------------------------------------- metadata and checks


def audit_metadata(run: AuditRun) -> dict[str, Any]:
    audit, totals = run.audit, run.audit.totals
    metadata: dict[str, Any] = {
        "per_pool": dg.MetadataValue.md(markdown_table(audit.table, POOL_COLUMNS)),
        "total_compute_cost_usd_per_hour": dg.MetadataValue.float(totals["compute_cost_usd_per_hour"]),
        "total_idle_cost_usd_per_hour": dg.MetadataValue.float(totals["idle_cost_usd_per_hour"]),
        "utilization_pct": dg.MetadataValue.float(totals["utilization_pct"]),
        **{key: dg.MetadataValue.int(int(totals[key])) for key in TOTAL_COUNTS},
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


def _check_metadata(outcome: CheckOutcome) -> dict[str, Any]:
    metadata: dict[str, Any] = {
        key: dg.MetadataValue.float(value) if isinstance(value, float) else dg.MetadataValue.int(value)
        for key, value in outcome.figures.items()
    }
    metadata.update({key: dg.MetadataValue.md(value) for key, value in outcome.tables.items()})
    metadata.update({key: dg.MetadataValue.json(value) for key, value in outcome.names.items()})
    return metadata


def check_results(run: AuditRun, idle_cost_threshold: float) -> list[dg.AssetCheckResult]:
    return [
        dg.AssetCheckResult(
            check_name=c.check_name,
            passed=c.passed,
            description=c.description,
            metadata=_check_metadata(c),
            severity=dg.AssetCheckSeverity.WARN,
        )
        for c in evaluate_checks(run, idle_cost_threshold)
    ]


def _log_run(log, run: AuditRun) -> None:
    t = run.audit.totals
    log.info(
        f"pool audit: {t['pools']} pools, {run.instances} instances, running={t['running']} busy={t['busy']} "
        f"idle={t['idle']}, compute {t['compute_cost_usd_per_hour']:.4f} USD/h, idle {t['idle_cost_usd_per_hour']:.4f}"
        f" USD/h, {t['pools_with_problems']} pools with problems"
        + (" (dry run: nothing written)" if run.dry_run else "")
    )
    for row in run.audit.problems.itertuples(index=False):
        log.warning(f"pool {row.pool!r} ({row.kind}) left out of the totals: {row.problem}")


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
    config_schema=config_schema(PoolAuditParams),
    tags=CAPABILITY_TAGS,
)
def pool_audit(
    context: dg.AssetExecutionContext,
    dynamodb: DynamoDBResource,
    ec2: EC2Resource,
    cloudwatch: CloudWatchResource,
    s3: S3Resource,
    fleet: FleetSettings,
) -> dg.MaterializeResult:
    params = params_from_config(context, PoolAuditParams)
    with aws_errors(context):
        run = run_pool_audit(
            dynamodb=dynamodb.get_client(),
            ec2=ec2.get_client(),
            cloudwatch=cloudwatch.get_client(),
            s3=s3.get_client(),
            jobs_table=fleet.jobs_table,
            pools_table=fleet.pools_table,
            archive_bucket=fleet.archive_bucket,
            namespace=fleet.metrics_namespace,
            dry_run=params.dry_run,
            progress=context.log.info,
        )
    _log_run(context.log, run)
    return dg.MaterializeResult(
        metadata=audit_metadata(run), check_results=check_results(run, params.idle_cost_threshold_usd_per_hour)
    )


def housekeeping_audit_events(
    context: dg.OpExecutionContext, audit: HousekeepingAudit
) -> list[dg.AssetMaterialization | dg.AssetCheckEvaluation]:
    """A housekeeping ``pool_audit`` task's audit as a ``pool_audit`` materialization of the run that
    ran it, with its check evaluations, exactly as the asset records them."""
    _log_run(context.log, audit.run)
    metadata = audit_metadata(audit.run)
    metadata["triggered_by"] = dg.MetadataValue.text("housekeeping message task_type=pool_audit")
    events: list[dg.AssetMaterialization | dg.AssetCheckEvaluation] = [
        dg.AssetMaterialization(asset_key=ASSET_KEY, metadata=metadata)
    ]
    for result in check_results(audit.run, audit.idle_cost_threshold_usd_per_hour):
        events.append(
            dg.AssetCheckEvaluation(
                asset_key=ASSET_KEY,
                check_name=result.check_name,
                passed=result.passed,
                description=result.description,
                metadata=result.metadata,
                severity=dg.AssetCheckSeverity.WARN,
            )
        )
    return events


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
    config_schema=config_schema(PoolCostReportParams),
    tags=CAPABILITY_TAGS,
)
def pool_cost_report(context: dg.AssetExecutionContext, s3: S3Resource, fleet: FleetSettings) -> dg.MaterializeResult:
    params = params_from_config(context, PoolCostReportParams)
    day = dt.date.fromisoformat(context.partition_key)
    with aws_errors(context):
        result = build_daily_report(
            s3=s3.get_client(),
            archive_bucket=fleet.archive_bucket,
            day=day,
            max_gap=dt.timedelta(minutes=params.max_gap_minutes),
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
