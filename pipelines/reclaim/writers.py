"""Writes of the reclaim actions, directly to DynamoDB: one conditional write per item.

Every write is conditional on what the scan saw (state, time field, attempts). A failed condition
means an executor (or another reclaim run) wrote first: the item is counted as ``raced`` and left
alone. Every write is also fenced by the attempt it read (``attemptId``, the retry RFC's fencing
token): a write made for an attempt that a retry has superseded is refused. Retries that are due
now update the AgendaProgress and put the ReadyAgenda item in one ``TransactWriteItems``, so a
crash never leaves a reset agenda without its queue entry, and the ReadyAgenda id is
deterministic, so a repeated write is refused rather than queued twice.
"""

from __future__ import annotations

import json
import re
from typing import Any

from botocore.exceptions import ClientError

from pipelines.common import to_item
from pipelines.reclaim.decide import CLOSE, FAIL, HOLD, QUEUE, RETRY, Decision, ready_item
from pipelines.reclaim.source import (
    COMPLETE,
    EXECUTING,
    FAILED,
    MESSAGE_ATTR,
    PENDING,
    RETRY_AT_ATTR,
    RETRY_DECISION_ATTR,
    STATE_ATTR,
    WAITING,
    Candidate,
    TableError,
)
from pipelines.retry import ATTEMPT_ID_ATTR, dynamodb_fence

DONE, RACED = "done", "raced"
OPERATION_LINK_ATTR = "agendaProgressId"  # OperationProgress -> its AgendaProgress (contract extension)


class ItemError(RuntimeError):
    """This one item could not be written (bad data, endpoint error): logged, counted, run goes on."""


def _code(exc: ClientError) -> str:
    return exc.response.get("Error", {}).get("Code", "")


def _raise_item_error(exc: ClientError, item_id: str) -> None:
    if _code(exc) in ("ValidationException", "SerializationException"):
        raise ItemError(f"{item_id}: {_code(exc)}: {exc.response['Error'].get('Message', '')}") from None
    raise exc


def diagnostics_json(c: Candidate, event: dict[str, Any] | None) -> str:
    return json.dumps(c.diagnostics + ([event] if event else []), separators=(",", ":"), default=str)


class _Update:
    """An UpdateItem / TransactWriteItems Update on one AgendaProgress item, built up step by step."""

    def __init__(self, time_field: str) -> None:
        self.names = {
            "#s": STATE_ATTR,
            "#m": MESSAGE_ATTR,
            "#t": time_field,
            "#rd": RETRY_DECISION_ATTR,
            "#ra": RETRY_AT_ATTR,
        }
        self.values: dict[str, Any] = {}
        self.sets: list[str] = []
        self.removes: list[str] = []
        self.conditions: list[str] = []
        self.time_field = time_field

    def set(self, path: str, name: str, value: Any) -> _Update:
        self.values[f":{name}"] = value
        self.sets.append(f"{path} = :{name}")
        return self

    def touch(self, now: int) -> _Update:
        """The time field and ``updatedTime`` become now."""
        self.set("#t", "now", {"N": str(now)})
        if self.time_field != "updatedTime":
            self.sets.append("updatedTime = :now")
        return self

    def remove(self, *paths: str) -> _Update:
        self.removes.extend(p for p in paths if p != self.time_field)
        return self

    def when(self, expression: str, **values: Any) -> _Update:
        self.conditions.append(expression)
        self.values.update({f":{k}": v for k, v in values.items()})
        return self

    def fenced(self, attempt_id: str | None) -> _Update:
        """The item still names the attempt the scan saw: a write for a superseded attempt is refused."""
        fence = dynamodb_fence(attempt_id)
        self.names.update(fence["names"])
        self.values.update(fence["values"])
        return self.when(fence["condition"])

    def when_unchanged(self, c: Candidate) -> _Update:
        """The item still has the state, time and attempt the scan saw (an executor writing moves the time)."""
        self.when("#s = :seen_state", seen_state={"S": c.state})
        if c.time_attr:
            self.when("#t = :seen_time", seen_time=c.time_attr)
        return self.fenced(c.attempt_id)

    def request(self, table: str, key: dict[str, Any]) -> dict[str, Any]:
        expression = "SET " + ", ".join(self.sets)
        if self.removes:
            expression += " REMOVE " + ", ".join(self.removes)
        condition = " AND ".join(self.conditions)
        referenced = set(re.findall(r"#\w+", expression + " " + condition))
        used = {n: v for n, v in self.names.items() if n in referenced}
        return {
            "TableName": table,
            "Key": key,
            "UpdateExpression": expression,
            "ConditionExpression": condition,
            "ExpressionAttributeNames": used,
            "ExpressionAttributeValues": self.values,
        }


