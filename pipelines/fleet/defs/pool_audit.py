"""The pool audit's Dagster layer: the ``pool_audit`` asset with its checks, the daily ``pool_cost_report``, their
jobs and schedules, and a housekeeping audit recorded as the same (:func:`record_housekeeping_audits`)."""

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

import dagster as dg

from pipelines.common.defs.config import config_schema, params_from_config
from pipelines.common.defs.failures import AWS_RETRY_POLICY, one_line_failures
from pipelines.common.defs.metadata import CheckNotes, metadata_from, noted, table_from
from pipelines.common.defs.metrics import CommittedChangeMetrics
from pipelines.common.defs.schedules import ONE_AT_A_TIME_TAG, schedule
from pipelines.common.defs.summary import mark_dry_run, own_outcome
from pipelines.common.defs.tasks import resource_clients
from pipelines.common.looks import Look
from pipelines.fleet.context import fleet_context
from pipelines.fleet.housekeeping import TaskResult
from pipelines.fleet.pool_audit.audit import (
    AuditRun,
    PoolAuditParams,
    PoolCostReportParams,
    build_daily_report,
    look_at_fleet,
    run_pool_audit,
)
from pipelines.fleet.pool_audit.checks import CHECK_DESCRIPTIONS, evaluate_checks
from pipelines.fleet.pool_audit.render import cost_chart_text
from resources import FleetSettings, S3Resource

ASSET_KEY = dg.AssetKey("pool_audit")
CAPABILITY_TAGS = {"groundskeeper/capability": "pool_audit"}
ASSET_OPTIONS = {"group_name": "fleet", "tags": CAPABILITY_TAGS, "retry_policy": AWS_RETRY_POLICY}
JOB_OPTIONS = {"tags": CAPABILITY_TAGS, "executor_def": dg.in_process_executor}  # one asset each: in process

# The per-pool tables: at most 4 columns, shown inline (docs/development.md, "Metadata"); all are in the CSV.
POOL_COLUMNS = {
    "pool": "pool",
    "compute_cost_usd_per_hour": "compute USD/h",
    "idle_cost_usd_per_hour": "idle USD/h",
    "instances": "busy/idle",
}
PROBLEM_COLUMNS = {"pool": "pool", "kind": "kind", "problem": "left out of the totals because"}
REPORT_COLUMNS = {"pool": "pool", "cost_usd": "USD", "idle_cost_usd": "idle USD", "idle_share_pct": "idle %"}


def audit_metadata(run: AuditRun) -> dict[str, Any]:
    """The asset's metadata, as docs/fleet.md lists it ("Where the figures go")."""
    audit, totals = run.audit, run.audit.totals
    metadata: dict[str, Any] = metadata_from(
        {
            "total_compute_cost_usd_per_hour": float(totals["compute_cost_usd_per_hour"]),
            "total_idle_cost_usd_per_hour": float(totals["idle_cost_usd_per_hour"]),
            "utilization_pct": float(totals["utilization_pct"]),
            "pools_with_problems": int(totals["pools_with_problems"]),
        }
    )
    instances = audit.table["busy"].astype(str) + "/" + audit.table["idle"].astype(str)
    metadata["per_pool"] = table_from(audit.table.assign(instances=instances).to_dict("records"), POOL_COLUMNS)
    if not audit.problems.empty:
        metadata["problems"] = table_from(audit.problems.to_dict("records"), PROBLEM_COLUMNS)
    if run.snapshot_key:
        metadata["snapshot"] = dg.MetadataValue.path(f"s3://{run.archive_bucket}/{run.snapshot_key}")
    counters = {  # the totals' counts; pools_with_problems is a key figure above
        **{key: n for key, n in totals.items() if isinstance(n, int) and key != "pools_with_problems"},
        "instances_audited": run.instances,
        "instances_with_running_jobs": run.running_jobs,
        "cloudwatch_datums": run.metric_datums,
        "cloudwatch_calls": run.metric_calls,
        "compute_seconds": round(run.compute_seconds, 2),
    }
    price_list = f"{run.prices.source} (as of {run.prices.as_of})"
    metadata |= metadata_from(
        {"counters": counters, "metrics_skipped_pools": run.metrics_skipped, "price_list": price_list}
    )
    metadata["taken_at"] = dg.MetadataValue.timestamp(run.taken_at)
    metadata["dry_run"] = dg.MetadataValue.bool(run.dry_run)
    return metadata


# A check's metadata by the type of its value (pipelines/fleet/pool_audit/checks.py): a text is a markdown table.
CHECK_METADATA = {int: dg.MetadataValue.int, float: dg.MetadataValue.float, str: dg.MetadataValue.md}


