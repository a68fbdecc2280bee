"""The housekeeping schedules (as runs-fleet's EventBridge rules) and the dead-letter checks' schedule."""

import datetime as dt
from collections.abc import Mapping

import dagster as dg

from pipelines.common.defs.schedules import ONE_AT_A_TIME_TAG, schedule, scheduled_time, tick_time
from pipelines.common.defs.tasks import resource_clients
from pipelines.common.looks import Look
from pipelines.common.sqs import dead_letter_depth, queue_name
from pipelines.common.task import Task
from pipelines.fleet.context import fleet_context
from pipelines.fleet.defs.checks import dead_letter_checks_job
from pipelines.fleet.housekeeping import DISPATCHER, TASKS
from resources import FleetSettings


def _request(task_type: str, context: dg.ScheduleEvaluationContext) -> dict:
    """The run config of the task's run at this tick: runs-fleet's housekeeping message."""
    moment = scheduled_time(context)
    return {"task_type": task_type, "timestamp": moment.isoformat() if moment else None, "params": {}}


def housekeeping_schedule(task: Task, crons: Mapping[str, str] | None = None) -> dg.ScheduleDefinition:
    """The ``housekeeping`` job on the task's cron, looking first with the task's look."""
    assert task.look is not None and task.cron is not None, f"{task.name} has no look"
    look_task, name = task.look, task.name

    def look(context: dg.ScheduleEvaluationContext) -> Look:
        request = DISPATCHER.parse(_request(name, context))
        params, _ = DISPATCHER.params(request)
        clients = resource_clients(context, task.look_clients)  # only the clients the look reads with, no metrics
        return look_task(fleet_context(context.resources.fleet, log=context.log, **clients), request, params)

    def request(context: dg.ScheduleEvaluationContext) -> dg.RunRequest:
        config = _request(name, context)
        return dg.RunRequest(
            run_key=f"{name}-{config['timestamp']}" if config["timestamp"] else None,
            run_config=config,
            tags={ONE_AT_A_TIME_TAG: f"housekeeping:{name}"},  # one run per task, which its value names
        )

    return schedule(
        name=f"housekeeping_{name}_schedule",
        crons=crons,
        job_name="housekeeping",
        cron_schedule=task.cron,
        look=look,
        refresh=dt.timedelta(minutes=30),  # a state look's (orphaned_instances past its query bound)
        request=request,
        required_resource_keys={"fleet", *task.look_clients},
        description=f"Runs the {name} housekeeping task ({task.cron}), as runs-fleet's EventBridge rules do. "
        f"Looks first at {task.looks_at} and skips the tick when the task would change nothing.",
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
        *(housekeeping_schedule(task, crons) for task in TASKS if task.look is not None),
        schedule(
            name="fleet_dead_letter_checks_schedule",
            crons=crons,
            job=dead_letter_checks_job,
            cron_schedule="*/10 * * * *",
            look=_dead_letter_look,
            refresh=dt.timedelta(hours=1),
            required_resource_keys={"fleet", "sqs"},
            description="Every 10 minutes: depth of each fleet dead-letter queue. Looks first (one "
            "GetQueueAttributes per dead-letter queue) and runs the checks when a depth differs from what "
            "the last checks recorded, and at least every hour.",
        ),
    ]
