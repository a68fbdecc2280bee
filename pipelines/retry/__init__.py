"""Retry policies, attempt ids and fencing (the retry RFC). Pure Python: no Dagster imports here.

Public API (import from ``pipelines.retry``)::

    policy = policy_from_json({"kind": "exponential", "initial": 5, "coefficient": 2,
                               "maxDelay": 3600, "maxAttempts": 5, "jitter": "full"})
    policy.delay(n)          # n = attempts made so far -> seconds (float) or STOP
    policy.max_attempts      # first run included; None = unlimited
    policy.is_retryable(exc) # False for the policy's nonRetryable error types (class name,
                             # dotted name, or AWS error code) and for RetryPolicyError
    policy.to_json()         # the JSON form back
    policy_from_text("sidekiq")           # a run tag value: preset name, "none" or JSON
    timeline(policy).to_markdown()        # every wait, cumulative and worst case with jitter

- Forms: ``none()``, ``fixed(delay, max_attempts)``, ``exponential(initial, coefficient,
  max_delay, max_attempts, jitter)`` with jitter ``none``/``full``/``plus-minus``,
  ``function("mypkg.policies:delay", max_attempts)``; JSON kinds ``none``, ``fixed``,
  ``exponential``, ``preset``, ``function`` (see ``pipelines.retry.config``).
- ``delay(0)`` is the wait before the first run (0 for the built-in forms). Once ``n`` reaches
  ``max_attempts`` the answer is ``STOP`` (falsy). A failing user function raises
  ``DelayFunctionError`` (a ``RetryPolicyError``) naming it: never retry on that.
- Bad input raises ``RetryPolicyError`` (a ``ValueError``) with ``.field`` and ``.value``.
- ``PRESETS``: sidekiq, oban, river, celery, celery-backoff, temporal, step-functions, runs-fleet,
  each with its ``source``.
- ``classify_aws_error(exc)`` / ``is_transient(exc)`` (``pipelines.retry.classify``): throttling,
  5xx and connection errors are transient; validation, access denied and other 4xx are not.
- ``retry_call(fn, policy)`` (``pipelines.retry.call``): retry one call in plain Python (sleeps
  ``policy.delay(n)`` after transient AWS errors), for batch code that should not fail a whole op.
- Attempts (``pipelines.retry.attempts``): ``new_attempt_id()`` for each new attempt, and
  ``dynamodb_fence(attempt_id)``, the condition that refuses a late write from a superseded
  attempt (used by reclaim's retry action and writes).
- Run tags of run-level retries (``pipelines.retry.tags``): ``POLICY_TAG``, ``ATTEMPT_TAG``,
  ``RETRY_OF_TAG``, ``ROOT_TAG``.

The Dagster layer is elsewhere: ``pipelines.common.defs.failures`` (the one AWS failure policy:
Dagster's ``AWS_RETRY_POLICY``, derived from ``DEFAULT_OP_POLICY`` and declared on every op, asset
and check that does AWS work, and the ``one_line_failures`` decorator of their bodies),
``pipelines.retry.defs`` (the ``retry_policies`` asset and the retry demo job) and
``sensors.run_retries`` (the ``delayed_run_retries`` sensor, wired to every job in
``pipelines/definitions.py``; nothing in this package imports ``sensors``).
"""

from pipelines.retry.attempts import ATTEMPT_ID_ATTR, dynamodb_fence, new_attempt_id
from pipelines.retry.call import retry_call
from pipelines.retry.classify import TRANSIENT_ITEM_CODES, Classification, ErrorKind, classify_aws_error, is_transient
from pipelines.retry.config import policy_from_json, policy_from_text
from pipelines.retry.policy import (
    STOP,
    DelayFunctionError,
    RetryPolicy,
    RetryPolicyError,
    exponential,
    fixed,
    function,
    none,
)
from pipelines.retry.presets import PRESETS, preset
from pipelines.retry.simulate import Step, Timeline, human, timeline

__all__ = [
    "ATTEMPT_ID_ATTR",
    "PRESETS",
    "STOP",
    "Classification",
    "DelayFunctionError",
    "ErrorKind",
    "RetryPolicy",
    "RetryPolicyError",
    "Step",
    "Timeline",
    "classify_aws_error",
    "dynamodb_fence",
    "exponential",
    "fixed",
    "function",
    "human",
    "is_transient",
    "TRANSIENT_ITEM_CODES",
    "new_attempt_id",
    "none",
    "policy_from_json",
    "policy_from_text",
    "preset",
    "retry_call",
    "timeline",
]
