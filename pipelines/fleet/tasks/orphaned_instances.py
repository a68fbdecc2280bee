"""runs-fleet's ``orphaned_instances`` housekeeping task: terminate managed instances without a
running job, in two phases (tag a suspect; terminate it on a later pass if it is still orphaned)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from pipelines.common import iso
from pipelines.common.aws_batches import chunks
from pipelines.common.looks import Look
from pipelines.common.params import param
from pipelines.common.task import Task
from pipelines.fleet.calls import aws_call
from pipelines.fleet.context import FleetContext
from pipelines.fleet.messages import HousekeepingRequest
from pipelines.fleet.metrics import publish_count
from pipelines.fleet.tasks.instances import described_instances, instance_tags

MANAGED_TAG = "runs-fleet:managed"
SUSPECT_TAG = "groundskeeper:orphan-suspected"
ORPHAN_SLACK = dt.timedelta(minutes=10)

LOOK_MAX_QUERIES = 20
"""A look queries the running job of at most this many candidates; more candidates than that, and
the run looks at them all."""


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


def managed_instances(ec2, states=("pending", "running")) -> list[dict[str, Any]]:
    return described_instances(
        ec2,
        {"Name": f"tag:{MANAGED_TAG}", "Values": ["true"]},
        {"Name": "instance-state-name", "Values": list(states)},
    )


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


def _orphan_window(
    req: HousekeepingRequest, params: OrphanedInstancesParams
) -> tuple[dt.datetime, dt.timedelta, dt.datetime]:
    """(now, confirm_after, cutoff): instances launched before ``cutoff`` are candidates."""
    now = req.now()
    confirm_after = dt.timedelta(minutes=params.confirm_after_minutes)
    return now, confirm_after, now - dt.timedelta(minutes=params.max_runtime) - ORPHAN_SLACK


def plan_orphans(
    ctx: FleetContext, req: HousekeepingRequest, params: OrphanedInstancesParams, instances: list | None = None
) -> OrphanPlan:
    """The pass's reads: managed instances (unless given), and a running-job query per candidate;
    and what it would do."""
    now, confirm_after, cutoff = _orphan_window(req, params)
    instances = managed_instances(ctx.ec2) if instances is None else instances
    plan = OrphanPlan(now, cutoff, instances, [i for i in instances if i["LaunchTime"] < cutoff])
    suspect, terminate, cleared, waiting = plan.suspect, plan.terminate, plan.cleared, plan.waiting
    for inst in plan.candidates:
        iid = inst["InstanceId"]
        tags = instance_tags(inst)
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


def orphaned_instances(ctx: FleetContext, req: HousekeepingRequest, params: OrphanedInstancesParams) -> dict[str, Any]:
    """Two phases: tag an orphan as suspected; terminate it on a later pass if it is still orphaned."""
    plan = plan_orphans(ctx, req, params)
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


def look_orphaned_instances(ctx: FleetContext, req: HousekeepingRequest, params: OrphanedInstancesParams) -> Look:
    """Due when a pass would tag, untag or terminate an instance: one ``DescribeInstances`` (paged),
    then a running-job query per instance launched before the cutoff."""
    _, _, cutoff = _orphan_window(req, params)
    instances = managed_instances(ctx.ec2)
    candidates = [i for i in instances if i["LaunchTime"] < cutoff]
    if not candidates:
        return Look.idle(f"no managed instance launched before {iso(cutoff)} ({len(instances)} running or pending)")
    if len(candidates) > LOOK_MAX_QUERIES:
        return Look.work(f"{len(candidates)} managed instances launched before {iso(cutoff)}")
    plan = plan_orphans(ctx, req, params, instances)
    if not plan.acts:
        return Look.idle(
            f"{len(candidates)} managed instance(s) launched before {iso(cutoff)}: none to tag, untag or "
            f"terminate ({len(plan.waiting)} suspect(s) waiting for their confirmation)"
        )
    return Look.work(
        f"to suspect {len(plan.suspect)}, terminate {len(plan.terminate)}, clear {len(plan.cleared)} "
        f"of {len(candidates)} managed instance(s) launched before {iso(cutoff)}"
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
