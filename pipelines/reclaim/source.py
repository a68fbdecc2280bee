"""Where stale AgendaProgress candidates come from (a filtered scan or an index query), and each
returned item as a :class:`Candidate` or a :class:`Skip`. No Dagster imports."""

import datetime as dt
import json
import re
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from botocore.exceptions import ClientError

from pipelines.common.aws_batches import error_code
from pipelines.reclaim.params import ReclaimParams
from pipelines.retry import ATTEMPT_ID_ATTR

STATE_ATTR = "processingState"
MESSAGE_ATTR = "processingStateMessage"
CONTRACT_INDEX = "processingState-updatedTime-index"
EXECUTING, WAITING, COMPLETE = "EXECUTING", "WAITING", "COMPLETE"
FAILED, PENDING = "failed", "pending"
# Contract extensions (optional attributes, see docs/reclaim.md, "Contract extensions").
RETRY_AT_ATTR = "retryAt"  # N: a retry decided but not yet due; queued by a later run
RETRYABLE_ATTR = "retryable"  # BOOL: false marks an agenda as non-retryable
RETRY_DECISION_ATTR = "retryDecision"  # S: "exhausted" / "non-retryable": a failure already handled
# ATTEMPT_ID_ATTR "attemptId" (S): the current attempt, written by the retry action (the fencing token)

BASE_ATTRS = (STATE_ATTR, MESSAGE_ATTR, "diagnosticEvents", "attemptsCompleted", "maximumAttempts", ATTEMPT_ID_ATTR)
AGENDA_ATTRS = ("agendaId", "customerId", "agendaInsight", "addedTime")  # for the retry's ReadyAgenda item
RETRY_ATTRS = (RETRY_AT_ATTR, RETRYABLE_ATTR, RETRY_DECISION_ATTR, *AGENDA_ATTRS)
# Expression placeholders (with "#t", the time field) shared by the reads and the writes.
ATTR_NAMES = {"#s": STATE_ATTR, "#m": MESSAGE_ATTR, "#ra": RETRY_AT_ATTR, "#rd": RETRY_DECISION_ATTR}
_READ_VALUES = {
    ":exec": {"S": EXECUTING},
    ":wait": {"S": WAITING},
    ":complete": {"S": COMPLETE},
    ":failed": {"S": FAILED},
    ":ntype": {"S": "N"},
}


class TableError(RuntimeError):
    """The table, its key or the named index does not fit the parameters; the message names it."""


@dataclass(frozen=True)
class TableInfo:
    table: str
    key_attrs: tuple[str, ...]
    index: str | None  # the GSI to query, or None for the scan path
    item_count: int | None = None


def inspect_table(dynamodb, params: ReclaimParams) -> TableInfo:
    """DescribeTable: check the id field is the hash key and choose the index or the scan path."""
    desc = describe_table(dynamodb, params.tableName, "tableName")
    keys = key_schema(desc)
    if keys.get("HASH") != params.idFieldName:
        raise TableError(
            f"idFieldName {params.idFieldName!r} is not the hash key of table {params.tableName!r} "
            f"(its hash key is {keys.get('HASH')!r})"
        )
    key_attrs = tuple(k for k in (keys.get("HASH"), keys.get("RANGE")) if k)
    index = _choose_index(desc, params)
    return TableInfo(table=params.tableName, key_attrs=key_attrs, index=index, item_count=desc.get("ItemCount"))


def describe_table(dynamodb, table: str, param: str) -> dict[str, Any]:
    """DescribeTable's ``Table``; a missing table is a ``TableError`` naming the parameter."""
    try:
        return dynamodb.describe_table(TableName=table)["Table"]
    except ClientError as exc:
        if error_code(exc) == "ResourceNotFoundException":
            raise TableError(f"table {table!r} does not exist ({param})") from None
        raise


def key_schema(desc: dict[str, Any]) -> dict[str, str]:
    """``{"HASH": name, "RANGE": name}`` of a table's or an index's description."""
    return {k["KeyType"]: k["AttributeName"] for k in desc["KeySchema"]}


