"""Code location for the fleet benchmark's backlog measure (``benchmarks/fleet.py``): the real
``process_termination_queue`` job and ``termination_queue_sensor`` with the local resources, and
nothing else that starts runs by itself (no demo traffic, no schedules of other capabilities), so
that every run the daemon launches is a drain run the sensor asked for."""

import dagster as dg

from pipelines.fleet.defs import process_termination_queue, termination_queue_sensor
from resources import resources_for

defs = dg.Definitions(
    jobs=[process_termination_queue], sensors=[termination_queue_sensor], resources=resources_for("local")
)
