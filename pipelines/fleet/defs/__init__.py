"""Dagster layer of runs-fleet's queue processors: ``jobs`` (the drain, housekeeping and redrive
jobs), ``sensors`` (one per queue), ``schedules`` (housekeeping, dead-letter checks) and
``checks`` (the dead-letter queues' depth)."""

from collections.abc import Mapping

import dagster as dg

from pipelines.common.defs import fan_out_executor
from pipelines.fleet.defs.checks import DLQ_ASSETS, DLQ_CHECKS, dead_letter_checks_job
from pipelines.fleet.defs.jobs import (
    QUEUE_TAG,
    ResultHook,
    housekeeping_jobs,
    process_termination_queue,
    redrive_dead_letters,
    termination_queue_job,
)
from pipelines.fleet.defs.schedules import schedules
from pipelines.fleet.defs.sensors import housekeeping_queue_sensor, termination_queue_sensor
from pipelines.fleet.housekeeping import Housekeeping, Task


def build_defs(
    deployment: str,
    *,
    housekeeping_tasks: Mapping[str, Task] | None = None,
    result_hooks: Mapping[str, ResultHook] | None = None,
) -> dg.Definitions:
    """The same in every deployment (the fleet processors run wherever the queues are), but for the
    termination drain's executor under ``cluster``.

    ``housekeeping_tasks`` are dispatched besides runs-fleet's own; ``result_hooks`` record a task's
    typed result as Dagster events (both wired in by ``pipelines/definitions.py``)."""
    process_housekeeping_queue, housekeeping = housekeeping_jobs(Housekeeping(housekeeping_tasks), result_hooks)
    executor = fan_out_executor(deployment)  # cluster: termination drains are competing consumers on the workers
    return dg.Definitions(
        assets=list(DLQ_ASSETS.values()),
        asset_checks=DLQ_CHECKS,
        jobs=[
            termination_queue_job(executor) if executor else process_termination_queue,
            process_housekeeping_queue,
            housekeeping,
            redrive_dead_letters,
            dead_letter_checks_job,
        ],
        schedules=schedules(),
        sensors=[termination_queue_sensor, housekeeping_queue_sensor],
    )


__all__ = ["QUEUE_TAG", "build_defs", "process_termination_queue", "termination_queue_sensor"]
