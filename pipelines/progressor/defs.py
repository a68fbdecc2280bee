"""Dagster wiring for progressor (docs/progressor.md): its job, schedules, health assets and their checks."""

import datetime as dt
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import dagster as dg

from pipelines.common.aws_batches import put_metrics
from pipelines.common.defs.metadata import CheckNotes, metadata_from, noted
from pipelines.common.defs.metrics import CommittedChangeMetrics
from pipelines.common.defs.schedules import ONE_AT_A_TIME_TAG, schedule
from pipelines.common.defs.tasks import task_job, task_schedule
from pipelines.common.looks import Look
from pipelines.progressor.health import CHECKS, checks, durations_chart, health_datums, measure, recorded_state
from pipelines.progressor.targets import Target, load_targets
from pipelines.progressor.task import TASK
from resources.clients import CloudWatchResource
from resources.postgres import ProgressorDatabase

CAPABILITY = {"groundskeeper/capability": "progressor"}
NAMESPACE_TAG = "groundskeeper/progressor_namespace"


collect_zombies_job = task_job(TASK)


def schedule_for(target: Target, crons: Mapping[str, str] | None = None) -> dg.ScheduleDefinition:
    return task_schedule(
        TASK,
        collect_zombies_job,
        name=f"collect_zombies_{target.name}",
        cron=target.cron,
        params=target.params,
        run_config=target.config,
        tags={**CAPABILITY, NAMESPACE_TAG: target.params.namespace},
        crons=crons,
    )


def health_schedule(targets: list[Target], job: Any, crons: Mapping[str, str] | None = None) -> dg.ScheduleDefinition:
    def look(context: dg.ScheduleEvaluationContext) -> Look:
        states, said = {}, []
        with context.resources.progressor_db.connection() as conn:
            for target in targets:
                namespace = target.params.namespace
                states[namespace] = recorded_state(measure(conn, target.params, checked_only=True))
                failing = [name for name, passed in states[namespace]["checks"].items() if not passed]
                said.append(f"{namespace}: " + (f"failing {', '.join(failing)}" if failing else "healthy"))
        return Look.state(states, "; ".join(said))

    return schedule(
        name="progressor_health_schedule",
        crons=crons,
        job=job,
        cron_schedule="*/5 * * * *",
        look=look,
        refresh=dt.timedelta(hours=1),  # at least hourly, whatever the look finds
        required_resource_keys={"progressor_db"},
        description="Progressor health of every target namespace, with its checks. Looks first every 5 minutes "
        "(the figures the checks read: zombies and the oldest running task, overdue timers, process errors in "
        "24 h; not the tasks by status or the durations) and runs when a check's outcome or one of those counts "
        "differs from what the last run recorded, and at least every hour.",
    )


def health_asset(target: Target, notes: CheckNotes | None = None) -> dg.AssetsDefinition:
    """The namespace's health asset with its checks (a failed one adds its note from ``notes``)."""
    key = dg.AssetKey(["progressor", f"health_{target.name}"])
    namespace = target.params.namespace

    @dg.asset(
        key=key,
        group_name="progressor",
        description=f"Is progressor keeping up in {namespace}? Zombies, overdue timers, the oldest running task, "
        "recent process errors, tasks by status and task durations (chart).",
        check_specs=[dg.AssetCheckSpec(name, asset=key, description=d) for name, d in CHECKS.items()],
        tags=CAPABILITY,
    )
    def progressor_health(
        context: dg.AssetExecutionContext, progressor_db: ProgressorDatabase, cloudwatch: CloudWatchResource
    ) -> dg.MaterializeResult:
        try:
            with progressor_db.connection() as conn:
                health = measure(conn, target.params)
        except TASK.failures as exc:  # the collection's one-line failures
            raise dg.Failure(description=str(exc), allow_retries=False) from None
        health.clock.warn(context.log)
        # To the deployment's metrics sink; a failure is a warning, never a failed run.
        metrics = CommittedChangeMetrics(context, cloudwatch, f"progressor health {namespace}")
        put_metrics(metrics, progressor_db.metrics_namespace, health_datums(health))
        results = []
        for c in checks(health):
            description, demo = noted(dg.AssetCheckKey(key, c.name), c.passed, c.description, notes)
            results.append(
                dg.AssetCheckResult(
                    check_name=c.name,
                    passed=c.passed,
                    severity=dg.AssetCheckSeverity[c.severity],
                    description=description,
                    metadata=demo,
                )
            )
        figures = {
            "zombies": health.zombies,
            "overdue_timers": health.overdue_timers,
            "oldest_running_seconds": float(health.oldest_running_seconds),
            "oldest_running": health.oldest_running or "none",
            "errored_24h": health.errored_24h,
            "running": health.running,
            **{f"tasks_{s}": n for s, n in health.tasks_by_status.items()},
            "tasks_by_status": health.tasks_by_status,
            "database_time_zone": health.clock.describe(),
            "metrics_published": metrics.published,
        }
        return dg.MaterializeResult(
            metadata={**metadata_from(figures), "task_durations": dg.MetadataValue.md(durations_chart(health))},
            check_results=results,
        )

    return progressor_health


def build_defs(
    *,
    targets_file: Path | None = None,
    crons: Mapping[str, str] | None = None,
    check_notes: CheckNotes | None = None,
) -> dg.Definitions:
    """The job; per target namespace of ``targets_file`` a schedule and a health asset. Schedules at the crons
    ``crons`` names; a failed check with its note from ``check_notes``."""
    targets = load_targets(targets_file)
    assets = [health_asset(t, check_notes) for t in targets]
    schedules = [schedule_for(t, crons) for t in targets]
    jobs: list = [collect_zombies_job]
    if assets:
        health_job = dg.define_asset_job(
            "progressor_health_job",
            selection=dg.AssetSelection.groups("progressor"),
            tags={**CAPABILITY, ONE_AT_A_TIME_TAG: "progressor_health_job"},
            description="Progressor health of every target namespace (zombies, overdue timers, the oldest running "
            "task, recent process errors, task durations) with its checks; launched by progressor_health_schedule.",
        )
        jobs.append(health_job)
        schedules.append(health_schedule(targets, health_job, crons))
    return dg.Definitions(assets=assets, jobs=jobs, schedules=schedules)
