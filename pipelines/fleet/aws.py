"""Batched AWS helpers for the fleet processors, each AWS call retried by runs-fleet's policy.

Every helper takes a plain boto3 client. Batch APIs are used wherever AWS has one:
``DeleteMessageBatch`` / ``SendMessageBatch`` (10), ``DeleteParameters`` (10), ``PutMetricData``
(1000 datums, with ``Values``/``Counts`` so that many samples cost one datum).

A transient AWS error (the retry library's classification, ``pipelines.retry.aws``) is retried by
:func:`aws_call` after runs-fleet's fixed waits: 100 ms, 500 ms, 1 s (the retry library's
``runs-fleet`` preset), then the error is raised.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import logging
import re
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from pipelines.common import dimension_value, iso
from pipelines.common.aws_batches import chunks, error_code, put_metrics
from pipelines.retry import is_transient, preset, retry_call

T = TypeVar("T")
log = logging.getLogger(__name__)

POLICY = preset("runs-fleet")
"""runs-fleet's retry of one AWS call (pkg/events/handler.go): waits 0.1, 0.5, 1 s, 4 attempts."""
REASON_ATTRIBUTE = "groundskeeper-reason"
SOURCE_ATTRIBUTE = "groundskeeper-source-queue"


@dataclass
class FleetContext:
    """The clients and names the fleet processors and tasks work with, and where they log."""

    ssm: Any
    dynamodb: Any
    cloudwatch: Any
    s3: Any
    jobs_table: str
    archive_bucket: str
    namespace: str
    log: Any
    ec2: Any = None  # only the housekeeping tasks need EC2
    pools_table: str = ""  # only the pool_audit task reads the pools table


def aws_call(
    operation: Callable[[], T], *, what: str = "AWS call", retryable: Callable[[BaseException], bool] = is_transient
) -> T:
    """``operation()`` retried by :data:`POLICY` after a transient AWS error (or what ``retryable`` accepts)."""

    def note(attempt: int, exc: BaseException, wait: float) -> None:
        log.warning("%s failed (%s), retry %d in %.1fs", what, exc, attempt, wait)

    return retry_call(operation, POLICY, retryable=retryable, on_retry=note)


# ---------------------------------------------------------------------------------- SQS


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


def queue_name(queue_url: str) -> str:
    return queue_url.rstrip("/").rsplit("/", 1)[-1]


def receive(sqs, queue_url: str, *, max_messages: int = 10, wait_seconds: int = 0) -> list[dict[str, Any]]:
    return aws_call(
        lambda: sqs.receive_message(
            QueueUrl=queue_url,
            MaxNumberOfMessages=max(1, min(10, max_messages)),
            WaitTimeSeconds=wait_seconds,
            AttributeNames=["All"],
            MessageAttributeNames=["All"],
        ).get("Messages", []),
        what="ReceiveMessage",
    )


def delete_messages(sqs, queue_url: str, messages: Sequence[dict[str, Any]]) -> list[str]:
    """``DeleteMessageBatch`` in tens. Returns the message ids that could not be deleted."""
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
ENVELOPE_ATTRIBUTE = "groundskeeper-envelope"
ENVELOPE = "groundskeeper-dead-letter"
_NOT_SQS_TEXT = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def sqs_text(text: str, limit: int = 1000) -> str:
    """``text`` as SQS accepts it in an attribute: one line of allowed characters, at most ``limit``."""
    return _NOT_SQS_TEXT.sub("?", " ".join(text.split()))[:limit]


def _clean_attribute(value: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in value.items() if k in {"DataType", "StringValue", "BinaryValue"}}


def message_size(body: str, attributes: dict[str, dict[str, Any]]) -> int:
    """What SQS counts against its size limits: body, and each attribute's name, type and value."""
    size = len(body.encode("utf-8", "surrogatepass"))
    for name, value in attributes.items():
        size += len(name.encode()) + len(value.get("DataType", "").encode())
        if "StringValue" in value:
            size += len(value["StringValue"].encode("utf-8", "surrogatepass"))
        size += len(value.get("BinaryValue", b""))
    return size


