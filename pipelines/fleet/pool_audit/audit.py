"""One pool audit (:func:`run_pool_audit`, also the housekeeping task ``pool_audit``) and one daily
report (:func:`build_daily_report`), in as few AWS calls as the APIs allow (docs/fleet.md, "How it reads AWS")."""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

if TYPE_CHECKING:
    import pandas as pd

from pipelines.common import first_line, from_item
from pipelines.common.aws_batches import datum, error_code, put_metrics
from pipelines.common.looks import Look
from pipelines.common.params import ParamsError, param
from pipelines.common.task import Task
from pipelines.fleet.calls import put_object
from pipelines.fleet.context import FleetContext
from pipelines.fleet.messages import HousekeepingRequest
from pipelines.fleet.pool_audit.compute import (
    PoolAudit,
    PriceList,
    audit_pools,
    daily_report,
    load_price_list,
    pool_label,
)
from pipelines.fleet.pool_audit.render import cost_chart_svg
from pipelines.fleet.tasks.orphaned_instances import MANAGED_TAG, instance_tags

log = logging.getLogger(__name__)

POOL_TAG = "runs-fleet:pool"
RUNNING_JOBS_INDEX = "status-instance_id-index"
AUDITED_STATES = ["pending", "running", "stopping", "stopped"]
INSTANCES_PAGE_SIZE = 1000  # DescribeInstances' maximum
PREFIX = "pool-audit"


def load_pools(dynamodb, table: str) -> list[dict[str, Any]]:
    pages = dynamodb.get_paginator("scan").paginate(TableName=table)
    return [from_item(item) for page in pages for item in page.get("Items", [])]


