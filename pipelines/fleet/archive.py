"""What the fleet keeps in its archive bucket besides dead letters: raw messages and archived-job markers."""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Sequence
from typing import Any

from pipelines.common import iso
from pipelines.fleet.calls import aws_call
from pipelines.fleet.messages import fingerprint


def archived_job_key(job_id: str) -> str:
    """The marker of a job that old_jobs archived and deleted."""
    return f"archived-jobs/{fingerprint(job_id)}.json"


class RunArchive:
    """The raw messages one run received, in ONE S3 object per run (JSON Lines), written before handling.
    S3 objects cannot be appended to: each ``write`` rewrites the object with everything received so far,
    and past ``max_bytes`` the run starts a new part (``<run>.part-0002.jsonl``). Thread-safe."""

    def __init__(self, s3, bucket: str, queue: str, run_id: str, *, max_bytes: int = 256 * 1024):
        self.s3, self.bucket, self.max_bytes = s3, bucket, max_bytes
        self.prefix = f"raw/{queue}/{dt.datetime.now(dt.UTC):%Y-%m-%d}/{run_id}"
        self._lines: list[bytes] = []
        self._size = 0
        self._part = 1
        self._lock = threading.Lock()
        self.keys: list[str] = []

    def write(self, messages: Sequence[dict[str, Any]]) -> str:
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
            body = b"".join(self._lines)
            key = f"{self.prefix}.jsonl" if self._part == 1 else f"{self.prefix}.part-{self._part:04d}.jsonl"
            aws_call(
                lambda: self.s3.put_object(Bucket=self.bucket, Key=key, Body=body, ContentType="application/x-ndjson"),
                what="PutObject (raw archive)",
            )
            if key not in self.keys:
                self.keys.append(key)
            return key
