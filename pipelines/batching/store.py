"""Batching's DynamoDB and S3 access; every write is conditional or idempotent, a lock fenced by the lease.
No Dagster."""

import json
import time
from collections.abc import Iterable, Iterator
from decimal import Decimal
from typing import Any

from botocore.exceptions import ClientError

from pipelines.batching.schedule import format_batch_time, parse_batch_time
from pipelines.common import from_item
from pipelines.common.aws_batches import (
    TRANSACTION_LIMIT,
    FenceFailed,
    chunks,
    conditional_write,
    error_code,
    transact_conditional,
)
from pipelines.retry.policy import Formula

PENDING_INDEX = "pending-index"
BATCH_ACTION = "BATCH"


class ReceiverBusy(RuntimeError):
    """Another live run holds the receiver's lease."""


class LeaseLost(RuntimeError):
    """This run no longer holds the receiver's lease (it expired and another run took it)."""


def batch_id(receiver: str, batch_time, n: int) -> str:
    """Deterministic in (receiver, T, n): ``<receiver>/<T>/<n>``."""
    return f"{receiver}/{format_batch_time(batch_time)}/{n}"


def parse_batch_id(value: str):
    """``(receiver, T, n)`` from a batch id, or None when it is not one of ours."""
    try:
        receiver, when, n = value.rsplit("/", 2)
        return receiver, parse_batch_time(when), int(n)
    except (ValueError, AttributeError):
        return None


def file_key(receiver: str, batch_time, n: int) -> str:
    return f"batches/{receiver}/{format_batch_time(batch_time)}/{n}.jsonl"


def ledger_key(receiver: str, batch_time) -> str:
    return f"ledger/{receiver}/{format_batch_time(batch_time)}.json"


def scan_receivers(dynamodb, table: str) -> list[dict[str, Any]]:
    return [
        from_item(i) for page in dynamodb.get_paginator("scan").paginate(TableName=table) for i in page.get("Items", [])
    ]


def get_receiver(dynamodb, table: str, receiver: str) -> dict[str, Any] | None:
    item = dynamodb.get_item(TableName=table, Key={"receiver": {"S": receiver}}, ConsistentRead=True).get("Item")
    return from_item(item) if item else None


def update_receiver(dynamodb, table: str, receiver: str, update: str, condition: str, values: dict, **extra) -> Any:
    """A conditional update of the receiver item: the response, or None when ``condition`` failed."""
    return conditional_write(
        lambda: dynamodb.update_item(
            TableName=table,
            Key={"receiver": {"S": receiver}},
            UpdateExpression=update,
            ConditionExpression=condition,
            ExpressionAttributeValues=values,
            **extra,
        )
    )


def lease_owner(run_id: str, partition: str) -> str:
    """The lease owner of a run's batcher of one (day, receiver) partition: two partitions of one receiver in one
    run (a window across midnight) take the lease in turn."""
    return f"run-{run_id}:{partition}"


def _set_lease(dynamodb, table: str, receiver: str, owner: str, until_ms: int, condition: str, values=None) -> Any:
    """The receiver item after setting this run's lease until ``until_ms``, or None when ``condition`` failed."""
    update = "SET batch_lease_owner = :o, batch_lease_until = :u"
    values = {":o": {"S": owner}, ":u": {"N": str(until_ms)}, **(values or {})}
    response = update_receiver(dynamodb, table, receiver, update, condition, values, ReturnValues="ALL_NEW")
    return from_item(response["Attributes"]) if response else None


def acquire_lease(
    dynamodb, table: str, receiver: str, owner: str, lease_seconds: float, wait_seconds: float, clock=time.time
) -> dict[str, Any] | None:
    """Take the receiver's lease (waiting up to ``wait_seconds`` for another run's, then ``ReceiverBusy``);
    returns the receiver item, or None when the receiver does not exist."""
    deadline = clock() + wait_seconds
    while True:
        now_ms = int(clock() * 1000)
        item = _set_lease(
            dynamodb,
            table,
            receiver,
            owner,
            now_ms + int(lease_seconds * 1000),
            "attribute_exists(receiver) AND (attribute_not_exists(batch_lease_owner) "
            "OR batch_lease_until < :now OR batch_lease_owner = :o)",
            {":now": {"N": str(now_ms)}},
        )
        if item is not None:
            return item
        current = get_receiver(dynamodb, table, receiver)
        if current is None:
            return None
        if clock() >= deadline:
            raise ReceiverBusy(
                f"receiver {receiver!r} is being batched by {current.get('batch_lease_owner')!r} "
                f"(lease until {current.get('batch_lease_until')} ms); gave up after {wait_seconds:.0f}s"
            )
        time.sleep(min(1.0, max(0.05, deadline - clock())))


