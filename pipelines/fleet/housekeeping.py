"""Housekeeping tasks (``orphaned_instances``, ``stale_ssm``, ``old_jobs``) and their dispatcher.

``TASKS`` maps a ``task_type`` to its function ``(FleetContext, HousekeepingRequest) -> counts``.
A function may carry a ``params`` attribute (the parameter names it accepts besides ``now`` and
``dryRun``). Adding a task is one entry in ``TASKS``. ``pool_audit`` is
``pipelines.pool_audit.housekeeping.pool_audit_task``.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pipelines.common import from_item, iso
from pipelines.fleet.aws import (
    BACKOFF_SECONDS,
    FleetContext,
    RunArchive,
    chunks,
    dead_letter_into,
    delete_messages,
    delete_parameters,
    publish_count,
    with_backoff,
)
from pipelines.fleet.drain import QueueDrain, queue_drain
from pipelines.fleet.messages import (
    FINAL_STATUSES,
    RUNNER_PREFIX,
    HousekeepingRequest,
    InvalidMessage,
    fingerprint,
    instance_of_parameter,
    int_param,
    parse_housekeeping,
)
from pipelines.pool_audit.housekeeping import pool_audit_task

MANAGED_TAG = "runs-fleet:managed"
SUSPECT_TAG = "groundskeeper:orphan-suspected"
ORPHAN_SLACK = dt.timedelta(minutes=10)
_REASON_TIME = re.compile(r"\((\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}) (?:GMT|UTC)\)")


Task = Callable[[FleetContext, HousekeepingRequest], dict[str, Any]]


def _task(*params: str) -> Callable[[Task], Task]:
    def mark(fn: Task) -> Task:
        fn.params = set(params)  # type: ignore[attr-defined]
        return fn

    return mark


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
        page = with_backoff(lambda: dynamodb.query(**kwargs), what="Query instance_id-index")
        if page.get("Count", 0):
            return True
        if "LastEvaluatedKey" not in page:
            return False
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


@_task("max_runtime", "confirm_after_minutes")
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
            with_backoff(
                lambda: ctx.ec2.create_tags(Resources=suspect, Tags=[{"Key": SUSPECT_TAG, "Value": iso(now)}]),
                what="CreateTags",
            )
        if cleared:
            with_backoff(lambda: ctx.ec2.delete_tags(Resources=cleared, Tags=[{"Key": SUSPECT_TAG}]), what="DeleteTags")
        for part in chunks(terminate, 100):
            response = with_backoff(
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


@_task("terminated_grace_minutes")
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


def batch_delete(dynamodb, table: str, keys: list[dict[str, Any]], *, sleeps=BACKOFF_SECONDS) -> int:
    """``BatchWriteItem`` deletes, 25 a call, ``UnprocessedItems`` retried with the seed's backoff."""
    calls = 0
    for part in chunks(keys, 25):
        request = {table: [{"DeleteRequest": {"Key": key}} for key in part]}
        attempt = 0
        while request:
            response = with_backoff(lambda request=request: dynamodb.batch_write_item(RequestItems=request))
            calls += 1
            request = response.get("UnprocessedItems") or {}
            if request:
                if attempt >= len(sleeps):
                    raise RuntimeError(f"BatchWriteItem left {len(request[table])} item(s) unprocessed")
                time.sleep(sleeps[attempt])
                attempt += 1
    return calls


