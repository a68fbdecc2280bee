"""One namespace's health figures, checks and CloudWatch datums (docs/progressor.md, "Health asset and checks",
"Metrics": progressor itself exports no count of collected zombies). No Dagster."""

from dataclasses import dataclass, field
from typing import Any

from psycopg2 import sql

from pipelines.common import dimension_value
from pipelines.common.aws_batches import datum
from pipelines.common.charts import INLINE_MARKDOWN_LIMIT, Bar, text_bars
from pipelines.progressor.collector import Clock, prepare
from pipelines.progressor.params import CollectParams
from pipelines.progressor.schema import TASK_STATUSES

BUCKETS_MS = (50, 150, 300, 500, 750, 1000)  # progressor's histogram buckets (prometheus "le")
BUCKET_LABELS = tuple(f"<={b}" for b in BUCKETS_MS) + (">1000",)
_WHENS = " ".join(f"WHEN d <= {b} THEN {i}" for i, b in enumerate(BUCKETS_MS))
_BUCKET_CASE = f"CASE {_WHENS} ELSE {len(BUCKETS_MS)} END"  # a duration d (ms) -> its bucket's index


@dataclass
class Health:
    namespace: str
    clock: Clock
    zombies: int = 0
    zombie_threshold_seconds: int = 0
    overdue_timers: int = 0
    overdue_after_seconds: int = 0
    most_overdue_seconds: float = 0.0
    oldest_running_seconds: float = 0.0
    oldest_running: str = ""
    errored_24h: int = 0
    running: int = 0
    tasks_by_status: dict[str, int] = field(default_factory=dict)
    durations: dict[str, list[int]] = field(default_factory=dict)  # task_type -> count per bucket
    duration_max_ms: dict[str, float] = field(default_factory=dict)


def measure(conn, params: CollectParams, *, checked_only: bool = False) -> Health:
    """Read the figures (a few aggregate queries; the durations read the last 24 h of finished tasks); with
    ``checked_only`` (a schedule's look), only those the checks read: no tasks by status, no durations."""
    tables, threshold, columns = prepare(conn, params)
    health = Health(tables.namespace, threshold.clock, zombie_threshold_seconds=threshold.seconds)
    health.overdue_after_seconds = 2 * params.task_scan_timeout
    with conn.cursor() as cur:

        def rows(template: str, *values: object, **extra: sql.Composable) -> list[tuple]:
            cur.execute(tables.sql(template, *values, **extra))
            return cur.fetchall()

        [(health.zombies, health.running, health.oldest_running_seconds, health.oldest_running)] = rows(
            "SELECT count(*) FILTER (WHERE {older}), count(*), "
            "coalesce(max({age}) FILTER (WHERE isfinite(r.running_time)), 0)::float8, "
            "coalesce((SELECT process_id || ' task ' || task_id || ' (' || task_type || ')' FROM {running} r "
            "ORDER BY {age} DESC LIMIT 1), '') FROM {running} r",
            older=threshold.older,
            age=threshold.age,  # the zombies' reading of running_time (the writers' zones), not the raw value
        )
        [(health.overdue_timers, health.most_overdue_seconds)] = rows(
            "SELECT count(*), coalesce(max(extract(epoch FROM now() - scheduled_time)) "
            "FILTER (WHERE isfinite(scheduled_time)), 0)::float8 "
            "FROM {schedule} WHERE status = 'waiting' AND task_type IN ('timeout', 'remove') "
            "AND scheduled_time < now() - make_interval(secs => {}) "
            "AND process_id NOT IN (SELECT process_id FROM {running})",  # progressor's scanner skips those
            health.overdue_after_seconds,
        )
        if "status_changed_at" in columns:  # progressor's own collector sets none: its zombie task's finished_time
            errored = (
                "SELECT count(*) FROM {processes} p LEFT JOIN {tasks} t ON t.task_id = p.corrupted_by "
                "WHERE p.status = 'error' AND greatest(p.status_changed_at, t.finished_time) > "
            )
        else:
            errored = "SELECT count(DISTINCT process_id) FROM {tasks} WHERE status = 'error' AND finished_time > "
        [(health.errored_24h,)] = rows(errored + "now() - interval '24 hours'")
        if not checked_only:  # the run's figures besides the checks' (a look reads those only)
            counted = dict(rows("SELECT status::text, count(*) FROM {tasks} GROUP BY 1"))
            health.tasks_by_status = {status: counted.get(status, 0) for status in TASK_STATUSES}
            for task_type, bucket, count, max_ms in rows(
                "SELECT task_type::text, " + _BUCKET_CASE + " AS bucket, count(*), max(d) FROM ("
                "  SELECT task_type, extract(epoch FROM finished_time - running_time) * 1000 AS d FROM {tasks} "
                "  WHERE status = 'finished' AND isfinite(running_time) AND isfinite(finished_time) "
                "  AND finished_time > now() - interval '24 hours') f GROUP BY 1, 2"
            ):
                health.durations.setdefault(task_type, [0] * len(BUCKET_LABELS))[bucket] = count
                health.duration_max_ms[task_type] = max(health.duration_max_ms.get(task_type, 0.0), float(max_ms))
    conn.rollback()
    return health


