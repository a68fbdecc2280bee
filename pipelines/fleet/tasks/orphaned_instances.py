"""runs-fleet's ``orphaned_instances`` housekeeping task (docs/fleet.md, "Housekeeping")."""

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from pipelines.common import iso
from pipelines.common.aws_batches import chunks
from pipelines.common.looks import Look
from pipelines.common.params import param
from pipelines.common.task import Task
from pipelines.fleet.calls import aws_call, publish_count
from pipelines.fleet.context import FleetContext
from pipelines.fleet.messages import HousekeepingRequest

MANAGED_TAG = "runs-fleet:managed"
SUSPECT_TAG = "groundskeeper:orphan-suspected"
ORPHAN_SLACK = dt.timedelta(minutes=10)

LOOK_MAX_QUERIES = 20
"""A look queries the running job of at most this many candidates; more candidates than that (long jobs
still running), and the run looks at them all when the candidates or their suspect marks change, and at
least every refresh interval of the housekeeping schedules."""


@dataclass(frozen=True)
class OrphanedInstancesParams:
    max_runtime: int = param(
        360,
        description="Minutes a runner may run: instances launched before now - max_runtime - 10 min are candidates.",
        minimum=1,
        maximum=7 * 24 * 60,
    )
    confirm_after_minutes: int = param(
        4,
        description="Minutes between tagging a suspect and terminating it if it is still orphaned.",
        minimum=0,
        maximum=24 * 60,
    )


def described_instances(ec2, *filters: dict[str, Any]) -> list[dict[str, Any]]:
    pages = ec2.get_paginator("describe_instances").paginate(Filters=list(filters))
    return [inst for page in pages for reservation in page["Reservations"] for inst in reservation["Instances"]]


def instance_tags(instance: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in instance.get("Tags", [])}


def managed_instances(ec2, states=("pending", "running")) -> list[dict[str, Any]]:
    return described_instances(
        ec2,
        {"Name": f"tag:{MANAGED_TAG}", "Values": ["true"]},
        {"Name": "instance-state-name", "Values": list(states)},
    )


def has_running_job(dynamodb, jobs_table: str, instance_id: str) -> bool:
    pages = dynamodb.get_paginator("query").paginate(
        TableName=jobs_table,
        IndexName="instance_id-index",
        KeyConditionExpression="instance_id = :i",
        FilterExpression="#s = :running",
        ExpressionAttributeNames={"#s": "status"},
        ExpressionAttributeValues={":i": {"S": instance_id}, ":running": {"S": "running"}},
        Select="COUNT",
    )
    return aws_call(lambda: any(page.get("Count", 0) for page in pages), what="Query instance_id-index")


@dataclass
class OrphanPlan:
    """What an ``orphaned_instances`` pass would do, from its reads (no writes)."""

    now: dt.datetime
    cutoff: dt.datetime  # instances launched before it are candidates
    instances: list[dict[str, Any]]
    candidates: list[dict[str, Any]]
    suspect: list[str] = field(default_factory=list)
    terminate: list[str] = field(default_factory=list)
    cleared: list[str] = field(default_factory=list)
    waiting: list[str] = field(default_factory=list)
    unreadable: dict[str, str] = field(default_factory=dict)  # suspects whose mark is no time with a zone


def plan_orphans(
    ctx: FleetContext, req: HousekeepingRequest, params: OrphanedInstancesParams, max_queries: int | None = None
) -> OrphanPlan:
    """The pass's reads: managed instances, and a running-job query per candidate; and what it would do.
    With more than ``max_queries`` candidates, none is queried (the plan says only who the candidates are)."""
    now = req.now()
    cutoff = now - dt.timedelta(minutes=params.max_runtime) - ORPHAN_SLACK
    instances = managed_instances(ctx.ec2)
    plan = OrphanPlan(now, cutoff, instances, [i for i in instances if i["LaunchTime"] < cutoff])
    if max_queries is not None and len(plan.candidates) > max_queries:
        return plan
    for inst in plan.candidates:
        iid = inst["InstanceId"]
        tags = instance_tags(inst)
        if has_running_job(ctx.dynamodb, ctx.jobs_table, iid):
            if SUSPECT_TAG in tags:
                plan.cleared.append(iid)
            continue
        if SUSPECT_TAG not in tags:
            plan.suspect.append(iid)
            continue
        try:
            since = dt.datetime.fromisoformat(tags[SUSPECT_TAG])
            confirmed = since <= now - dt.timedelta(minutes=params.confirm_after_minutes)
        except (ValueError, TypeError):  # an unreadable mark (or one with no time zone) is renewed, never trusted
            plan.suspect.append(iid)
            plan.unreadable[iid] = tags[SUSPECT_TAG]
            continue
        (plan.terminate if confirmed else plan.waiting).append(iid)
    return plan


