"""Whether a failed run is retried by ``delayed_run_retries``, decided once for the retry sensor and for
alerting (docs/retry.md, "Checks and metrics"); no Dagster."""

import random
from collections.abc import Mapping
from dataclasses import dataclass

from pipelines.retry.policy import STOP, RetryPolicyError, invalid
from pipelines.retry.presets import policy_from_text
from pipelines.retry.simulate import human
from pipelines.retry.tags import ATTEMPT_TAG, POLICY_TAG

RETRY_SENSOR = "delayed_run_retries"  # the sensor that retries by this decision (sensors/run_retries.py)
RETRY_MARGIN_SECONDS = 180.0  # the retry sensor's interval (30 s) and a busy daemon's lag, with room


@dataclass(frozen=True)
class RunRetry:
    """``wait``: seconds from the failure to the retry's launch, or None when it is not retried."""

    wait: float | None
    attempt: int  # the attempt that failed (1 for the original run)
    why: str  # one line: why not, or when and by which policy
    bad_tags: bool = False  # not retried because its tags could not be read


def run_policy(text: str):
    """The policy of a ``groundskeeper/retry_policy`` tag, or RetryPolicyError (one without nonRetryable)."""
    policy = policy_from_text(text)
    if policy.non_retryable:
        raise invalid("nonRetryable", list(policy.non_retryable), "absent (a run retry never reads the run's error)")
    return policy


def run_retry(tags: Mapping[str, str], seed: str) -> RunRetry:
    """The decision for a failed run with these run tags; ``seed`` (its run id) fixes the jitter."""
    text = tags.get(POLICY_TAG)
    if text is None:
        return RunRetry(None, 1, f"no {POLICY_TAG} tag")
    try:
        policy = run_policy(text)
        raw = tags.get(ATTEMPT_TAG, "1")
        attempt = int(raw)
        if attempt < 1:
            raise ValueError(f"{ATTEMPT_TAG}={raw!r}: an attempt number is 1 or more")
        wait = policy.delay(attempt, random.Random(seed))
    except (RetryPolicyError, ValueError) as exc:
        return RunRetry(None, 1, f"not retried, bad {POLICY_TAG} or {ATTEMPT_TAG} tag: {exc}", bad_tags=True)
    if wait is STOP:
        return RunRetry(None, attempt, f"not retried, attempt {attempt} was the last ({policy.describe()})")
    return RunRetry(float(wait), attempt, f"retry in {human(wait)} ({policy.describe()})")