def renew_lease(dynamodb, table: str, receiver: str, owner: str, lease_seconds: float) -> dict[str, Any]:
    """Extend this run's lease and return the receiver item as it is now (``LeaseLost`` if not ours)."""
    until_ms = int(time.time() * 1000) + int(lease_seconds * 1000)
    item = _set_lease(dynamodb, table, receiver, owner, until_ms, "batch_lease_owner = :o")
    if item is None:
        raise LeaseLost(f"run {owner!r} lost the lease on receiver {receiver!r}")
    return item


def release_lease(dynamodb, table: str, receiver: str, owner: str) -> None:
    remove = "REMOVE batch_lease_owner, batch_lease_until"
    update_receiver(dynamodb, table, receiver, remove, "batch_lease_owner = :o", {":o": {"S": owner}})


def claim_empty_batch(dynamodb, table: str, receiver: str, owner: str, day: str, batch_time) -> bool:
    """Claim the one empty file of local day ``day`` (``whenEmpty.onlyOncePerDay``) for batch time T,
    only while this run holds the lease: True when T has it (now, or from an earlier run of T that
    died before its ledger entry), False when another batch time of the day (or a later day) has it."""
    claimed = update_receiver(
        dynamodb,
        table,
        receiver,
        "SET empty_batch_day = :d, empty_batch_time = :t",
        "batch_lease_owner = :o AND (attribute_not_exists(empty_batch_day) OR empty_batch_day < :d "
        "OR (empty_batch_day = :d AND empty_batch_time = :t))",
        {":o": {"S": owner}, ":d": {"S": day}, ":t": {"S": format_batch_time(batch_time)}},
    )
    if claimed is None and (get_receiver(dynamodb, table, receiver) or {}).get("batch_lease_owner") != owner:
        raise LeaseLost(f"run {owner!r} lost the lease on receiver {receiver!r}")
    return claimed is not None


def _pending_pages(dynamodb, table: str, receiver: str, **select):
    """A query of ``receiver``'s pending records (the sparse ``pending-index``)."""
    return dynamodb.get_paginator("query").paginate(
        TableName=table,
        IndexName=PENDING_INDEX,
        KeyConditionExpression="pending_receiver = :r",
        ExpressionAttributeValues={":r": {"S": receiver}},
        **select,
    )


def query_pending(dynamodb, table: str, receiver: str) -> list[dict[str, Any]]:
    return [from_item(i) for page in _pending_pages(dynamodb, table, receiver) for i in page.get("Items", [])]


def pending_keys(dynamodb, table: str, receiver: str, limit: int) -> Iterator[dict[str, Any]]:
    """The first ``limit`` of ``receiver``'s pending records, each with only what tells whether a run batches
    it (``record_id``, ``receiver``, ``created_at``, ``batch_id``), a page at a time."""
    keys = "record_id, receiver, created_at, batch_id"
    bound = {"MaxItems": limit, "PageSize": limit}
    pages = _pending_pages(dynamodb, table, receiver, ProjectionExpression=keys, PaginationConfig=bound)
    return (from_item(i) for page in pages for i in page.get("Items", []))


CONFLICT_POLICY = Formula(
    name="transaction-conflicts",
    formula=lambda n: 0.05 * n,
    max_attempts=8,
    summary="0.05 s x n (0.05 s to 0.35 s), 8 attempts",
    source="batching: a transaction cancelled by another writer's transaction is simply tried again",
)


def _update_in_groups(
    dynamodb, table: str, record_ids: Iterable[str], update: str, condition: str, values: dict, fence=None
) -> list[str]:
    """Conditional updates in transactions of 100 (99 + ``fence``); returns the ids written (a record whose
    condition fails is left out). A failed fence raises ``LeaseLost``."""

    def action(rid: str) -> dict[str, Any]:
        return {
            "Update": {
                "TableName": table,
                "Key": {"record_id": {"S": rid}},
                "UpdateExpression": update,
                "ConditionExpression": condition,
                "ExpressionAttributeValues": values,
            }
        }

    written: list[str] = []
    for group in chunks(list(record_ids), TRANSACTION_LIMIT - (1 if fence else 0)):
        try:
            result = transact_conditional(dynamodb, group, action, fence=fence, policy=CONFLICT_POLICY)
        except FenceFailed as exc:
            raise LeaseLost("the receiver's lease changed hands while locking records") from exc
        if result.failed:
            raise result.error
        if result.refused:
            raise ValueError(f"record update refused: {'; '.join(f'{rid}: {why}' for rid, why in result.refused)}")
        written.extend(result.applied)
    return written