def orphaned_instances(ctx: FleetContext, req: HousekeepingRequest, params: OrphanedInstancesParams) -> dict[str, Any]:
    """Two phases: tag an orphan as suspected; terminate it on a later pass if it is still orphaned."""
    plan = plan_orphans(ctx, req, params)
    suspect, terminate, cleared = plan.suspect, plan.terminate, plan.cleared
    ctx.log.info(
        f"orphaned_instances: {len(plan.instances)} managed running/pending, {len(plan.candidates)} launched before "
        f"{iso(plan.cutoff)}; suspect {suspect}, terminate {terminate}, waiting {plan.waiting}, no longer suspect "
        f"{cleared}" + (" (dry run)" if req.dry_run else "")
    )
    for iid, mark in plan.unreadable.items():
        ctx.log.warning(
            f"orphaned_instances: {iid}'s {SUSPECT_TAG} {mark!r} is no ISO-8601 time with a time zone: "
            "it counts as a new suspect (its mark is renewed), not as one to terminate"
        )
    terminated: list[str] = []
    if not req.dry_run:
        if suspect:
            aws_call(
                lambda: ctx.ec2.create_tags(Resources=suspect, Tags=[{"Key": SUSPECT_TAG, "Value": iso(plan.now)}]),
                what="CreateTags",
            )
        if cleared:
            aws_call(lambda: ctx.ec2.delete_tags(Resources=cleared, Tags=[{"Key": SUSPECT_TAG}]), what="DeleteTags")
        try:  # a later batch failing still publishes those terminated
            for part in chunks(terminate, 100):
                response = aws_call(
                    lambda part=part: ctx.ec2.terminate_instances(InstanceIds=list(part)), what="TerminateInstances"
                )
                terminated += [  # not those a concurrent pass had terminated already
                    i["InstanceId"]
                    for i in response.get("TerminatingInstances", [])
                    if i.get("PreviousState", {}).get("Name") not in ("shutting-down", "terminated")
                ]
        finally:
            publish_count(ctx.cloudwatch, ctx.namespace, "OrphanedInstancesTerminated", len(terminated))
    return {
        "managed_instances": len(plan.instances),
        "candidates": len(plan.candidates),
        "suspected": len(suspect),
        "terminated": len(terminated),
        "would_terminate": len(terminate) if req.dry_run else 0,
        "waiting": len(plan.waiting),
        "cleared": len(cleared),
        "dry_run": req.dry_run,
    }


def look_orphaned_instances(ctx: FleetContext, req: HousekeepingRequest, params: OrphanedInstancesParams) -> Look:
    """Due when a pass would tag, untag or terminate an instance: one ``DescribeInstances`` (paged),
    then a running-job query per instance launched before the cutoff."""
    plan = plan_orphans(ctx, req, params, max_queries=LOOK_MAX_QUERIES)
    candidates, cutoff = len(plan.candidates), iso(plan.cutoff)
    if not candidates:
        return Look.idle(f"no managed instance launched before {cutoff} ({len(plan.instances)} running or pending)")
    if candidates > LOOK_MAX_QUERIES:
        marks = {i["InstanceId"]: instance_tags(i).get(SUSPECT_TAG) for i in plan.candidates}
        return Look.state(marks, f"{candidates} managed instances launched before {cutoff}, too many to query")
    if not (plan.suspect or plan.terminate or plan.cleared):
        return Look.idle(
            f"{candidates} managed instance(s) launched before {cutoff}: none to tag, untag or "
            f"terminate ({len(plan.waiting)} suspect(s) waiting for their confirmation)"
        )
    return Look.work(
        f"to suspect {len(plan.suspect)}, terminate {len(plan.terminate)}, clear {len(plan.cleared)} "
        f"of {candidates} managed instance(s) launched before {cutoff}"
    )


TASK = Task(
    name="orphaned_instances",
    params=OrphanedInstancesParams,
    run=orphaned_instances,
    clients=("ec2", "dynamodb", "cloudwatch"),
    look=look_orphaned_instances,
    look_clients=("ec2", "dynamodb"),
    cron="*/5 * * * *",
    looks_at="managed instances launched before the task's cutoff (DescribeInstances, then a "
    "running-job query per such instance)",
)
