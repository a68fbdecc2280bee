"""The queue sensors: launch a drain run when messages wait and no drain run of that queue is going."""

import dagster as dg

from pipelines.common.defs import active_run, aws_errors, still_going
from pipelines.fleet.aws import queue_depth, queue_name
from pipelines.fleet.defs.jobs import HOUSEKEEPING_QUEUE, QUEUE_TAG, TERMINATION_QUEUE
from resources import FleetSettings


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
        active = active_run(context.instance, job_name)
        if active is not None:
            return dg.SkipReason(f"{depth['visible']} waiting; drain run {still_going(active)}")
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
