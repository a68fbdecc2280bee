"""Attempt ids and fencing of the retry RFC ("Ids management" and "Retry implementation").

Whoever queues a new attempt of a piece of work gives it a fresh ``attempt_id``
(:func:`new_attempt_id`) and writes it on the work's record: the id is the fencing token. Every
later write made on behalf of an attempt is conditional on the record still naming that attempt
(:func:`dynamodb_fence`), so a late write from a superseded attempt (an executor that came back
after its attempt timed out and was retried) is refused by DynamoDB instead of overwriting the
new attempt's state.

Used by POP's agenda reclaimer: its retry action writes a new ``attemptId`` on the AgendaProgress
and the ReadyAgenda item, and each of its own writes is fenced by the attempt it read.
"""

from __future__ import annotations

import uuid

ATTEMPT_ID_ATTR = "attemptId"


def new_attempt_id() -> str:
    """A fresh, unique attempt id (``att-<32 hex>``)."""
    return f"att-{uuid.uuid4().hex}"


def dynamodb_fence(attempt_id: str | None, attribute: str = ATTEMPT_ID_ATTR) -> dict:
    """The pieces of a conditional DynamoDB write (UpdateItem, Put or a transaction item) made on
    behalf of ``attempt_id``: merge ``condition`` (AND it with your own), ``names`` and ``values``
    into your call. The write is accepted only while the record still names that attempt;
    ``None`` stands for a record written before attempt ids existed, which has none. A failed
    condition (``ConditionalCheckFailedException``) then means a newer attempt took over.
    """
    if attempt_id is None:
        return {"condition": "attribute_not_exists(#fence)", "names": {"#fence": attribute}, "values": {}}
    return {
        "condition": "#fence = :fence",
        "names": {"#fence": attribute},
        "values": {":fence": {"S": attempt_id}},
    }


__all__ = ["ATTEMPT_ID_ATTR", "dynamodb_fence", "new_attempt_id"]
