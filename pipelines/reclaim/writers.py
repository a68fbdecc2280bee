"""Conditional writes of the reclaim actions to DynamoDB, a failed condition being ``raced``
(``docs/reclaim.md``, "Fail", "Grouped writes", "Retry")."""

import json
import re
import time
import uuid
from typing import Any, Self

from botocore.exceptions import ClientError

from pipelines.common import from_item, to_item
from pipelines.common.aws_batches import CALL_POLICY, cancellation_codes, conditional_write, error_code, retry_note
from pipelines.reclaim.decide import CLOSE, FAIL, HOLD, NOT_RETRYABLE_MESSAGE, QUEUE, RETRY, Decision
from pipelines.reclaim.params import ReclaimParams
from pipelines.reclaim.source import (
    ATTR_NAMES,
    COMPLETE,
    EXECUTING,
    FAILED,
    PENDING,
    STATE_ATTR,
    WAITING,
    Candidate,
    TableError,
    describe_table,
    indexes_on,
    item_events,
    used_placeholders,
)
from pipelines.retry import ATTEMPT_ID_ATTR, TRANSIENT_ITEM_CODES, dynamodb_fence, is_transient, retry_call
from pipelines.retry.policy import exponential

DONE, RACED = "done", "raced"
STATEMENTS_PER_CALL = 25  # BatchExecuteStatement's limit
# Statements that came back throttled (or with a transient server error, ``TRANSIENT_ITEM_CODES``) inside a
# successful ``BatchExecuteStatement`` are sent again: botocore retries failed calls, not failed statements.
STATEMENT_POLICY = exponential(0.05, max_delay=2.0, max_attempts=8)  # 0.05 s doubling to 2 s, 8 attempts
ITEM_STATEMENT_CODES = frozenset({"ValidationError", "ItemCollectionSizeLimitExceeded", "DuplicateItem"})
READY_NAMESPACE = uuid.UUID("6f1c1f5e-4f0e-4c53-9a39-0c1d4d1b2a77")  # of the ReadyAgenda items' ids
OPERATION_LINK_ATTR = "agendaProgressId"  # OperationProgress -> its AgendaProgress (contract extension)


class ItemError(RuntimeError):
    """This one item could not be written (bad data, endpoint error): logged, counted, run goes on."""


class _StatementsThrottled(Exception):
    """Some statements of a ``BatchExecuteStatement`` came back throttled: worth another call."""


_EXPRESSION_TOKEN = re.compile(r"attribute_not_exists\((?P<missing>#?\w+)\)|[#:]?[A-Za-z_]\w*")
_PARTIQL_KEYWORDS = frozenset({"AND", "OR", "NOT"})


def _quote(name: str) -> str:
    if '"' in name:
        raise ItemError(f"attribute or table name {name!r} cannot be quoted in PartiQL")
    return f'"{name}"'


