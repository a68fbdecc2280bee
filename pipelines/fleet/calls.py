"""runs-fleet's AWS calls, each retried by the retry library's ``runs-fleet`` preset; metrics in as few
``PutMetricData`` calls as possible (1000 datums a call, ``Values``/``Counts``: many samples, one datum)."""

import logging
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from typing import TypeVar

from botocore.exceptions import ClientError

from pipelines.common import dimension_value
from pipelines.common.aws_batches import CALL_POLICY, chunks, no_such_object, put_metrics, retry_note
from pipelines.retry import retry_call

T = TypeVar("T")
log = logging.getLogger(__name__)

POLICY = CALL_POLICY
"""Read at each call (tests replace it with a policy that does not wait)."""


def aws_call(operation: Callable[[], T], *, what: str = "AWS call") -> T:
    """``operation()`` retried by :data:`POLICY` after a transient AWS error."""
    return retry_call(operation, POLICY, on_retry=retry_note(what, log))


def put_object(s3, bucket: str, key: str, body: bytes, *, what: str = "AWS call", **options: str) -> None:
    """One retried ``PutObject``; ``options`` such as ``ContentType``."""
    aws_call(lambda: s3.put_object(Bucket=bucket, Key=key, Body=body, **options), what=what)


def read_object(s3, bucket: str, key: str, *, what: str = "AWS call") -> bytes | None:
    """One retried ``GetObject``: the object's body, or None when there is no such object."""
    try:
        return aws_call(lambda: s3.get_object(Bucket=bucket, Key=key)["Body"].read(), what=what)
    except ClientError as exc:
        if no_such_object(exc):
            return None
        raise


def delete_parameters(ssm, names: Sequence[str], counts: Counter | None = None) -> Counter:
    """``DeleteParameters`` in tens, counted into ``counts`` as each ten is deleted (a later ten failing leaves
    the earlier counted). A parameter that is already gone counts as ``missing``, not an error."""
    counts = Counter(deleted=0, missing=0) if counts is None else counts
    for batch in chunks(sorted(set(names)), 10):
        response = aws_call(lambda batch=batch: ssm.delete_parameters(Names=list(batch)), what="DeleteParameters")
        counts["deleted"] += len(response.get("DeletedParameters", []))
        counts["missing"] += len(response.get("InvalidParameters", []))
    return counts


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
        datums = [
            {"MetricName": name, "Unit": unit, "Values": [v for v, _ in part], "Counts": [c for _, c in part]}
            | ({"Dimensions": [{"Name": k, "Value": v} for k, v in dims]} if dims else {})
            for (name, dims, unit), values in self._samples.items()
            for part in chunks(list(values.items()), 150)  # PutMetricData: at most 150 distinct values per datum
        ]
        put_metrics(cloudwatch, namespace, datums, policy=POLICY)


def publish_count(cloudwatch, namespace: str, name: str, value: int) -> None:
    batch = MetricBatch()
    batch.add(name, value)
    batch.publish(cloudwatch, namespace)
