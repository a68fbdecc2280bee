"""The Dagster helpers every capability uses in the same way, one module per kind (config, failures,
metrics, metadata, active runs, schedules, summary, tasks); :func:`build_defs` holds what
spans capabilities."""

import dagster as dg

from pipelines.common.defs.summary import operations_summary_asset


def build_defs(executor: dg.ExecutorDefinition | None = None) -> dg.Definitions:
    """``operations_summary`` and the default executor: in process (no process per step, also for
    runs launched from the UI), unless given one (the cluster's Celery executor)."""
    return dg.Definitions(assets=[operations_summary_asset()], executor=executor or dg.in_process_executor)
