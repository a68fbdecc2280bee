"""runs-fleet's ``old_jobs`` housekeeping task (docs/fleet.md, "Housekeeping")."""

import datetime as dt
import json
import math
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pipelines.common import from_item, iso, printable
from pipelines.common.aws_batches import TRANSACTION_LIMIT, transact_conditional
from pipelines.common.looks import Look
from pipelines.common.params import param
from pipelines.common.task import Task
from pipelines.fleet import calls as fleet_calls
from pipelines.fleet.calls import aws_call, publish_count, put_object
from pipelines.fleet.context import FleetContext
from pipelines.fleet.messages import FINAL_STATUSES, HousekeepingRequest, fingerprint, utcnow


@dataclass(frozen=True)
class OldJobsParams:
    retention_days: int = param(
        7, description="Days a finished job is kept before it is archived and deleted.", minimum=1, maximum=3650
    )


def archived_job_key(job_id: str) -> str:
    return f"archived-jobs/{fingerprint(job_id)}.json"


def mark_archived(ctx: FleetContext, records: list[dict[str, Any]], archive_key: str) -> None:
    """One small marker per archived job, written before its delete: a late copy of its termination message
    is then a duplicate, not an unknown job (docs/contracts.md, "Fleet")."""
    archived = {"archive": archive_key, "archived_at": iso(utcnow())}  # the same for every job of the page

    def put(record: dict[str, Any]) -> None:
        body = json.dumps({"job_id": record["job_id"], "status": record.get("status"), **archived}).encode()
        key = archived_job_key(record["job_id"])
        put_object(ctx.s3, ctx.archive_bucket, key, body, what="PutObject (archived job marker)")

    with ThreadPoolExecutor(max_workers=8, thread_name_prefix="archived-marker") as pool:
        list(pool.map(put, records))  # raises the first failure: then nothing of the page is deleted


def _old_jobs_cutoff(req: HousekeepingRequest, params: OldJobsParams) -> str:
    return iso(req.now() - dt.timedelta(days=params.retention_days))


def _old_jobs_query(jobs_table: str, status: str, cutoff: str, *, limit: int) -> dict[str, Any]:
    return {
        "TableName": jobs_table,
        "IndexName": "completed_at-index",
        "KeyConditionExpression": "#s = :s AND completed_at < :cutoff",
        "ExpressionAttributeNames": {"#s": "status"},
        "ExpressionAttributeValues": {":s": {"S": status}, ":cutoff": {"S": cutoff}},
        "Limit": limit,
    }


DELETES = ("archived", "already_deleted", "changed", "refused")  # what became of the archived jobs


def _delete(ctx: FleetContext, items: list[dict[str, Any]], counts: Counter) -> None:
    """Delete a page's jobs as it read them, 100 a transaction (``batch_writes``): ``archived`` counts those
    this pass deleted; a job already gone was deleted by another pass, one that changed is kept."""

    def delete(item: dict[str, Any]) -> dict[str, Any]:
        return {
            "Delete": {
                "TableName": ctx.jobs_table,
                "Key": {"job_id": item["job_id"]},
                "ConditionExpression": "#s = :s AND completed_at = :c",
                "ExpressionAttributeNames": {"#s": "status"},
                "ExpressionAttributeValues": {":s": item["status"], ":c": item["completed_at"]},
                "ReturnValuesOnConditionCheckFailure": "ALL_OLD",
            }
        }

    done = transact_conditional(
        ctx.dynamodb, items, delete, policy=fleet_calls.POLICY, what="TransactWriteItems (delete old jobs)"
    )
    counts["batch_writes"] += math.ceil(len(items) / TRANSACTION_LIMIT)
    counts["archived"] += len(done.applied)
    counts.update("changed" if current else "already_deleted" for _, current in done.conditional)
    counts["refused"] += len(done.refused)
    if done.refused:
        reasons = "; ".join(f"{printable(item['job_id']['S'])}: {reason}" for item, reason in done.refused)
        ctx.log.warning(f"old_jobs: {len(done.refused)} archived job(s) not deleted, refused: {reasons}")
    if done.failed:
        raise done.error


