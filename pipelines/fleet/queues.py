"""SQS calls within SQS's limits, and dead-lettering (docs/fleet.md, "Poison messages and dead letters")."""

import base64
import json
import logging
import re
from collections.abc import Sequence
from typing import Any

from pipelines.common.aws_batches import chunks, error_code
from pipelines.common.sqs import queue_name
from pipelines.fleet.calls import aws_call, put_object
from pipelines.fleet.messages import fingerprint

log = logging.getLogger(__name__)


def receive(
    sqs, queue_url: str, *, max_messages: int = 10, wait_seconds: int = 0, visibility: int | None = None
) -> list[dict[str, Any]]:
    """Up to ``max_messages`` (at most 10) messages with all their attributes; ``visibility``: default the queue's."""
    hidden = {} if visibility is None else {"VisibilityTimeout": visibility}
    return aws_call(
        lambda: sqs.receive_message(
            QueueUrl=queue_url,
            MaxNumberOfMessages=max(1, min(10, max_messages)),
            WaitTimeSeconds=wait_seconds,
            AttributeNames=["All"],
            MessageAttributeNames=["All"],
            **hidden,
        ).get("Messages", []),
        what="ReceiveMessage",
    )


def delete_messages(sqs, queue_url: str, messages: Sequence[dict[str, Any]]) -> list[str]:
    """The ids of the messages that could not be deleted."""
    failed: list[str] = []
    for batch in chunks(list(messages), 10):
        entries = [{"Id": str(n), "ReceiptHandle": m["ReceiptHandle"]} for n, m in enumerate(batch)]
        try:
            response = aws_call(
                lambda entries=entries: sqs.delete_message_batch(QueueUrl=queue_url, Entries=entries),
                what="DeleteMessageBatch",
            )
        except Exception as exc:  # after runs-fleet's retries: these come back after their visibility timeout
            log.error("DeleteMessageBatch of %d message(s) failed: %s", len(batch), exc)
            failed += [m["MessageId"] for m in batch]
            continue
        for entry in response.get("Failed", []):
            message = batch[int(entry["Id"])]
            failed.append(message["MessageId"])
            log.warning("could not delete message %s: %s", message["MessageId"], entry.get("Message"))
    return failed


MAX_BATCH_ENTRIES = 10  # SendMessageBatch / DeleteMessageBatch entries
MAX_MESSAGE_BYTES = 256 * 1024  # one message, body and attributes; a bigger dead letter goes to S3
MAX_BATCH_BYTES = 1024 * 1024  # one SendMessageBatch, all entries together
MAX_ATTRIBUTES = 10  # message attributes per message
_NOT_SQS_TEXT = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")  # in an attribute


def clean_attribute(value: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in value.items() if k in {"DataType", "StringValue", "BinaryValue"}}


def message_size(body: str, attributes: dict[str, dict[str, Any]]) -> int:
    """What SQS counts against its size limits: body, and each attribute's name, type and value."""
    size = len(body.encode("utf-8", "surrogatepass"))
    for name, value in attributes.items():
        size += len(name.encode()) + len(value.get("DataType", "").encode()) + len(value.get("BinaryValue", b""))
        size += len(value.get("StringValue", "").encode("utf-8", "surrogatepass"))
    return size


def send_entries(sqs, queue_url: str, outgoing: Sequence[tuple[str, dict[str, Any]]]) -> list[str | None]:
    """``SendMessageBatch`` of (body, attributes) within SQS's batch limits. Returns, per entry, None
    when sent or why not: a failed entry or a failed call fails those entries only, never the rest."""
    errors: list[str | None] = [None] * len(outgoing)
    batches: list[list[int]] = []  # indexes, by SendMessageBatch's limits: 10 entries and 1 MiB together
    total = 0
    for n, (body, attrs) in enumerate(outgoing):
        size = message_size(body, attrs)
        if not batches or len(batches[-1]) == MAX_BATCH_ENTRIES or total + size > MAX_BATCH_BYTES:
            batches.append([])
            total = 0
        batches[-1].append(n)
        total += size
    for batch in batches:
        entries = [{"Id": str(n), "MessageBody": outgoing[n][0], "MessageAttributes": outgoing[n][1]} for n in batch]
        try:
            response = aws_call(
                lambda entries=entries: sqs.send_message_batch(QueueUrl=queue_url, Entries=entries),
                what="SendMessageBatch",
            )
        except Exception as exc:  # after runs-fleet's retries
            log.error("SendMessageBatch to %s failed for %d message(s): %s", queue_name(queue_url), len(batch), exc)
            for n in batch:
                errors[n] = f"{error_code(exc)}: {exc}"
            continue
        ok = {entry["Id"] for entry in response.get("Successful", [])}
        failed = {entry["Id"]: entry for entry in response.get("Failed", [])}
        for n in batch:
            if str(n) not in ok:
                entry = failed.get(str(n), {})
                errors[n] = f"{entry.get('Code', 'not sent')}: {entry.get('Message', '')}"
    return errors