class _Update:
    """An UpdateItem / TransactWriteItems Update on one AgendaProgress item, built up step by step."""

    def __init__(self, time_field: str) -> None:
        self.names = {**ATTR_NAMES, "#t": time_field}
        self.values: dict[str, Any] = {}
        self.sets: list[str] = []
        self.removes: list[str] = []
        self.conditions: list[str] = []
        self.time_field = time_field

    def set(self, path: str, name: str, value: Any) -> Self:
        self.values[f":{name}"] = value
        self.sets.append(f"{path} = :{name}")
        return self

    def touch(self, now: int) -> Self:
        self.set("#t", "now", {"N": str(now)})
        if self.time_field != "updatedTime":
            self.sets.append("updatedTime = :now")
        return self

    def fail(self, now: int, diag: str) -> Self:
        self.set("#s", "complete", {"S": COMPLETE}).set("#m", "failed", {"S": FAILED}).touch(now)
        self.sets.append("completedTime = :now")
        return self.set("diagnosticEvents", "diag", {"S": diag})

    def remove(self, *paths: str) -> Self:
        self.removes.extend(p for p in paths if p != self.time_field)
        return self

    def when(self, expression: str, **values: Any) -> Self:
        self.conditions.append(expression)
        self.values.update({f":{k}": v for k, v in values.items()})
        return self

    def fenced(self, attempt_id: str | None) -> Self:
        """The item still names the attempt the scan saw: a write for a superseded attempt is refused."""
        fence = dynamodb_fence(attempt_id)
        self.names.update(fence["names"])
        self.values.update(fence["values"])
        return self.when(fence["condition"])

    def when_unchanged(self, c: Candidate) -> Self:
        """The item still has the state, time and attempt the scan saw (an executor writing moves the time)."""
        self.when("#s = :seen_state", seen_state={"S": c.state})
        if c.time_attr:
            self.when("#t = :seen_time", seen_time=c.time_attr)
        return self.fenced(c.attempt_id)

    def partiql(self, table: str, key: dict[str, Any]) -> dict[str, Any]:
        """The same conditional update as one PartiQL statement with positional parameters:
        ``UPDATE "t" SET "a" = ? ... REMOVE "b" WHERE "id" = ? AND <the conditions>`` (``#name`` becomes
        the quoted name, ``:value`` a ``?``, ``attribute_not_exists(x)`` ``x IS MISSING``)."""
        parameters: list[Any] = []
        sets = [" SET " + self._partiql(s, parameters) for s in self.sets]
        removes = [" REMOVE " + self._partiql(r, parameters) for r in self.removes]
        where = [f"{_quote(name)} = ?" for name in key]
        parameters.extend(key.values())
        where += [self._partiql(c, parameters) for c in self.conditions]
        statement = f"UPDATE {_quote(table)}{''.join(sets)}{''.join(removes)} WHERE {' AND '.join(where)}"
        return {"Statement": statement, "Parameters": parameters}

    def _partiql(self, expression: str, parameters: list[Any]) -> str:
        def token(match: re.Match[str]) -> str:
            word = match.group(0)
            if match.group("missing"):
                return f"{self._name(match.group('missing'))} IS MISSING"
            if word.startswith(":"):
                parameters.append(self.values[word])
                return "?"
            return word if word in _PARTIQL_KEYWORDS else self._name(word)

        return _EXPRESSION_TOKEN.sub(token, expression)

    def _name(self, path: str) -> str:
        return _quote(self.names.get(path, path))

    def plain(self) -> dict[str, Any]:
        """The same update as a partial object of plain values (the HTTP endpoint's PUT; None removes)."""
        assigned = dict(assignment.split(" = ") for assignment in self.sets)
        body = from_item({self.names.get(path, path): self.values[value] for path, value in assigned.items()})
        return body | {self.names.get(path, path): None for path in self.removes}

    def request(self, table: str, key: dict[str, Any]) -> dict[str, Any]:
        expression = "SET " + ", ".join(self.sets)
        if self.removes:
            expression += " REMOVE " + ", ".join(self.removes)
        condition = " AND ".join(self.conditions)
        return {
            "TableName": table,
            "Key": key,
            "UpdateExpression": expression,
            "ConditionExpression": condition,
            "ExpressionAttributeNames": used_placeholders(self.names, f"{expression} {condition}"),
            "ExpressionAttributeValues": self.values,
        }


def _retry_decision(d: Decision) -> str:
    """Why a failure will not be retried: the item or the policy's ``nonRetryable`` refused it, or it ran out."""
    return "non-retryable" if d.reason.startswith(NOT_RETRYABLE_MESSAGE) else "exhausted"


def progress_update(c: Candidate, d: Decision, params: ReclaimParams, *, now: int, cutoff: int) -> _Update:
    """The conditional update of one AgendaProgress for decision ``d``, for both writers (and their tests)."""
    u = _Update(params.timeFieldName)
    diag = json.dumps(c.diagnostics + ([d.event] if d.event else []), separators=(",", ":"), default=str)
    if d.kind == FAIL:
        u.fail(now, diag).set("attemptsCompleted", "n", {"N": str(d.attempt)})
        if params.reclaimAction == "retry":
            u.set("#rd", "decision", {"S": _retry_decision(d)})
        u.when_unchanged(c)
        if "N" in (c.time_attr or {}):
            u.when("#t < :cutoff", cutoff={"N": str(cutoff)})
    elif d.kind == CLOSE:
        u.set("#rd", "decision", {"S": _retry_decision(d)})
        u.set("diagnosticEvents", "diag", {"S": diag})
        u.when_unchanged(c).when("#m = :failed_seen AND attribute_not_exists(#rd)", failed_seen={"S": FAILED})
    elif d.kind in (RETRY, HOLD):
        u.set("#s", "waiting", {"S": WAITING}).set("#m", "pending", {"S": PENDING}).touch(now)
        u.set("attemptsCompleted", "n", {"N": str(d.attempt)}).set("diagnosticEvents", "diag", {"S": diag})
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
            seen_retry_at=c.retry_at_attr,
        ).fenced(c.attempt_id)
    return u


