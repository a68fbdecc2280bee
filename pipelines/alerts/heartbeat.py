"""The alert sensor's heartbeat: one ``AlertsHeartbeat`` datum per tick at which alerts can be
delivered (every configured sink took its last message or had nothing to take). No Dagster.

The template's ``AlertsHeartbeatAlarm`` pages (through the alerts topic) when no heartbeat arrived
for 10 minutes (missing data is breaching): a stopped daemon, a broken alert sensor or sinks that
cannot deliver page too.
"""

from __future__ import annotations

from pipelines.retry import fixed, retry_call

HEARTBEAT_METRIC = "AlertsHeartbeat"
HEARTBEAT_POLICY = fixed(1, 3)  # a throttled PutMetricData is tried twice more within the tick


def publish_heartbeat(cloudwatch, namespace: str, env: str) -> None:
    """One datum of dimension ``Env`` (the template's): deployments sharing an account and a
    namespace each feed their own alarm."""
    datum = {
        "MetricName": HEARTBEAT_METRIC,
        "Value": 1.0,
        "Unit": "Count",
        "Dimensions": [{"Name": "Env", "Value": env}],
    }
    retry_call(lambda: cloudwatch.put_metric_data(Namespace=namespace, MetricData=[datum]), HEARTBEAT_POLICY)
