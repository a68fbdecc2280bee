"""Failures make dev's demo causes on purpose, said where an operator sees them. No Dagster.

The local deployment's demo traffic (``pipelines/demo``, ``pipelines/progressor/demo.py``) makes some
checks fail on purpose, so that each capability has something to show: an instance tagged with a
pool that no longer exists, idle runners kept warm, malformed termination messages (dead-lettered),
progressor workers that crash (zombies, overdue timers, errored processes). A check that fails that
way says so in the local deployment only: its description ends with :data:`SEEDED` and what the demo
did, and its metadata has a ``demo`` entry with the same words (the alerts it opens carry the
description). In ``prod`` and ``cluster`` nothing is added.
"""

from __future__ import annotations

SEEDED = "the demo seeds this on purpose"


def seeded(deployment: str, passed: bool, description: str, what: str | None) -> tuple[str, dict[str, str]]:
    """The check's description, and metadata to add: in the local deployment, for a failed check the
    demo causes (``what`` says how), ``"<description> (the demo seeds this on purpose: <what>)"`` and
    ``{"demo": ...}``; otherwise the description unchanged and nothing."""
    if deployment != "local" or passed or not what:
        return description, {}
    note = f"{SEEDED}: {what}"
    return (f"{description} ({note})" if description else note), {"demo": note}