def recorded(log, run: AuditRun, notes: CheckNotes | None, kind: type) -> tuple[dict[str, Any], list[Any]]:
    """Logs an audit; returns its metadata and its checks as ``kind``: ``dg.AssetCheckResult`` (the
    asset's) or ``dg.AssetCheckEvaluation`` (a housekeeping task's), with a failed check's note."""
    t = run.audit.totals
    log.info(
        f"pool audit: {t['pools']} pools, {run.instances} instances, running={t['running']} busy={t['busy']} "
        f"idle={t['idle']}, compute {t['compute_cost_usd_per_hour']:.4f} USD/h, idle {t['idle_cost_usd_per_hour']:.4f}"
        f" USD/h, {t['pools_with_problems']} pools with problems"
        + (" (dry run: nothing written)" if run.dry_run else "")
    )
    for row in run.audit.problems.itertuples(index=False):
        log.warning(f"pool {row.pool!r} ({row.kind}) left out of the totals: {row.problem}")
    checks = []
    for c in evaluate_checks(run):
        description, demo = noted(dg.AssetCheckKey(ASSET_KEY, c.check_name), c.passed, c.description, notes)
        metadata = {key: CHECK_METADATA.get(type(v), dg.MetadataValue.json)(v) for key, v in c.metadata.items()}
        checks.append(
            kind(
                asset_key=ASSET_KEY,
                check_name=c.check_name,
                passed=c.passed,
                description=description,
                metadata=metadata | demo,
                severity=dg.AssetCheckSeverity.WARN,
            )
        )
    return audit_metadata(run), checks


