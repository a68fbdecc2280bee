"""Is a run still queued or running, and how a skip reason names such a run."""

from __future__ import annotations

from typing import Any

import dagster as dg

_QUEUED = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED]
ACTIVE_STATUSES = [*_QUEUED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED]


def still_going(run: Any) -> str:
    """How a skip reason names the run that is still going: ``<run id> is still queued``."""
    return f"{run.run_id} is still {'queued' if run.status in _QUEUED else 'running'}"
