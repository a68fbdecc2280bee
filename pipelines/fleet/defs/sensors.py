"""The queue sensors: launch a drain run when messages wait and no drain run of that queue is going."""

import dagster as dg

from pipelines.common.defs import aws_errors
from pipelines.fleet.aws import queue_depth, queue_name
from pipelines.fleet.defs.jobs import HOUSEKEEPING_QUEUE, QUEUE_TAG, TERMINATION_QUEUE
from resources import FleetSettings

ACTIVE = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]


def queue_sensor(name: str, job_name: str, queue_field: str, label: str, queue_tag: str) -> dg.SensorDefinition:
    @dg.sensor(
        name=name,
        job_name=job_name,
        minimum_interval_seconds=30,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Launches a {job_name} run when messages wait on the {label} queue (one GetQueueAttributes).",
        required_resource_keys={"sqs", "fleet"},
    )
    def _sensor(context: dg.SensorEvaluationContext):
        fleet: FleetSettings = context.resources.fleet
        url = getattr(fleet, queue_field)
        with aws_errors(context):
            depth = queue_depth(context.resources.sqs.get_client(), url)
        if depth["visible"] == 0:
            return dg.SkipReason(f"{queue_name(url)} is empty ({depth['in_flight']} in flight)")
        active = context.instance.get_runs(filters=dg.RunsFilter(job_name=job_name, statuses=ACTIVE), limit=1)
        if active:
            return dg.SkipReason(f"{depth['visible']} waiting; drain run {active[0].run_id} is still going")
        sequence = int(context.cursor or 0) + 1
        context.update_cursor(str(sequence))
        return dg.RunRequest(run_key=f"{label}-drain-{sequence}", tags={QUEUE_TAG: queue_tag})

    return _sensor


termination_queue_sensor = queue_sensor(
    "termination_queue_sensor", "process_termination_queue", "termination_queue_url", "termination", TERMINATION_QUEUE
)
housekeeping_queue_sensor = queue_sensor(
    "housekeeping_queue_sensor",
    "process_housekeeping_queue",
    "housekeeping_queue_url",
    "housekeeping",
    HOUSEKEEPING_QUEUE,
)