def pool_audit_asset(notes: CheckNotes | None = None) -> dg.AssetsDefinition:
    """The ``pool_audit`` snapshot asset with its checks (a failed one adds its note from ``notes``)."""

    @dg.asset(
        **ASSET_OPTIONS,
        key=ASSET_KEY,
        kinds={"pandas", "s3", "cloudwatch"},
        description=(
            "Snapshot of every fleet pool: running, pending, stopped, busy and idle instances, what they cost "
            "per hour and what idle capacity costs. Publishes PoolComputeCost, PoolIdleCost and PoolUtilization "
            "and stores the table as CSV under `s3://$RUNS_FLEET_ARCHIVE_BUCKET/pool-audit/snapshots/`."
        ),
        check_specs=[dg.AssetCheckSpec(name, asset=ASSET_KEY, description=d) for name, d in CHECK_DESCRIPTIONS.items()],
        config_schema=config_schema(PoolAuditParams),
        required_resource_keys={"dynamodb", "ec2", "cloudwatch", "s3", "fleet"},
    )
    @one_line_failures
    def pool_audit(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        own_outcome(context)
        params = params_from_config(context, PoolAuditParams)
        metrics = CommittedChangeMetrics(context, context.resources.cloudwatch, "pool audit")
        clients = resource_clients(context, ("dynamodb", "ec2", "s3"))
        ctx = fleet_context(context.resources.fleet, log=context.log, cloudwatch=metrics, **clients)
        run = run_pool_audit(ctx, params, dry_run=params.dry_run)
        metadata, checks = recorded(context.log, run, notes, dg.AssetCheckResult)
        if params.dry_run:  # its figures are its metadata: no summary's counts tag (a short runs list)
            mark_dry_run(context)
        else:
            metadata["metrics_published"] = dg.MetadataValue.bool(metrics.published)
        return dg.MaterializeResult(metadata=metadata, check_results=checks)

    return pool_audit


def record_housekeeping_audits(
    context: dg.OpExecutionContext, results: Iterable[TaskResult], notes: CheckNotes | None = None
) -> None:
    """Each housekeeping ``pool_audit`` task's audit among ``results`` as a ``pool_audit`` materialization
    of the run that ran it, with its check evaluations, exactly as the asset records them."""
    for result in results:
        if result.audit is None:
            continue
        metadata, checks = recorded(context.log, result.audit, notes, dg.AssetCheckEvaluation)
        metadata["triggered_by"] = dg.MetadataValue.text("housekeeping message task_type=pool_audit")
        for event in [dg.AssetMaterialization(asset_key=ASSET_KEY, metadata=metadata), *checks]:
            context.log_event(event)


# end_offset=1: today's partition is the day so far; the schedule builds yesterday's once the day is over.
daily_partitions = dg.DailyPartitionsDefinition(start_date="2026-11-01", timezone="UTC", end_offset=1)


@dg.asset(
    **ASSET_OPTIONS,
    kinds={"pandas", "s3"},
    partitions_def=daily_partitions,
    deps=[ASSET_KEY],
    description=(
        "USD per pool for one UTC day, time-weighted over that day's pool_audit snapshots, with the idle share "
        "and a chart (cost per pool, idle part highlighted) shown on this page; the CSV and the chart as SVG "
        "are stored under `s3://$RUNS_FLEET_ARCHIVE_BUCKET/pool-audit/reports/<day>/`."
    ),
    config_schema=config_schema(PoolCostReportParams),
)
@one_line_failures
def pool_cost_report(context: dg.AssetExecutionContext, s3: S3Resource, fleet: FleetSettings) -> dg.MaterializeResult:
    params = params_from_config(context, PoolCostReportParams)
    day = dt.date.fromisoformat(context.partition_key)
    ctx = fleet_context(fleet, log=context.log, s3=s3.get_client())
    result = build_daily_report(ctx, day, dt.timedelta(minutes=params.max_gap_minutes))
    t = result.totals
    # Under an hour, two significant digits: a few minutes covered never show as 0.
    hours = round(t["hours_covered"], 2) if t["hours_covered"] >= 1 else float(f"{t['hours_covered']:.2g}")
    context.log.info(
        f"pool cost report {day}: {len(result.snapshot_keys)} snapshots, {hours:g} h covered, "
        f"{t['cost_usd']:.2f} USD of which idle {t['idle_cost_usd']:.2f} USD ({t['idle_share_pct']:.1f}%)"
    )
    if t["hours_covered"] < 23.5:
        context.log.warning(f"snapshots cover {hours:g} of 24 hours on {day}: figures are for the covered hours only")
    metadata: dict[str, Any] = metadata_from({**t, "hours_covered": hours, "snapshots_skipped": result.skipped})
    metadata["chart"] = dg.MetadataValue.md(cost_chart_text(result.report))
    metadata["per_pool"] = table_from(result.report.to_dict("records"), REPORT_COLUMNS)
    metadata["report_csv"] = dg.MetadataValue.path(f"s3://{fleet.archive_bucket}/{result.csv_key}")
    metadata["chart_svg"] = dg.MetadataValue.path(f"s3://{fleet.archive_bucket}/{result.svg_key}")
    return dg.MaterializeResult(metadata=metadata)


pool_audit_job = dg.define_asset_job(
    "pool_audit_job",
    **(JOB_OPTIONS | {"tags": {**CAPABILITY_TAGS, ONE_AT_A_TIME_TAG: "pool_audit_job"}}),
    selection=dg.AssetSelection.assets(ASSET_KEY),
    description="Audit every fleet pool now (also run by pool_audit_schedule when the fleet changes, and at "
    "least every 20 minutes).",
)
pool_cost_report_job = dg.define_asset_job(
    "pool_cost_report_job",
    **JOB_OPTIONS,
    selection=dg.AssetSelection.assets(pool_cost_report),
    partitions_def=daily_partitions,
    description="Build the daily pool cost report for one UTC day (backfill for a range of days).",
)


def _fleet_look(context: dg.ScheduleEvaluationContext) -> Look:
    clients = resource_clients(context, ("dynamodb", "ec2"))
    return look_at_fleet(fleet_context(context.resources.fleet, log=context.log, **clients))


def pool_audit_schedule(crons: Mapping[str, str] | None = None) -> dg.ScheduleDefinition:
    return schedule(
        name="pool_audit_schedule",
        crons=crons,
        job=pool_audit_job,
        cron_schedule="*/10 * * * *",
        execution_timezone="UTC",
        look=_fleet_look,
        refresh=dt.timedelta(minutes=20),
        required_resource_keys={"fleet", "dynamodb", "ec2"},
        description="Every 10 minutes: a pool_audit snapshot (metrics, CSV, checks). Looks first (the audit's own "
        "reads: the pools table, the managed instances, the running jobs) and takes the snapshot when the pools or "
        "the instance counts per pool, state, type and busy differ from the last snapshot's, and at least every "
        "20 minutes (the cost report counts a snapshot for at most 30).",
    )


def _previous_day(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
    day = (context.scheduled_execution_time - dt.timedelta(days=1)).date().isoformat()
    return dg.RunRequest(run_key=day, partition_key=day)


pool_cost_report_schedule = schedule(
    name="pool_cost_report_schedule",
    job=pool_cost_report_job,
    cron_schedule="20 0 * * *",
    execution_timezone="UTC",
    request=_previous_day,
    description="00:20 UTC: the previous (complete) day's pool_cost_report.",
)
