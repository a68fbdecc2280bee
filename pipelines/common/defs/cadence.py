"""A schedule's cadence as its factory passes it to Dagster: its own cron, or the one the code
location gives it by name (``crons``, passed in by ``pipelines/definitions.py``), and a description
that says so."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import dagster as dg


@dataclass(frozen=True)
class ScheduleCadence:
    """What a schedule factory passes to Dagster: ``cron_schedule``, ``default_status``, and its
    description with the note (:meth:`describe`)."""

    cron_schedule: str
    default_status: dg.DefaultScheduleStatus
    note: str = ""

    def describe(self, description: str) -> str:
        """``description``, with the note when the cadence is not the schedule's own."""
        return f"{description} {self.note}".strip() if self.note else description


def schedule_cadence(
    name: str,
    cron: str,
    crons: Mapping[str, str] | None = None,
    status: dg.DefaultScheduleStatus = dg.DefaultScheduleStatus.RUNNING,
) -> ScheduleCadence:
    """The cadence of schedule ``name`` (its own cron ``cron`` and default ``status``): the cron
    ``crons`` names for it, when it names one, else its own."""
    given = (crons or {}).get(name, cron)
    note = f"This code location runs it on {given}, not {cron}." if given != cron else ""
    return ScheduleCadence(given, status, note)
