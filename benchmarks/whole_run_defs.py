"""Code location for ``benchmarks/whole_run.py``'s daemon variant: one real job of Groundskeeper,
with the deployment's resources, and the one sensor that launches it, nothing else that starts runs.

``WHOLE_RUN_JOB`` names the job. ``WHOLE_RUN_SENSOR`` names the product's own sensor for it (the
termination drain: ``termination_queue_sensor``, which decides itself, from the queue, when to
launch); without it, a benchmark sensor launches one run of the job with ``WHOLE_RUN_CONFIG`` (JSON)
and ``WHOLE_RUN_TAGS`` (JSON), as the product's schedule or decider would, through the same daemon,
queue, run launcher and run worker.
"""

from __future__ import annotations

import json
import os

import dagster as dg

from pipelines import definitions as groundskeeper
from resources import deployment_name, resources_for


def _subset() -> dg.Definitions:
    full = groundskeeper.defs  # the code location's own (a second Definitions at module scope is refused)
    job = next(j for j in full.jobs if j.name == os.environ["WHOLE_RUN_JOB"])
    sensor_name = os.environ.get("WHOLE_RUN_SENSOR")
    if sensor_name:
        sensor = next(s for s in full.sensors if s.name == sensor_name)
    else:

        @dg.sensor(
            name="whole_run_once",
            job_name=job.name,
            minimum_interval_seconds=5,
            default_status=dg.DefaultSensorStatus.RUNNING,
        )
        def sensor(context: dg.SensorEvaluationContext):
            return dg.RunRequest(
                run_key="whole-run",  # once per instance
                run_config=json.loads(os.environ.get("WHOLE_RUN_CONFIG", "{}")),
                tags=json.loads(os.environ.get("WHOLE_RUN_TAGS", "{}")),
            )

    return dg.Definitions(
        assets=full.assets,  # an asset job (receiver_batches_job) needs its assets
        asset_checks=full.asset_checks,
        jobs=[job],
        sensors=[sensor],
        resources=resources_for(deployment_name()),
        executor=dg.in_process_executor,  # as pipelines/definitions.py
    )


defs = _subset()
