"""A minimal progressor in SQL, for the demo traffic, the tests and the benchmark. No Dagster.

It writes rows the way progressor's ``prg_pg_backend`` does (PrepareInit, PrepareCall, a worker's
SaveResult, a timer) so that the collector and the health checks see realistic data. A worker
completes a task in progressor's lock order: the process row first (``UPDATE processes``), then the
running row (``DELETE FROM running``).
"""

from __future__ import annotations

import time

from pipelines.progressor.schema import Tables

_TASK_COLUMNS = "process_id, task_type, status, scheduled_time, running_time, last_retry_interval, attempts_count"


def start_process(cur, tables: Tables, process_id: str, *, age_seconds: float = 0.0, task_type: str = "init") -> int:
    """A new process whose first task runs since ``age_seconds`` ago (PrepareInit). Returns the task id."""
    cur.execute(
        tables.sql(
            "INSERT INTO {processes} (process_id, status, created_at, previous_status, status_changed_at) "
            "VALUES ({}, 'running', now() - make_interval(secs => {}), 'init', now() - make_interval(secs => {}))",
            process_id,
            age_seconds,
            age_seconds,
        )
    )
    return run_task(cur, tables, process_id, task_type, age_seconds=age_seconds)


def run_task(
    cur,
    tables: Tables,
    process_id: str,
    task_type: str,
    *,
    age_seconds: float = 0.0,
    attempts_count: int = 0,
    last_retry_interval: int = 0,
) -> int:
    """A task of ``process_id`` running since ``age_seconds`` ago (in tasks and running)."""
    cur.execute(
        tables.sql(
            "INSERT INTO {tasks} (" + _TASK_COLUMNS + ") VALUES ({}, {}, 'running', "
            "now() - make_interval(secs => {}), now() - make_interval(secs => {}), {}, {}) RETURNING task_id",
            process_id,
            task_type,
            age_seconds,
            age_seconds,
            last_retry_interval,
            attempts_count,
        )
    )
    task_id = cur.fetchone()[0]
    cur.execute(
        tables.sql(
            "INSERT INTO {running} (process_id, task_id, task_type, status, scheduled_time, running_time, "
            "last_retry_interval, attempts_count) "
            "SELECT process_id, task_id, task_type, status, scheduled_time, running_time, last_retry_interval, "
            "attempts_count FROM {tasks} WHERE task_id = {}",
            task_id,
        )
    )
    return task_id


def schedule_task(
    cur, tables: Tables, process_id: str, task_type: str, *, in_seconds: float = 60.0, status: str = "waiting"
) -> int:
    """A waiting (or blocked) task of ``process_id`` due in ``in_seconds`` (negative: overdue)."""
    cur.execute(
        tables.sql(
            "INSERT INTO {tasks} (" + _TASK_COLUMNS + ") VALUES ({}, {}, {}, now() + make_interval(secs => {}), "
            "NULL, 0, 0) RETURNING task_id",
            process_id,
            task_type,
            status,
            in_seconds,
        )
    )
    task_id = cur.fetchone()[0]
    cur.execute(
        tables.sql(
            "INSERT INTO {schedule} (task_id, process_id, task_type, status, scheduled_time, last_retry_interval, "
            "attempts_count) SELECT task_id, process_id, task_type, status, scheduled_time, 0, 0 "
            "FROM {tasks} WHERE task_id = {}",
            task_id,
        )
    )
    return task_id


def complete_running(conn, tables: Tables, process_id: str, *, hold_seconds: float = 0.0, on_locked=None) -> bool:
    """A live worker finishes the process's running task, in progressor's lock order: the process row
    (``UPDATE processes``), then (after ``hold_seconds`` of work) the running row and the task. Returns
    False, writing nothing, if the running row is gone (the task was collected meanwhile)."""
    with conn, conn.cursor() as cur:
        cur.execute(tables.sql("UPDATE {processes} SET status = 'running' WHERE process_id = {}", process_id))
        if on_locked is not None:
            on_locked()
        if hold_seconds:
            time.sleep(hold_seconds)
        cur.execute(tables.sql("DELETE FROM {running} WHERE process_id = {} RETURNING task_id", process_id))
        row = cur.fetchone()
        if row is None:
            conn.rollback()
            return False
        cur.execute(
            tables.sql("UPDATE {tasks} SET status = 'finished', finished_time = now() WHERE task_id = {}", row[0])
        )
        return True