def indexes_on(desc: dict[str, Any], hash_key: str) -> dict[str, str | None]:
    """The GSIs of a table's description with hash key ``hash_key`` and projection ALL: name -> range key."""
    return {
        gsi["IndexName"]: key_schema(gsi).get("RANGE")
        for gsi in desc.get("GlobalSecondaryIndexes", [])
        if key_schema(gsi)["HASH"] == hash_key and gsi.get("Projection", {}).get("ProjectionType") == "ALL"
    }


def _choose_index(desc: dict, params: ReclaimParams) -> str | None:
    fits = [name for name, range_key in indexes_on(desc, STATE_ATTR).items() if range_key == params.timeFieldName]
    if not params.indexName:
        return CONTRACT_INDEX if CONTRACT_INDEX in fits else next(iter(fits), None)
    gsi = next((g for g in desc.get("GlobalSecondaryIndexes", []) if g["IndexName"] == params.indexName), None)
    if gsi is None:
        raise TableError(f"indexName {params.indexName!r} is not an index of table {params.tableName!r}")
    if params.indexName not in fits:
        raise TableError(
            f"indexName {params.indexName!r} must have hash key {STATE_ATTR!r}, range key "
            f"{params.timeFieldName!r} and projection ALL (it has {key_schema(gsi)}, "
            f"{gsi.get('Projection', {}).get('ProjectionType')})"
        )
    return params.indexName


# moto answers HTTP 500 when `<` compares an S attribute with a number (real DynamoDB says false): the
# attribute_type guard comes first. Non-numeric and missing times pass the filter on purpose, so that
# they are logged and counted (ISO-8601 strings are parsed client side).
STALE_TIME = "((attribute_type(#t, :ntype) AND #t < :cutoff) OR NOT attribute_type(#t, :ntype))"
HELD_DUE = "(attribute_type(#ra, :ntype) AND #ra <= :now)"
UNHANDLED_FAILURE = "(#m = :failed AND attribute_not_exists(#rd))"


def used_placeholders(placeholders: dict[str, Any], text: str) -> dict[str, Any]:
    """The placeholders ``text`` uses: DynamoDB refuses unused ones."""
    return {k: v for k, v in placeholders.items() if re.search(re.escape(k) + r"\b", text)}


def build_requests(info: TableInfo, params: ReclaimParams, now: int, segment: int = 0) -> list[tuple[str, str, dict]]:
    """The reads one run makes: a single filtered scan (segment ``segment``), or index queries, each
    ``(label, "scan" or "query", its kwargs without paging)``."""
    retry = params.reclaimAction == "retry"
    names = {"#t": params.timeFieldName, **ATTR_NAMES}
    values = {**_READ_VALUES, ":cutoff": {"N": str(params.cutoff_ms(now))}, ":now": {"N": str(now)}}
    attrs = dict.fromkeys([*info.key_attrs, params.timeFieldName, *BASE_ATTRS, *(RETRY_ATTRS if retry else ())])
    projection = {f"#p{i}": attr for i, attr in enumerate(attrs)}
    base: dict[str, Any] = {"TableName": info.table, "Limit": params.objectScanLimit}

    def read(label: str, operation: str, newest_first: bool = False, **expressions: str) -> tuple[str, str, dict]:
        text = " ".join(expressions.values())
        kwargs = {
            **base,
            **expressions,
            **({"ScanIndexForward": False} if newest_first else {}),
            "ProjectionExpression": ", ".join(projection),
            "ExpressionAttributeNames": {**projection, **used_placeholders(names, text)},
            "ExpressionAttributeValues": used_placeholders(values, text),
        }
        return label, operation, kwargs

    if info.index is None:
        clauses = [f"(#s = :exec AND {STALE_TIME})"]
        if params.includeWaiting:
            clauses.append(f"(#s = :wait AND attribute_not_exists(#ra) AND {STALE_TIME})")
        if retry:
            clauses.append(f"(#s = :wait AND {HELD_DUE})")
        if params.retryFailed:
            clauses.append(f"(#s = :complete AND {UNHANDLED_FAILURE})")
        if params.segments > 1:
            base.update(Segment=segment, TotalSegments=params.segments)
        return [read(f"scan segment {segment + 1}/{params.segments}", "scan", FilterExpression=" OR ".join(clauses))]

    base["IndexName"] = info.index
    label = f"query {info.index}"
    requests = [read(f"{label} EXECUTING", "query", KeyConditionExpression="#s = :exec AND #t < :cutoff")]
    waiting = ["(attribute_not_exists(#ra) AND #t < :cutoff)"] if params.includeWaiting else []
    if retry:
        waiting.append(HELD_DUE)
    if waiting:
        where = {"KeyConditionExpression": "#s = :wait", "FilterExpression": " OR ".join(waiting)}
        requests.append(read(f"{label} WAITING", "query", **where))
    if params.retryFailed:  # newest first: recent failures ahead of the ever longer history of handled ones
        where = {"KeyConditionExpression": "#s = :complete", "FilterExpression": UNHANDLED_FAILURE}
        requests.append(read(f"{label} COMPLETE/failed", "query", newest_first=True, **where))
    return requests


