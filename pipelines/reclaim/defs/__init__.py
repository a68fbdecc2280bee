"""Dagster wiring of POP's agenda reclaimer: the ``reclaim_agendas`` job (``jobs.py``) and one
schedule per target of the deployment's targets file (``schedules.py``)."""

import dagster as dg

from pipelines.common.defs.executors import fan_out_executor
from pipelines.reclaim.defs.jobs import JOB_NAME, SegmentPlan, older_run_on_same_table, reclaim_agendas, reclaim_job
from pipelines.reclaim.defs.schedules import TABLE_TAG, schedule_for
from pipelines.reclaim.targets import load_targets, targets_path


def build_defs(deployment: str) -> dg.Definitions:
    """The job everywhere (its segments on the Celery workers under ``cluster``); a schedule per
    entry of the deployment's targets file."""
    targets = load_targets(targets_path(deployment))
    executor = fan_out_executor(deployment)
    job = reclaim_job(executor) if executor else reclaim_agendas
    return dg.Definitions(jobs=[job], schedules=[schedule_for(t, deployment, job) for t in targets])


__all__ = [
    "JOB_NAME",
    "TABLE_TAG",
    "SegmentPlan",
    "build_defs",
    "older_run_on_same_table",
    "reclaim_agendas",
    "reclaim_job",
    "schedule_for",
]