def _attributes_for_send(message: dict[str, Any], extra: dict[str, str]) -> dict[str, Any]:
    attrs = {}
    for name, value in (message.get("MessageAttributes") or {}).items():
        if name in extra or name.startswith("groundskeeper-dlq"):
            continue
        attrs[name] = _clean_attribute(value)
    for name, value in extra.items():
        attrs[name] = {"DataType": "String", "StringValue": sqs_text(value)}
    # SQS allows 10 attributes per message: ours (``extra``, last) are the ones kept.
    return dict(list(attrs.items())[-MAX_ATTRIBUTES:])


def _size_batches(sizes: Sequence[int]) -> Iterable[list[int]]:
    """Indexes of ``sizes`` grouped by SendMessageBatch's limits: 10 entries and 1 MiB together."""
    batch: list[int] = []
    total = 0
    for n, size in enumerate(sizes):
        if batch and (len(batch) == MAX_BATCH_ENTRIES or total + size > MAX_BATCH_BYTES):
            yield batch
            batch, total = [], 0
        batch.append(n)
        total += size
    if batch:
        yield batch


def send_entries(sqs, queue_url: str, outgoing: Sequence[tuple[str, dict[str, Any]]]) -> list[str | None]:
    """``SendMessageBatch`` of (body, attributes) within SQS's batch limits. Returns, per entry, None
    when sent or why not: a failed entry or a failed call fails those entries only, never the rest."""
    errors: list[str | None] = [None] * len(outgoing)
    for batch in _size_batches([message_size(body, attrs) for body, attrs in outgoing]):
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