@dataclass
class Candidate:
    """One item the filter returned, in plain values plus what the conditional write must match."""

    id: str
    key: dict[str, Any]  # low-level key of the item
    kind: str  # "timeout" (stale EXECUTING/WAITING), "failed" (COMPLETE/failed), "held" (retryAt due)
    state: str
    time_attr: dict[str, Any]  # the time field exactly as read (the write's condition)
    time_ms: int
    attempts: int = 0
    attempts_attr: dict[str, Any] | None = None
    max_attempts: int = 3
    diagnostics: list = field(default_factory=list)
    retry_at: int | None = None
    retry_at_attr: dict[str, Any] | None = None  # retryAt exactly as read (the queue write's condition)
    retryable: bool = True
    error_type: str | None = None  # the last diagnostic event's errorType (checked against the policy)
    agenda: dict[str, Any] = field(default_factory=dict)  # agendaId, customerId, insightId, addedTime
    attempt_id: str | None = None  # the attempt the item names (None: written before attempt ids)


@dataclass
class Skip:
    id: str
    reason: str


def parse_time(attr: dict[str, Any] | None) -> tuple[int | None, str | None]:
    """(epoch ms, None) or (None, why not). Numbers are epoch ms; ISO-8601 strings are parsed."""
    if attr is None:
        return None, "time field missing"
    if "N" in attr:
        try:
            return int(Decimal(attr["N"])), None
        except InvalidOperation:
            return None, f"time field {attr['N']!r} is not a number"
    if "S" in attr:
        text = attr["S"].strip()
        try:
            moment = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
        except ValueError:
            return None, f"time field {text[:40]!r} is neither epoch ms nor ISO-8601"
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=dt.UTC)
        return int(moment.timestamp() * 1000), None
    return None, f"time field has DynamoDB type {next(iter(attr), '?')}, not N or an ISO-8601 S"


def _int(attr: dict | None, default: int) -> int:
    try:
        return int(Decimal(attr["N"])) if attr and "N" in attr else default
    except InvalidOperation:
        return default


MAX_EVENTS_DEPTH = 100
"""JSON nested deeper is kept as text: its write, which dumps it a few frames deeper, could not."""


def _deeper_than(value: Any, depth: int) -> bool:
    """Whether lists and maps nest more than ``depth`` levels in ``value`` (iterative: no recursion)."""
    stack = [(value, 0)]
    while stack:
        node, level = stack.pop()
        if level > depth:
            return True
        inside = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((child, level + 1) for child in inside)
    return False


