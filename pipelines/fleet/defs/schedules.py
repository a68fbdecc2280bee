"""The housekeeping schedules (as runs-fleet's EventBridge rules) and the dead-letter checks' schedule.

Each looks before it launches a run (``pipelines.common.defs.schedules``): a housekeeping schedule
reads what its task would act on (``pipelines.fleet.cleanup.LOOKS``) and skips the tick when there
is nothing; the dead-letter checks run when a dead-letter queue's depth differs from what the last
checks recorded, and at least every :data:`DEAD_LETTER_REFRESH`.
"""

import datetime as dt
from collections.abc import Mapping

import dagster as dg

from pipelines.common.defs.schedules import schedule, scheduled_time, tick_time
from pipelines.common.looks import Look
from pipelines.common.sqs import dead_letter_depth, queue_name
from pipelines.fleet.cleanup import LOOKS
from pipelines.fleet.context import FleetContext, fleet_context
from pipelines.fleet.housekeeping import Housekeeping
from resources import FleetSettings

HOUSEKEEPING_SCHEDULES = {
    "orphaned_instances": "*/5 * * * *",
    "stale_ssm": "*/15 * * * *",
    "old_jobs": "0 * * * *",
}

LOOKED_AT = {
    "orphaned_instances": "managed instances launched before the task's cutoff (DescribeInstances, then a "
    "running-job query per such instance)",
    "stale_ssm": "the runner parameters and their instances (GetParametersByPath, DescribeInstances)",
    "old_jobs": "finished jobs completed before the retention cutoff (one Query of one item per final status)",
}
"""What each housekeeping schedule reads before it launches a run (said in its description)."""

DEAD_LETTER_REFRESH = dt.timedelta(hours=1)
"""The dead-letter checks run at least this often, whatever the depths."""

DISPATCHER = Housekeeping()


def _request(task_type: str, context: dg.ScheduleEvaluationContext) -> dict:
    """The run config of the task's run at this tick: runs-fleet's housekeeping message."""
    moment = scheduled_time(context)
    return {"task_type": task_type, "timestamp": moment.isoformat() if moment else None, "params": {}}


LOOK_CLIENTS = {
    "orphaned_instances": ("ec2", "dynamodb"),
    "stale_ssm": ("ssm", "ec2"),
    "old_jobs": ("dynamodb",),
}
"""The clients each look reads with (the others are not built)."""


def _look_context(context: dg.ScheduleEvaluationContext, services: tuple[str, ...]) -> FleetContext:
    """A look's context: only the clients it reads with (``services``), no metrics."""
    clients = {service: getattr(context.resources, service).get_client() for service in services}
    return fleet_context(context.resources.fleet, log=context.log, **clients)


def housekeeping_schedule(task_type: str, cron: str, crons: Mapping[str, str] | None = None) -> dg.ScheduleDefinition:
    look_task = LOOKS[task_type]

    def look(context: dg.ScheduleEvaluationContext) -> Look:
        request = DISPATCHER.parse({k: v for k, v in _request(task_type, context).items() if v is not None})
        return look_task(_look_context(context, LOOK_CLIENTS[task_type]), request)

    def request(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
        config = _request(task_type, context)
        return dg.RunRequest(
            run_key=f"{task_type}-{config['timestamp']}" if config["timestamp"] else None,
            run_config=config,
            tags={"groundskeeper/task": task_type},
        )

    return schedule(
        name=f"housekeeping_{task_type}_schedule",
        crons=crons,
        job_name="housekeeping",
        cron_schedule=cron,
        look=look,
        request=request,
        required_resource_keys={"fleet", *LOOK_CLIENTS[task_type]},
        description=f"Runs the {task_type} housekeeping task ({cron}), as runs-fleet's EventBridge rules do. "
        f"Looks first at {LOOKED_AT[task_type]} and skips the tick when the task would change nothing.",
    )


def _dead_letter_look(context: dg.ScheduleEvaluationContext) -> Look:
    fleet: FleetSettings = context.resources.fleet
    sqs = context.resources.sqs.get_client()
    urls = (fleet.termination_dlq_url, fleet.housekeeping_dlq_url)
    depths = {queue_name(url): dead_letter_depth(sqs, url) for url in urls}
    said = ", ".join(f"{name} {d['depth']}" for name, d in depths.items())
    return Look.state(depths, f"dead letters at {tick_time(context):%H:%M}: {said}")


def schedules(crons: Mapping[str, str] | None = None) -> list[dg.ScheduleDefinition]:
    return [
        *(housekeeping_schedule(task, cron, crons) for task, cron in HOUSEKEEPING_SCHEDULES.items()),
        schedule(
            name="fleet_dead_letter_checks_schedule",
            crons=crons,
            job_name="fleet_dead_letter_checks",
            cron_schedule="*/10 * * * *",
            look=_dead_letter_look,
            refresh=DEAD_LETTER_REFRESH,
            required_resource_keys={"fleet", "sqs"},
            description="Every 10 minutes: depth of each fleet dead-letter queue. Looks first (one "
            "GetQueueAttributes per dead-letter queue) and runs the checks when a depth differs from what "
            "the last checks recorded, and at least every hour.",
        ),
    ]
