"""What a schedule finds when it looks before it launches a run (``docs/development.md``, "One
schedule factory; schedules look first"): a *work* look (:meth:`Look.work`, :meth:`Look.idle`) or a
*state* look (:meth:`Look.state`), decided by ``pipelines.common.defs.schedules``. No Dagster."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Look:
    """``due``: a run would do something; ``reason``: what the look found (one line);
    ``fingerprint``: of the state read, for a state look (None for a work look)."""

    due: bool
    reason: str
    fingerprint: str | None = None

    @classmethod
    def work(cls, reason: str) -> Look:
        return cls(True, reason)

    @classmethod
    def idle(cls, reason: str) -> Look:
        return cls(False, reason)

    @classmethod
    def state(cls, value: Any, reason: str) -> Look:
        """``value`` (JSON-able) is what the run would record; ``due`` is decided against the last run's."""
        return cls(False, reason, fingerprint(value))


def fingerprint(value: Any) -> str:
    """A short, stable digest of a JSON-able value (keys sorted; other types by ``str``)."""
    text = json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