def _archive_page(ctx: FleetContext, status: str, cutoff: str, items: list[dict[str, Any]], counts: Counter) -> str:
    """One page of a status: archived to one object (returns its key), each job marked, then deleted."""
    records = [from_item(item) for item in items]
    body = "".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in records).encode()
    ids = ",".join(sorted(r["job_id"] for r in records))
    # Deterministic key: archiving the same records again (after a crash) rewrites one object.
    key = f"jobs/{status}/{cutoff[:10]}/{fingerprint(ids)[:24]}.jsonl"
    put_object(
        ctx.s3, ctx.archive_bucket, key, body, what="PutObject (job archive)", ContentType="application/x-ndjson"
    )
    mark_archived(ctx, records, key)
    _delete(ctx, items, counts)
    return key


def old_jobs(ctx: FleetContext, req: HousekeepingRequest, params: OldJobsParams) -> dict[str, Any]:
    """Archive finished jobs older than the retention to S3 (JSON Lines), then delete them. Never scans.
    ``JobRecordsArchived`` counts the jobs this pass deleted, also when it fails part-way."""
    cutoff = _old_jobs_cutoff(req, params)
    counts: Counter = Counter()
    keys_written: list[str] = []
    try:
        for status in FINAL_STATUSES:
            kwargs = _old_jobs_query(ctx.jobs_table, status, cutoff, limit=1000)
            while True:
                page = aws_call(lambda kwargs=kwargs: ctx.dynamodb.query(**kwargs), what="Query completed_at-index")
                counts["queries"] += 1
                items = page.get("Items", [])
                counts[status] += len(items)
                if items and not req.dry_run:
                    keys_written.append(_archive_page(ctx, status, cutoff, items, counts))
                if "LastEvaluatedKey" not in page:
                    break
                kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
    finally:
        if not req.dry_run:
            publish_count(ctx.cloudwatch, ctx.namespace, "JobRecordsArchived", counts["archived"])
    deleted = ", ".join(f"{k}={counts[k]}" for k in DELETES)
    ctx.log.info(
        f"old_jobs: completed_at before {cutoff}: "
        + ", ".join(f"{s}={counts[s]}" for s in FINAL_STATUSES)
        + (" (dry run: nothing archived or deleted)" if req.dry_run else f"; {len(keys_written)} object(s), {deleted}")
    )
    return {
        "cutoff": cutoff,
        "found": sum(counts[s] for s in FINAL_STATUSES),
        **{k: counts[k] for k in DELETES},
        "archive_objects": len(keys_written),
        "queries": counts["queries"],
        "batch_writes": counts["batch_writes"],
        "dry_run": req.dry_run,
    }


def look_old_jobs(ctx: FleetContext, req: HousekeepingRequest, params: OldJobsParams) -> Look:
    """Due when a finished job completed before the retention cutoff: one ``Query`` of one item per
    final status."""
    cutoff = _old_jobs_cutoff(req, params)
    for status in FINAL_STATUSES:
        query = {**_old_jobs_query(ctx.jobs_table, status, cutoff, limit=1), "Select": "COUNT"}
        if ctx.dynamodb.query(**query).get("Count", 0):
            return Look.work(f"{status} jobs completed before {cutoff}")
    return Look.idle(f"no finished job completed before {cutoff}")


TASK = Task(
    name="old_jobs",
    params=OldJobsParams,
    run=old_jobs,
    clients=("dynamodb", "s3", "cloudwatch"),
    look=look_old_jobs,
    look_clients=("dynamodb",),
    cron="0 * * * *",
    looks_at="finished jobs completed before the retention cutoff (one Query of one item per final status)",
)