REASON_ATTRIBUTE = "groundskeeper-reason"
SOURCE_ATTRIBUTE = "groundskeeper-source-queue"
ENVELOPE_ATTRIBUTE = "groundskeeper-envelope"
ENVELOPE = "groundskeeper-dead-letter"


def _json_attributes(attrs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Message attributes as JSON (a binary value in base64)."""
    return {
        name: {k: base64.b64encode(v).decode() if isinstance(v, bytes | bytearray) else v for k, v in value.items()}
        for name, value in attrs.items()
    }


def dead_letter_entry(message: dict[str, Any], reason: str, source: str, s3, bucket: str) -> tuple[str, dict[str, Any]]:
    """The (body, attributes) that dead-letters ``message`` with ``reason``: envelope and S3 pointer as
    docs/fleet.md, "Poison messages and dead letters", describes them."""
    ours = {REASON_ATTRIBUTE: _NOT_SQS_TEXT.sub("?", " ".join(reason.split()))[:1000], SOURCE_ATTRIBUTE: source}
    originals = {
        name: clean_attribute(value)
        for name, value in (message.get("MessageAttributes") or {}).items()
        if name not in (REASON_ATTRIBUTE, SOURCE_ATTRIBUTE, ENVELOPE_ATTRIBUTE)
        and not name.startswith("groundskeeper-dlq")
    }
    original = body = message.get("Body") or ""
    room = MAX_ATTRIBUTES - len(ours)
    kept = originals
    if len(originals) > room:
        names = list(originals)
        kept = {k: originals[k] for k in names[: room - 1]}  # one more slot for the envelope marker
        moved = {k: originals[k] for k in names[room - 1 :]}
        ours[ENVELOPE_ATTRIBUTE] = "attributes"
        body = json.dumps(
            {"envelope": ENVELOPE, "body": body, "message_attributes": _json_attributes(moved)}, ensure_ascii=False
        )
    attrs = {**kept, **{k: {"DataType": "String", "StringValue": v} for k, v in ours.items()}}
    if message_size(body, attrs) <= MAX_MESSAGE_BYTES:
        return body, attrs
    key = f"dead-letters/{source}/oversized/{fingerprint(original)}.json"
    record = {
        "message_id": message.get("MessageId"),
        "reason": reason,
        "source_queue": source,
        "body": original,
        "message_attributes": _json_attributes(message.get("MessageAttributes") or {}),
    }
    data = json.dumps(record, ensure_ascii=False).encode("utf-8", "surrogatepass")
    put_object(s3, bucket, key, data, what="PutObject (oversized dead letter)", ContentType="application/json")
    pointer = {
        "envelope": ENVELOPE,
        "body_s3": f"s3://{bucket}/{key}",
        "body_bytes": len(original.encode("utf-8", "surrogatepass")),
        "body_sha256": fingerprint(original),
    }
    ours[ENVELOPE_ATTRIBUTE] = "s3"
    return json.dumps(pointer), {k: {"DataType": "String", "StringValue": v} for k, v in ours.items()}


def dead_letter_into(handler, poison: Sequence[tuple[dict[str, Any], str]], counts, to_ack: list) -> None:
    """Send (message, reason) pairs from ``handler``'s queue to its dead-letter queue (:func:`dead_letter_entry`)
    and count them; those sent join ``to_ack``, the rest stay in the queue (``dead_letter_failed``)."""
    if not poison:
        return
    sqs, ctx, dlq_url, source = handler.sqs, handler.ctx, handler.dlq_url, queue_name(handler.queue_url)
    ready: list[tuple[dict[str, Any], tuple[str, dict[str, Any]]]] = []
    unsent: list[dict[str, Any]] = []
    for message, reason in poison:
        try:
            ready.append((message, dead_letter_entry(message, reason, source, ctx.s3, ctx.archive_bucket)))
        except Exception as exc:
            log.error("could not dead-letter %s (%s), left in the queue: %s", message.get("MessageId"), reason, exc)
            unsent.append(message)
    errors = send_entries(sqs, dlq_url, [entry for _, entry in ready])
    sent = [m for (m, _), error in zip(ready, errors, strict=True) if error is None]
    unsent += [m for (m, _), error in zip(ready, errors, strict=True) if error is not None]
    counts["dead_lettered"] += len(sent)
    counts["dead_letter_failed"] += len(unsent)
    counts["failed"] += len(unsent)
    to_ack += sent
