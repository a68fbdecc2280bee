"""The one "is a run of this job still queued or running" check (:func:`active_run`), for sensors
and schedules that skip their tick (with a ``SkipReason`` naming the run, :func:`still_going`)
instead of piling up runs in the queue; :func:`exclusive_schedule` is such a schedule."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster as dg

from pipelines.common.defs.cadence import schedule_cadence

ACTIVE_STATUSES = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]
"""A run in one of these is still queued or running (it has not finished, failed or been canceled)."""


def active_run(instance: dg.DagsterInstance, job_name: str, tags: Mapping[str, str] | None = None) -> Any:
    """The newest run of ``job_name`` (with all of ``tags``) that is still queued or running, or None."""
    runs = instance.get_runs(
        filters=dg.RunsFilter(job_name=job_name, statuses=ACTIVE_STATUSES, tags=dict(tags or {})), limit=1
    )
    return runs[0] if runs else None


def still_going(run: Any) -> str:
    """How a skip reason names the run that is still going: ``<run id> is still queued``."""
    state = "queued" if run.status in (dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED) else "running"
    return f"{run.run_id} is still {state}"


def exclusive_schedule(
    *,
    name: str,
    job: Any,
    cron_schedule: str,
    description: str,
    crons: Mapping[str, str] | None = None,
    default_status: dg.DefaultScheduleStatus = dg.DefaultScheduleStatus.RUNNING,
    run_config: Mapping[str, Any] | None = None,
    tags: Mapping[str, str] | None = None,
    same_run_tags: Mapping[str, str] | None = None,
) -> dg.ScheduleDefinition:
    """A schedule that launches ``job`` (with ``run_config`` and ``tags``) unless a run of the same
    job (with ``same_run_tags``, e.g. the same namespace) is still queued or running: then the tick
    skips and says which run. ``cron_schedule`` is its own cadence, unless ``crons`` names another
    (``schedule_cadence``)."""
    job_name = job.name
    cadence = schedule_cadence(name, cron_schedule, crons, default_status)

    def evaluate(context: dg.ScheduleEvaluationContext):
        try:
            instance = context.instance
        except dg.DagsterInvariantViolationError:  # a bare build_schedule_context() in a test: no runs
            instance = None
        previous = active_run(instance, job_name, same_run_tags) if instance is not None else None
        if previous is not None:
            return dg.SkipReason(f"the previous {job_name} run {still_going(previous)}: not queueing another")
        return dg.RunRequest(run_config=dict(run_config or {}), tags=dict(tags or {}))

    return dg.ScheduleDefinition(
        name=name,
        job=job,
        cron_schedule=cadence.cron_schedule,
        execution_fn=evaluate,
        default_status=cadence.default_status,
        description=cadence.describe(f"{description} Skips a tick while the previous run is still queued or running."),
    )