def parse_events(events: Any) -> list:
    """``diagnosticEvents`` as a list: JSON text is parsed (unparseable text, or nested deeper than
    :data:`MAX_EVENTS_DEPTH`, is kept as one event)."""
    if isinstance(events, str):
        try:
            parsed = json.loads(events)
            if _deeper_than(parsed, MAX_EVENTS_DEPTH):
                raise RecursionError
            events = parsed
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser (or the write) goes
            return [{"message": "unparseable diagnosticEvents kept as text", "payload": events[:2000]}]
    return events if isinstance(events, list) else [events]


def item_events(attr: dict[str, Any] | None) -> list:
    """An item's ``diagnosticEvents`` attribute as a list: JSON text as :func:`parse_events` reads it; a value
    of another DynamoDB type (the contract's is S) is kept as one event holding it as read, so that no
    write drops it (a NULL holds none)."""
    if attr is None or "NULL" in attr:
        return []
    if "S" in attr:
        return parse_events(attr["S"])
    return [{"message": f"diagnosticEvents of DynamoDB type {next(iter(attr), '?')} kept as read", "payload": attr}]


def _error_type(events: list) -> str | None:
    last = events[-1] if events and isinstance(events[-1], dict) else {}
    payload = last.get("payload") if isinstance(last.get("payload"), dict) else {}
    value = last.get("errorType") or payload.get("errorType")
    return str(value) if value else None


def _agenda(item: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {name: item[name]["S"] for name in ("agendaId", "customerId") if "S" in item.get(name, {})}
    try:
        insight = json.loads(item.get("agendaInsight", {}).get("S", "{}"))
        if isinstance(insight, dict) and insight.get("insightId") is not None:
            out["insightId"] = str(insight["insightId"])
    except (ValueError, RecursionError):
        pass
    out["addedTime"] = _int(item.get("addedTime"), 0)
    return out


def to_candidate(item: dict[str, Any], info: TableInfo, params: ReclaimParams, now: int) -> Candidate | Skip | None:
    """Classify one returned item; None means "not stale after all" (e.g. a fresh ISO time)."""
    item_id = next(iter(item.get(params.idFieldName, {}).values()), "?")
    state = item.get(STATE_ATTR, {}).get("S")
    message = item.get(MESSAGE_ATTR, {}).get("S")
    time_attr = item.get(params.timeFieldName)
    diagnostics = item_events(item.get("diagnosticEvents"))
    common = dict(
        id=str(item_id),
        key={k: item[k] for k in info.key_attrs if k in item},
        state=state,
        attempts=_int(item.get("attemptsCompleted"), 0),
        attempts_attr=item.get("attemptsCompleted"),
        max_attempts=_int(item.get("maximumAttempts"), 3),
        diagnostics=diagnostics,
        error_type=_error_type(diagnostics),
        retryable=item.get(RETRYABLE_ATTR, {}).get("BOOL", True) is not False,
        agenda=_agenda(item),
        attempt_id=item.get(ATTEMPT_ID_ATTR, {}).get("S"),
    )
    retry_at = _int(item.get(RETRY_AT_ATTR), -1) if RETRY_AT_ATTR in item else None
    if state == WAITING and retry_at is not None:
        if params.reclaimAction != "retry" or retry_at > now:
            return None
        seen = {"retry_at": retry_at, "retry_at_attr": item[RETRY_AT_ATTR]}
        return Candidate(kind="held", time_attr=time_attr or {}, time_ms=0, **seen, **common)
    if state == COMPLETE:
        if not (params.retryFailed and message == FAILED and RETRY_DECISION_ATTR not in item):
            return None
        time_ms, _ = parse_time(time_attr)
        return Candidate(kind="failed", time_attr=time_attr or {}, time_ms=time_ms or 0, **common)
    if state == EXECUTING or (state == WAITING and params.includeWaiting):
        time_ms, problem = parse_time(time_attr)
        if problem:
            return Skip(id=str(item_id), reason=problem)
        if time_ms >= params.cutoff_ms(now):
            return None
        return Candidate(kind="timeout", time_attr=time_attr, time_ms=time_ms, **common)
    return None
