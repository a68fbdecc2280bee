"""One pool audit end to end, and one daily report, over boto3 clients (no Dagster).

The ``pool_audit`` asset, its schedule and the housekeeping ``pool_audit`` task all call
:func:`run_pool_audit`; the ``pool_cost_report`` asset calls :func:`build_daily_report`.
"""

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
from pipelines.fleet.pool_audit import store
from pipelines.fleet.pool_audit.compute import PoolAudit, audit_pools, daily_report, instances_frame
from pipelines.fleet.pool_audit.prices import PriceList, load_price_list
from pipelines.fleet.pool_audit.render import cost_chart_svg


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


def run_pool_audit(
    *,
    dynamodb,
    ec2,
    cloudwatch,
    s3,
    jobs_table: str,
    pools_table: str,
    archive_bucket: str,
    namespace: str,
    dry_run: bool = False,
    prices: PriceList | None = None,
    now: dt.datetime | None = None,
    progress: store.Progress | None = None,
) -> AuditRun:
    """Read pools, instances and running jobs; compute; publish metrics and the CSV snapshot.

    ``dry_run`` computes everything and writes nothing (no metrics, no snapshot).
    """
    prices = prices or load_price_list()
    taken_at = now or dt.datetime.now(dt.UTC)
    pools = store.load_pools(dynamodb, pools_table)
    instances = store.list_fleet_instances(ec2, progress=progress)
    busy = store.running_job_instances(dynamodb, jobs_table, progress=progress)
    if progress:
        progress(f"read {len(pools)} pools, {len(instances)} managed instances, {len(busy)} with running jobs")

    started = time.perf_counter()
    audit = audit_pools(pools, instances_frame(instances), busy, prices)
    compute_seconds = time.perf_counter() - started

    run = AuditRun(
        audit=audit,
        taken_at=taken_at,
        instances=len(instances),
        running_jobs=len(busy),
        compute_seconds=compute_seconds,
        prices=prices,
        dry_run=dry_run,
        archive_bucket=archive_bucket,
    )
    datums, run.metrics_skipped = store.metric_datums(audit.table, taken_at)
    run.metric_datums = len(datums)
    if dry_run:
        return run
    run.metric_calls = put_metrics(cloudwatch, namespace, datums)
    run.snapshot_key = store.snapshot_key(taken_at)
    store.put_csv(s3, archive_bucket, run.snapshot_key, snapshot_frame(audit, taken_at))
    return run


def look_at_fleet(*, dynamodb, ec2, jobs_table: str, pools_table: str) -> Look:
    """A schedule's look before an audit: the audit's own reads (pools, managed instances, running
    jobs), as a state look: an audit of the same state gives the same snapshot."""
    pools = store.load_pools(dynamodb, pools_table)
    instances = store.list_fleet_instances(ec2)
    busy = store.running_job_instances(dynamodb, jobs_table)
    state = {
        "pools": sorted(json.dumps(pool, sort_keys=True, default=str) for pool in pools),
        "instances": sorted(instances, key=lambda row: row["instance_id"]),
        "busy": sorted(busy),
    }
    return Look.state(state, f"{len(pools)} pools, {len(instances)} managed instances, {len(busy)} with running jobs")


def snapshot_frame(audit: PoolAudit, taken_at: dt.datetime) -> pd.DataFrame:
    """The CSV stored per audit: the table with its time in front."""
    import pandas as pd  # lazy: keeps pandas out of the code location's load time

    return audit.table.assign(snapshot_at=pd.Timestamp(taken_at).tz_convert("UTC"))[
        ["snapshot_at", *audit.table.columns]
    ]


# ---------------------------------------------------------------- daily report


@dataclass
class DailyReport:
    day: dt.date
    report: pd.DataFrame
    totals: dict[str, float | int]
    svg: str
    snapshot_keys: list[str]
    csv_key: str | None = None
    svg_key: str | None = None


def build_daily_report(
    *,
    s3,
    archive_bucket: str,
    day: dt.date,
    max_gap: dt.timedelta = dt.timedelta(minutes=30),
    write: bool = True,
    now: dt.datetime | None = None,
    progress: store.Progress | None = None,
) -> DailyReport:
    """Time-weight the day's snapshots (plus the previous day's last one, which covers midnight).

    For today, snapshots cover time up to ``now`` (default: the clock) only.
    """
    import pandas as pd  # lazy: keeps pandas out of the code location's load time

    keys = store.list_snapshot_keys(s3, archive_bucket, day)
    before = store.list_snapshot_keys(s3, archive_bucket, day - dt.timedelta(days=1))
    if before:
        keys = [before[-1], *keys]
    frames = []
    for n, key in enumerate(keys, start=1):
        frames.append(store.read_snapshot(s3, archive_bucket, key))
        if progress and n % 50 == 0:
            progress(f"read {n}/{len(keys)} snapshots")
    snapshots = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    day_start = dt.datetime.combine(day, dt.time(), tzinfo=dt.UTC)
    report, totals = daily_report(snapshots, day_start, max_gap, now or dt.datetime.now(dt.UTC))
    svg = cost_chart_svg(report, f"Fleet cost per pool on {day:%Y-%m-%d} (USD, UTC day), idle part highlighted")
    result = DailyReport(day=day, report=report, totals=totals, svg=svg, snapshot_keys=keys)
    if write:
        result.csv_key = store.report_key(day, "report.csv")
        result.svg_key = store.report_key(day, "chart.svg")
        store.put_csv(s3, archive_bucket, result.csv_key, report)
        store.put_text(s3, archive_bucket, result.svg_key, svg, "image/svg+xml")
    return result
