"""One schedule per reclaim target (the targets file, ``pipelines.reclaim.targets``)."""

import dagster as dg

from pipelines.common.defs.cadence import schedule_cadence
from pipelines.reclaim.defs.jobs import reclaim_agendas
from pipelines.reclaim.targets import Target

TABLE_TAG = "groundskeeper/table"  # one reclaim run per table (dagster.yaml tag concurrency limit)


def schedule_for(target: Target, deployment: str, job: dg.JobDefinition = reclaim_agendas) -> dg.ScheduleDefinition:
    table = target.config["tableName"]
    name = f"reclaim_{target.name}"
    cadence = schedule_cadence(deployment, name, target.cron)
    return dg.ScheduleDefinition(
        name=name,
        job=job,
        cron_schedule=cadence.cron_schedule,
        run_config=target.config,
        tags={TABLE_TAG: table, "groundskeeper/capability": "reclaim"},
        default_status=cadence.default_status,
        description=cadence.describe(f"Reclaim stale agendas of {table} ({target.cron})."),
    )
