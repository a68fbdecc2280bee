"""JSON form of retry policies (the table in docs/retry.md), so a run config or a run tag can carry
one. Bad input raises ``RetryPolicyError`` naming the field and the value."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from pipelines.retry import policy as p
from pipelines.retry.presets import preset

_FIELDS: dict[str, tuple[Callable[..., p.RetryPolicy], set[str], set[str]]] = {
    # kind: (constructor, taking the fields in snake_case; required and optional fields besides nonRetryable)
    "none": (p.none, set(), set()),
    "fixed": (p.fixed, {"delay", "maxAttempts"}, set()),
    "exponential": (p.exponential, {"initial", "maxAttempts"}, {"coefficient", "maxDelay", "jitter", "jitterRatio"}),
    "preset": (preset, {"name"}, set()),
    "function": (p.function, {"path"}, {"maxAttempts"}),
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
    build, required, optional = _FIELDS[kind]
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
    return build(**{re.sub("([A-Z])", r"_\1", key).lower(): value for key, value in obj.items() if key != "kind"})


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
