"""Seeding tables for local tooling (the demo, the cluster's seed table, benchmarks): ``batch_write``.
No job of the product writes with ``BatchWriteItem`` (its deletes and puts are conditional transactions)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from pipelines.common.aws_batches import CALL_POLICY, chunks
from pipelines.retry import is_transient, retry_call
from pipelines.retry.policy import RetryPolicy

log = logging.getLogger(__name__)
BATCH_WRITE_LIMIT = 25  # BatchWriteItem requests per call


class Unprocessed(Exception):
    """``BatchWriteItem`` left items unprocessed (throttled): worth another try after a wait."""


def _retry_batch_write(exc: BaseException) -> bool:
    return isinstance(exc, Unprocessed) or is_transient(exc)


def _note(attempt: int, exc: BaseException, wait: float) -> None:
    log.warning("BatchWriteItem failed (%s), retry %d in %.1fs", exc, attempt, wait)


def batch_write(dynamodb, table: str, requests: Sequence[dict[str, Any]], *, policy: RetryPolicy = CALL_POLICY) -> int:
    """``BatchWriteItem`` 25 requests a call, ``UnprocessedItems`` sent again as the policy allows
    (then ``Unprocessed``); returns the number of calls."""
    calls = 0
    for part in chunks(list(requests), BATCH_WRITE_LIMIT):
        request = {table: list(part)}

        def write() -> None:
            nonlocal request, calls
            response = dynamodb.batch_write_item(RequestItems=request)
            calls += 1
            left = response.get("UnprocessedItems") or {}
            if left:
                request = left
                raise Unprocessed(f"BatchWriteItem left {len(left.get(table, []))} item(s) unprocessed")

        retry_call(write, policy, retryable=_retry_batch_write, on_retry=_note)
    return calls
