"""What the pool audit reads from and writes to AWS, in as few calls as the APIs allow (paginated,
1000 instances or datums a call). Running jobs come from one Query of the jobs table's
``status-instance_id-index``; a table without that index is scanned instead, with a warning."""

from __future__ import annotations

import datetime as dt
import io
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd
from botocore.exceptions import ClientError

from pipelines.common import from_item
from pipelines.common.aws_batches import error_code

log = logging.getLogger(__name__)

MANAGED_TAG = "runs-fleet:managed"
POOL_TAG = "runs-fleet:pool"
RUNNING_JOBS_INDEX = "status-instance_id-index"
AUDITED_STATES = ["pending", "running", "stopping", "stopped"]
INSTANCES_PAGE_SIZE = 1000  # DescribeInstances' maximum
MAX_DIMENSION_VALUE = 1024
PREFIX = "pool-audit"

Progress = Callable[[str], None]


def load_pools(dynamodb, table: str) -> list[dict[str, Any]]:
    """Every pools-table item as plain values."""
    pages = dynamodb.get_paginator("scan").paginate(TableName=table)
    return [from_item(item) for page in pages for item in page.get("Items", [])]


def list_fleet_instances(ec2, progress: Progress | None = None) -> list[dict[str, Any]]:
    """Managed instances that are pending, running, stopping or stopped, 1000 per call, as
    ``instance_id, state, pool, instance_type`` rows (``pool`` None without a pool tag)."""
    rows: list[dict[str, Any]] = []
    pages = ec2.get_paginator("describe_instances").paginate(
        Filters=[
            {"Name": f"tag:{MANAGED_TAG}", "Values": ["true"]},
            {"Name": "instance-state-name", "Values": AUDITED_STATES},
        ],
        PaginationConfig={"PageSize": INSTANCES_PAGE_SIZE},
    )
    for n, page in enumerate(pages, start=1):
        for reservation in page.get("Reservations", []):
            for inst in reservation.get("Instances", []):
                tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
                rows.append(
                    {
                        "instance_id": inst["InstanceId"],
                        "state": inst.get("State", {}).get("Name", ""),
                        "pool": tags.get(POOL_TAG),
                        "instance_type": inst.get("InstanceType"),
                    }
                )
        if progress and n % 5 == 0:
            progress(f"DescribeInstances: {n} pages, {len(rows)} instances so far")
    return rows


def running_job_instances(dynamodb, jobs_table: str, progress: Progress | None = None) -> set[str]:
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
    """``PoolComputeCost``/``PoolIdleCost`` (USD per hour) for priced pools and ``PoolUtilization``
    (percent) for every pool of the pools table. Returns the datums and the pools left out."""
    datums: list[dict[str, Any]] = []
    skipped: list[str] = []
    for row in table.loc[table["kind"] == "pool"].itertuples(index=False):
        if not 0 < len(row.pool) <= MAX_DIMENSION_VALUE:
            skipped.append(row.pool[:80])
            continue
        dims = [{"Name": "PoolName", "Value": row.pool}]
        if row.in_totals:
            datums.append(_datum("PoolComputeCost", dims, row.compute_cost_usd_per_hour, "None", timestamp))
            datums.append(_datum("PoolIdleCost", dims, row.idle_cost_usd_per_hour, "None", timestamp))
        datums.append(_datum("PoolUtilization", dims, row.utilization_pct, "Percent", timestamp))
    return datums, skipped


def _datum(name: str, dims: list[dict[str, str]], value: float, unit: str, timestamp: dt.datetime) -> dict[str, Any]:
    return {"MetricName": name, "Dimensions": dims, "Value": float(value), "Unit": unit, "Timestamp": timestamp}


def snapshot_key(taken_at: dt.datetime) -> str:
    """``pool-audit/snapshots/<YYYY-MM-DD>/<YYYYMMDDTHHMMSSmmmZ>.csv`` (UTC; sorts by time)."""
    t = taken_at.astimezone(dt.UTC)
    return f"{PREFIX}/snapshots/{t:%Y-%m-%d}/{t:%Y%m%dT%H%M%S}{t.microsecond // 1000:03d}Z.csv"


def list_snapshot_keys(s3, bucket: str, day: dt.date) -> list[str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=f"{PREFIX}/snapshots/{day:%Y-%m-%d}/")
    return sorted(obj["Key"] for page in pages for obj in page.get("Contents", []) if obj["Key"].endswith(".csv"))


def read_snapshot(s3, bucket: str, key: str) -> pd.DataFrame:
    import pandas as pd  # lazy: keeps pandas out of the code location's load time

    body = s3.get_object(Bucket=bucket, Key=key)["Body"].read()
    text_columns = {name: str for name in ("pool", "kind", "instance_type", "price_source", "problem")}
    return pd.read_csv(io.BytesIO(body), dtype=text_columns, keep_default_na=False, na_values=[""])