def progress_update(c: Candidate, d: Decision, *, time_field: str, now: int, action: str, cutoff: int) -> _Update:
    """The conditional update of one AgendaProgress for decision ``d`` (shared by the writers' tests)."""
    u = _Update(time_field)
    diag = {"S": diagnostics_json(c, d.event)}
    if d.kind == FAIL:
        u.set("#s", "complete", {"S": COMPLETE}).set("#m", "failed", {"S": FAILED}).touch(now)
        u.sets.append("completedTime = :now")
        u.set("diagnosticEvents", "diag", diag).set("attemptsCompleted", "n", {"N": str(d.attempt)})
        if action == "retry":
            u.set("#rd", "decision", {"S": "exhausted" if c.retryable else "non-retryable"})
        u.when_unchanged(c)
        if "N" in (c.time_attr or {}):
            u.when("#t < :cutoff", cutoff={"N": str(cutoff)})
    elif d.kind == CLOSE:
        u.set("#rd", "decision", {"S": "exhausted" if c.retryable else "non-retryable"})
        u.set("diagnosticEvents", "diag", diag)
        u.when_unchanged(c).when("#m = :failed_seen AND attribute_not_exists(#rd)", failed_seen={"S": FAILED})
    elif d.kind in (RETRY, HOLD):
        u.set("#s", "waiting", {"S": WAITING}).set("#m", "pending", {"S": PENDING}).touch(now)
        u.set("attemptsCompleted", "n", {"N": str(d.attempt)}).set("diagnosticEvents", "diag", diag)
        u.remove("completedTime", "startedTime", "#rd")
        u.set(ATTEMPT_ID_ATTR, "new_attempt", {"S": d.attempt_id})  # the new attempt: the fencing token
        if d.kind == HOLD:
            u.set("#ra", "retry_at", {"N": str(d.retry_at)})
        u.when_unchanged(c)
        if c.kind == "failed":
            u.when("attribute_not_exists(#rd)")
        if c.attempts_attr:
            u.when("attemptsCompleted = :seen_attempts", seen_attempts=c.attempts_attr)
        else:
            u.when("attribute_not_exists(attemptsCompleted)")
    elif d.kind == QUEUE:
        u.remove("#ra").touch(now)
        u.when(
            "#s = :waiting_seen AND #ra = :seen_retry_at",
            waiting_seen={"S": WAITING},
            seen_retry_at={"N": str(c.retry_at)},
        ).fenced(c.attempt_id)
    return u


class DynamoWriter:
    """Applies decisions with conditional DynamoDB writes. Returns ``done`` or ``raced`` per item."""

    def __init__(self, dynamodb, *, table: str, time_field: str, ready_table: str | None, action: str) -> None:
        self.dynamodb = dynamodb
        self.table = table
        self.time_field = time_field
        self.ready_table = ready_table
        self.action = action

    def apply(self, c: Candidate, d: Decision, *, now: int, cutoff: int) -> str:
        u = progress_update(c, d, time_field=self.time_field, now=now, action=self.action, cutoff=cutoff)
        request = u.request(self.table, c.key)
        if d.kind in (RETRY, QUEUE):
            return self._transact(request, ready_item(self.table, c, d, now), c.id)
        try:
            self.dynamodb.update_item(**request)
            return DONE
        except ClientError as exc:
            if _code(exc) == "ConditionalCheckFailedException":
                return RACED
            _raise_item_error(exc, c.id)
        return RACED  # unreachable

    def _transact(self, update: dict[str, Any], ready: dict[str, Any], item_id: str) -> str:
        if not self.ready_table:
            raise ItemError(f"{item_id}: no ReadyAgenda table configured (AGENDA_READY_TABLE)")
        try:
            self.dynamodb.transact_write_items(
                TransactItems=[
                    {"Update": update},
                    {
                        "Put": {
                            "TableName": self.ready_table,
                            "Item": to_item(ready),
                            "ConditionExpression": "attribute_not_exists(id)",
                        }
                    },
                ]
            )
            return DONE
        except ClientError as exc:
            if _code(exc) == "TransactionCanceledException":
                return RACED  # the progress moved on, or this attempt was queued already
            _raise_item_error(exc, item_id)
        return RACED  # unreachable


