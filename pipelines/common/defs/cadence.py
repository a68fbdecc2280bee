"""A schedule's cadence as its factory passes it to Dagster: the cron, the default status and the
description, in the local deployment at the demo's cadence (``pipelines.common.cadence``)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import dagster as dg

from pipelines.common.cadence import deployment_cadence


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
    deployment: str, name: str, cron: str, status: dg.DefaultScheduleStatus = dg.DefaultScheduleStatus.RUNNING
) -> ScheduleCadence:
    """The cadence of schedule ``name`` (its own cron ``cron`` and default ``status``) in
    ``deployment``: only the local deployment reads ``GROUNDSKEEPER_DEMO``."""
    cadence = deployment_cadence(deployment, name, cron, os.environ)
    return ScheduleCadence(cadence.cron, dg.DefaultScheduleStatus.STOPPED if cadence.stopped else status, cadence.note)
