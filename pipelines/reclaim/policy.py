"""The retry action's policy: the retry library's JSON form (``retryPolicy``), seen through one adapter.

Without ``retryPolicy`` the original retry Lambda's behaviour holds: retry at once, as long as the
agenda's own ``maximumAttempts`` (default 3) allows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipelines.common.params import ParamsError

DEFAULT_POLICY_JSON = {"kind": "fixed", "delay": 0, "maxAttempts": None}


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

    def describe(self) -> str:
        return self.policy.describe()


def policy_from_params(retry_policy: dict[str, Any] | None) -> ReclaimPolicy:
    from pipelines.retry import RetryPolicyError, policy_from_json

    try:
        return ReclaimPolicy(policy_from_json(retry_policy if retry_policy is not None else DEFAULT_POLICY_JSON))
    except RetryPolicyError as exc:
        raise ParamsError(f"retryPolicy: {exc}") from None


class ImmediatePolicy:
    """Fail action and dry runs of it: no policy involved."""

    def delay_for(self, n: int) -> float | None:
        return 0.0

    def allows(self, error_type: str | None) -> bool:
        return True
