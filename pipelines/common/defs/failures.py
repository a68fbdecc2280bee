"""The one AWS failure policy of ops, assets, asset checks and sensors (``docs/retry.md``)."""

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import dagster as dg

from pipelines.retry.classify import ErrorKind, classify_aws_error
from pipelines.retry.policy import STOP, RetryPolicy, RetryPolicyError, exponential
from resources.clients import explain_aws_error

DEFAULT_OP_POLICY = exponential(initial=2, coefficient=2, max_delay=60, max_attempts=3, jitter="full")
"""Ops', assets' and checks' retries, for outages longer than botocore's: as :data:`AWS_RETRY_POLICY`."""

_BACKOFFS = (None, dg.Backoff.LINEAR, dg.Backoff.EXPONENTIAL)
_JITTERS = {"none": None, "full": dg.Jitter.FULL}

F = TypeVar("F", bound=Callable[..., Any])


def dagster_retry_policy(policy: RetryPolicy) -> dg.RetryPolicy | None:
    """Dagster's ``RetryPolicy`` nearest to the library's ``policy`` (None for one attempt): the
    backoff whose waits come closest; ``RetryPolicyError`` for one Dagster cannot state."""
    if policy.max_attempts is None:
        raise RetryPolicyError("a Dagster retry policy needs a number of attempts", field="maxAttempts", value=None)
    jitter = policy.jitter.name
    if jitter not in _JITTERS:
        raise RetryPolicyError(f"Dagster has no jitter {jitter!r} (only none or full)", field="jitter", value=jitter)
    retries = policy.max_attempts - 1
    if retries < 1:
        return None
    waits = [policy.nominal(n) for n in range(1, retries + 1)]
    if any(wait is STOP for wait in waits):
        raise RetryPolicyError(f"{policy.describe()} stops before its last attempt", field="maxAttempts")

    def distance(backoff: dg.Backoff | None) -> float:
        candidate = dg.RetryPolicy(max_retries=retries, delay=waits[0], backoff=backoff)
        return sum(abs(candidate.calculate_delay(n) - wait) for n, wait in enumerate(waits, start=1))

    backoff = min(_BACKOFFS, key=distance)  # the first of equals: no backoff before linear before exponential
    return dg.RetryPolicy(max_retries=retries, delay=waits[0], backoff=backoff, jitter=_JITTERS[jitter])


AWS_RETRY_POLICY: dg.RetryPolicy = dagster_retry_policy(DEFAULT_OP_POLICY)  # type: ignore[assignment]
"""Declared by every op, asset and asset check that does AWS work: ``LINEAR`` from 2 s, full jitter."""


def describe_retry_policy(policy: dg.RetryPolicy) -> str:
    """``2 retries, 2s linear backoff, full jitter``: a Dagster retry policy on one line."""
    parts = [f"{policy.max_retries} retr{'y' if policy.max_retries == 1 else 'ies'}"]
    if policy.delay:
        backoff = policy.backoff.value.lower() if policy.backoff else "fixed"
        parts.append(f"{policy.delay:g}s {backoff}" + (" backoff" if policy.backoff else " delay"))
    if policy.jitter:
        parts.append(f"{policy.jitter.value.lower().replace('_', '-')} jitter")
    return ", ".join(parts)


def step_retry_policy(context: Any) -> dg.RetryPolicy | None:
    """The retry policy Dagster applies to the running step, or None (also outside a step)."""
    op_context = getattr(context, "op_execution_context", context)  # an asset's or a check's context
    if not isinstance(op_context, dg.OpExecutionContext):
        return None
    try:
        return op_context.job_def.get_retry_policy_for_handle(op_context.op_handle)
    except dg.DagsterError:  # invoked directly (build_op_context): no job, no policy
        return None


def _final(message: str, cause: BaseException | None) -> dg.Failure:
    """``dg.Failure(message, allow_retries=False)`` as ``raise ... from cause`` would leave it."""
    failure = dg.Failure(description=message, allow_retries=False)
    failure.__cause__ = cause  # which also suppresses the context, as ``raise ... from`` does
    return failure


def _instead_of(context: Any, exc: BaseException) -> BaseException:
    """What the body raises instead of ``exc`` (``exc`` itself: left to the retry policy, or passed on)."""
    if isinstance(exc, dg.RetryRequested | dg.DagsterError):
        return exc  # an explicit retry request, or Dagster's own error (which no policy retries)
    policy = step_retry_policy(context)
    if isinstance(exc, dg.DagsterExecutionInterruptedError | KeyboardInterrupt):
        # Dagster retries an interrupted step that has a retry policy (dagster-io/dagster#15026, under
        # the in-process executor): terminating the run would start the step again. It fails instead.
        return exc if policy is None else _final("interrupted (the run is being terminated): not retried", exc)
    if isinstance(exc, dg.Failure):
        if policy is not None:
            exc.allow_retries = False  # a failure the body chose is final
        return exc
    classified = classify_aws_error(exc)
    if classified.kind is ErrorKind.NOT_AWS:
        return exc if policy is None else _final(f"{type(exc).__name__}: {exc}", exc)
    retryable = classified.transient and DEFAULT_OP_POLICY.is_retryable(exc)
    attempts = context.retry_number + 1 if policy is not None else 1
    if policy is not None and retryable and attempts <= policy.max_retries:
        context.log.warning(
            f"attempt {attempts} failed with a transient AWS error ({classified.reason}); "
            f"the step's retry policy tries again ({describe_retry_policy(policy)})"
        )
        return exc
    explained = explain_aws_error(exc)
    message = explained or classified.reason
    if classified.transient and not retryable:
        message = f"{message} (non-retryable for the policy {DEFAULT_OP_POLICY.describe()})"
    elif classified.transient and policy is not None:
        message = f"gave up after {attempts} attempt(s) ({describe_retry_policy(policy)}): {message}"
    return _final(message, None if explained else exc)  # an explained error needs no botocore stack trace


_CAUGHT = (Exception, dg.DagsterExecutionInterruptedError, KeyboardInterrupt)


def one_line_failures(fn: F) -> F:
    """A body (plain or generator, ``context`` first) under the one AWS failure policy: only transient
    AWS errors are left to the step's retry policy, anything else fails in one line."""
    params = list(inspect.signature(fn).parameters)
    if not params or params[0] != "context":
        raise TypeError(f"{fn.__qualname__}: one_line_failures needs the context as the first parameter, `context`")

    if inspect.isgeneratorfunction(fn):

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return (yield from fn(*args, **kwargs))
            except _CAUGHT as exc:
                if (instead := _instead_of(args[0] if args else kwargs["context"], exc)) is exc:
                    raise
                raise instead from instead.__cause__

    else:

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except _CAUGHT as exc:
                if (instead := _instead_of(args[0] if args else kwargs["context"], exc)) is exc:
                    raise
                raise instead from instead.__cause__

    wrapper.one_line_failures = True  # type: ignore[attr-defined]  # what tests/test_retry_dagster.py looks for
    return wrapper  # type: ignore[return-value]
