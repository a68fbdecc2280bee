"""The pool audit's asset jobs. One asset each: the in-process executor (no process per step)."""

import dagster as dg

from pipelines.pool_audit.defs.assets import ASSET_KEY, CAPABILITY_TAGS, daily_partitions, pool_cost_report

pool_audit_job = dg.define_asset_job(
    "pool_audit_job",
    selection=dg.AssetSelection.assets(ASSET_KEY),
    description="Audit every fleet pool now (also run by pool_audit_schedule every 10 minutes).",
    tags=CAPABILITY_TAGS,
    executor_def=dg.in_process_executor,
)
pool_cost_report_job = dg.define_asset_job(
    "pool_cost_report_job",
    selection=dg.AssetSelection.assets(pool_cost_report),
    partitions_def=daily_partitions,
    description="Build the daily pool cost report for one UTC day (backfill for a range of days).",
    tags=CAPABILITY_TAGS,
    executor_def=dg.in_process_executor,
)
