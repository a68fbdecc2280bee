"""Op-level retries: a policy and an AWS error become a ``dg.RetryRequested``.

Wrap the AWS work of an op::

    with aws_retries(context):            # or aws_retries(context, policy_from_text("river"))
        ...boto3 calls...

- a transient AWS error (throttling, 5xx, connection) that the policy allows to retry raises
  ``dg.RetryRequested(max_retries=policy.max_attempts - 1, seconds_to_wait=policy.delay(n))``;
- once the policy says STOP, or for a permanent AWS error (validation, access denied, missing
  table...), the op fails with one line (``dg.Failure``, never retried);
- a failing user delay function fails the op with the policy error naming it (never retried);
- anything that is not an AWS error is re-raised unchanged.
"""

import contextlib
import random
from collections.abc import Iterator

import dagster as dg

from pipelines.retry.aws import ErrorKind, classify_aws_error
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
def aws_retries(
    context: dg.OpExecutionContext | dg.AssetExecutionContext, policy: RetryPolicy | None = None
) -> Iterator[None]:
    """Around AWS work in an op or asset: retry transient AWS errors by ``policy``, fail clearly otherwise."""
    policy = policy or DEFAULT_OP_POLICY
    try:
        yield
    except Exception as exc:
        attempts = context.retry_number + 1
        classified = classify_aws_error(exc)
        try:
            request = retry_requested(policy, exc, context.retry_number)
        except RetryPolicyError as policy_error:
            raise dg.Failure(description=f"retry policy error: {policy_error}", allow_retries=False) from exc
        if request is not None:
            context.log.warning(
                f"attempt {attempts} failed with a transient AWS error ({classified.reason}); "
                f"retrying in {request.seconds_to_wait:.1f}s ({policy.describe()})"
            )
            raise request from exc
        if classified.kind is ErrorKind.NOT_AWS:
            raise
        explained = explain_aws_error(exc)
        message = explained or classified.reason
        if classified.transient and not policy.is_retryable(exc):
            message = f"{message} (non-retryable for the policy {policy.describe()})"
        elif classified.transient:
            message = f"gave up after {attempts} attempt(s) ({policy.describe()}): {message}"
        # an explained error needs no botocore stack trace under it
        raise dg.Failure(description=message, allow_retries=False) from (None if explained else exc)