def put_ready_item(dynamodb, ready_table: str, item: dict[str, Any]) -> bool:
    """Idempotent ReadyAgenda put (used by the HTTP writer); False if it was queued already."""
    try:
        dynamodb.put_item(TableName=ready_table, Item=to_item(item), ConditionExpression="attribute_not_exists(id)")
        return True
    except ClientError as exc:
        if _code(exc) == "ConditionalCheckFailedException":
            return False
        raise


class OperationProgressWriter:
    """Fails the EXECUTING OperationProgress items of a failed agenda (``operationProgressTableName``).

    OperationProgress items carry ``agendaProgressId`` (S): the id of their AgendaProgress, either as
    the table's hash key or as the hash key of a GSI with projection ALL.
    """

    def __init__(self, dynamodb, table: str) -> None:
        self.dynamodb = dynamodb
        self.table = table
        try:
            desc = dynamodb.describe_table(TableName=table)["Table"]
        except ClientError as exc:
            if _code(exc) == "ResourceNotFoundException":
                raise TableError(f"table {table!r} does not exist (operationProgressTableName)") from None
            raise
        self.keys = [k["AttributeName"] for k in desc["KeySchema"]]
        self.index = None
        if self.keys[0] != OPERATION_LINK_ATTR:
            for gsi in desc.get("GlobalSecondaryIndexes", []):
                hash_key = next(k["AttributeName"] for k in gsi["KeySchema"] if k["KeyType"] == "HASH")
                if hash_key == OPERATION_LINK_ATTR and gsi.get("Projection", {}).get("ProjectionType") == "ALL":
                    self.index = gsi["IndexName"]
                    break
            else:
                raise TableError(
                    f"table {table!r} (operationProgressTableName) has neither the hash key nor a GSI "
                    f"(projection ALL) on {OPERATION_LINK_ATTR!r}"
                )

    def fail_executing(self, progress_id: str, event: dict[str, Any], now: int) -> tuple[int, int]:
        """(failed, raced) for the EXECUTING operations of one agenda."""
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "KeyConditionExpression": "#link = :id",
            "FilterExpression": "#s = :executing",
            "ExpressionAttributeNames": {"#link": OPERATION_LINK_ATTR, "#s": STATE_ATTR},
            "ExpressionAttributeValues": {":id": {"S": progress_id}, ":executing": {"S": EXECUTING}},
        }
        if self.index:
            kwargs["IndexName"] = self.index
        failed = raced = 0
        while True:
            page = self.dynamodb.query(**kwargs)
            for item in page.get("Items", []):
                try:
                    events = json.loads(item.get("diagnosticEvents", {}).get("S", "[]"))
                except ValueError:
                    events = []
                events = (events if isinstance(events, list) else [events]) + [event]
                try:
                    self.dynamodb.update_item(
                        TableName=self.table,
                        Key={k: item[k] for k in self.keys},
                        UpdateExpression="SET #s = :complete, #m = :failed, updatedTime = :now, "
                        "completedTime = :now, diagnosticEvents = :diag",
                        ConditionExpression="#s = :executing",
                        ExpressionAttributeNames={"#s": STATE_ATTR, "#m": MESSAGE_ATTR},
                        ExpressionAttributeValues={
                            ":complete": {"S": COMPLETE},
                            ":failed": {"S": FAILED},
                            ":executing": {"S": EXECUTING},
                            ":now": {"N": str(now)},
                            ":diag": {"S": json.dumps(events, separators=(",", ":"), default=str)},
                        },
                    )
                    failed += 1
                except ClientError as exc:
                    if _code(exc) != "ConditionalCheckFailedException":
                        raise
                    raced += 1
            if not page.get("LastEvaluatedKey"):
                return failed, raced
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
