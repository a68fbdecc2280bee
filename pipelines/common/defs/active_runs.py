"""Is a run still queued or running (:data:`ACTIVE_STATUSES`, :func:`active_run`), and how a skip
reason names such a run (:func:`still_going`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import dagster as dg

_QUEUED = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED]
ACTIVE_STATUSES = [*_QUEUED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED]
"""A run in one of these is still queued or running (it has not finished, failed or been canceled)."""


def active_run(instance: dg.DagsterInstance, job_name: str, tags: Mapping[str, str] | None = None) -> Any:
    """The newest run of ``job_name`` (with all of ``tags``) that is still queued or running, or None."""
    runs = instance.get_runs(
        filters=dg.RunsFilter(job_name=job_name, statuses=ACTIVE_STATUSES, tags=dict(tags or {})), limit=1
    )
    return runs[0] if runs else None


def still_going(run: Any) -> str:
    """How a skip reason names the run that is still going: ``<run id> is still queued``."""
    return f"{run.run_id} is still {'queued' if run.status in _QUEUED else 'running'}"
