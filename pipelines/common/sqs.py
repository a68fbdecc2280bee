"""What every capability reads of an SQS queue: its name (from its URL) and its depth, and a
dead-letter queue's depth, read one way for the fleet's checks, their schedule's look and the
alerts. No Dagster."""

from __future__ import annotations


def queue_name(queue_url: str) -> str:
    """The queue's name: the last segment of its URL (``.../123456789012/runs-fleet-termination``)."""
    return queue_url.rstrip("/").rsplit("/", 1)[-1]


def queue_depth(sqs, queue_url: str) -> dict[str, int]:
    """Visible and in-flight messages (one ``GetQueueAttributes``)."""
    attrs = sqs.get_queue_attributes(
        QueueUrl=queue_url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return {
        "visible": int(attrs.get("ApproximateNumberOfMessages", 0)),
        "in_flight": int(attrs.get("ApproximateNumberOfMessagesNotVisible", 0)),
    }


def dead_letter_depth(sqs, dlq_url: str) -> dict[str, int]:
    """A dead-letter queue's depth: ``depth`` counts its messages visible and in flight (a dead letter
    that is being redriven or inspected is one until it is deleted), beside ``visible`` and
    ``in_flight``. One ``GetQueueAttributes``."""
    depth = queue_depth(sqs, dlq_url)
    return {**depth, "depth": depth["visible"] + depth["in_flight"]}
