"""Is a run still queued, running or being cancelled, how a skip reason names such a run, and the runs' ends as
sensors read them."""

from collections.abc import Container, Iterable
from typing import Any

import dagster as dg

_QUEUED = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED]
ACTIVE_STATUSES = [*_QUEUED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]
"""A run being cancelled runs until it stops: Dagster's run queue counts it against the tag concurrency limits."""
_STILL = {dg.DagsterRunStatus.CANCELING: "being cancelled", **dict.fromkeys(_QUEUED, "queued")}


def still_going(run: Any) -> str:
    """How a skip reason names the run that is still going: ``<run id> is still queued`` (``running``, ``being
    cancelled``)."""
    return f"{run.run_id} is still {_STILL.get(run.status, 'running')}"


FIRST_TICK_LOOKBACK_SECONDS = 3600  # with no read position yet, the first read takes the last hour's


def first_position(instance: dg.DagsterInstance, kind, clock: float) -> int:
    """Where run events of ``kind`` are read from when none was ever read: after its last event older than an
    hour (the first read takes the last hour's), 0 when there is none. A position, never a time window: a
    later read goes on from there however long the sensor was stopped."""
    older = dg.RunStatusChangeRecordsFilter(event_type=kind, before_timestamp=clock - FIRST_TICK_LOOKBACK_SECONDS)
    records = instance.fetch_run_status_changes(older, limit=1).records
    return records[0].storage_id if records else 0


def status_changes(instance: dg.DagsterInstance, kind, after: int, limit: int) -> list:
    """At most ``limit`` run events of ``kind`` after storage id ``after``, oldest first: how the alerts sensor
    and ``delayed_run_retries`` read runs' ends (from :func:`first_position` the first time)."""
    wanted = dg.RunStatusChangeRecordsFilter(event_type=kind, after_storage_id=after)
    return instance.fetch_run_status_changes(wanted, limit=limit, ascending=True).records


def not_retried(
    instance: dg.DagsterInstance, run: Any, job_names: Container[str] | None, here: str | None
) -> str | None:
    """Why ``delayed_run_retries`` does not retry the failed ``run`` whatever its policy says (alerting reads this
    rule too), else None: a run of another code location than ``here``, of a job not in ``job_names`` (None: not
    known), that was terminated (RUN_CANCELING: by an operator or its max runtime), or that ran part of its job's
    ops or steps (an op selection, a re-execution from failure), which a run request cannot select."""
    if other_location(run, here):
        return "it is another code location's run"
    if job_names is not None and run.job_name not in job_names:
        return f"job {run.job_name} is not a named job of the code location"
    if instance.get_records_for_run(run.run_id, of_type=dg.DagsterEventType.RUN_CANCELING, limit=1).records:
        return "it was terminated"
    if run.op_selection or _some_steps(instance, run):
        return "it ran part of its job's ops or steps, and a re-launch would run the whole job"
    return None


def other_location(run: Any, here: str | None) -> bool:
    """Whether ``run`` is of another code location than ``here`` (None: not known, and then no run is)."""
    origin = run.remote_job_origin
    return bool(here and origin and origin.repository_origin.code_location_origin.location_name != here)


def run_assets(instance: dg.DagsterInstance, run: Any) -> set:
    """The assets ``run`` materializes, whichever job ran it: its asset selection, else the ones it planned."""
    if run.asset_selection:
        return set(run.asset_selection)
    kind = dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED
    planned = instance.get_records_for_run(run.run_id, of_type=kind, limit=100).records
    return {r.event_log_entry.dagster_event.asset_key for r in planned if r.event_log_entry.dagster_event}


def _some_steps(instance: dg.DagsterInstance, run: Any) -> bool:
    """Whether ``run`` ran only some of its execution plan's steps (one run in process names them all)."""
    if run.step_keys_to_execute is None:
        return False
    plan_id = run.execution_plan_snapshot_id
    plan = instance.get_execution_plan_snapshot(plan_id) if plan_id else None
    return plan is None or set(run.step_keys_to_execute) != {step.key for step in plan.steps}


def child_run(instance: dg.DagsterInstance, run_id: str, tags: Iterable[str]) -> tuple[str, str] | None:
    """The first run launched from ``run_id`` under one of ``tags`` (a re-execution's ``dagster/parent_run_id``,
    a retry's ``groundskeeper/retry_of``): (that tag, its run id), or None."""
    for tag in tags:
        records = instance.get_run_records(dg.RunsFilter(tags={tag: run_id}), limit=1)
        if records:
            return tag, records[0].dagster_run.run_id
    return None
