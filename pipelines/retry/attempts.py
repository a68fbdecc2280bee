"""Attempt ids and fencing of the retry RFC: a new attempt of a piece of work gets a fresh
``attempt_id``, written on the work's record, and every later write on behalf of an attempt is
conditional on the record still naming it, so a late write from a superseded attempt is refused."""

from __future__ import annotations

import uuid

ATTEMPT_ID_ATTR = "attemptId"


def new_attempt_id() -> str:
    """A fresh, unique attempt id (``att-<32 hex>``)."""
    return f"att-{uuid.uuid4().hex}"


def dynamodb_fence(attempt_id: str | None, attribute: str = ATTEMPT_ID_ATTR) -> dict:
    """The ``condition`` (AND it with your own), ``names`` and ``values`` of a DynamoDB write made on
    behalf of ``attempt_id`` (``None``: a record from before attempt ids). A failed condition
    (``ConditionalCheckFailedException``) means a newer attempt took over."""
    if attempt_id is None:
        return {"condition": "attribute_not_exists(#fence)", "names": {"#fence": attribute}, "values": {}}
    return {"condition": "#fence = :fence", "names": {"#fence": attribute}, "values": {":fence": {"S": attempt_id}}}
