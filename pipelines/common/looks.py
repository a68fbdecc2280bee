"""What a schedule finds when it looks before it launches a run. No Dagster.

A run costs a new process (Dagster, the code location, the clients) whatever it finds to do; a
look is one or a few reads of what the run would read first, made where the schedule is evaluated.
A look says either that a run would do something (``due``) or that it would not, and what it
found, in one line (the schedule's tick shows it). Two kinds:

- *work*: the run acts on something (orphaned instances, stale parameters, old jobs, zombie tasks):
  the look reads whether there is any (:meth:`Look.work`, :meth:`Look.idle`);
- *state*: the run records what it reads (asset checks, snapshots): the look reads the same state and
  gives its :func:`fingerprint`; the schedule runs when it differs from the last run's, and at
  least every so often (``pipelines.common.defs.schedules``).
"""

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
        """A state look: ``value`` (JSON-able) is what the run would record; ``due`` is decided later,
        against the last run's fingerprint."""
        return cls(False, reason, fingerprint(value))


def fingerprint(value: Any) -> str:
    """A short, stable digest of a JSON-able value (keys sorted; other types by ``str``)."""
    text = json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
