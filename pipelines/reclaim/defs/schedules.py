"""One schedule per reclaim target (the targets file, ``pipelines.reclaim.targets``)."""

from collections.abc import Mapping

import dagster as dg

from pipelines.common.defs.cadence import schedule_cadence
from pipelines.reclaim.defs.jobs import reclaim_agendas
from pipelines.reclaim.targets import Target

TABLE_TAG = "groundskeeper/table"  # one reclaim run per table (dagster.yaml tag concurrency limit)


def schedule_for(
    target: Target, job: dg.JobDefinition = reclaim_agendas, crons: Mapping[str, str] | None = None
) -> dg.ScheduleDefinition:
    table = target.config["tableName"]
    name = f"reclaim_{target.name}"
    cadence = schedule_cadence(name, target.cron, crons)
    return dg.ScheduleDefinition(
        name=name,
        job=job,
        cron_schedule=cadence.cron_schedule,
        run_config=target.config,
        tags={TABLE_TAG: table, "groundskeeper/capability": "reclaim"},
        default_status=cadence.default_status,
        description=cadence.describe(f"Reclaim stale agendas of {table} ({target.cron})."),
    )