def send_messages(
    sqs, queue_url: str, items: Sequence[tuple[dict[str, Any], dict[str, str]]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``SendMessageBatch`` of (received message, extra string attributes). Returns (sent, failed)."""
    errors = send_entries(sqs, queue_url, [(m["Body"], _attributes_for_send(m, extra)) for m, extra in items])
    sent = [m for (m, _), error in zip(items, errors, strict=True) if error is None]
    failed = [m for (m, _), error in zip(items, errors, strict=True) if error is not None]
    return sent, failed


def _json_attributes(attrs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Message attributes as JSON (a binary value in base64)."""
    out = {}
    for name, value in attrs.items():
        value = dict(value)
        if isinstance(value.get("BinaryValue"), bytes | bytearray):
            value["BinaryValue"] = base64.b64encode(value["BinaryValue"]).decode()
        out[name] = value
    return out


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass(frozen=True)
class DeadLetterArchive:
    """Where a dead letter too big for SQS goes whole: ``s3://<bucket>/dead-letters/<queue>/oversized/``."""

    s3: Any
    bucket: str

    def put(self, source: str, message: dict[str, Any], reason: str) -> str:
        body = message.get("Body") or ""
        key = (
            f"dead-letters/{source}/oversized/{hashlib.sha256(body.encode('utf-8', 'surrogatepass')).hexdigest()}.json"
        )
        record = {
            "message_id": message.get("MessageId"),
            "reason": reason,
            "source_queue": source,
            "body": body,
            "message_attributes": _json_attributes(message.get("MessageAttributes") or {}),
        }
        data = json.dumps(record, ensure_ascii=False).encode("utf-8", "surrogatepass")
        aws_call(
            lambda: self.s3.put_object(Bucket=self.bucket, Key=key, Body=data, ContentType="application/json"),
            what="PutObject (oversized dead letter)",
        )
        return f"s3://{self.bucket}/{key}"


def dead_letter_entry(
    message: dict[str, Any], reason: str, source: str, archive: DeadLetterArchive | None = None
) -> tuple[str, dict[str, Any]]:
    """The (body, attributes) that dead-letters ``message`` with ``reason``.

    The reason and the source queue are always attributes. The message's own attributes follow as
    many as fit in SQS's 10; when some do not, the body becomes an envelope (JSON ``{"envelope":
    "groundskeeper-dead-letter", "body": <the body>, "message_attributes": <the rest>}``, attribute
    ``groundskeeper-envelope=attributes``). A message that would be bigger than 256 KiB is stored whole
    in the archive bucket and the envelope points to it (``body_s3``, ``body_bytes``, ``body_sha256``;
    ``groundskeeper-envelope=s3``); without an archive it cannot be dead-lettered (``ValueError``).
    """
    ours = {REASON_ATTRIBUTE: sqs_text(reason), SOURCE_ATTRIBUTE: source}
    originals = {
        name: _clean_attribute(value)
        for name, value in (message.get("MessageAttributes") or {}).items()
        if name not in (REASON_ATTRIBUTE, SOURCE_ATTRIBUTE, ENVELOPE_ATTRIBUTE)
        and not name.startswith("groundskeeper-dlq")
    }
    body = message.get("Body") or ""
    room = MAX_ATTRIBUTES - len(ours)
    kept, moved = dict(originals), {}
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
    if archive is None:
        raise ValueError("too big for the dead-letter queue and no archive bucket to put it in")
    original = message.get("Body") or ""
    pointer = {
        "envelope": ENVELOPE,
        "body_s3": archive.put(source, message, reason),
        "body_bytes": len(original.encode("utf-8", "surrogatepass")),
        "body_sha256": _sha256(original),
    }
    ours[ENVELOPE_ATTRIBUTE] = "s3"
    return json.dumps(pointer), {k: {"DataType": "String", "StringValue": v} for k, v in ours.items()}


def dead_letter(
    sqs,
    source_url: str,
    dlq_url: str,
    poison: Sequence[tuple[dict[str, Any], str]],
    archive: DeadLetterArchive | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Send (message, reason) pairs to the dead-letter queue with the reason as an attribute
    (:func:`dead_letter_entry`). Returns (sent, failed). Only sent messages may be deleted from
    the source queue: a failed one stays there, and its redrive policy moves it."""
    source = queue_name(source_url)
    ready: list[tuple[dict[str, Any], tuple[str, dict[str, Any]]]] = []
    failed: list[dict[str, Any]] = []
    for message, reason in poison:
        try:
            ready.append((message, dead_letter_entry(message, reason, source, archive)))
        except Exception as exc:
            log.error("could not dead-letter %s (%s), left in the queue: %s", message.get("MessageId"), reason, exc)
            failed.append(message)
    errors = send_entries(sqs, dlq_url, [entry for _, entry in ready])
    sent = [m for (m, _), error in zip(ready, errors, strict=True) if error is None]
    failed += [m for (m, _), error in zip(ready, errors, strict=True) if error is not None]
    return sent, failed


def dead_letter_into(
    sqs,
    source_url: str,
    dlq_url: str,
    poison: Sequence[tuple[dict[str, Any], str]],
    counts,
    to_ack: list,
    archive: DeadLetterArchive | None = None,
) -> None:
    """Dead-letter ``poison``; count it, and add what was sent to ``to_ack`` (to delete from the source).
    What could not be sent stays in the source queue (``dead_letter_failed``)."""
    if poison:
        sent, unsent = dead_letter(sqs, source_url, dlq_url, poison, archive)
        counts["dead_lettered"] += len(sent)
        counts["dead_letter_failed"] += len(unsent)
        counts["failed"] += len(unsent)
        to_ack += sent


def message_received_at(message: dict[str, Any], default: dt.datetime | None = None) -> dt.datetime:
    sent = (message.get("Attributes") or {}).get("SentTimestamp")
    if sent and str(sent).isdigit():
        return dt.datetime.fromtimestamp(int(sent) / 1000, dt.UTC)
    return default or dt.datetime.now(dt.UTC)


def archived_job_key(job_id: str) -> str:
    """The archive bucket's marker of a job that old_jobs archived and deleted (``archived-jobs/<sha256>``)."""
    return f"archived-jobs/{_sha256(job_id)}.json"


# ---------------------------------------------------------------------------------- SSM


def delete_parameters(ssm, names: Sequence[str]) -> dict[str, int]:
    """``DeleteParameters`` in tens. A parameter that is already gone counts as ``missing``, not an error."""
    counts = {"deleted": 0, "missing": 0}
    for batch in chunks(sorted(set(names)), 10):
        response = aws_call(lambda batch=batch: ssm.delete_parameters(Names=list(batch)), what="DeleteParameters")
        counts["deleted"] += len(response.get("DeletedParameters", []))
        counts["missing"] += len(response.get("InvalidParameters", []))
    return counts


# --------------------------------------------------------------------------------- metrics


class MetricBatch:
    """Collects samples and publishes them in as few ``PutMetricData`` calls as possible."""

    def __init__(self) -> None:
        # (name, dimensions, unit) -> value -> count
        self._samples: dict[tuple[str, tuple[tuple[str, str], ...], str], dict[float, float]] = defaultdict(
            lambda: defaultdict(float)
        )

    def add(self, name: str, value: float, *, unit: str = "Count", **dimensions: str) -> None:
        dims = tuple(sorted((k, dimension_value(v)) for k, v in dimensions.items()))
        self._samples[(name, dims, unit)][float(value)] += 1

    def __len__(self) -> int:
        return len(self._samples)

    def datums(self) -> list[dict[str, Any]]:
        out = []
        for (name, dims, unit), values in self._samples.items():
            pairs = list(values.items())
            for part in chunks(pairs, 150):  # PutMetricData: at most 150 distinct values per datum
                datum: dict[str, Any] = {
                    "MetricName": name,
                    "Unit": unit,
                    "Values": [v for v, _ in part],
                    "Counts": [c for _, c in part],
                }
                if dims:
                    datum["Dimensions"] = [{"Name": k, "Value": v} for k, v in dims]
                out.append(datum)
        return out

    def publish(self, cloudwatch, namespace: str) -> int:
        """Publish everything collected (1000 datums per call). Returns the number of calls."""
        calls = put_metrics(cloudwatch, namespace, self.datums(), policy=POLICY)
        self._samples.clear()
        return calls


def publish_count(cloudwatch, namespace: str, name: str, value: int) -> None:
    batch = MetricBatch()
    batch._samples[(name, (), "Count")][float(value)] += 1
    batch.publish(cloudwatch, namespace)


# ---------------------------------------------------------------------------------- S3


class RunArchive:
    """The raw messages one run received, in ONE S3 object per run (JSON Lines), written before handling.

    S3 objects cannot be appended to, so each ``write`` rewrites the run's object with everything
    received so far; past ``max_bytes`` the run starts a new part (``<run>.part-0002.jsonl``) so a
    long backlog costs no more than small objects. Thread-safe.
    """

    def __init__(self, s3, bucket: str, queue: str, run_id: str, *, max_bytes: int = 256 * 1024):
        self.s3, self.bucket, self.max_bytes = s3, bucket, max_bytes
        self.prefix = f"raw/{queue}/{dt.datetime.now(dt.UTC):%Y-%m-%d}/{run_id}"
        self._lines: list[bytes] = []
        self._size = 0
        self._part = 1
        self._lock = threading.Lock()
        self.keys: list[str] = []

    @property
    def key(self) -> str:
        return f"{self.prefix}.jsonl" if self._part == 1 else f"{self.prefix}.part-{self._part:04d}.jsonl"

    def write(self, messages: Sequence[dict[str, Any]]) -> str:
        """Store these received messages (with those before them). Returns the object key."""
        received = iso(dt.datetime.now(dt.UTC))
        lines = [
            json.dumps(
                {
                    "message_id": m.get("MessageId"),
                    "received_at": received,
                    "receive_count": (m.get("Attributes") or {}).get("ApproximateReceiveCount"),
                    "sent_timestamp": (m.get("Attributes") or {}).get("SentTimestamp"),
                    "body": m.get("Body"),
                },
                ensure_ascii=False,
            ).encode("utf-8", "surrogatepass")
            + b"\n"
            for m in messages
        ]
        with self._lock:
            if self._lines and self._size + sum(map(len, lines)) > self.max_bytes:
                self._lines, self._size, self._part = [], 0, self._part + 1
            self._lines += lines
            self._size += sum(map(len, lines))
            body, key = b"".join(self._lines), self.key
            aws_call(
                lambda: self.s3.put_object(Bucket=self.bucket, Key=key, Body=body, ContentType="application/x-ndjson"),
                what="PutObject (raw archive)",
            )
            if key not in self.keys:
                self.keys.append(key)
            return key
