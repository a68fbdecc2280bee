"""CloudWatch metrics of progressor zombie collection and health. No Dagster: takes a boto3 client.

Progressor exports only Prometheus histograms and no count of collected zombies, so Groundskeeper adds:

- ``ProgressorZombiesCollected`` (Count): zombies errored or retried by a ``collect_zombies`` run;
- ``ProgressorOverdueTimers`` (Count): waiting timers more than 2 x task_scan_timeout overdue;
- ``ProgressorTaskDuration`` (Milliseconds, dimension ``TaskType`` too): the last 24 h of finished tasks
  as a CloudWatch value/count set, one value per progressor bucket (its upper bound; the overflow bucket
  sends the largest observed duration).

Dimension ``Namespace`` = the progressor namespace id. Dimension values are cleaned as the fleet's
are (:func:`pipelines.common.dimension_value`: printable ASCII, which CloudWatch requires).
"""

from __future__ import annotations

from typing import Any

from pipelines.common import dimension_value
from pipelines.progressor.health import BUCKETS_MS, Health


def _dims(namespace: str, **extra: str) -> list[dict[str, str]]:
    values = {"Namespace": namespace, **extra}
    return [{"Name": k, "Value": dimension_value(v)} for k, v in values.items()]


def collection_datums(namespace: str, collected: int) -> list[dict[str, Any]]:
    return [
        {
            "MetricName": "ProgressorZombiesCollected",
            "Dimensions": _dims(namespace),
            "Value": collected,
            "Unit": "Count",
        }
    ]


def health_datums(health: Health) -> list[dict[str, Any]]:
    datums: list[dict[str, Any]] = [
        {
            "MetricName": "ProgressorOverdueTimers",
            "Dimensions": _dims(health.namespace),
            "Value": health.overdue_timers,
            "Unit": "Count",
        }
    ]
    for task_type, counts in sorted(health.durations.items()):
        values = [*map(float, BUCKETS_MS), max(float(BUCKETS_MS[-1]) + 1, health.duration_max_ms[task_type])]
        pairs = [(v, c) for v, c in zip(values, counts, strict=True) if c]
        if pairs:
            datums.append(
                {
                    "MetricName": "ProgressorTaskDuration",
                    "Dimensions": _dims(health.namespace, TaskType=task_type),
                    "Values": [v for v, _ in pairs],
                    "Counts": [float(c) for _, c in pairs],
                    "Unit": "Milliseconds",
                }
            )
    return datums
