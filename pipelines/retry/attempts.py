"""``retry_call`` and the attempt ids that fence an attempt's writes (docs/retry.md, "Presets" and
"One AWS failure policy"): a superseded attempt's late write is refused."""

import itertools
import time
import uuid
from collections.abc import Callable
from typing import TypeVar

from pipelines.retry.classify import is_transient
from pipelines.retry.policy import STOP, RetryPolicy

T = TypeVar("T")
ATTEMPT_ID_ATTR = "attemptId"


def retry_call(
    fn: Callable[[], T],
    policy: RetryPolicy,
    *,
    retryable: Callable[[BaseException], bool] = is_transient,
    sleep: Callable[[float], None] = time.sleep,
    on_retry: Callable[[int, BaseException, float], None] | None = None,
) -> T:
    """Call ``fn`` until it returns; after a failure that is ``retryable`` (default: a transient
    AWS error) and allowed by ``policy.is_retryable``, wait ``policy.delay(n)`` and call again.
    When the policy says STOP, or for any other error, the error is raised as is. A failing
    user delay function raises its ``DelayFunctionError`` (chained to the call's error)."""
    for attempts in itertools.count(1):
        try:
            return fn()
        except Exception as exc:
            if not (retryable(exc) and policy.is_retryable(exc)):
                raise
            try:
                wait = policy.delay(attempts)
            except Exception as policy_error:
                raise policy_error from exc
            if wait is STOP:
                raise
            if on_retry is not None:
                on_retry(attempts, exc, wait)
            sleep(wait)


def new_attempt_id() -> str:
    return f"att-{uuid.uuid4().hex}"


def dynamodb_fence(attempt_id: str | None, attribute: str = ATTEMPT_ID_ATTR) -> dict:
    """The ``condition`` (AND it with your own), ``names`` and ``values`` of a DynamoDB write made on
    behalf of ``attempt_id`` (``None``: a record from before attempt ids). A failed condition
    (``ConditionalCheckFailedException``) means a newer attempt took over."""
    if attempt_id is None:
        return {"condition": "attribute_not_exists(#fence)", "names": {"#fence": attribute}, "values": {}}
    return {"condition": "#fence = :fence", "names": {"#fence": attribute}, "values": {":fence": {"S": attempt_id}}}
