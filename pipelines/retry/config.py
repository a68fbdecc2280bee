"""JSON form of retry policies (the table in docs/retry.md), so a run config or a run tag can carry
one. Bad input raises ``RetryPolicyError`` naming the field and the value."""

from __future__ import annotations

import json
from typing import Any

from pipelines.retry import policy as p
from pipelines.retry.presets import preset

_FIELDS: dict[str, tuple[set[str], set[str]]] = {
    # kind: (required, optional)
    "none": (set(), set()),
    "fixed": ({"delay", "maxAttempts"}, set()),
    "exponential": ({"initial", "maxAttempts"}, {"coefficient", "maxDelay", "jitter", "jitterRatio"}),
    "preset": ({"name"}, set()),
    "function": ({"path"}, {"maxAttempts"}),
}


def policy_from_json(obj: Any) -> p.RetryPolicy:
    """Build a policy from its JSON form (a dict, or a JSON string of one)."""
    if isinstance(obj, str):
        try:
            obj = json.loads(obj)
        except json.JSONDecodeError as exc:
            raise p.RetryPolicyError(f"policy is not valid JSON: {exc}", field="policy", value=obj) from None
        except RecursionError:
            raise p.RetryPolicyError("policy is nested too deeply to be a policy", field="policy", value=None) from None
    if not isinstance(obj, dict):
        raise p.RetryPolicyError(f"policy must be a JSON object, got {obj!r}", field="policy", value=obj)
    kind = obj.get("kind")
    if kind not in _FIELDS:
        raise p.RetryPolicyError(f"kind must be one of {sorted(_FIELDS)}, got {kind!r}", field="kind", value=kind)
    required, optional = _FIELDS[kind]
    missing = sorted(required - obj.keys())
    if missing:
        raise p.RetryPolicyError(f"{kind} policy needs {missing[0]!r}", field=missing[0], value=None)
    unknown = sorted(obj.keys() - required - optional - {"kind", "nonRetryable"})
    if unknown:
        raise p.RetryPolicyError(
            f"{kind} policy has an unknown field {unknown[0]!r} (value {obj[unknown[0]]!r})",
            field=unknown[0],
            value=obj[unknown[0]],
        )
    nr = obj.get("nonRetryable", [])
    if kind == "none":
        return p.none(non_retryable=nr)
    if kind == "fixed":
        return p.fixed(obj["delay"], obj["maxAttempts"], non_retryable=nr)
    if kind == "exponential":
        return p.exponential(
            obj["initial"],
            obj.get("coefficient", 2.0),
            obj.get("maxDelay"),
            obj["maxAttempts"],
            obj.get("jitter", "none"),
            jitter_ratio=obj.get("jitterRatio", 0.1),
            non_retryable=nr,
        )
    if kind == "preset":
        return preset(obj["name"], p._names(nr))
    return p.function(obj["path"], obj.get("maxAttempts"), non_retryable=nr)


def policy_from_text(text: str) -> p.RetryPolicy:
    """A run tag's value: a preset name (``sidekiq``), ``none``, or a JSON policy object."""
    if not isinstance(text, str) or not text.strip():
        raise p.RetryPolicyError(
            f"policy must be a preset name or a JSON object, got {text!r}", field="policy", value=text
        )
    text = text.strip()
    if text.startswith("{"):
        return policy_from_json(text)
    if text == "none":
        return p.none()
    return preset(text)
