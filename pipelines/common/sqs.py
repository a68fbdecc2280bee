"""An SQS queue's name and depth, and a dead-letter queue's depth, read one way everywhere. No Dagster."""


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
    """``visible``, ``in_flight`` and ``depth``, both: a dead letter being redriven is one until deleted."""
    depth = queue_depth(sqs, dlq_url)
    return {**depth, "depth": depth["visible"] + depth["in_flight"]}
