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
from dataclasses import dataclass, field
from typing import Any

from pipelines.common import from_item, iso
from pipelines.common.aws_batches import batch_write, chunks
from pipelines.common.looks import Look
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
from pipelines.fleet.ssm_parameters import delete_parameters

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


@dataclass
class OrphanPlan:
    """What an ``orphaned_instances`` pass would do, from its reads (no writes)."""

    now: dt.datetime
    cutoff: dt.datetime
    instances: list[dict[str, Any]]
    candidates: list[dict[str, Any]]
    suspect: list[str] = field(default_factory=list)
    terminate: list[str] = field(default_factory=list)
    cleared: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)

    @property
    def acts(self) -> bool:
        return bool(self.suspect or self.terminate or self.cleared)


def _orphan_window(req: HousekeepingRequest) -> tuple[dt.datetime, dt.timedelta, dt.datetime]:
    """(now, confirm_after, cutoff): instances launched before ``cutoff`` are candidates."""
    now = req.now()
    max_runtime = int_param(req.params, "max_runtime", 360, 1, 7 * 24 * 60)
    confirm_after = dt.timedelta(minutes=int_param(req.params, "confirm_after_minutes", 4, 0, 24 * 60))
    return now, confirm_after, now - dt.timedelta(minutes=max_runtime) - ORPHAN_SLACK


def plan_orphans(ctx: FleetContext, req: HousekeepingRequest, instances: list | None = None) -> OrphanPlan:
    """The pass's reads: managed instances (unless given), and a running-job query per candidate;
    and what it would do."""
    now, confirm_after, cutoff = _orphan_window(req)
    instances = managed_instances(ctx.ec2) if instances is None else instances
    plan = OrphanPlan(now, cutoff, instances, [i for i in instances if i["LaunchTime"] < cutoff])
    suspect, terminate, cleared, waiting = plan.suspect, plan.terminate, plan.cleared, plan.waiting
    for inst in plan.candidates:
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
    return plan


def orphaned_instances(ctx: FleetContext, req: HousekeepingRequest) -> dict[str, Any]:
    """Two phases: tag an orphan as suspected; terminate it on a later pass if it is still orphaned."""
    plan = plan_orphans(ctx, req)
    now, cutoff, instances, candidates = plan.now, plan.cutoff, plan.instances, plan.candidates
    suspect, terminate, cleared, waiting = plan.suspect, plan.terminate, plan.cleared, plan.waiting
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


@dataclass
class RunnerParameters:
    """The runner parameters read page by page: by instance id, and the names not of the runner shape.
    ``complete``: every page was read (False when a look stopped at its page limit)."""

    by_instance: dict[str, list[str]] = field(default_factory=dict)
    unrecognised: list[str] = field(default_factory=list)
    pages: int = 0
    complete: bool = True


def runner_parameters(ssm, max_pages: int | None = None) -> RunnerParameters:
    """``/runs-fleet/runners/`` page by page (all of them, or the first ``max_pages``)."""
    found = RunnerParameters()
    for page in ssm.get_paginator("get_parameters_by_path").paginate(Path=RUNNER_PREFIX.rstrip("/"), Recursive=True):
        if max_pages is not None and found.pages >= max_pages:
            found.complete = False
            break
        found.pages += 1
        for param in page.get("Parameters", []):
            iid = instance_of_parameter(param["Name"])
            if iid is None:
                found.unrecognised.append(param["Name"])
            else:
                found.by_instance.setdefault(iid, []).append(param["Name"])
    return found


