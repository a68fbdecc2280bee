"""Retry policies, attempt ids and fencing (docs/retry.md): plain Python, no Dagster imports here."""

from pipelines.retry.attempts import ATTEMPT_ID_ATTR, dynamodb_fence, new_attempt_id, retry_call
from pipelines.retry.classify import TRANSIENT_ITEM_CODES, classify_aws_error, is_transient
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
from pipelines.retry.presets import PRESETS, policy_from_json, policy_from_text, preset
from pipelines.retry.simulate import human, timeline

__all__ = [
    "ATTEMPT_ID_ATTR",
    "PRESETS",
    "STOP",
    "DelayFunctionError",
    "RetryPolicy",
    "RetryPolicyError",
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
