"""One schedule per reclaim target (the targets file, ``pipelines.reclaim.targets``)."""

from collections.abc import Mapping

import dagster as dg

from pipelines.common.defs.schedules import schedule
from pipelines.reclaim.defs.jobs import reclaim_agendas
from pipelines.reclaim.targets import Target

TABLE_TAG = "groundskeeper/table"  # one reclaim run per table (dagster.yaml tag concurrency limit)


def schedule_for(
    target: Target, job: dg.JobDefinition = reclaim_agendas, crons: Mapping[str, str] | None = None
) -> dg.ScheduleDefinition:
    table = target.config["tableName"]
    name = f"reclaim_{target.name}"
    return schedule(
        name=name,
        job=job,
        cron_schedule=target.cron,
        run_config=target.config,
        tags={TABLE_TAG: table, "groundskeeper/capability": "reclaim"},
        crons=crons,
        description=f"Reclaim stale agendas of {table} ({target.cron}).",
    )
