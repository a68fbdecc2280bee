"""Dagster layer of the pool audit: ``assets`` (the ``pool_audit`` snapshot with its checks, the
daily ``pool_cost_report``, and the hook that records a housekeeping audit), ``jobs``, ``schedules``.
"""

import dagster as dg

from pipelines.pool_audit.checks import CHECK_DESIRED_IDLE, CHECK_IDLE_COST, CHECK_KNOWN_POOLS
from pipelines.pool_audit.defs.assets import ASSET_KEY, housekeeping_audit_events, pool_audit, pool_cost_report
from pipelines.pool_audit.defs.jobs import pool_audit_job, pool_cost_report_job
from pipelines.pool_audit.defs.schedules import pool_audit_schedule, pool_cost_report_schedule


def build_defs() -> dg.Definitions:
    """The same in every deployment: both schedules are on by default."""
    return dg.Definitions(
        assets=[pool_audit, pool_cost_report],
        jobs=[pool_audit_job, pool_cost_report_job],
        schedules=[pool_audit_schedule, pool_cost_report_schedule],
    )


__all__ = [
    "ASSET_KEY",
    "CHECK_DESIRED_IDLE",
    "CHECK_IDLE_COST",
    "CHECK_KNOWN_POOLS",
    "build_defs",
    "housekeeping_audit_events",
    "pool_audit",
    "pool_cost_report",
]
