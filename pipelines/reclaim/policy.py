"""The retry action's policy: the retry library's JSON form (``retryPolicy``); unset, retry at once
while the agenda's own ``maximumAttempts`` allows (the original retry Lambda)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipelines.common.params import ParamsError


@dataclass(frozen=True)
class ReclaimPolicy:
    """``delay_for(n)``: seconds before the next attempt after ``n`` attempts, None = stop."""

    policy: Any

    def delay_for(self, n: int) -> float | None:
        from pipelines.retry import STOP

        value = self.policy.delay(n)
        return None if value is STOP else float(value)

    def allows(self, error_type: str | None) -> bool:
        """False when the agenda's last error is one of the policy's non-retryable error types."""
        return not error_type or self.policy.is_retryable(error_type)


def policy_from_params(retry_policy: dict[str, Any] | None) -> ReclaimPolicy:
    from pipelines.retry import RetryPolicyError, policy_from_json

    if retry_policy is None:
        retry_policy = {"kind": "fixed", "delay": 0, "maxAttempts": None}
    try:
        return ReclaimPolicy(policy_from_json(retry_policy))
    except RetryPolicyError as exc:
        raise ParamsError(f"retryPolicy: {exc}") from None


class ImmediatePolicy:
    """Fail action and dry runs of it: no policy involved."""

    def delay_for(self, n: int) -> float | None:
        return 0.0

    def allows(self, error_type: str | None) -> bool:
        return True