Outcome = str | ItemError  # DONE, RACED, or why this one item could not be written


def apply_each(writer, pairs: list[tuple[Candidate, Decision]], *, now: int, cutoff: int) -> list[Outcome]:
    outcomes: list[Outcome] = []
    for c, d in pairs:
        try:
            outcomes.append(writer.apply(c, d, now=now, cutoff=cutoff))
        except ItemError as exc:
            outcomes.append(exc)
    return outcomes


class DynamoWriter:
    """Applies decisions with conditional DynamoDB writes, ``done`` or ``raced`` per item; ``grouped``: fail,
    close and hold updates go 25 to a ``BatchExecuteStatement`` (PartiQL WHERE per statement: not moto)."""

    def __init__(self, dynamodb, params: ReclaimParams, *, ready_table=None, grouped=False, sleep=time.sleep) -> None:
        self.dynamodb = dynamodb
        self.params = params
        self.table = params.tableName
        self.ready_table = ready_table
        self.grouped = grouped
        self.sleep = sleep  # between retries of throttled statements (tests pass their own)

    def apply(self, c: Candidate, d: Decision, *, now: int, cutoff: int) -> str:
        request = progress_update(c, d, self.params, now=now, cutoff=cutoff).request(self.table, c.key)
        try:
            if d.kind in (RETRY, QUEUE):
                put = ready_put(self.ready_table, self.table, c, d, now)
                self.dynamodb.transact_write_items(TransactItems=[{"Update": request}, {"Put": put}])
            else:
                self.dynamodb.update_item(**request)
        except ClientError as exc:
            code = error_code(exc)
            if code == "ConditionalCheckFailedException":
                return RACED
            if code == "TransactionCanceledException":
                return _cancelled(c, exc)
            if code not in ("ValidationException", "SerializationException"):
                raise
            raise ItemError(f"{c.id}: {code}: {exc.response['Error'].get('Message', '')}") from None
        return DONE

    def apply_many(self, pairs: list[tuple[Candidate, Decision]], *, now: int, cutoff: int) -> list[Outcome]:
        """Outcomes in the order of ``pairs``; retries and queued retries stay one transaction each."""
        if not self.grouped:
            return apply_each(self, pairs, now=now, cutoff=cutoff)
        outcomes: dict[int, Outcome] = {}
        statements: list[tuple[int, dict[str, Any]]] = []
        for i, (c, d) in enumerate(pairs):
            if d.kind in (RETRY, QUEUE):
                outcomes[i] = apply_each(self, [(c, d)], now=now, cutoff=cutoff)[0]
                continue
            u = progress_update(c, d, self.params, now=now, cutoff=cutoff)
            try:
                statements.append((i, u.partiql(self.table, c.key)))
            except ItemError as exc:
                outcomes[i] = exc
        for group in _distinct_groups(statements, pairs):
            outcomes.update(self._execute(group, pairs, now=now, cutoff=cutoff))
        return [outcomes[i] for i in range(len(pairs))]

    def _execute(
        self, group: list[tuple[int, dict[str, Any]]], pairs: list[tuple[Candidate, Decision]], *, now: int, cutoff: int
    ) -> dict[int, Outcome]:
        """One ``BatchExecuteStatement``, then one more per retry of the statements DynamoDB throttled."""
        outcomes: dict[int, Outcome] = {}
        pending = list(group)

        def attempt() -> None:
            nonlocal pending
            response = self.dynamodb.batch_execute_statement(Statements=[statement for _, statement in pending])
            throttled, codes = [], set()
            for (i, statement), answer in zip(pending, response["Responses"], strict=True):
                error = answer.get("Error")
                code = (error or {}).get("Code", "")
                if not error:
                    outcomes[i] = DONE
                elif code == "ConditionalCheckFailed":
                    outcomes[i] = RACED
                elif code in TRANSIENT_ITEM_CODES:
                    throttled.append((i, statement))
                    codes.add(code)
                elif code in ITEM_STATEMENT_CODES:
                    outcomes[i] = ItemError(f"{pairs[i][0].id}: {code}: {error.get('Message', '')}")
                else:  # ResourceNotFound, AccessDenied: the call's own failure, as UpdateItem would raise it
                    raise ClientError(
                        {"Error": {"Code": code, "Message": error.get("Message", "")}}, "BatchExecuteStatement"
                    )
            pending = throttled
            if throttled:
                raise _StatementsThrottled(", ".join(sorted(codes)))

        try:
            retry_call(
                attempt, STATEMENT_POLICY, retryable=lambda exc: isinstance(exc, _StatementsThrottled), sleep=self.sleep
            )
        except _StatementsThrottled as exc:  # still throttled when the policy stopped
            reason = f"still throttled after {STATEMENT_POLICY.max_attempts} attempts ({exc})"
        except ClientError as exc:
            if error_code(exc) == "ValidationException":
                # The call as a whole was refused (a statement it could not take): this group goes
                # one item at a time, so that only the bad item is an error.
                found = apply_each(self, [pairs[i] for i, _ in pending], now=now, cutoff=cutoff)
                return {**outcomes, **{i: o for (i, _), o in zip(pending, found, strict=True)}}
            if not is_transient(exc):
                raise
            reason = f"{error_code(exc)} after botocore's retries"  # the call itself failed
        else:
            return outcomes
        for i, _ in pending:  # left for a later pass (docs/reclaim.md, "Grouped writes")
            outcomes[i] = ItemError(f"{pairs[i][0].id}: {reason}; left for a later pass")
        return outcomes


