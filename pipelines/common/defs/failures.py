"""The one AWS failure policy of ops, assets, asset checks and sensors.

:func:`aws_errors`, around AWS work: a transient AWS error (throttling, 5xx, connection) is retried
by the retry library's policy (``dg.RetryRequested`` with the policy's wait, in ops and assets), a
permanent one fails with the one line of ``resources.errors``. Plain-Python code that works
through a batch retries single calls with ``pipelines.retry.retry_call`` and the same kind of
policy, so that one throttled call does not restart a whole op.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from typing import Any

import dagster as dg

from pipelines.retry.classify import ErrorKind, classify_aws_error
from pipelines.retry.policy import STOP, RetryPolicy, RetryPolicyError, exponential
from resources.errors import explain_aws_error

DEFAULT_OP_POLICY = exponential(initial=2, coefficient=2, max_delay=60, max_attempts=3, jitter="full")
"""Ops that name no policy: 3 attempts, waits up to 2 s then 4 s (full jitter). botocore already
retries each call a few times; this is the second layer, for outages longer than a call."""


UNLIMITED_RETRIES = 10_000
"""``max_retries`` given to Dagster for a policy without ``max_attempts`` (Dagster needs a number)."""


def retry_requested(
    policy: RetryPolicy, error: BaseException, retry_number: int, rng: random.Random | None = None
) -> dg.RetryRequested | None:
    """The ``dg.RetryRequested`` for ``error`` after ``retry_number + 1`` attempts, or None when
    the error is not a transient AWS error, is non-retryable for the policy, or the policy says
    STOP. Raises ``RetryPolicyError`` if the policy itself fails (a user delay function)."""
    if not classify_aws_error(error).transient or not policy.is_retryable(error):
        return None
    wait = policy.delay(retry_number + 1, rng)
    if wait is STOP:
        return None
    max_retries = policy.max_attempts - 1 if policy.max_attempts is not None else UNLIMITED_RETRIES
    return dg.RetryRequested(max_retries=max_retries, seconds_to_wait=wait)


@contextlib.contextmanager
def aws_errors(context: Any, policy: RetryPolicy | None = None) -> Iterator[None]:
    """Around AWS work: retry transient AWS errors by ``policy`` (ops and assets; a sensor or an
    asset check cannot be retried, so there the error fails the tick or check), fail clearly
    otherwise. Errors that are not AWS errors pass through unchanged."""
    policy = policy or DEFAULT_OP_POLICY
    try:
        yield
    except Exception as exc:
        classified = classify_aws_error(exc)
        if classified.kind is ErrorKind.NOT_AWS:
            raise
        retry_number = getattr(context, "retry_number", None)
        attempts = (retry_number or 0) + 1
        if isinstance(retry_number, int):
            try:
                request = retry_requested(policy, exc, retry_number)
            except RetryPolicyError as policy_error:
                raise dg.Failure(description=f"retry policy error: {policy_error}", allow_retries=False) from exc
            if request is not None:
                context.log.warning(
                    f"attempt {attempts} failed with a transient AWS error ({classified.reason}); "
                    f"retrying in {request.seconds_to_wait:.1f}s ({policy.describe()})"
                )
                raise request from exc
        explained = explain_aws_error(exc)
        message = explained or classified.reason
        if classified.transient and not policy.is_retryable(exc):
            message = f"{message} (non-retryable for the policy {policy.describe()})"
        elif classified.transient and isinstance(retry_number, int):
            message = f"gave up after {attempts} attempt(s) ({policy.describe()}): {message}"
        # an explained error needs no botocore stack trace under it
        raise dg.Failure(description=message, allow_retries=False) from (None if explained else exc)
