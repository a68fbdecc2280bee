"""Dagster wiring of POP's agenda reclaimer: the ``reclaim_agendas`` job (``jobs.py``) and one
schedule per target of the targets file it is given (``schedules.py``)."""

from collections.abc import Mapping
from pathlib import Path

import dagster as dg

from pipelines.reclaim.defs.jobs import older_run_on_same_table, reclaim_agendas, reclaim_job
from pipelines.reclaim.defs.schedules import schedule_for
from pipelines.reclaim.targets import load_targets


def build_defs(
    *,
    targets_file: Path | None = None,
    executor: dg.ExecutorDefinition | None = None,
    crons: Mapping[str, str] | None = None,
) -> dg.Definitions:
    """The job (its segments on ``executor`` when given: the cluster's Celery workers); a schedule
    per entry of ``targets_file`` (at the cron ``crons`` names for it, if any)."""
    targets = load_targets(targets_file)
    job = reclaim_job(executor) if executor else reclaim_agendas
    return dg.Definitions(jobs=[job], schedules=[schedule_for(t, job, crons) for t in targets])


__all__ = ["build_defs", "older_run_on_same_table", "schedule_for"]
