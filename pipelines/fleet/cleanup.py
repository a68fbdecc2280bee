"""runs-fleet's clean-up tasks, each ``(FleetContext, HousekeepingRequest) -> summary``:
``orphaned_instances`` (terminate managed instances without a running job, in two phases),
``stale_ssm`` (delete runner parameters of instances that are gone) and ``old_jobs`` (archive
finished jobs to S3, then delete them). ``pipelines.fleet.housekeeping`` dispatches them."""

from __future__ import annotations

import datetime as dt
import json
import re
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pipelines.common import from_item, iso
from pipelines.common.aws_batches import batch_write, chunks
from pipelines.fleet import calls as fleet_calls
from pipelines.fleet.archive import archived_job_key
from pipelines.fleet.calls import aws_call
from pipelines.fleet.context import FleetContext
from pipelines.fleet.messages import (
    FINAL_STATUSES,
    RUNNER_PREFIX,
    HousekeepingRequest,
    fingerprint,
    instance_of_parameter,
    int_param,
    utcnow,
)
from pipelines.fleet.metrics import publish_count
from pipelines.fleet.parameters import delete_parameters

MANAGED_TAG = "runs-fleet:managed"
SUSPECT_TAG = "groundskeeper:orphan-suspected"
ORPHAN_SLACK = dt.timedelta(minutes=10)
_REASON_TIME = re.compile(r"\((\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}) (?:GMT|UTC)\)")


# ------------------------------------------------------------------ orphaned_instances


def managed_instances(ec2, states=("pending", "running")) -> list[dict[str, Any]]:
    out = []
    for page in ec2.get_paginator("describe_instances").paginate(
        Filters=[
            {"Name": f"tag:{MANAGED_TAG}", "Values": ["true"]},
            {"Name": "instance-state-name", "Values": list(states)},
        ]
    ):
        for reservation in page["Reservations"]:
            out += reservation["Instances"]
    return out


def has_running_job(dynamodb, jobs_table: str, instance_id: str) -> bool:
    kwargs: dict[str, Any] = {
        "TableName": jobs_table,
        "IndexName": "instance_id-index",
        "KeyConditionExpression": "instance_id = :i",
        "FilterExpression": "#s = :running",
        "ExpressionAttributeNames": {"#s": "status"},
        "ExpressionAttributeValues": {":i": {"S": instance_id}, ":running": {"S": "running"}},
        "Select": "COUNT",
    }
    while True:
        page = aws_call(lambda: dynamodb.query(**kwargs), what="Query instance_id-index")
        if page.get("Count", 0):
            return True
        if "LastEvaluatedKey" not in page:
            return False
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def orphaned_instances(ctx: FleetContext, req: HousekeepingRequest) -> dict[str, Any]:
    """Two phases: tag an orphan as suspected; terminate it on a later pass if it is still orphaned."""
    now = req.now()
    max_runtime = int_param(req.params, "max_runtime", 360, 1, 7 * 24 * 60)
    confirm_after = dt.timedelta(minutes=int_param(req.params, "confirm_after_minutes", 4, 0, 24 * 60))
    cutoff = now - dt.timedelta(minutes=max_runtime) - ORPHAN_SLACK
    instances = managed_instances(ctx.ec2)
    candidates = [i for i in instances if i["LaunchTime"] < cutoff]
    suspect, terminate, cleared, waiting = [], [], [], []
    for inst in candidates:
        iid = inst["InstanceId"]
        tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
        if has_running_job(ctx.dynamodb, ctx.jobs_table, iid):
            if SUSPECT_TAG in tags:
                cleared.append(iid)
            continue
        if SUSPECT_TAG not in tags:
            suspect.append(iid)
            continue
        try:
            since = dt.datetime.fromisoformat(tags[SUSPECT_TAG])
        except ValueError:
            since = now  # an unreadable mark is renewed, never trusted
            suspect.append(iid)
            continue
        (terminate if since <= now - confirm_after else waiting).append(iid)
    ctx.log.info(
        f"orphaned_instances: {len(instances)} managed running/pending, {len(candidates)} launched before "
        f"{iso(cutoff)}; suspect {suspect}, terminate {terminate}, waiting {waiting}, no longer suspect {cleared}"
        + (" (dry run)" if req.dry_run else "")
    )
    terminated: list[str] = []
    if not req.dry_run:
        if suspect:
            aws_call(
                lambda: ctx.ec2.create_tags(Resources=suspect, Tags=[{"Key": SUSPECT_TAG, "Value": iso(now)}]),
                what="CreateTags",
            )
        if cleared:
            aws_call(lambda: ctx.ec2.delete_tags(Resources=cleared, Tags=[{"Key": SUSPECT_TAG}]), what="DeleteTags")
        for part in chunks(terminate, 100):
            response = aws_call(
                lambda part=part: ctx.ec2.terminate_instances(InstanceIds=list(part)), what="TerminateInstances"
            )
            terminated += [i["InstanceId"] for i in response.get("TerminatingInstances", [])]
        publish_count(ctx.cloudwatch, ctx.namespace, "OrphanedInstancesTerminated", len(terminated))
    return {
        "managed_instances": len(instances),
        "candidates": len(candidates),
        "suspected": len(suspect),
        "terminated": len(terminated),
        "would_terminate": len(terminate) if req.dry_run else 0,
        "waiting": len(waiting),
        "cleared": len(cleared),
        "dry_run": req.dry_run,
    }


