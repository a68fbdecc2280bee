"""The ``redrive_dead_letters`` task (docs/fleet.md, "Redrive dead letters"): SQS dead letters, not
``pipelines.redrive``'s failed partitions."""

import base64
import json
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from pipelines.common import iso
from pipelines.common.aws_batches import chunks
from pipelines.common.params import param
from pipelines.common.sqs import queue_name
from pipelines.common.summary import counters_of
from pipelines.common.task import Task, TaskRun
from pipelines.fleet.calls import aws_call, put_object, read_object
from pipelines.fleet.drain import receive_budget
from pipelines.fleet.messages import fingerprint, utcnow
from pipelines.fleet.queues import (
    ENVELOPE,
    ENVELOPE_ATTRIBUTE,
    MAX_ATTRIBUTES,
    REASON_ATTRIBUTE,
    SOURCE_ATTRIBUTE,
    clean_attribute,
    delete_messages,
    receive,
    send_entries,
)

REDRIVE_ATTRIBUTE = "groundskeeper-redrive-count"


@dataclass(frozen=True)
class RedriveSettings:
    queue: str = param(
        "termination",
        description="Whose dead-letter queue to redrive.",
        choices=("termination", "housekeeping"),
    )
    rate_per_second: float = param(
        10.0,
        description="Messages sent back per second, on average.",
        minimum=0.1,
        maximum=1000,
        aliases=("ratePerSecond",),
    )
    max_messages: int = param(
        0,
        description="Stop after this many dead letters (0: until the dead-letter queue is empty).",
        minimum=0,
        maximum=100_000,
        aliases=("maxMessages",),
    )
    max_seconds: float = param(
        300,
        description="Stop after this many seconds (the rate's waits included); the rest stays in the dead-letter "
        "queue.",
        minimum=1,
        maximum=3600,
    )
    max_redrives: int = param(
        3,
        description="A message redriven this many times already is quarantined in S3 instead.",
        minimum=0,
        maximum=100,
        aliases=("maxRedrives",),
    )
    dry_run: bool = param(
        False,
        description="Count what would be redriven and quarantined; move nothing.",
        aliases=("dryRun",),
    )


def _reason(message: dict[str, Any]) -> str:
    attr = (message.get("MessageAttributes") or {}).get(REASON_ATTRIBUTE) or {}
    return attr.get("StringValue") or "failed its source queue's maxReceiveCount receives (SQS redrive policy)"


class Ledger:
    """Redrive counts per fingerprint, one small S3 object each."""

    def __init__(self, s3, bucket: str, queue: str):
        self.s3, self.bucket, self.prefix = s3, bucket, f"dead-letters/{queue}"

    def count(self, fp: str) -> int:
        body = read_object(self.s3, self.bucket, f"{self.prefix}/redriven/{fp}.json")
        return 0 if body is None else int(json.loads(body).get("count", 0))

    def record(self, fp: str, count: int, reason: str) -> None:
        body = json.dumps({"fingerprint": fp, "count": count, "last_reason": reason, "redriven_at": iso(utcnow())})
        put_object(self.s3, self.bucket, f"{self.prefix}/redriven/{fp}.json", body.encode())

    def quarantine(self, fp: str, message: dict[str, Any], count: int, reason: str | None = None) -> None:
        key = f"{self.prefix}/quarantine/{fp}.json"
        body = {
            "fingerprint": fp,
            "redrives": count,
            "last_reason": reason or _reason(message),
            "quarantined_at": iso(utcnow()),
            "message_id": message.get("MessageId"),
            "body": message.get("Body"),
            "message_attributes": {
                k: v.get("StringValue") for k, v in (message.get("MessageAttributes") or {}).items()
            },
        }
        put_object(self.s3, self.bucket, key, json.dumps(body, ensure_ascii=False).encode())


class BadEnvelope(ValueError):
    """A dead letter's envelope that cannot be opened (it is quarantined with this reason)."""


DEAD_LETTER_ATTRIBUTES = {REASON_ATTRIBUTE, SOURCE_ATTRIBUTE, ENVELOPE_ATTRIBUTE, REDRIVE_ATTRIBUTE}


