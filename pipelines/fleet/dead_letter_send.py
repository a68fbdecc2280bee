"""Sending poison messages to a dead-letter queue, with the reason and the source queue as attributes
(docs/fleet.md, "Poison messages and dead letters"). Sending them back is ``dead_letter_redrive``."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Sequence
from typing import Any

from pipelines.common.sqs import queue_name
from pipelines.fleet.calls import aws_call
from pipelines.fleet.messages import fingerprint
from pipelines.fleet.queues import (
    MAX_ATTRIBUTES,
    MAX_MESSAGE_BYTES,
    clean_attribute,
    message_size,
    send_entries,
    sqs_text,
)

log = logging.getLogger(__name__)

REASON_ATTRIBUTE = "groundskeeper-reason"
SOURCE_ATTRIBUTE = "groundskeeper-source-queue"
ENVELOPE_ATTRIBUTE = "groundskeeper-envelope"
ENVELOPE = "groundskeeper-dead-letter"


def _json_attributes(attrs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Message attributes as JSON (a binary value in base64)."""
    out = {}
    for name, value in attrs.items():
        value = dict(value)
        if isinstance(value.get("BinaryValue"), bytes | bytearray):
            value["BinaryValue"] = base64.b64encode(value["BinaryValue"]).decode()
        out[name] = value
    return out


def dead_letter_entry(message: dict[str, Any], reason: str, source: str, s3, bucket: str) -> tuple[str, dict[str, Any]]:
    """The (body, attributes) that dead-letters ``message`` with ``reason``.

    The reason and the source queue are always attributes; the message's own follow as many as fit
    in SQS's 10, and the rest go into an envelope body (``groundskeeper-envelope=attributes``). A
    message bigger than 256 KiB is stored whole in the archive bucket and the envelope points to it
    (``groundskeeper-envelope=s3``).
    """
    ours = {REASON_ATTRIBUTE: sqs_text(reason), SOURCE_ATTRIBUTE: source}
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
    aws_call(
        lambda: s3.put_object(Bucket=bucket, Key=key, Body=data, ContentType="application/json"),
        what="PutObject (oversized dead letter)",
    )
    pointer = {
        "envelope": ENVELOPE,
        "body_s3": f"s3://{bucket}/{key}",
        "body_bytes": len(original.encode("utf-8", "surrogatepass")),
        "body_sha256": fingerprint(original),
    }
    ours[ENVELOPE_ATTRIBUTE] = "s3"
    return json.dumps(pointer), {k: {"DataType": "String", "StringValue": v} for k, v in ours.items()}


def dead_letter_into(
    sqs, ctx, source_url: str, dlq_url: str, poison: Sequence[tuple[dict[str, Any], str]], counts, to_ack: list
) -> None:
    """Send (message, reason) pairs to the dead-letter queue (:func:`dead_letter_entry`; ``ctx``: the
    ``FleetContext`` whose archive bucket takes the oversized ones); count them, and add those sent to
    ``to_ack``. What could not be sent stays in the source queue (``dead_letter_failed``), where its
    redrive policy moves it."""
    if not poison:
        return
    source = queue_name(source_url)
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
