"""CloudWatch metrics of progressor zombie collection and health (docs/progressor.md, "Metrics"): progressor
exports only Prometheus histograms, no count of collected zombies. No Dagster."""

from __future__ import annotations

from typing import Any

from pipelines.common import dimension_value
from pipelines.progressor.health import BUCKETS_MS, Health


def _dims(namespace: str, **extra: str) -> list[dict[str, str]]:
    return [{"Name": k, "Value": dimension_value(v)} for k, v in {"Namespace": namespace, **extra}.items()]


def _count(metric: str, namespace: str, value: int) -> dict[str, Any]:
    return {"MetricName": metric, "Dimensions": _dims(namespace), "Value": value, "Unit": "Count"}


def collection_datums(namespace: str, collected: int) -> list[dict[str, Any]]:
    return [_count("ProgressorZombiesCollected", namespace, collected)]


def health_datums(health: Health) -> list[dict[str, Any]]:
    """Overdue timers, and the last 24 h of task durations per task_type as a value/count set: one value per
    bucket, its upper bound (the overflow bucket's is the largest duration seen)."""
    datums = [_count("ProgressorOverdueTimers", health.namespace, health.overdue_timers)]
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
