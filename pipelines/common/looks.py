"""What a schedule finds when it looks before it launches a run: a *work* or a *state* look."""

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Self


@dataclass(frozen=True)
class Look:
    """``due``: a run would do something; ``reason``: what the look found; ``fingerprint``: a state look's."""

    due: bool
    reason: str
    fingerprint: str | None = None

    @classmethod
    def work(cls, reason: str) -> Self:
        return cls(True, reason)

    @classmethod
    def idle(cls, reason: str) -> Self:
        return cls(False, reason)

    @classmethod
    def state(cls, value: Any, reason: str) -> Self:
        """``value`` (JSON-able) is what the run would record; ``due`` is decided against the last run's."""
        return cls(False, reason, fingerprint(value))


def fingerprint(value: Any) -> str:
    """A short, stable digest of a JSON-able value (keys sorted; other types by ``str``)."""
    text = json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