# ------------------------------------------------------------------------- stale_ssm


def terminated_at(instance: dict[str, Any]) -> dt.datetime | None:
    """When a terminated instance stopped, from ``StateTransitionReason`` ("User initiated (... GMT)")."""
    match = _REASON_TIME.search(instance.get("StateTransitionReason") or "")
    if not match:
        return None
    return dt.datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S").replace(tzinfo=dt.UTC)


def stale_ssm(ctx: FleetContext, req: HousekeepingRequest) -> dict[str, Any]:
    """Delete runner parameters of instances that do not exist or were terminated over 10 minutes ago."""
    now = req.now()
    grace = dt.timedelta(minutes=int_param(req.params, "terminated_grace_minutes", 10, 0, 24 * 60))
    by_instance: dict[str, list[str]] = {}
    unrecognised: list[str] = []
    pages = 0
    for page in ctx.ssm.get_paginator("get_parameters_by_path").paginate(
        Path=RUNNER_PREFIX.rstrip("/"), Recursive=True
    ):
        pages += 1
        for param in page.get("Parameters", []):
            iid = instance_of_parameter(param["Name"])
            if iid is None:
                unrecognised.append(param["Name"])
            else:
                by_instance.setdefault(iid, []).append(param["Name"])
    if unrecognised:
        ctx.log.warning(
            f"stale_ssm: left {len(unrecognised)} parameter(s) not of the runner shape: {unrecognised[:10]}"
        )
    seen: dict[str, dict[str, Any]] = {}
    ids = sorted(by_instance)
    for part in chunks(ids, 100):
        for page in ctx.ec2.get_paginator("describe_instances").paginate(
            Filters=[{"Name": "instance-id", "Values": list(part)}]
        ):
            for reservation in page["Reservations"]:
                for inst in reservation["Instances"]:
                    seen[inst["InstanceId"]] = inst
    stale, recent = [], []
    for iid in ids:
        inst = seen.get(iid)
        if inst is None:
            stale.append(iid)
        elif inst["State"]["Name"] == "terminated":
            when = terminated_at(inst)
            (stale if when is not None and when <= now - grace else recent).append(iid)
    names = [n for iid in stale for n in by_instance[iid]]
    ctx.log.info(
        f"stale_ssm: {len(ids)} runner parameter instance(s) in {pages} page(s); {len(stale)} gone or terminated "
        f"over {grace} ago, {len(recent)} terminated recently" + (" (dry run)" if req.dry_run else "")
    )
    deleted = {"deleted": 0, "missing": 0}
    if not req.dry_run:
        deleted = delete_parameters(ctx.ssm, names)
        publish_count(ctx.cloudwatch, ctx.namespace, "SSMParametersDeleted", deleted["deleted"])
    return {
        "parameters": sum(len(v) for v in by_instance.values()),
        "stale": len(names),
        "deleted": deleted["deleted"],
        "already_gone": deleted["missing"],
        "recently_terminated": len(recent),
        "unrecognised": len(unrecognised),
        "dry_run": req.dry_run,
    }


