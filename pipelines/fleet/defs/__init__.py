"""Dagster layer of runs-fleet's queue processors: ``jobs`` (the drain, housekeeping and redrive
jobs), ``sensors`` (one per queue), ``schedules`` (housekeeping, dead-letter checks),
``checks`` (the dead-letter queues' depth) and ``pool_audit`` (the pool audit's assets, jobs and
schedules, and the recording of a housekeeping ``pool_audit`` task)."""

import dagster as dg

from pipelines.common.defs.executors import fan_out_executor
from pipelines.fleet.defs.checks import DLQ_ASSETS, DLQ_CHECKS, dead_letter_checks_job
from pipelines.fleet.defs.jobs import (
    QUEUE_TAG,
    housekeeping_jobs,
    process_termination_queue,
    redrive_dead_letters,
    termination_queue_job,
)
from pipelines.fleet.defs.pool_audit import (
    pool_audit,
    pool_audit_job,
    pool_audit_schedule,
    pool_cost_report,
    pool_cost_report_job,
    pool_cost_report_schedule,
)
from pipelines.fleet.defs.schedules import schedules
from pipelines.fleet.defs.sensors import housekeeping_queue_sensor, termination_queue_sensor


def build_defs(deployment: str) -> dg.Definitions:
    """The same in every deployment (the fleet processors run wherever the queues are; both pool
    audit schedules are on by default), but for the termination drain's executor under ``cluster``."""
    process_housekeeping_queue, housekeeping = housekeeping_jobs()
    executor = fan_out_executor(deployment)  # cluster: termination drains are competing consumers on the workers
    return dg.Definitions(
        assets=[*DLQ_ASSETS.values(), pool_audit, pool_cost_report],
        asset_checks=DLQ_CHECKS,
        jobs=[
            termination_queue_job(executor) if executor else process_termination_queue,
            process_housekeeping_queue,
            housekeeping,
            redrive_dead_letters,
            dead_letter_checks_job,
            pool_audit_job,
            pool_cost_report_job,
        ],
        schedules=[*schedules(deployment), pool_audit_schedule(deployment), pool_cost_report_schedule],
        sensors=[termination_queue_sensor, housekeeping_queue_sensor],
    )


__all__ = ["QUEUE_TAG", "build_defs", "process_termination_queue", "termination_queue_sensor"]