@dataclass(frozen=True)
class CheckOutcome:
    name: str
    passed: bool
    severity: str  # "WARN" or "ERROR"
    description: str


CHECKS = {
    "no_zombies": "No running task is older than progressor's zombie threshold.",
    "timers_on_time": "No waiting timer of a process with no running task is more than 2 x task_scan_timeout "
    "overdue (the timer scanner keeps up).",
    "oldest_running_task": "The oldest running task is younger than the zombie threshold.",
    "no_recent_process_errors": "No process went to error in the last 24 hours.",
}


def checks(health: Health) -> list[CheckOutcome]:
    """One outcome per check, each saying what an operator should look at when it fails."""
    ns = health.namespace
    too_old = health.oldest_running_seconds >= health.zombie_threshold_seconds
    return [
        CheckOutcome(
            "no_zombies",
            health.zombies == 0,
            "ERROR",
            f"{health.zombies} running task(s) of {ns} are older than {health.zombie_threshold_seconds}s: a worker "
            "node died. Run collect_zombies (or check that its schedule is on)."
            if health.zombies
            else "no zombies",
        ),
        CheckOutcome(
            "timers_on_time",
            health.overdue_timers == 0,
            "ERROR",
            f"{health.overdue_timers} timer(s) of {ns} are overdue by more than {health.overdue_after_seconds}s "
            f"(worst {health.most_overdue_seconds:.0f}s): progressor's timer scanner is behind or stopped; check "
            "the progressor nodes' scanners and their database pool."
            if health.overdue_timers
            else "timers on time",
        ),
        CheckOutcome(
            "oldest_running_task",
            not too_old,
            "WARN",
            f"oldest running task: {health.oldest_running or 'none'}, running for "
            f"{health.oldest_running_seconds:.0f}s (threshold {health.zombie_threshold_seconds}s)"
            + (": look at that process's worker" if too_old else ""),
        ),
        CheckOutcome(
            "no_recent_process_errors",
            health.errored_24h == 0,
            "WARN",
            f"{health.errored_24h} process(es) of {ns} went to error in the last 24 h: look at their detail "
            "(zombie detected = a collected zombie) and corrupted_by task."
            if health.errored_24h
            else "no process errors in the last 24 h",
        ),
    ]


def recorded_state(health: Health) -> dict[str, Any]:
    """What a schedule's look compares with the last run's: each check's outcome and the counts behind them
    (docs/progressor.md, "Health asset and checks")."""
    return {
        "checks": {c.name: c.passed for c in checks(health)},
        "zombies": health.zombies,
        "overdue_timers": health.overdue_timers,
        "errored_24h": health.errored_24h,
    }


def durations_chart(health: Health) -> str:
    """Task durations of the last 24 h as text bars shown inline: per bucket (ms), a part per task_type; the
    legend names each task_type with its longest duration. The per-type table follows while it all fits inline."""
    if not health.durations:
        return "no finished tasks in the last 24 h"
    types = sorted(health.durations)
    bars = [
        Bar(label, [health.durations[t][i] for t in types], str(sum(health.durations[t][i] for t in types)))
        for i, label in enumerate(BUCKET_LABELS)
    ]
    legend = [f"{t} (max {health.duration_max_ms[t]:.0f} ms)" for t in types]
    chart = text_bars(bars, legend, more="buckets", visible_parts=True)
    table = [
        "| task_type | " + " | ".join(BUCKET_LABELS) + " | max ms |",
        "|---" * (len(BUCKET_LABELS) + 2) + "|",
        *(
            f"| {t} | " + " | ".join(map(str, health.durations[t])) + f" | {health.duration_max_ms[t]:.0f} |"
            for t in types
        ),
    ]
    both = f"{chart}\n\n" + "\n".join(table)
    return both if len(both) < INLINE_MARKDOWN_LIMIT else chart


def _dims(namespace: str, **extra: str) -> list[dict[str, str]]:
    return [{"Name": k, "Value": dimension_value(v)} for k, v in {"Namespace": namespace, **extra}.items()]


def _count(metric: str, namespace: str, value: int) -> dict[str, Any]:
    return datum(metric, value, Namespace=dimension_value(namespace))


def collection_datums(namespace: str, collected: int) -> list[dict[str, Any]]:
    return [_count("ProgressorZombiesCollected", namespace, collected)]


def health_datums(health: Health) -> list[dict[str, Any]]:
    """Overdue timers, and the last 24 h of task durations per task_type (docs/progressor.md, "Metrics")."""
    datums = [_count("ProgressorOverdueTimers", health.namespace, health.overdue_timers)]
    for task_type, counts in sorted(health.durations.items()):
        values = [*map(float, BUCKETS_MS), max(float(BUCKETS_MS[-1]) + 1, health.duration_max_ms[task_type])]
        pairs = [(v, c) for v, c in zip(values, counts, strict=True) if c]
        if pairs:
            datums.append(
                {
                    "MetricName": "ProgressorTaskDuration",
                    "Dimensions": _dims(health.namespace, TaskType=task_type),
                    "Values": [v for v, _ in pairs],
                    "Counts": [float(c) for _, c in pairs],
                    "Unit": "Milliseconds",
                }
            )
    return datums