def _cancelled(c: Candidate, exc: ClientError) -> str:
    """A cancelled retry transaction: ``raced`` when a condition failed (the progress moved on, or this
    attempt was queued already); otherwise (throttled, a conflict, an item DynamoDB refuses) an error of the item."""
    codes = cancellation_codes(exc) or []
    if "ConditionalCheckFailed" in codes:
        return RACED
    reasons = exc.response.get("CancellationReasons") or []
    said = "; ".join(
        f"{code}: {r.get('Message') or ''}" for code, r in zip(codes, reasons, strict=True) if code != "None"
    )
    refusals = set(codes) - {"None"}
    later = "; left for a later pass" if refusals and refusals <= TRANSIENT_ITEM_CODES else ""
    raise ItemError(f"{c.id}: TransactWriteItems cancelled ({said or 'no reason given'}){later}")


def _distinct_groups(
    statements: list[tuple[int, dict[str, Any]]], pairs: list[tuple[Candidate, Decision]]
) -> list[list[tuple[int, dict[str, Any]]]]:
    """Groups of up to 25 statements, never two on the same item in one call (DynamoDB refuses that)."""
    groups: list[dict[str, tuple[int, dict[str, Any]]]] = []  # each by its items' keys
    for i, statement in statements:
        key = json.dumps(pairs[i][0].key, sort_keys=True)
        group = next((g for g in groups if len(g) < STATEMENTS_PER_CALL and key not in g), None)
        if group is None:
            group = {}
            groups.append(group)
        group[key] = (i, statement)
    return [list(group.values()) for group in groups]


