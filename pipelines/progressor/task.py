"""``collect_zombies`` as a task (``pipelines.common.task``). No Dagster."""

from dataclasses import asdict
from typing import Any

from pipelines.common.aws_batches import put_metrics
from pipelines.common.looks import Look
from pipelines.common.task import Task, TaskRun
from pipelines.progressor.collector import ClockError, Counts, collect_zombies, prepare
from pipelines.progressor.health import collection_datums
from pipelines.progressor.params import CollectParams
from pipelines.progressor.schema import NamespaceError


def collect(run: TaskRun, _request: None, params: CollectParams) -> dict[str, Any]:
    counts = Counts()
    try:
        with run.progressor_db.connection() as conn:
            collect_zombies(conn, params, run.log, counts)
    finally:  # a run failing part way still logs and publishes what its committed batches did
        run.log.info(
            f"progressor {params.namespace}: found {counts.found}, errored {counts.errored}, "
            f"retried {counts.retried}, skipped_locked {counts.skipped_locked}, "
            f"batches_rolled_back {counts.batches_rolled_back}, failed {counts.failed}"
            + (f", would error {counts.would_error}, would retry {counts.would_retry}" if params.dry_run else "")
        )
        if not params.dry_run:
            datums = collection_datums(params.namespace, counts.errored + counts.retried)
            put_metrics(run.cloudwatch, run.progressor_db.metrics_namespace, datums)
    result = {**asdict(counts), "namespace": params.namespace, "action": params.action, "dry_run": params.dry_run}
    if not params.dry_run:
        result["metrics_published"] = run.cloudwatch.published
    return result


def look(run: TaskRun, _request: None, params: CollectParams) -> Look:
    """One count of the running rows older than the threshold, each ``running_time`` read as a run reads it
    (``collector.prepare``: in the writers' zones, ``collector.Clock``): the zombies a run would find."""
    with run.progressor_db.connection() as conn:
        tables, threshold, _ = prepare(conn, params)
        with conn.cursor() as cur:
            cur.execute(tables.sql("SELECT count(*) FROM {running} r WHERE {older}", older=threshold.older))
            found = cur.fetchone()[0]
        conn.rollback()
    seconds = threshold.seconds
    if found:
        return Look.work(f"{found} running task(s) of {params.namespace} older than {seconds}s")
    return Look.idle(f"no running task of {params.namespace} older than {seconds}s")


TASK = Task(
    name="collect_zombies",
    params=CollectParams,
    run=collect,
    clients=("progressor_db", "cloudwatch"),
    look=look,
    look_clients=("progressor_db",),
    looks_at="the running tasks older than the zombie threshold (one count)",
    job="collect_zombies",
    op="collect_namespace_zombies",
    description="Progressor: collect zombie tasks (running rows left by dead workers) without disturbing live "
    "workers; error them as progressor does, or retry zombie timers.",
    # Run monitoring cancels a run after 30 minutes, whatever holds it (each statement is bounded too).
    tags={"groundskeeper/capability": "progressor", "dagster/max_runtime": "1800"},
    what=lambda params: f"progressor {params.namespace}",
    counters=lambda result: {
        "zombies_collected": result["errored"] + result["retried"],
        "retried": result["retried"],
        "errored": result["errored"],
    },
    failures=(NamespaceError, ClockError, ConnectionError),  # ConnectionError: ProgressorDatabaseError
)
