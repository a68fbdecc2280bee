"""The retry action's policy: the retry library's JSON form (``retryPolicy``); unset, retry at once
while the agenda's own ``maximumAttempts`` allows (the original retry Lambda)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipelines.common.params import ParamsError
from pipelines.retry import STOP, RetryPolicy, RetryPolicyError, policy_from_json


@dataclass(frozen=True)
class ReclaimPolicy:
    """``delay_for(n)``: seconds before the next attempt after ``n`` attempts, None = stop."""

    policy: RetryPolicy

    def delay_for(self, n: int) -> float | None:
        value = self.policy.delay(n)
        return None if value is STOP else float(value)

    def allows(self, error_type: str | None) -> bool:
        """False when the agenda's last error is one of the policy's non-retryable error types."""
        return not error_type or self.policy.is_retryable(error_type)


def policy_from_params(retry_policy: dict[str, Any] | None) -> ReclaimPolicy:
    """``retryPolicy`` as a policy (unset: retry at once); one the retry library refuses is a ``ParamsError``."""
    if retry_policy is None:
        retry_policy = {"kind": "fixed", "delay": 0, "maxAttempts": None}
    try:
        return ReclaimPolicy(policy_from_json(retry_policy))
    except RetryPolicyError as exc:
        raise ParamsError(f"retryPolicy: {exc}") from None
