"""runs-fleet's ``stale_ssm`` housekeeping task (docs/fleet.md, "Housekeeping")."""

import datetime as dt
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pipelines.common.aws_batches import chunks
from pipelines.common.looks import Look
from pipelines.common.params import param
from pipelines.common.task import Task
from pipelines.fleet.calls import delete_parameters, publish_count
from pipelines.fleet.context import FleetContext
from pipelines.fleet.messages import RUNNER_PREFIX, HousekeepingRequest, instance_of_parameter
from pipelines.fleet.tasks.orphaned_instances import described_instances

_REASON_TIME = re.compile(r"\((\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}) (?:GMT|UTC)\)")

LOOK_MAX_PAGES = 300
"""A look reads at most this many pages of runner parameters (10 a page: 3,000 runners); with more
pages than that and none stale so far it declares work, saying so, and the run reads them all."""


@dataclass(frozen=True)
class StaleSsmParams:
    terminated_grace_minutes: int = param(
        10,
        description="Minutes after its instance terminated (or, for an instance EC2 does not describe, after it "
        "was written) before a runner parameter is deleted.",
        minimum=0,
        maximum=24 * 60,
    )


@dataclass
class RunnerParameters:
    """The runner parameters read so far: by instance id, when each instance's was last written, and the
    names not of the runner shape. ``complete``: the last page was read."""

    by_instance: dict[str, list[str]] = field(default_factory=dict)
    written: dict[str, dt.datetime] = field(default_factory=dict)
    unrecognised: list[str] = field(default_factory=list)
    pages: int = 0
    complete: bool = False


def runner_parameter_pages(ssm) -> Iterator[RunnerParameters]:
    """``/runs-fleet/runners/`` page by page: after each page, what was read so far."""
    found = RunnerParameters()
    for page in ssm.get_paginator("get_parameters_by_path").paginate(Path=RUNNER_PREFIX.rstrip("/"), Recursive=True):
        found.pages += 1
        for parameter in page.get("Parameters", []):
            iid = instance_of_parameter(parameter["Name"])
            if iid is None:
                found.unrecognised.append(parameter["Name"])
            else:
                found.by_instance.setdefault(iid, []).append(parameter["Name"])
                found.written[iid] = parameter["LastModifiedDate"]  # the one name of the runner shape
        found.complete = "NextToken" not in page
        yield found


def runner_parameters(ssm) -> RunnerParameters:
    """All of ``/runs-fleet/runners/``."""
    *_, found = runner_parameter_pages(ssm)  # a paginator yields at least one page
    return found


def stale_instances(
    ec2, ids: list[str], now: dt.datetime, grace: dt.timedelta, written: dict[str, dt.datetime]
) -> tuple[list[str], list[str]]:
    """(stale, recent) among ``ids`` (described 100 at a time): stale when terminated, or not described
    with its parameter ``written``, over ``grace`` ago (EC2 may not describe an instance launched just now
    yet); recent when terminated since."""
    seen = {
        inst["InstanceId"]: inst
        for part in chunks(ids, 100)
        for inst in described_instances(ec2, {"Name": "instance-id", "Values": list(part)})
    }
    stale, recent = [], []
    for iid in ids:
        inst = seen.get(iid)
        if inst is None:
            if written[iid] <= now - grace:
                stale.append(iid)
        elif inst["State"]["Name"] == "terminated":
            match = _REASON_TIME.search(inst.get("StateTransitionReason") or "")  # "User initiated (... GMT)"
            when = dt.datetime.strptime(match[1], "%Y-%m-%d %H:%M:%S").replace(tzinfo=dt.UTC) if match else None
            (stale if when is not None and when <= now - grace else recent).append(iid)
    return stale, recent


def stale_ssm(ctx: FleetContext, req: HousekeepingRequest, params: StaleSsmParams) -> dict[str, Any]:
    """Delete runner parameters of instances that do not exist or were terminated over the grace ago."""
    grace = dt.timedelta(minutes=params.terminated_grace_minutes)
    found = runner_parameters(ctx.ssm)
    if left := found.unrecognised:
        ctx.log.warning(f"stale_ssm: left {len(left)} parameter(s) not of the runner shape: {left[:10]}")
    ids = sorted(found.by_instance)
    stale, recent = stale_instances(ctx.ec2, ids, req.now(), grace, found.written)
    names = [n for iid in stale for n in found.by_instance[iid]]
    ctx.log.info(
        f"stale_ssm: {len(ids)} runner parameter instance(s) in {found.pages} page(s); {len(stale)} gone or "
        f"terminated over {grace} ago, {len(recent)} terminated recently" + (" (dry run)" if req.dry_run else "")
    )
    deleted: Counter = Counter()
    if not req.dry_run:
        try:  # counted ten by ten: a later ten failing still publishes what was deleted
            delete_parameters(ctx.ssm, names, deleted)
        finally:
            publish_count(ctx.cloudwatch, ctx.namespace, "SSMParametersDeleted", deleted["deleted"])
    return {
        "parameters": sum(len(v) for v in found.by_instance.values()),
        "stale": len(names),
        "deleted": deleted["deleted"],
        "already_gone": deleted["missing"],
        "recently_terminated": len(recent),
        "unrecognised": len(found.unrecognised),
        "dry_run": req.dry_run,
    }


def look_stale_ssm(ctx: FleetContext, req: HousekeepingRequest, params: StaleSsmParams) -> Look:
    """Due at the first instance whose parameters a pass would delete: the runner parameters page by page,
    their instances described 100 at a time as they are read; idle once every page is read and none is
    stale (more than :data:`LOOK_MAX_PAGES` pages: due)."""
    grace = dt.timedelta(minutes=params.terminated_grace_minutes)
    found, checked, recent = RunnerParameters(), 0, 0
    for found in runner_parameter_pages(ctx.ssm):
        ids = list(found.by_instance)
        while len(ids) - checked >= 100 or (found.complete and checked < len(ids)):
            stale, since = stale_instances(ctx.ec2, ids[checked : checked + 100], req.now(), grace, found.written)
            checked, recent = min(checked + 100, len(ids)), recent + len(since)
            if stale:
                return Look.work(
                    f"{len(stale)} of the first {checked} instance(s) with runner parameters gone or "
                    f"terminated over {grace} ago"
                )
        if found.pages >= LOOK_MAX_PAGES and not found.complete:
            return Look.work(
                f"more than {found.pages} pages of runner parameters, the look's bound ({checked} instance(s) "
                "described, none stale): the run reads them all"
            )
    if not found.by_instance:
        return Look.idle(f"no runner parameters ({len(found.unrecognised)} of another shape)")
    return Look.idle(
        f"{checked} instance(s) with runner parameters, none gone or terminated over {grace} ago "
        f"({recent} terminated since)"
    )


TASK = Task(
    name="stale_ssm",
    params=StaleSsmParams,
    run=stale_ssm,
    clients=("ssm", "ec2", "cloudwatch"),
    look=look_stale_ssm,
    look_clients=("ssm", "ec2"),
    cron="*/15 * * * *",
    looks_at="the runner parameters and their instances (GetParametersByPath, DescribeInstances)",
)