def stale_instances(ec2, ids: list[str], now: dt.datetime, grace: dt.timedelta) -> tuple[list[str], list[str]]:
    """(stale, recent) among ``ids`` (described 100 at a time): stale when gone or terminated over
    ``grace`` ago, recent when terminated since."""
    seen: dict[str, dict[str, Any]] = {}
    for part in chunks(ids, 100):
        for page in ec2.get_paginator("describe_instances").paginate(
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
    return stale, recent


def _ssm_grace(req: HousekeepingRequest) -> dt.timedelta:
    return dt.timedelta(minutes=int_param(req.params, "terminated_grace_minutes", 10, 0, 24 * 60))


def stale_ssm(ctx: FleetContext, req: HousekeepingRequest) -> dict[str, Any]:
    """Delete runner parameters of instances that do not exist or were terminated over 10 minutes ago."""
    now = req.now()
    grace = _ssm_grace(req)
    found = runner_parameters(ctx.ssm)
    by_instance, unrecognised, pages = found.by_instance, found.unrecognised, found.pages
    if unrecognised:
        ctx.log.warning(
            f"stale_ssm: left {len(unrecognised)} parameter(s) not of the runner shape: {unrecognised[:10]}"
        )
    ids = sorted(by_instance)
    stale, recent = stale_instances(ctx.ec2, ids, now, grace)
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


def _old_jobs_cutoff(req: HousekeepingRequest) -> str:
    return iso(req.now() - dt.timedelta(days=int_param(req.params, "retention_days", 7, 1, 3650)))


def _old_jobs_query(jobs_table: str, status: str, cutoff: str, *, limit: int) -> dict[str, Any]:
    """The ``completed_at-index`` query of the jobs of ``status`` completed before ``cutoff``."""
    return {
        "TableName": jobs_table,
        "IndexName": "completed_at-index",
        "KeyConditionExpression": "#s = :s AND completed_at < :cutoff",
        "ExpressionAttributeNames": {"#s": "status"},
        "ExpressionAttributeValues": {":s": {"S": status}, ":cutoff": {"S": cutoff}},
        "Limit": limit,
    }


def old_jobs(ctx: FleetContext, req: HousekeepingRequest) -> dict[str, Any]:
    """Archive finished jobs older than the retention to S3 (JSON Lines), then delete them. Never scans."""
    cutoff = _old_jobs_cutoff(req)
    counts: Counter = Counter()
    keys_written: list[str] = []
    for status in FINAL_STATUSES:
        kwargs = _old_jobs_query(ctx.jobs_table, status, cutoff, limit=1000)
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


# ----------------------------------------------------------------------------- looks
# What each task's schedule reads before it launches a run (``pipelines.common.looks``): the
# task's own first reads, so that a run is launched when it would act, and only then.

LOOK_MAX_QUERIES = 20
"""An ``orphaned_instances`` look queries the running job of at most this many candidates; more
candidates than that, and the run looks at them all."""

LOOK_MAX_PAGES = 5
"""A ``stale_ssm`` look reads at most this many pages of runner parameters (10 a page); more
parameters than that, and the run reads them all."""


def look_orphaned_instances(ctx: FleetContext, req: HousekeepingRequest) -> Look:
    """Due when a pass would tag, untag or terminate an instance: one ``DescribeInstances`` (paged),
    then a running-job query per instance launched before the cutoff."""
    _, _, cutoff = _orphan_window(req)
    instances = managed_instances(ctx.ec2)
    candidates = [i for i in instances if i["LaunchTime"] < cutoff]
    if not candidates:
        return Look.idle(f"no managed instance launched before {iso(cutoff)} ({len(instances)} running or pending)")
    if len(candidates) > LOOK_MAX_QUERIES:
        return Look.work(f"{len(candidates)} managed instances launched before {iso(cutoff)}")
    plan = plan_orphans(ctx, req, instances)
    if not plan.acts:
        return Look.idle(
            f"{len(candidates)} managed instance(s) launched before {iso(cutoff)}: none to tag, untag or "
            f"terminate ({len(plan.waiting)} suspect(s) waiting for their confirmation)"
        )
    return Look.work(
        f"to suspect {len(plan.suspect)}, terminate {len(plan.terminate)}, clear {len(plan.cleared)} "
        f"of {len(candidates)} managed instance(s) launched before {iso(cutoff)}"
    )


def look_stale_ssm(ctx: FleetContext, req: HousekeepingRequest) -> Look:
    """Due when a pass would delete a parameter: up to :data:`LOOK_MAX_PAGES` pages of runner
    parameters, then one ``DescribeInstances`` of their instances."""
    found = runner_parameters(ctx.ssm, max_pages=LOOK_MAX_PAGES)
    if not found.complete:
        return Look.work(f"over {len(found.by_instance)} instances with runner parameters: the run reads them all")
    if not found.by_instance:
        return Look.idle(f"no runner parameters ({len(found.unrecognised)} of another shape)")
    grace = _ssm_grace(req)
    ids = sorted(found.by_instance)
    stale, recent = stale_instances(ctx.ec2, ids, req.now(), grace)
    if not stale:
        return Look.idle(
            f"{len(ids)} instance(s) with runner parameters, none gone or terminated over {grace} ago "
            f"({len(recent)} terminated since)"
        )
    return Look.work(
        f"{len(stale)} of {len(ids)} instance(s) with runner parameters gone or terminated over {grace} ago"
    )


def look_old_jobs(ctx: FleetContext, req: HousekeepingRequest) -> Look:
    """Due when a finished job completed before the retention cutoff: one ``Query`` of one item per
    final status."""
    cutoff = _old_jobs_cutoff(req)
    for status in FINAL_STATUSES:
        query = {**_old_jobs_query(ctx.jobs_table, status, cutoff, limit=1), "Select": "COUNT"}
        if ctx.dynamodb.query(**query).get("Count", 0):
            return Look.work(f"{status} jobs completed before {cutoff}")
    return Look.idle(f"no finished job completed before {cutoff}")


LOOKS = {
    "orphaned_instances": look_orphaned_instances,
    "stale_ssm": look_stale_ssm,
    "old_jobs": look_old_jobs,
}
"""The look of each scheduled task (``pipelines.fleet.defs.schedules``)."""
