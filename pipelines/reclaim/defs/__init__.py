"""Dagster wiring of POP's agenda reclaimer: the ``reclaim_agendas`` job (``jobs.py``) and one
schedule per target of the targets file it is given."""

from collections.abc import Mapping
from pathlib import Path

import dagster as dg

from pipelines.common.defs.schedules import schedule
from pipelines.common.targets import Target
from pipelines.reclaim.defs.jobs import older_run_on_same_table, reclaim_agendas, reclaim_job
from pipelines.reclaim.targets import load_targets

TABLE_TAG = "groundskeeper/table"  # one reclaim run per table (dagster.yaml tag concurrency limit)


def schedule_for(
    target: Target, job: dg.JobDefinition = reclaim_agendas, crons: Mapping[str, str] | None = None
) -> dg.ScheduleDefinition:
    table = target.config["tableName"]
    return schedule(
        name=f"reclaim_{target.name}",
        job=job,
        cron_schedule=target.cron,
        run_config=target.config,
        tags={TABLE_TAG: table, "groundskeeper/capability": "reclaim"},
        crons=crons,
        description=f"Reclaim stale agendas of {table} ({target.cron}).",
    )


def build_defs(
    *,
    targets_file: Path | None = None,
    executor: dg.ExecutorDefinition | None = None,
    crons: Mapping[str, str] | None = None,
) -> dg.Definitions:
    """The job (its segments on ``executor`` when given: the cluster's Celery workers); a schedule
    per entry of ``targets_file`` (at the cron ``crons`` names for it, if any)."""
    job = reclaim_job(executor) if executor else reclaim_agendas
    return dg.Definitions(jobs=[job], schedules=[schedule_for(t, job, crons) for t in load_targets(targets_file)])


__all__ = ["build_defs", "older_run_on_same_table", "schedule_for"]