def ready_put(ready_table: str | None, table: str, c: Candidate, d: Decision, now: int) -> dict[str, Any]:
    """The put of the retry's ReadyAgenda item (``docs/reclaim.md``, "Retry"), refused when it was queued
    already: its id is deterministic in (table, agenda progress id, attempt)."""
    if not ready_table:
        raise ItemError(f"{c.id}: no ReadyAgenda table configured (AGENDA_READY_TABLE)")
    insight_id, customer_id = c.agenda.get("insightId"), c.agenda.get("customerId")
    if missing := [name for name, value in (("insightId", insight_id), ("customerId", customer_id)) if not value]:
        # POP's schedulers query ReadyAgenda by both: an item without them would never be taken
        raise ItemError(f"{c.id}: no {' or '.join(missing)} (agendaInsight, customerId) for its ReadyAgenda item")
    item = {
        "id": str(uuid.uuid5(READY_NAMESPACE, f"{table}/{c.id}/{d.attempt}")),
        "insightId": insight_id,
        "agendaId": c.agenda.get("agendaId"),
        "customerId": customer_id,
        "insightIdCustomerIdComposite": insight_id + customer_id,  # POP's index key (PersistentReadyAgendaConverter)
        "added": min(c.agenda.get("addedTime") or 0, now),
        "agendaProgressId": c.id,
        "retryAttempt": d.attempt,
        "attemptId": d.attempt_id,
        "priority": 1,
    }  # to_item leaves out a missing agendaId
    return {"TableName": ready_table, "Item": to_item(item), "ConditionExpression": "attribute_not_exists(id)"}


class OperationProgressWriter:
    """Fails the EXECUTING OperationProgress items of a failed agenda (``operationProgressTableName``),
    found by ``agendaProgressId``: the table's hash key or the hash key of a GSI with projection ALL."""

    def __init__(self, dynamodb, table: str) -> None:
        self.dynamodb = dynamodb
        self.table = table
        desc = describe_table(dynamodb, table, "operationProgressTableName")
        self.keys = [k["AttributeName"] for k in desc["KeySchema"]]
        self.index = None
        if self.keys[0] != OPERATION_LINK_ATTR:
            fitting = indexes_on(desc, OPERATION_LINK_ATTR)
            if not fitting:
                raise TableError(
                    f"table {table!r} (operationProgressTableName) has neither the hash key nor a GSI "
                    f"(projection ALL) on {OPERATION_LINK_ATTR!r}"
                )
            self.index = next(iter(fitting))

    def fail_executing(self, progress_id: str, event: dict[str, Any], now: int) -> tuple[int, list[ItemError]]:
        """How many EXECUTING operations of one agenda were failed (one that moved on meanwhile is left), and an
        error for each update that failed (the others are still written); each call is retried by ``CALL_POLICY``,
        and a Query page that still fails is one more error (the items of its pages and after it left EXECUTING)."""
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "KeyConditionExpression": "#link = :id",
            "FilterExpression": "#s = :executing",
            "ExpressionAttributeNames": {"#link": OPERATION_LINK_ATTR, "#s": STATE_ATTR},
            "ExpressionAttributeValues": {":id": {"S": progress_id}, ":executing": {"S": EXECUTING}},
            **({"IndexName": self.index} if self.index else {}),
        }
        failed, refused = 0, []
        while True:
            try:
                page = retry_call(lambda: self.dynamodb.query(**kwargs), CALL_POLICY, on_retry=retry_note("Query"))
            except Exception as exc:  # still failing: what its earlier pages failed stays counted
                refused.append(ItemError(f"a {self.table} Query failed, its items from there left EXECUTING: {exc}"))
                return failed, refused
            for item in page.get("Items", []):
                events = item_events(item.get("diagnosticEvents")) + [event]
                u = _Update("updatedTime").fail(now, json.dumps(events, separators=(",", ":"), default=str))
                u.when("#s = :executing", executing={"S": EXECUTING})
                key = {k: item[k] for k in self.keys}
                request = u.request(self.table, key)
                update = lambda: conditional_write(lambda: self.dynamodb.update_item(**request))  # noqa: B023, E731
                try:
                    if retry_call(update, CALL_POLICY, on_retry=retry_note("UpdateItem")) is not None:
                        failed += 1
                except Exception as exc:  # refused, or still failing after the call policy
                    refused.append(ItemError(f"{self.table} item {from_item(key)}: {exc}"))
            if "LastEvaluatedKey" not in page:
                return failed, refused
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