@_task("retention_days")
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
            page = with_backoff(lambda kwargs=kwargs: ctx.dynamodb.query(**kwargs), what="Query completed_at-index")
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
                    with_backoff(
                        lambda key=key, body=body: ctx.s3.put_object(
                            Bucket=ctx.archive_bucket, Key=key, Body=body.encode(), ContentType="application/x-ndjson"
                        ),
                        what="PutObject (job archive)",
                    )
                    keys_written.append(key)
                    counts["batch_writes"] += batch_delete(
                        ctx.dynamodb, ctx.jobs_table, [{"job_id": item["job_id"]} for item in items]
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


# ------------------------------------------------------------------------ dispatcher

TASKS: dict[str, Task] = {
    "orphaned_instances": orphaned_instances,
    "stale_ssm": stale_ssm,
    "old_jobs": old_jobs,
    "pool_audit": pool_audit_task,
}


def parse_request(data: Any) -> HousekeepingRequest:
    """Validate a message body or run config against the known tasks (``InvalidMessage`` otherwise)."""
    request = parse_housekeeping(
        data, allowed_params={name: getattr(fn, "params", set()) for name, fn in TASKS.items()}
    )
    task_for(request)
    return request


def task_for(request: HousekeepingRequest) -> Task:
    if request.task_type in TASKS:
        return TASKS[request.task_type]
    raise InvalidMessage(f"unknown task_type {request.task_type[:40]!r}")


def run_task(ctx: FleetContext, request: HousekeepingRequest) -> dict[str, Any]:
    """Run one validated request. Task parameters out of range raise ``InvalidMessage``."""
    return task_for(request)(ctx, request)


class HousekeepingHandler:
    """One round of housekeeping messages (a ``drain.RoundHandler``): identical requests run once."""

    report_keys = ("received", "tasks_run", "dead_lettered", "failed", "deleted")

    def __init__(self, *, sqs, ctx: FleetContext, archive: RunArchive, queue_url: str, dlq_url: str):
        self.sqs, self.ctx, self.archive, self.queue_url, self.dlq_url = sqs, ctx, archive, queue_url, dlq_url
        self.results: list[dict[str, Any]] = []

    def __call__(
        self, messages: list[dict[str, Any]], pool: ThreadPoolExecutor, started_at: float | None = None
    ) -> Counter:
        counts: Counter = Counter()
        log = self.ctx.log
        try:
            self.archive.write(messages)
        except Exception as exc:
            log.error(f"archiving {len(messages)} raw message(s) failed, leaving them in the queue: {exc}")
            counts["failed"] += len(messages)
            return counts
        poison: list[tuple[dict[str, Any], str]] = []
        groups: dict[str, tuple[HousekeepingRequest, list[dict[str, Any]]]] = {}
        for message in messages:
            try:
                request = parse_request(message.get("Body"))
            except InvalidMessage as exc:
                log.warning(f"dead-lettering housekeeping message {message.get('MessageId')}: {exc.reason}")
                poison.append((message, exc.reason))
                continue
            groups.setdefault(request.key(), (request, []))[1].append(message)
        to_ack: list[dict[str, Any]] = []
        for request, group in groups.values():
            try:
                result = run_task(self.ctx, request)
            except InvalidMessage as exc:
                log.warning(f"dead-lettering housekeeping message(s) for {request.task_type}: {exc.reason}")
                poison += [(m, exc.reason) for m in group]
                continue
            except Exception as exc:  # stays in the queue; SQS dead-letters it after 3 receives
                log.error(f"housekeeping task {request.task_type} failed, message left in the queue: {exc!r}")
                counts["failed"] += len(group)
                continue
            self.results.append({"task_type": request.task_type, **result})
            counts[f"task_{request.task_type}"] += 1
            counts["tasks_run"] += 1
            counts["duplicates_in_round"] += len(group) - 1
            to_ack += group
        dead_letter_into(self.sqs, self.queue_url, self.dlq_url, poison, counts, to_ack)
        if to_ack:
            not_deleted = delete_messages(self.sqs, self.queue_url, to_ack)
            counts["deleted"] += len(to_ack) - len(not_deleted)
        return counts


def housekeeping_drain(ctx: FleetContext, **kwargs) -> QueueDrain:
    """A ``QueueDrain`` of the housekeeping queue (``sqs``, ``queue_url``, ``dlq_url``, ``run_id``, ``limits``)."""
    return queue_drain(HousekeepingHandler, ctx, **kwargs)
