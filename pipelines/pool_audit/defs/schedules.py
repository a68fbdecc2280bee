"""The pool audit's schedules, both on by default: a snapshot every 10 minutes, and yesterday's report."""

import datetime as dt

import dagster as dg

from pipelines.pool_audit.defs.jobs import pool_audit_job, pool_cost_report_job

pool_audit_schedule = dg.ScheduleDefinition(
    name="pool_audit_schedule",
    job=pool_audit_job,
    cron_schedule="*/10 * * * *",
    execution_timezone="UTC",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Every 10 minutes: a pool_audit snapshot (metrics, CSV, checks).",
)


@dg.schedule(
    name="pool_cost_report_schedule",
    job=pool_cost_report_job,
    cron_schedule="20 0 * * *",
    execution_timezone="UTC",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="00:20 UTC: the previous (complete) day's pool_cost_report.",
)
def pool_cost_report_schedule(context: dg.ScheduleEvaluationContext):
    day = (context.scheduled_execution_time - dt.timedelta(days=1)).date().isoformat()
    return dg.RunRequest(run_key=day, partition_key=day)
