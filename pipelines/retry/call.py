"""Retry one call in plain Python, by a policy: for batch code that should not restart a whole op
because one AWS call was throttled."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from pipelines.retry.classify import is_transient
from pipelines.retry.policy import STOP, RetryPolicy

T = TypeVar("T")


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
    attempts = 0
    while True:
        try:
            return fn()
        except Exception as exc:
            attempts += 1
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
