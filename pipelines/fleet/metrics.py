"""The fleet's CloudWatch metrics in as few ``PutMetricData`` calls as possible: 1000 datums a
call, with ``Values``/``Counts`` so that many samples cost one datum."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from pipelines.common import dimension_value
from pipelines.common.aws_batches import chunks, put_metrics
from pipelines.fleet import calls


class MetricBatch:
    def __init__(self) -> None:
        # (name, dimensions, unit) -> value -> count
        self._samples: dict[tuple[str, tuple[tuple[str, str], ...], str], dict[float, float]] = defaultdict(
            lambda: defaultdict(float)
        )

    def add(self, name: str, value: float, *, unit: str = "Count", **dimensions: str) -> None:
        dims = tuple(sorted((k, dimension_value(v)) for k, v in dimensions.items()))
        self._samples[(name, dims, unit)][float(value)] += 1

    def publish(self, cloudwatch, namespace: str) -> None:
        datums = []
        for (name, dims, unit), values in self._samples.items():
            for part in chunks(list(values.items()), 150):  # PutMetricData: at most 150 distinct values per datum
                datum: dict[str, Any] = {
                    "MetricName": name,
                    "Unit": unit,
                    "Values": [v for v, _ in part],
                    "Counts": [c for _, c in part],
                }
                if dims:
                    datum["Dimensions"] = [{"Name": k, "Value": v} for k, v in dims]
                datums.append(datum)
        put_metrics(cloudwatch, namespace, datums, policy=calls.POLICY)


def publish_count(cloudwatch, namespace: str, name: str, value: int) -> None:
    batch = MetricBatch()
    batch.add(name, value)
    batch.publish(cloudwatch, namespace)
