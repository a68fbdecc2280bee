"""The alert sensor's ``AlertsHeartbeat`` datum, published at each tick where alerts can be delivered:
the template's alarm pages when none came for 10 minutes (a stopped daemon, a broken sensor, stuck sinks).
No Dagster."""

from __future__ import annotations

from pipelines.common.aws_batches import put_metrics
from pipelines.retry import fixed

HEARTBEAT_METRIC = "AlertsHeartbeat"
HEARTBEAT_POLICY = fixed(1, 3)  # a throttled PutMetricData is tried twice more within the tick


def publish_heartbeat(cloudwatch, namespace: str, env: str) -> None:
    """One datum of dimension ``Env``: deployments sharing an account and a namespace each feed their own alarm."""
    datum = {
        "MetricName": HEARTBEAT_METRIC,
        "Value": 1.0,
        "Unit": "Count",
        "Dimensions": [{"Name": "Env", "Value": env}],
    }
    put_metrics(cloudwatch, namespace, [datum], policy=HEARTBEAT_POLICY)
