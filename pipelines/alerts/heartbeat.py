"""The alert sensor's heartbeat: one ``AlertsHeartbeat`` datum per tick. No Dagster.

The template's ``AlertsHeartbeatAlarm`` pages (through the alerts topic) when no heartbeat arrived
for 10 minutes (missing data is breaching): a stopped daemon or a broken alert sensor pages too.
"""

from __future__ import annotations

from pipelines.retry import fixed, retry_call

HEARTBEAT_METRIC = "AlertsHeartbeat"
HEARTBEAT_POLICY = fixed(1, 3)  # a throttled PutMetricData is tried twice more within the tick


def publish_heartbeat(cloudwatch, namespace: str) -> None:
    datum = {"MetricName": HEARTBEAT_METRIC, "Value": 1.0, "Unit": "Count"}
    retry_call(lambda: cloudwatch.put_metric_data(Namespace=namespace, MetricData=[datum]), HEARTBEAT_POLICY)