def list_fleet_instances(ec2, progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Managed instances as ``instance_id, state, pool, instance_type, spot`` rows (``pool`` None without a pool
    tag; ``spot``: EC2's ``InstanceLifecycle`` is ``spot``)."""
    rows: list[dict[str, Any]] = []
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[
            {"Name": f"tag:{MANAGED_TAG}", "Values": ["true"]},
            {"Name": "instance-state-name", "Values": AUDITED_STATES},
        ],
        PaginationConfig={"PageSize": INSTANCES_PAGE_SIZE},
    )
    for n, page in enumerate(pages, start=1):
        rows += [
            {
                "instance_id": inst["InstanceId"],
                "state": inst.get("State", {}).get("Name", ""),
                "pool": instance_tags(inst).get(POOL_TAG),
                "instance_type": inst.get("InstanceType"),
                "spot": inst.get("InstanceLifecycle") == "spot",
            }
            for reservation in page.get("Reservations", [])
            for inst in reservation.get("Instances", [])
        ]
        if progress and n % 5 == 0:
            progress(f"DescribeInstances: {n} pages, {len(rows)} instances so far")
    return rows


def running_job_instances(dynamodb, jobs_table: str, progress: Callable[[str], None] | None = None) -> set[str]:
    """Instance ids that have a job in status ``running`` (Query on the index; Scan if it is missing)."""
    base = {
        "TableName": jobs_table,
        "ExpressionAttributeNames": {"#s": "status"},
        "ExpressionAttributeValues": {":running": {"S": "running"}},
        "ProjectionExpression": "instance_id",
    }
    try:
        query = dynamodb.get_paginator("query")
        pages = list(query.paginate(IndexName=RUNNING_JOBS_INDEX, KeyConditionExpression="#s = :running", **base))
    except ClientError as exc:
        # AWS answers ValidationException ("does not have the specified index"), moto ResourceNotFound.
        missing_index = "index" in exc.response["Error"].get("Message", "").lower()
        if error_code(exc) not in {"ValidationException", "ResourceNotFoundException"} or not missing_index:
            raise
        message = f"{jobs_table} has no {RUNNING_JOBS_INDEX}: scanning it for running jobs instead (slow)"
        log.warning(message)
        if progress:
            progress(message)
        pages = dynamodb.get_paginator("scan").paginate(FilterExpression="#s = :running", **base)
    ids = (item.get("instance_id", {}).get("S") for page in pages for item in page.get("Items", []))
    return {value for value in ids if value}


def metric_datums(table: pd.DataFrame, timestamp: dt.datetime) -> tuple[list[dict[str, Any]], list[str]]:
    """The datums (costs of priced pools only, the utilization of every pool), and the pools left out."""
    datums: list[dict[str, Any]] = []
    skipped: list[str] = []
    for row in table.loc[table["kind"] == "pool"].itertuples(index=False):
        # CloudWatch's longest dimension value; a quoted name (not plain) is not the pool's own
        if not 0 < len(row.pool) <= 1024 or pool_label(row.pool) != row.pool:
            skipped.append(row.pool[:80])
            continue
        pool = {"PoolName": row.pool}
        if row.in_totals:
            datums.append(datum("PoolComputeCost", float(row.compute_cost_usd_per_hour), "None", timestamp, **pool))
            datums.append(datum("PoolIdleCost", float(row.idle_cost_usd_per_hour), "None", timestamp, **pool))
        datums.append(datum("PoolUtilization", float(row.utilization_pct), "Percent", timestamp, **pool))
    return datums, skipped


def list_snapshot_keys(s3, bucket: str, day: dt.date) -> list[str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{PREFIX}/snapshots/{day:%Y-%m-%d}/")
    return sorted(obj["Key"] for page in pages for obj in page.get("Contents", []) if obj["Key"].endswith(".csv"))


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
    """One audit run, with the threshold its checks use (the asset's config or a housekeeping message's)."""

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
    idle_cost_threshold_usd_per_hour: float = AuditMessageParams.idle_cost_threshold_usd_per_hour

    def summary(self) -> dict[str, Any]:
        """The small, JSON-friendly part: what the run's output and log show."""
        totals = self.audit.totals
        return {
            "pools": int(totals["pools"]),
            "instances": self.instances,
            **{key: int(totals[key]) for key in ("running", "busy", "idle")},
            **{key: round(float(totals[key]), 4) for key in ("compute_cost_usd_per_hour", "idle_cost_usd_per_hour")},
            "snapshot_key": self.snapshot_key or "(dry run: none)",
            "dry_run": self.dry_run,
        }


def _read_fleet(ctx: FleetContext, progress: Callable[[str], None] | None = None) -> tuple[list, list, set[str], str]:
    """The audit's reads: pools, managed instances, those of them with running jobs (not a terminated instance a
    job still names), and their counts in words."""
    pools = load_pools(ctx.dynamodb, ctx.pools_table)
    instances = list_fleet_instances(ctx.ec2, progress=progress)
    busy = running_job_instances(ctx.dynamodb, ctx.jobs_table, progress=progress)
    busy &= {i["instance_id"] for i in instances}
    read = f"{len(pools)} pools, {len(instances)} managed instances, {len(busy)} with running jobs"
    return pools, instances, busy, read


def run_pool_audit(
    ctx: FleetContext,
    params: AuditMessageParams = AuditMessageParams(),
    *,
    dry_run: bool = False,
    prices: PriceList | None = None,
    now: dt.datetime | None = None,
) -> AuditRun:
    """Read, compute and publish (docs/fleet.md, "Where the figures go"); ``dry_run`` writes nothing."""
    import pandas as pd  # lazy: keeps pandas out of the code location's load time

    prices = prices or load_price_list()
    taken_at = now or dt.datetime.now(dt.UTC)
    pools, instances, busy, read = _read_fleet(ctx, ctx.log.info)
    ctx.log.info(f"read {read}")
    started = time.perf_counter()
    audit = audit_pools(pools, instances, busy, prices)
    seconds = time.perf_counter() - started
    run = AuditRun(audit, taken_at, len(instances), len(busy), seconds, prices, dry_run, ctx.archive_bucket)
    run.idle_cost_threshold_usd_per_hour = params.idle_cost_threshold_usd_per_hour
    datums, run.metrics_skipped = metric_datums(audit.table, taken_at)
    run.metric_datums = len(datums)
    if dry_run:
        return run
    t = taken_at.astimezone(dt.UTC)  # <YYYYMMDDTHHMMSSmmmZ>.csv: the keys sort by time
    run.snapshot_key = f"{PREFIX}/snapshots/{t:%Y-%m-%d}/{t:%Y%m%dT%H%M%S}{t.microsecond // 1000:03d}Z.csv"
    snapshot = audit.table.assign(snapshot_at=pd.Timestamp(taken_at).tz_convert("UTC"))
    csv = snapshot[["snapshot_at", *audit.table.columns]].to_csv(index=False)
    # the snapshot first: a step retried after it failed publishes the metrics once
    put_object(ctx.s3, ctx.archive_bucket, run.snapshot_key, csv.encode(), what="PutObject", ContentType="text/csv")
    run.metric_calls = put_metrics(ctx.cloudwatch, ctx.namespace, datums)
    return run


def look_at_fleet(ctx: FleetContext) -> Look:
    """``pool_audit_schedule``'s look (``ctx.dynamodb`` and ``ctx.ec2`` only; docs/fleet.md, "Pool audit")."""
    pools, instances, busy, read = _read_fleet(ctx)
    counted = Counter(
        (i["pool"] or "", i["state"], i["instance_type"] or "", i["spot"], i["instance_id"] in busy) for i in instances
    )
    state = {
        "pools": sorted(json.dumps(pool, sort_keys=True, default=str) for pool in pools),
        "instances": sorted([*key, n] for key, n in counted.items()),
    }
    return Look.state(state, read)


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


def read_snapshot(body: bytes) -> pd.DataFrame:
    """A stored snapshot (CSV) as the rows the daily report reads, parsed. ValueError (pandas' parse errors
    are ValueErrors) or KeyError (a column missing) when it is not a snapshot the report can count."""
    import pandas as pd  # lazy: keeps pandas out of the code location's load time

    text = {name: str for name in ("pool", "kind", "instance_type", "price_source", "problem")}
    frame = pd.read_csv(io.BytesIO(body), dtype=text, keep_default_na=False, na_values=[""])
    numbers = ["running", "idle", "compute_cost_usd_per_hour", "idle_cost_usd_per_hour"]
    frame = frame[["snapshot_at", "pool", "in_totals", *numbers]]
    times = pd.to_datetime(frame["snapshot_at"], utc=True)
    if times.isna().any():
        raise ValueError("a row has no snapshot_at")
    return frame.assign(snapshot_at=times, **{column: pd.to_numeric(frame[column]) for column in numbers})


@dataclass
class DailyReport:
    report: pd.DataFrame
    totals: dict[str, float | int]
    snapshot_keys: list[str]
    csv_key: str
    svg_key: str
    skipped: list[str] = field(default_factory=list)  # keys of unreadable snapshots (each named in the run log)


def build_daily_report(
    ctx: FleetContext, day: dt.date, max_gap: dt.timedelta = dt.timedelta(minutes=30)
) -> DailyReport:
    """Time-weight the day's snapshots (plus the previous day's last one, which covers midnight);
    today's cover the time up to now only. Writes the report's CSV and SVG (``ctx.s3`` only)."""
    import pandas as pd  # lazy: keeps pandas out of the code location's load time

    s3, bucket = ctx.s3, ctx.archive_bucket
    keys = list_snapshot_keys(s3, bucket, day - dt.timedelta(days=1))[-1:] + list_snapshot_keys(s3, bucket, day)
    frames, skipped = [], []
    for n, key in enumerate(keys, start=1):
        try:
            frames.append(read_snapshot(s3.get_object(Bucket=bucket, Key=key)["Body"].read()))
        except (ValueError, KeyError) as exc:
            skipped.append(key)
            ctx.log.warning(f"pool cost report {day}: snapshot {key} skipped, unreadable: {first_line(exc)}")
        if n % 50 == 0:
            ctx.log.info(f"read {n}/{len(keys)} snapshots")
    snapshots = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    day_start = dt.datetime.combine(day, dt.time(), tzinfo=dt.UTC)
    report, totals = daily_report(snapshots, day_start, max_gap, dt.datetime.now(dt.UTC))
    svg = cost_chart_svg(report, f"Fleet cost per pool on {day:%Y-%m-%d} (USD, UTC day), idle part highlighted")
    csv_key, svg_key = (f"{PREFIX}/reports/{day:%Y-%m-%d}/{name}" for name in ("report.csv", "chart.svg"))
    s3.put_object(Bucket=bucket, Key=csv_key, Body=report.to_csv(index=False).encode(), ContentType="text/csv")
    s3.put_object(Bucket=bucket, Key=svg_key, Body=svg.encode(), ContentType="image/svg+xml")
    return DailyReport(report, totals, [key for key in keys if key not in skipped], csv_key, svg_key, skipped)
