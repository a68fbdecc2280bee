"""Dead letters: redrive to the source queue at a set rate, quarantine what keeps coming back.

Each message is fingerprinted (SHA-256 of its body). A small ledger object per fingerprint in the
archive bucket (``dead-letters/<queue>/redriven/<fingerprint>.json``) counts its redrives; once a
message has been redriven ``max_redrives`` times it is quarantined instead
(``dead-letters/<queue>/quarantine/<fingerprint>.json``: body, attributes, count, last reason)
and removed from the dead-letter queue, so it cannot loop forever.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from pipelines.common import iso
from pipelines.common.params import param
from pipelines.fleet.aws import REASON_ATTRIBUTE, aws_call, chunks, delete_messages, queue_name, send_messages
from pipelines.fleet.messages import fingerprint

REDRIVE_ATTRIBUTE = "groundskeeper-redrive-count"


@dataclass(frozen=True)
class RedriveSettings:
    """The ``redrive_dead_letters`` job's parameters, declared once (its flat run config)."""

    queue: str = param(
        "termination",
        description="Whose dead-letter queue to redrive.",
        choices=("termination", "housekeeping"),
    )
    rate_per_second: float = param(
        10.0,
        description="Messages sent back per second, on average.",
        minimum=0.01,
        aliases=("ratePerSecond",),
    )
    max_messages: int = param(
        0,
        description="Stop after this many dead letters (0: until the dead-letter queue is empty).",
        minimum=0,
        aliases=("maxMessages",),
    )
    max_redrives: int = param(
        3,
        description="A message redriven this many times already is quarantined in S3 instead.",
        minimum=0,
        aliases=("maxRedrives",),
    )
    dry_run: bool = param(
        False,
        description="Count what would be redriven and quarantined; move nothing.",
        aliases=("dryRun",),
    )


def _reason(message: dict[str, Any]) -> str:
    attr = (message.get("MessageAttributes") or {}).get(REASON_ATTRIBUTE) or {}
    return attr.get("StringValue") or "failed 3 receives (SQS redrive policy)"


class Ledger:
    """Redrive counts per fingerprint, one small S3 object each."""

    def __init__(self, s3, bucket: str, queue: str):
        self.s3, self.bucket, self.prefix = s3, bucket, f"dead-letters/{queue}"

    def count(self, fp: str) -> int:
        try:
            body = aws_call(
                lambda: self.s3.get_object(Bucket=self.bucket, Key=f"{self.prefix}/redriven/{fp}.json")["Body"].read()
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in {"NoSuchKey", "404"}:
                return 0
            raise
        return int(json.loads(body).get("count", 0))

    def record(self, fp: str, count: int, reason: str) -> None:
        body = json.dumps({"fingerprint": fp, "count": count, "last_reason": reason, "redriven_at": iso(_now())})
        aws_call(
            lambda: self.s3.put_object(Bucket=self.bucket, Key=f"{self.prefix}/redriven/{fp}.json", Body=body.encode())
        )

    def quarantine(self, fp: str, message: dict[str, Any], count: int) -> str:
        key = f"{self.prefix}/quarantine/{fp}.json"
        body = {
            "fingerprint": fp,
            "redrives": count,
            "last_reason": _reason(message),
            "quarantined_at": iso(_now()),
            "message_id": message.get("MessageId"),
            "body": message.get("Body"),
            "message_attributes": {
                k: v.get("StringValue") for k, v in (message.get("MessageAttributes") or {}).items()
            },
        }
        aws_call(
            lambda: self.s3.put_object(Bucket=self.bucket, Key=key, Body=json.dumps(body, ensure_ascii=False).encode())
        )
        return key


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def redrive(
    sqs, s3, *, dlq_url: str, source_url: str, bucket: str, settings: RedriveSettings, log: Any
) -> dict[str, Any]:
    """Move dead letters back to ``source_url`` at ``rate_per_second``; quarantine repeat offenders."""
    ledger = Ledger(s3, bucket, queue_name(source_url))
    counts: Counter = Counter()
    started = time.monotonic()
    seen: set[str] = set()
    peeked: list[dict[str, Any]] = []
    while not settings.max_messages or counts["received"] < settings.max_messages:
        ask = 10 if not settings.max_messages else min(10, settings.max_messages - counts["received"])
        messages = aws_call(
            lambda ask=ask: sqs.receive_message(
                QueueUrl=dlq_url,
                MaxNumberOfMessages=ask,
                WaitTimeSeconds=1,
                VisibilityTimeout=30 if settings.dry_run else 60,
                AttributeNames=["All"],
                MessageAttributeNames=["All"],
            ).get("Messages", [])
        )
        messages = [m for m in messages if m["MessageId"] not in seen]
        if not messages:
            break
        counts["received"] += len(messages)
        to_send, done = [], []
        for message in messages:
            seen.add(message["MessageId"])
            fp = fingerprint(message["Body"])
            count = ledger.count(fp)
            if count >= settings.max_redrives:
                log.warning(
                    f"quarantining {message['MessageId']} (fingerprint {fp[:12]}): redriven {count} times already"
                    + (" (dry run)" if settings.dry_run else "")
                )
                if not settings.dry_run:
                    ledger.quarantine(fp, message, count)
                    done.append(message)
                counts["quarantined"] += 1
            else:
                to_send.append((message, fp, count))
        if settings.dry_run:
            counts["would_redrive"] += len(to_send)
            peeked += messages
            continue
        for message, fp, count in to_send:  # count first: a crash may skip a redrive, never loop one
            ledger.record(fp, count + 1, _reason(message))
        sent, failed = send_messages(sqs, source_url, [(m, {REDRIVE_ATTRIBUTE: str(c + 1)}) for m, _, c in to_send])
        counts["redriven"] += len(sent)
        counts["send_failed"] += len(failed)
        done += sent
        if done:
            delete_messages(sqs, dlq_url, done)
        # Rate: never faster than rate_per_second on average.
        ahead = counts["redriven"] / settings.rate_per_second - (time.monotonic() - started)
        if ahead > 0:
            time.sleep(ahead)
    for batch in chunks(peeked, 10):  # a dry run puts back what it looked at
        entries = [
            {"Id": str(n), "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 0} for n, m in enumerate(batch)
        ]
        aws_call(lambda entries=entries: sqs.change_message_visibility_batch(QueueUrl=dlq_url, Entries=entries))
    out: dict[str, Any] = dict(counts)
    out["seconds"] = round(time.monotonic() - started, 2)
    out["dry_run"] = settings.dry_run
    log.info(
        f"redrive {queue_name(dlq_url)} -> {queue_name(source_url)}: " + ", ".join(f"{k}={v}" for k, v in out.items())
    )
    return out
