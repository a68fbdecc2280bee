"""The queue sensors: drain runs while messages wait, one per consumer slot (docs/fleet.md, "Parallel drains")."""

import json
import math
import time

import dagster as dg

from pipelines.common import time_gone_by
from pipelines.common.defs.active_runs import ACTIVE_STATUSES, still_going
from pipelines.common.defs.failures import one_line_failures
from pipelines.common.sqs import queue_depth, queue_name
from pipelines.fleet.defs.jobs import QUEUE_TAG, QUEUE_TAGS
from pipelines.fleet.drain import DrainLimits
from resources import FleetSettings

MESSAGES_PER_RUN = 10 * DrainLimits().concurrency
"""One more drain run per this many waiting messages (a full round of the default drain), up to the free slots."""
MAX_WAIT_SECONDS = 300
"""Fewer than :data:`MESSAGES_PER_RUN` waiting start a drain run once messages have waited this long: a trickle
of messages is drained a few minutes at a time, not a run per message."""


def slot_tag(queue_tag: str, slot: int) -> str:
    """The ``groundskeeper/queue`` value of consumer slot ``slot`` (1-based) of a queue."""
    return queue_tag if slot == 1 else f"{queue_tag}#{slot}"


def queue_sensor(label: str, interval: int = 30) -> dg.SensorDefinition:
    job_name, runs_field, queue_tag = f"process_{label}_queue", f"{label}_drain_runs", QUEUE_TAGS[label]

    @dg.sensor(
        name=f"{label}_queue_sensor",
        job_name=job_name,
        minimum_interval_seconds=interval,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Launches {job_name} runs when messages wait on the {label} queue (one GetQueueAttributes "
        f"every {interval} s), up to RUNS_FLEET_{runs_field.upper()} at once (default 1).",
        required_resource_keys={"sqs", "fleet"},
    )
    @one_line_failures
    def _sensor(context: dg.SensorEvaluationContext):
        fleet: FleetSettings = context.resources.fleet
        url = getattr(fleet, f"{label}_queue_url")
        slots = getattr(fleet, runs_field)
        depth = queue_depth(context.resources.sqs.get_client(), url)
        clock = time.time()
        try:  # the cursor: the run keys' sequence, and since when messages wait (an older cursor: the sequence)
            cursor = json.loads(context.cursor or "")
            sequence, since = (cursor, None) if isinstance(cursor, int) else (int(cursor["sequence"]), cursor["since"])
        except (ValueError, KeyError, TypeError, OverflowError):  # none (deleted, or set to something else):
            sequence, since = int(clock), None  # a sequence no earlier run key has used
        try:  # a time gone by (another evaluator's clock may run a little ahead), else the wait starts over
            since = None if since is None else min(time_gone_by(since, clock + MAX_WAIT_SECONDS), clock)
        except ValueError:
            since = None
        if depth["visible"] == 0:
            context.update_cursor(json.dumps({"sequence": sequence, "since": None}))
            return dg.SkipReason(f"{queue_name(url)} is empty ({depth['in_flight']} in flight)")
        since = clock if since is None else since
        context.update_cursor(json.dumps({"sequence": sequence, "since": since}))
        if depth["visible"] < MESSAGES_PER_RUN and clock - since < MAX_WAIT_SECONDS:
            return dg.SkipReason(
                f"{depth['visible']} waiting for {clock - since:.0f} s: a drain run starts at {MESSAGES_PER_RUN} "
                f"waiting or after {MAX_WAIT_SECONDS} s"
            )
        active = context.instance.get_runs(filters=dg.RunsFilter(job_name=job_name, statuses=ACTIVE_STATUSES))
        busy = {run.tags.get(QUEUE_TAG, queue_tag) for run in active}
        free = [k for k in range(1, slots + 1) if slot_tag(queue_tag, k) not in busy]
        launch = free[: math.ceil(depth["visible"] / MESSAGES_PER_RUN)]  # one run per MESSAGES_PER_RUN waiting
        if not launch:
            going = ", ".join(still_going(run) for run in active[:slots])
            what = "drain run" if slots == 1 else f"all {slots} drain slots busy: runs"
            return dg.SkipReason(f"{depth['visible']} waiting; {what} {going}")
        context.update_cursor(json.dumps({"sequence": sequence + len(launch), "since": None}))
        return [
            dg.RunRequest(run_key=f"{label}-drain-{sequence + n}", tags={QUEUE_TAG: slot_tag(queue_tag, slot)})
            for n, slot in enumerate(launch, 1)
        ]

    return _sensor


termination_queue_sensor = queue_sensor("termination")
# every 2 minutes: housekeeping tasks are periodic clean-ups (the schedules run them directly), not waited for
housekeeping_queue_sensor = queue_sensor("housekeeping", interval=120)
