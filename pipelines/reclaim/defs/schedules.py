"""One schedule per reclaim target (the targets file, ``pipelines.reclaim.targets``)."""

import dagster as dg

from pipelines.reclaim.defs.jobs import reclaim_agendas
from pipelines.reclaim.targets import Target

TABLE_TAG = "groundskeeper/table"  # one reclaim run per table (dagster.yaml tag concurrency limit)


def schedule_for(target: Target, job: dg.JobDefinition = reclaim_agendas) -> dg.ScheduleDefinition:
    table = target.config["tableName"]
    return dg.ScheduleDefinition(
        name=f"reclaim_{target.name}",
        job=job,
        cron_schedule=target.cron,
        run_config=target.config,
        tags={TABLE_TAG: table, "groundskeeper/capability": "reclaim"},
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description=f"Reclaim stale agendas of {table} ({target.cron}).",
    )