def lock_records(
    dynamodb, records_table: str, receivers_table: str, receiver: str, owner: str, record_ids: list[str], batch: str
) -> list[str]:
    """Set ``batch_id = batch`` on each record still pending with no ``batch_id`` (or this one: a lock that
    landed although its call failed is taken again on retry); returns the ids taken (records someone else
    took, or that stopped being pending, are left out, never overwritten)."""
    fence = {
        "ConditionCheck": {
            "TableName": receivers_table,
            "Key": {"receiver": {"S": receiver}},
            "ConditionExpression": "batch_lease_owner = :o",
            "ExpressionAttributeValues": {":o": {"S": owner}},
        }
    }
    return _update_in_groups(
        dynamodb,
        records_table,
        record_ids,
        "SET batch_id = :b",
        "next_action = :n AND (attribute_not_exists(batch_id) OR batch_id = :b)",
        {":b": {"S": batch}, ":n": {"S": BATCH_ACTION}},
        fence,
    )


def finalize_records(dynamodb, records_table: str, record_ids: Iterable[str], batch: str, batched_at: str) -> int:
    """Remove ``next_action``/``pending_receiver`` where ``batch_id = batch``; returns how many changed
    (a record already final is skipped: finalizing twice is harmless)."""
    written = _update_in_groups(
        dynamodb,
        records_table,
        record_ids,
        "REMOVE next_action, pending_receiver SET batched_at = :at",
        "batch_id = :b AND attribute_exists(next_action)",
        {":b": {"S": batch}, ":at": {"S": batched_at}},
    )
    return len(written)


def _json_number(value: Any) -> Any:
    if not isinstance(value, Decimal):  # a number in a DynamoDB map or list
        raise TypeError(f"{type(value).__name__} is not JSON")
    return int(value) if value == value.to_integral_value() else float(value)


def _as_text(value: Any) -> str:
    """A payload stored as another DynamoDB type: a map or list as its JSON, binary decoded, else ``str``."""
    try:
        return json.dumps(value, default=_json_number, separators=(",", ":"), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        raw = getattr(value, "value", value)  # boto3's Binary holds the bytes
        return raw.decode("utf-8", "backslashreplace") if isinstance(raw, bytes) else str(value)


def record_line(record: dict[str, Any], batch: str) -> str:
    """One JSON line; a payload that is not JSON text (not JSON, nested too deeply, a number JSON cannot hold
    such as ``1e400``, a DynamoDB map or binary) is kept as text with a flag."""
    line: dict[str, Any] = {k: record.get(k) for k in ("record_id", "receiver", "created_at")}
    line["batch_id"] = batch
    raw = record.get("payload")
    if raw is None or isinstance(raw, str):
        try:
            payload = None if raw is None else json.loads(raw)
            return json.dumps({**line, "payload": payload}, separators=(",", ":"), sort_keys=True, allow_nan=False)
        except (ValueError, RecursionError):
            pass
    line |= {"payload": raw if isinstance(raw, str) else _as_text(raw), "payload_invalid_json": True}
    return json.dumps(line, separators=(",", ":"), sort_keys=True)


def put_file(s3, bucket: str, key: str, lines: list[str], *, new_only: bool = False) -> bool:
    """Write the file; ``new_only``: only if no object has ``key`` yet (False when one has)."""
    body = ("\n".join(lines) + "\n") if lines else ""
    try:
        s3.put_object(
            Bucket=bucket,
            Key=key,
            Body=body.encode(),
            ContentType="application/x-ndjson",
            **({"IfNoneMatch": "*"} if new_only else {}),
        )
    except ClientError as exc:
        if new_only and error_code(exc) == "PreconditionFailed":
            return False
        raise
    return True


def list_keys(s3, bucket: str, prefix: str, start_after: str | None = None, stop_after: str | None = None):
    """Keys under ``prefix`` in order, from after ``start_after`` up to ``stop_after`` (inclusive)."""
    after = {"StartAfter": start_after} if start_after else {}
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix, **after):
        for obj in page.get("Contents", []):
            if stop_after is not None and obj["Key"] > stop_after:
                return
            yield obj["Key"]


def put_ledger(s3, bucket: str, receiver: str, batch_time, entry: dict[str, Any]) -> None:
    body = json.dumps(entry, sort_keys=True).encode()
    s3.put_object(Bucket=bucket, Key=ledger_key(receiver, batch_time), Body=body, ContentType="application/json")
