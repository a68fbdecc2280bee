"""The Dagster layer of runs-fleet's queue processors, dead-letter checks and pool audit."""

from collections.abc import Mapping

import dagster as dg

from pipelines.common.defs.metadata import CheckNotes
from pipelines.fleet.defs.checks import DLQ_ASSETS, dead_letter_checks_job, dlq_checks
from pipelines.fleet.defs.jobs import (
    QUEUE_TAG,
    housekeeping_jobs,
    process_termination_queue,
    redrive_dead_letters,
    termination_queue_job,
)
from pipelines.fleet.defs.pool_audit import (
    pool_audit_asset,
    pool_audit_job,
    pool_audit_schedule,
    pool_cost_report,
    pool_cost_report_job,
    pool_cost_report_schedule,
)
from pipelines.fleet.defs.schedules import schedules
from pipelines.fleet.defs.sensors import housekeeping_queue_sensor, termination_queue_sensor


def build_defs(
    *,
    executor: dg.ExecutorDefinition | None = None,
    crons: Mapping[str, str] | None = None,
    check_notes: CheckNotes | None = None,
) -> dg.Definitions:
    """The fleet processors: the termination drain on ``executor`` when given (the cluster's Celery
    workers), schedules at the crons ``crons`` names, a failed check with its note from ``check_notes``."""
    process_housekeeping_queue, housekeeping = housekeeping_jobs(check_notes)
    return dg.Definitions(
        assets=[*DLQ_ASSETS.values(), pool_audit_asset(check_notes), pool_cost_report],
        asset_checks=dlq_checks(check_notes),
        jobs=[
            termination_queue_job(executor) if executor else process_termination_queue,
            process_housekeeping_queue,
            housekeeping,
            redrive_dead_letters,
            dead_letter_checks_job,
            pool_audit_job,
            pool_cost_report_job,
        ],
        schedules=[*schedules(crons), pool_audit_schedule(crons), pool_cost_report_schedule],
        sensors=[termination_queue_sensor, housekeeping_queue_sensor],
    )


__all__ = ["QUEUE_TAG", "build_defs", "process_termination_queue", "termination_queue_sensor"]
