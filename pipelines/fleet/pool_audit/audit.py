"""One pool audit end to end (:func:`run_pool_audit`: the ``pool_audit`` asset and housekeeping task)
and one daily report (:func:`build_daily_report`: the ``pool_cost_report`` asset), over boto3 clients."""

from __future__ import annotations

import datetime as dt
import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

from pipelines.common.aws_batches import put_metrics
from pipelines.common.looks import Look
from pipelines.common.params import param
from pipelines.fleet.context import FleetContext
from pipelines.fleet.pool_audit import store
from pipelines.fleet.pool_audit.compute import PoolAudit, audit_pools, daily_report
from pipelines.fleet.pool_audit.prices import PriceList, load_price_list
from pipelines.fleet.pool_audit.render import cost_chart_svg


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
class PoolCostReportParams:
    max_gap_minutes: int = param(
        30,
        description="A snapshot stands for the time until the next one, but for at most this many minutes.",
        minimum=1,
        maximum=24 * 60,
    )


@dataclass
class AuditRun:
    audit: PoolAudit
    taken_at: dt.datetime
    instances: int
    running_jobs: int
    compute_seconds: float
    prices: PriceList
    dry_run: bool
    archive_bucket: str = ""
    snapshot_key: str | None = None
    metric_calls: int = 0
    metric_datums: int = 0
    metrics_skipped: list[str] = field(default_factory=list)


def _read_fleet(ctx: FleetContext, progress: store.Progress | None = None) -> tuple[list, list, set[str], str]:
    """The audit's reads: pools, managed instances, instances with running jobs, and their counts in words."""
    pools = store.load_pools(ctx.dynamodb, ctx.pools_table)
    instances = store.list_fleet_instances(ctx.ec2, progress=progress)
    busy = store.running_job_instances(ctx.dynamodb, ctx.jobs_table, progress=progress)
    read = f"{len(pools)} pools, {len(instances)} managed instances, {len(busy)} with running jobs"
    return pools, instances, busy, read


def run_pool_audit(
    ctx: FleetContext, *, dry_run: bool = False, prices: PriceList | None = None, now: dt.datetime | None = None
) -> AuditRun:
    """Read pools, instances and running jobs (progress to ``ctx.log``); compute; publish metrics and the
    CSV snapshot (the table with its time in front). ``dry_run`` computes everything and writes nothing."""
    import pandas as pd  # lazy: keeps pandas out of the code location's load time

    prices = prices or load_price_list()
    taken_at = now or dt.datetime.now(dt.UTC)
    pools, instances, busy, read = _read_fleet(ctx, ctx.log.info)
    ctx.log.info(f"read {read}")
    started = time.perf_counter()
    audit = audit_pools(pools, instances, busy, prices)
    seconds = time.perf_counter() - started
    run = AuditRun(audit, taken_at, len(instances), len(busy), seconds, prices, dry_run, ctx.archive_bucket)
    datums, run.metrics_skipped = store.metric_datums(audit.table, taken_at)
    run.metric_datums = len(datums)
    if dry_run:
        return run
    run.metric_calls = put_metrics(ctx.cloudwatch, ctx.namespace, datums)
    run.snapshot_key = store.snapshot_key(taken_at)
    snapshot = audit.table.assign(snapshot_at=pd.Timestamp(taken_at).tz_convert("UTC"))
    csv = snapshot[["snapshot_at", *audit.table.columns]].to_csv(index=False)
    ctx.s3.put_object(Bucket=ctx.archive_bucket, Key=run.snapshot_key, Body=csv.encode(), ContentType="text/csv")
    return run


def look_at_fleet(ctx: FleetContext) -> Look:
    """A schedule's look before an audit (``ctx.dynamodb`` and ``ctx.ec2`` only): the audit's own reads,
    as a state look: an audit of the same state gives the same snapshot."""
    pools, instances, busy, read = _read_fleet(ctx)
    state = {
        "pools": sorted(json.dumps(pool, sort_keys=True, default=str) for pool in pools),
        "instances": sorted(instances, key=lambda row: row["instance_id"]),
        "busy": sorted(busy),
    }
    return Look.state(state, read)


@dataclass
class DailyReport:
    report: pd.DataFrame
    totals: dict[str, float | int]
    snapshot_keys: list[str]
    csv_key: str
    svg_key: str


def build_daily_report(
    ctx: FleetContext, day: dt.date, max_gap: dt.timedelta = dt.timedelta(minutes=30)
) -> DailyReport:
    """Time-weight the day's snapshots (plus the previous day's last one, which covers midnight);
    today's cover the time up to now only. Writes the report's CSV and SVG (``ctx.s3`` only)."""
    import pandas as pd  # lazy: keeps pandas out of the code location's load time

    s3, bucket = ctx.s3, ctx.archive_bucket
    keys = store.list_snapshot_keys(s3, bucket, day)
    keys = store.list_snapshot_keys(s3, bucket, day - dt.timedelta(days=1))[-1:] + keys
    frames = []
    for n, key in enumerate(keys, start=1):
        frames.append(store.read_snapshot(s3, bucket, key))
        if n % 50 == 0:
            ctx.log.info(f"read {n}/{len(keys)} snapshots")
    snapshots = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    day_start = dt.datetime.combine(day, dt.time(), tzinfo=dt.UTC)
    report, totals = daily_report(snapshots, day_start, max_gap, dt.datetime.now(dt.UTC))
    svg = cost_chart_svg(report, f"Fleet cost per pool on {day:%Y-%m-%d} (USD, UTC day), idle part highlighted")
    csv_key, svg_key = (f"{store.PREFIX}/reports/{day:%Y-%m-%d}/{name}" for name in ("report.csv", "chart.svg"))
    s3.put_object(Bucket=bucket, Key=csv_key, Body=report.to_csv(index=False).encode(), ContentType="text/csv")
    s3.put_object(Bucket=bucket, Key=svg_key, Body=svg.encode(), ContentType="image/svg+xml")
    return DailyReport(report, totals, keys, csv_key, svg_key)