# -------------------------------------------------------------------------- old_jobs


MARKER_THREADS = 8


def mark_archived(ctx: FleetContext, records: list[dict[str, Any]], archive_key: str) -> None:
    """One small marker per archived job (``archived-jobs/<sha256 of job_id>.json``), written before
    the job is deleted: a late copy of its termination message is then known as a duplicate, not an
    unknown job. The bucket's lifecycle expires them after 15 days (SQS keeps a message 14 at most)."""
    archived_at = iso(utcnow())

    def put(record: dict[str, Any]) -> None:
        body = json.dumps(
            {
                "job_id": record["job_id"],
                "status": record.get("status"),
                "archive": archive_key,
                "archived_at": archived_at,
            }
        )
        aws_call(
            lambda: ctx.s3.put_object(
                Bucket=ctx.archive_bucket, Key=archived_job_key(record["job_id"]), Body=body.encode()
            ),
            what="PutObject (archived job marker)",
        )

    with ThreadPoolExecutor(max_workers=MARKER_THREADS, thread_name_prefix="archived-marker") as pool:
        list(pool.map(put, records))  # raises the first failure: then nothing of the page is deleted


def old_jobs(ctx: FleetContext, req: HousekeepingRequest) -> dict[str, Any]:
    """Archive finished jobs older than the retention to S3 (JSON Lines), then delete them. Never scans."""
    now = req.now()
    days = int_param(req.params, "retention_days", 7, 1, 3650)
    cutoff = iso(now - dt.timedelta(days=days))
    counts: Counter = Counter()
    keys_written: list[str] = []
    for status in FINAL_STATUSES:
        kwargs: dict[str, Any] = {
            "TableName": ctx.jobs_table,
            "IndexName": "completed_at-index",
            "KeyConditionExpression": "#s = :s AND completed_at < :cutoff",
            "ExpressionAttributeNames": {"#s": "status"},
            "ExpressionAttributeValues": {":s": {"S": status}, ":cutoff": {"S": cutoff}},
            "Limit": 1000,
        }
        while True:
            page = aws_call(lambda kwargs=kwargs: ctx.dynamodb.query(**kwargs), what="Query completed_at-index")
            counts["queries"] += 1
            items = page.get("Items", [])
            if items:
                counts[f"{status}"] += len(items)
                if not req.dry_run:
                    records = [from_item(item) for item in items]
                    body = "".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in records)
                    ids = ",".join(sorted(r["job_id"] for r in records))
                    # Deterministic key: archiving the same records again (after a crash) rewrites one object.
                    key = f"jobs/{status}/{cutoff[:10]}/{fingerprint(ids)[:24]}.jsonl"
                    aws_call(
                        lambda key=key, body=body: ctx.s3.put_object(
                            Bucket=ctx.archive_bucket, Key=key, Body=body.encode(), ContentType="application/x-ndjson"
                        ),
                        what="PutObject (job archive)",
                    )
                    keys_written.append(key)
                    mark_archived(ctx, records, key)
                    counts["batch_writes"] += batch_write(
                        ctx.dynamodb,
                        ctx.jobs_table,
                        [{"DeleteRequest": {"Key": {"job_id": item["job_id"]}}} for item in items],
                        policy=fleet_calls.POLICY,
                    )
                    counts["archived"] += len(items)
            if "LastEvaluatedKey" not in page:
                break
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
    ctx.log.info(
        f"old_jobs: completed_at before {cutoff}: "
        + ", ".join(f"{s}={counts[s]}" for s in FINAL_STATUSES)
        + (" (dry run: nothing archived or deleted)" if req.dry_run else f"; archived to {len(keys_written)} object(s)")
    )
    if not req.dry_run:
        publish_count(ctx.cloudwatch, ctx.namespace, "JobRecordsArchived", counts["archived"])
    return {
        "cutoff": cutoff,
        "found": sum(counts[s] for s in FINAL_STATUSES),
        "archived": counts["archived"],
        "archive_objects": len(keys_written),
        "queries": counts["queries"],
        "batch_writes": counts["batch_writes"],
        "dry_run": req.dry_run,
    }
