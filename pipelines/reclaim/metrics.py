"""CloudWatch metrics of a reclaim run: one metric per action, dimension ``TableName``. No Dagster."""

from __future__ import annotations

from typing import Any

from pipelines.common.aws_batches import put_metrics

# Counts field -> metric name (namespace RUNS_FLEET_METRICS_NAMESPACE, default RunsFleet).
ACTION_METRICS = {
    "reclaimed": "AgendaReclaimFailed",
    "retried": "AgendaReclaimRetried",
    "held": "AgendaReclaimHeld",
    "queued": "AgendaReclaimQueued",
    "exhausted": "AgendaReclaimExhausted",
    "raced": "AgendaReclaimRaced",
    "skipped": "AgendaReclaimSkipped",
    "errors": "AgendaReclaimErrors",
}


def put_reclaim_metrics(cloudwatch, namespace: str, table: str, counts: dict[str, Any]) -> int:
    """One PutMetricData call (retried after a transient error) with a datum per action (zeros
    included, so alarms see quiet runs)."""
    data = [
        {
            "MetricName": metric,
            "Dimensions": [{"Name": "TableName", "Value": table}],
            "Value": float(counts.get(field, 0)),
            "Unit": "Count",
        }
        for field, metric in ACTION_METRICS.items()
    ]
    put_metrics(cloudwatch, namespace, data)
    return len(data)
