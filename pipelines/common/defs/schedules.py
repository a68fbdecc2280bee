"""The one schedule factory, :func:`schedule`, of every schedule."""

import datetime as dt
import math
from collections.abc import Callable, Mapping
from typing import Any

import dagster as dg

from pipelines.common import first_line
from pipelines.common.defs.active_runs import ACTIVE_STATUSES, still_going
from pipelines.common.looks import Look

SCHEDULE_TAG = "dagster/schedule_name"
"""Dagster's tag on every run a schedule launches: which schedule (the last run of this schedule)."""

ONE_AT_A_TIME_TAG = "groundskeeper/one_at_a_time"
"""The instance runs one run per value at a time: a job's own name on the job (a Launchpad run holds it too),
``housekeeping:<task>`` on a housekeeping schedule's runs (one per task)."""


LOOK_TAG = "groundskeeper/look"
"""The fingerprint of the state the schedule's look read before the run (state looks)."""

REFRESH_SLACK = dt.timedelta(minutes=1)
"""A run created a few seconds after its tick counts as of that tick: the refresh is due this much early."""


def scheduled_time(context: dg.ScheduleEvaluationContext) -> dt.datetime | None:
    try:
        return context.scheduled_execution_time
    except Exception:  # build_schedule_context() without scheduled_execution_time: Dagster's check fails
        return None


def tick_time(context: dg.ScheduleEvaluationContext) -> dt.datetime:
    """The tick's scheduled time (UTC), or now for a context built without one."""
    return (scheduled_time(context) or dt.datetime.now(dt.UTC)).astimezone(dt.UTC)


def _ago(delta: dt.timedelta) -> str:
    minutes = int(delta.total_seconds() // 60)
    return f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{minutes} min"


def against_last_run(
    context: dg.ScheduleEvaluationContext, instance: Any, look: Look, job_name: str, name: str, refresh: dt.timedelta
) -> Look:
    """A state look decided against the last run of the schedule ``name``: due when there is none, it did
    not succeed, it read another state or it is ``refresh`` old."""
    filters = dg.RunsFilter(job_name=job_name, tags={SCHEDULE_TAG: name})
    records = instance.get_run_records(filters, limit=1) if instance is not None else []

    def decided(due: bool, why: str) -> Look:
        return Look(due, look.reason + why, look.fingerprint)

    if not records:
        return decided(True, "; no earlier run of this schedule")
    run, created = records[0].dagster_run, records[0].create_timestamp
    created = created.replace(tzinfo=dt.UTC) if created.tzinfo is None else created.astimezone(dt.UTC)
    if run.tags.get(LOOK_TAG) != look.fingerprint:
        return decided(True, f"; changed since run {run.run_id[:8]}")
    if run.status in ACTIVE_STATUSES:
        return decided(False, f": unchanged, and run {still_going(run)}")
    if run.status != dg.DagsterRunStatus.SUCCESS:
        return decided(True, f"; the last run {run.run_id[:8]} ended {run.status.value.lower()}")
    age = tick_time(context) - created
    if age >= refresh - REFRESH_SLACK:
        return decided(
            True, f"; unchanged, the last run {run.run_id[:8]} was {_ago(age)} ago (at least every {_ago(refresh)})"
        )
    due = dt.datetime.fromtimestamp(math.ceil((created + refresh - REFRESH_SLACK).timestamp() / 60) * 60, dt.UTC)
    return decided(
        False,
        f": unchanged since run {run.run_id[:8]} at {created:%H:%M} UTC; runs when it changes, "
        f"or at its first tick from {due:%H:%M} UTC",  # a whole minute, as a cron's ticks are
    )


def held_by(instance: dg.DagsterInstance, tags: Mapping[str, str]) -> Any:
    """The newest active run that a run with ``tags`` would wait for (a tag concurrency limit), or None."""
    queue = instance.get_concurrency_config().run_queue_config
    for limit in queue.tag_concurrency_limits if queue is not None else ():
        key, value = limit["key"], limit.get("value")
        if key not in tags or (value is not None and not isinstance(value, dict) and value != tags[key]):
            continue
        held = dg.RunsFilter(statuses=ACTIVE_STATUSES, tags={key: tags[key]})
        if instance.get_runs_count(held) >= limit["limit"]:
            return instance.get_runs(held, limit=1)[0]
    return None


def schedule(
    *,
    name: str,
    cron_schedule: str,
    description: str,
    job: Any = None,
    job_name: str | None = None,
    look: Callable[[dg.ScheduleEvaluationContext], Look] | None = None,
    refresh: dt.timedelta | None = None,
    request: Callable[[dg.ScheduleEvaluationContext], dg.RunRequest | dg.SkipReason] | None = None,
    run_config: Mapping[str, Any] | None = None,
    tags: Mapping[str, str] | None = None,
    required_resource_keys: set[str] | None = None,
    execution_timezone: str | None = None,
    crons: Mapping[str, str] | None = None,
    default_status: dg.DefaultScheduleStatus = dg.DefaultScheduleStatus.RUNNING,
) -> dg.ScheduleDefinition:
    """Each tick launches ``request(context)`` (default: ``run_config`` and ``tags``), unless the run
    would wait on a tag concurrency limit or ``look`` does not find it due (``refresh``: for a state
    look, the longest time between two runs)."""
    target = job.name if job is not None else job_name
    assert target is not None, "schedule needs job or job_name"
    cron = (crons or {}).get(name, cron_schedule)  # the code location's cron for it, else its own
    if cron != cron_schedule:
        description = f"{description} This code location runs it on {cron}, not {cron_schedule}."
    job_tags = dict(getattr(job, "tags", None) or {})

    def evaluate(context: dg.ScheduleEvaluationContext):
        run = request(context) if request else dg.RunRequest(run_config=dict(run_config or {}), tags=dict(tags or {}))
        if isinstance(run, dg.SkipReason):  # the request decides there is nothing to launch
            return run
        try:
            instance = context.instance
        except dg.DagsterInvariantViolationError:  # a bare build_schedule_context() in a test: no runs
            instance = None
        previous = held_by(instance, {**job_tags, **(run.tags or {})}) if instance is not None else None
        if previous is not None:
            return dg.SkipReason(f"the previous {previous.job_name} run {still_going(previous)}: not queueing another")
        if look is None:
            return run
        try:
            found = look(context)
        except Exception as exc:  # due, so that the run shows the problem
            found = Look(True, f"could not look ({type(exc).__name__}: {first_line(exc)}): running to be sure")
        if found.fingerprint is not None:
            if refresh is None:
                raise ValueError(f"{name}: a state look needs a refresh interval")
            found = against_last_run(context, instance, found, target, name, refresh)
        if not found.due:
            return dg.SkipReason(found.reason)
        context.log.info(f"launching {target}: {found.reason}")
        if found.fingerprint is not None:  # a state look's, for the next tick (Dagster adds the schedule's tag)
            run = run.with_replaced_attrs(tags={**(run.tags or {}), LOOK_TAG: found.fingerprint})
        return run

    return dg.ScheduleDefinition(
        name=name,
        job=job,
        job_name=None if job is not None else job_name,
        cron_schedule=cron,
        execution_fn=evaluate,
        execution_timezone=execution_timezone,
        default_status=default_status,
        required_resource_keys=set(required_resource_keys or ()),
        description=description,
    )
