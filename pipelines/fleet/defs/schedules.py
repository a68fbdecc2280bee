"""The housekeeping schedules (as runs-fleet's EventBridge rules) and the dead-letter checks' schedule."""

import dagster as dg

from pipelines.common.defs.cadence import schedule_cadence

HOUSEKEEPING_SCHEDULES = {
    "orphaned_instances": "*/5 * * * *",
    "stale_ssm": "*/15 * * * *",
    "old_jobs": "0 * * * *",
}


def housekeeping_schedule(task_type: str, cron: str, deployment: str) -> dg.ScheduleDefinition:
    name = f"housekeeping_{task_type}_schedule"
    cadence = schedule_cadence(deployment, name, cron)

    @dg.schedule(
        name=name,
        job_name="housekeeping",
        cron_schedule=cadence.cron_schedule,
        default_status=cadence.default_status,
        description=cadence.describe(
            f"Runs the {task_type} housekeeping task ({cron}), as runs-fleet's EventBridge rules do."
        ),
    )
    def _schedule(context: dg.ScheduleEvaluationContext):
        moment = context.scheduled_execution_time
        return dg.RunRequest(
            run_key=f"{task_type}-{moment.isoformat()}" if moment else None,
            run_config={"task_type": task_type, "timestamp": moment.isoformat() if moment else None, "params": {}},
            tags={"groundskeeper/task": task_type},
        )

    return _schedule


def schedules(deployment: str) -> list[dg.ScheduleDefinition]:
    return [
        *(housekeeping_schedule(task, cron, deployment) for task, cron in HOUSEKEEPING_SCHEDULES.items()),
        dg.ScheduleDefinition(
            name="fleet_dead_letter_checks_schedule",
            job_name="fleet_dead_letter_checks",
            cron_schedule="*/10 * * * *",
            default_status=dg.DefaultScheduleStatus.RUNNING,
            description="Every 10 minutes: depth of each fleet dead-letter queue.",
        ),
    ]