def _own_attributes(attrs: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The message's own attributes: without those the dead-lettering and the redrive added."""
    out = {}
    for name, value in attrs.items():
        if name in DEAD_LETTER_ATTRIBUTES or name.startswith("groundskeeper-dlq"):
            continue
        if not isinstance(value, dict) or not isinstance(value.get("DataType"), str):
            raise BadEnvelope(f"attribute {name!r} is not an SQS message attribute")
        clean = clean_attribute(value)
        binary = clean.get("BinaryValue")
        if isinstance(binary, str):  # as the envelope keeps it: base64
            try:
                clean["BinaryValue"] = base64.b64decode(binary, validate=True)
            except ValueError as exc:  # binascii.Error is one
                raise BadEnvelope(f"attribute {name!r}: BinaryValue is not base64") from exc
        if not isinstance(clean.get("StringValue", ""), str) or not isinstance(clean.get("BinaryValue", b""), bytes):
            raise BadEnvelope(f"attribute {name!r} has a value of the wrong type")
        out[name] = clean
    return out


def _archived(s3, bucket: str, queue: str, envelope: dict[str, Any]) -> dict[str, Any]:
    """The archived message an ``s3`` envelope points to: only in the archive bucket's
    ``dead-letters/<queue>/oversized/`` of the queue redriven, and only if its body has the envelope's SHA-256."""
    url, folder = envelope.get("body_s3"), f"s3://{bucket}/dead-letters/{queue}/oversized/"
    if not isinstance(url, str) or not url.startswith(folder) or "/" in url[len(folder) :] or ".." in url:
        raise BadEnvelope(f"body_s3 {str(url)[:200]!r} is not in {folder}")
    key = url.removeprefix(f"s3://{bucket}/")
    data = read_object(s3, bucket, key, what="GetObject (dead letter)")
    if data is None:
        raise BadEnvelope(f"the archived message {url} does not exist")
    try:
        record = json.loads(data)
    except ValueError as exc:
        raise BadEnvelope(f"the archived message {url} is not JSON") from exc
    if not isinstance(record, dict) or not isinstance(record.get("body"), str):
        raise BadEnvelope(f"the archived message {url} has no body")
    if fingerprint(record["body"]) != envelope.get("body_sha256"):
        raise BadEnvelope(f"the archived message {url} does not match the envelope's body_sha256")
    return record


def restore(message: dict[str, Any], s3, bucket: str, queue: str) -> tuple[str, dict[str, dict[str, Any]]]:
    """The (body, attributes) ``message`` had before it was dead-lettered: its envelope opened, the
    dead-letter and redrive attributes left out. ``BadEnvelope`` if the envelope cannot be opened."""
    attrs = message.get("MessageAttributes") or {}
    kind = (attrs.get(ENVELOPE_ATTRIBUTE) or {}).get("StringValue")
    body = message.get("Body") or ""
    if kind is None:
        return body, _own_attributes(attrs)
    if kind not in ("attributes", "s3"):
        raise BadEnvelope(f"unknown {ENVELOPE_ATTRIBUTE} {str(kind)[:100]!r} (attributes or s3)")
    try:
        envelope = json.loads(body)
    except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than the parser goes
        raise BadEnvelope(f"the envelope is not JSON: {exc}") from exc
    if not isinstance(envelope, dict) or envelope.get("envelope") != ENVELOPE:
        raise BadEnvelope(f'the envelope is not a JSON object with "envelope": "{ENVELOPE}"')
    if kind == "s3":
        record = _archived(s3, bucket, queue, envelope)
        moved = record.get("message_attributes") or {}
        original, restored = record["body"], {}
    else:
        original, moved = envelope.get("body"), envelope.get("message_attributes") or {}
        restored = _own_attributes(attrs)
    if not isinstance(original, str):
        raise BadEnvelope("the envelope has no body")
    if not isinstance(moved, dict):
        raise BadEnvelope("the envelope's message_attributes is not an object")
    restored.update(_own_attributes(moved))
    if len(restored) > MAX_ATTRIBUTES:
        raise BadEnvelope(f"the envelope holds {len(restored)} attributes, more than SQS's {MAX_ATTRIBUTES}")
    return original, restored


def redrive_dead_letters(run: TaskRun, _request: None, settings: RedriveSettings) -> dict[str, Any]:
    """Move the chosen queue's dead letters back to it at ``rate_per_second``; quarantine repeat offenders."""
    sqs, s3, log, bucket = run.sqs, run.s3, run.log, run.fleet.archive_bucket
    dlq_url, source_url = (getattr(run.fleet, f"{settings.queue}_{kind}_url") for kind in ("dlq", "queue"))
    queue = queue_name(source_url)
    ledger = Ledger(s3, bucket, queue)
    counts: Counter = Counter()
    started = time.monotonic()
    seen: set[str] = set()
    peeked: list[dict[str, Any]] = []
    stopped_by = "dead-letter queue empty"
    while True:
        ask = receive_budget(settings, counts["received"], started, 10)
        if isinstance(ask, str):
            stopped_by = ask
            break
        messages = receive(sqs, dlq_url, max_messages=ask, wait_seconds=1, visibility=30 if settings.dry_run else 60)
        messages = [m for m in messages if m["MessageId"] not in seen]
        if not messages:
            break
        counts["received"] += len(messages)
        to_send, done = [], []
        for message in messages:
            seen.add(message["MessageId"])
            bad: str | None = None  # why its envelope cannot be opened
            try:
                body, attrs = restore(message, s3, bucket, queue)
                fp = fingerprint(body)
                count = ledger.count(fp)
                if count < settings.max_redrives:
                    if len(attrs) < MAX_ATTRIBUTES:  # room for the redrive count (the ledger counts it anyway)
                        attrs[REDRIVE_ATTRIBUTE] = {"DataType": "String", "StringValue": str(count + 1)}
                    to_send.append((message, fp, count, (body, attrs)))
                    continue
                why = f"redriven {count} times already"
            except BadEnvelope as exc:
                fp, bad = fingerprint(message["Body"]), f"envelope cannot be opened: {exc}"
                why = f"its {bad}"
                counts["bad_envelope"] += 1
            dry = " (dry run)" if settings.dry_run else ""
            log.warning(f"quarantining {message['MessageId']} (fingerprint {fp[:12]}): {why}{dry}")
            if not settings.dry_run:
                ledger.quarantine(fp, message, count if bad is None else ledger.count(fp), reason=bad)
                done.append(message)
            counts["quarantined"] += 1
        if settings.dry_run:
            counts["would_redrive"] += len(to_send)
            peeked += messages
            continue
        for message, fp, count, _ in to_send:  # count first: a crash may skip a redrive, never loop one
            ledger.record(fp, count + 1, _reason(message))
        errors = send_entries(sqs, source_url, [entry for *_, entry in to_send])
        sent = [m for (m, *_), error in zip(to_send, errors, strict=True) if error is None]
        for (message, fp, count, _), error in zip(to_send, errors, strict=True):
            if error is not None:  # not a redrive: its count goes back
                ledger.record(fp, count, _reason(message))
                log.warning(f"{message['MessageId']} not sent back ({error}): it stays a dead letter")
        counts["redriven"] += len(sent)
        counts["send_failed"] += len(to_send) - len(sent)
        done += sent
        if done:  # what could not be deleted comes back after its visibility timeout (the ledger counted it)
            counts["delete_failed"] += len(delete_messages(sqs, dlq_url, done))
        # Rate: never faster than rate_per_second on average; never waiting past max_seconds.
        ahead = counts["redriven"] / settings.rate_per_second - (time.monotonic() - started)
        if ahead > 0:
            time.sleep(min(ahead, max(0.0, started + settings.max_seconds - time.monotonic())))
    for batch in chunks(peeked, 10):  # a dry run puts back what it looked at
        entries = [
            {"Id": str(n), "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 0} for n, m in enumerate(batch)
        ]
        aws_call(lambda entries=entries: sqs.change_message_visibility_batch(QueueUrl=dlq_url, Entries=entries))
    seconds = round(time.monotonic() - started, 2)
    out: dict[str, Any] = {**counts, "seconds": seconds, "dry_run": settings.dry_run, "stopped_by": stopped_by}
    log.info(f"redrive {queue_name(dlq_url)} -> {queue}: " + ", ".join(f"{k}={v}" for k, v in out.items()))
    return out


TASK = Task(
    name="redrive_dead_letters",
    params=RedriveSettings,
    run=redrive_dead_letters,
    clients=("sqs", "s3", "fleet"),
    job="redrive_dead_letters",
    op="redrive_dead_letter_queue",
    description="By hand: move dead-letter messages back to their source queue at a rate, and quarantine those "
    "redriven too often.",
    tags={"groundskeeper/capability": "fleet"},
    what=lambda settings: f"{settings.queue} dead-letter redrive",
    counters=lambda result: {"redriven": 0, **counters_of(result)},
)
