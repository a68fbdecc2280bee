"""Databases for the progressor tests on the local PostgreSQL (127.0.0.1:5432), created and dropped here,
and history rows (finished tasks, events) beside what ``infra.demo.progressor_engine`` writes."""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from pathlib import Path

import psycopg2

from pipelines.progressor.schema import Tables

PG = {"host": "127.0.0.1", "port": 5432, "user": os.environ.get("PGUSER", "postgres")}


def admin_connection():
    conn = psycopg2.connect(dbname="postgres", connect_timeout=10, **PG)
    conn.autocommit = True
    return conn


@contextlib.contextmanager
def scratch_database(prefix: str = "gk_progressor"):
    """A new database (unique per call, so per xdist worker too); yields its libpq URL; dropped after."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = admin_connection()
    try:
        with admin.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
        yield f"postgresql://{PG['user']}@{PG['host']}:{PG['port']}/{name}"
    finally:
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def unique_namespace(label: str) -> str:
    return f"{label}/{uuid.uuid4().hex[:8]}"


class ListLog:
    """A ``log`` for the collector that keeps its lines."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []
        self._logger = logging.getLogger("tests.progressor")

    def info(self, message: str) -> None:
        self.lines.append(("info", message))

    def warning(self, message: str) -> None:
        self.lines.append(("warning", message))

    def text(self, level: str | None = None) -> str:
        return "\n".join(m for lvl, m in self.lines if level in (None, lvl))


def finished_task(cur, tables: Tables, process_id: str, task_type: str, *, duration_ms: float, ago: float = 0) -> int:
    """History: a task that ran ``duration_ms`` and finished ``ago`` seconds ago."""
    cur.execute(
        tables.sql(
            "INSERT INTO {tasks} (process_id, task_type, status, scheduled_time, running_time, last_retry_interval, "
            "attempts_count, finished_time) VALUES ({}, {}, 'finished', "
            "now() - make_interval(secs => {}), now() - make_interval(secs => {}), 0, 0, "
            "now() - make_interval(secs => {})) RETURNING task_id",
            process_id,
            task_type,
            ago + duration_ms / 1000.0,
            ago + duration_ms / 1000.0,
            ago,
        )
    )
    return cur.fetchone()[0]


def add_event(cur, tables: Tables, process_id: str, task_id: int, event_id: int) -> None:
    """History: an event of the task, as progressor's workers write them."""
    cur.execute(
        tables.sql(
            "INSERT INTO {events} (process_id, task_id, event_id, payload) VALUES ({}, {}, {}, {})",
            process_id,
            task_id,
            event_id,
            b"event",
        )
    )


def local_run_limits() -> dict:
    """``dagster.yaml``'s run concurrency as ``instance_for_test`` overrides: its tag concurrency
    limits (one collection per namespace at a time) are what a schedule skips its tick on."""
    import yaml

    root = Path(__file__).resolve().parent.parent
    return {"concurrency": yaml.safe_load((root / "dagster.yaml").read_text())["concurrency"]}


def first_row_within(dsn: str, sql: str, args: tuple, seconds: float) -> tuple | None:
    """The first row ``sql`` returns, asked again and again on a connection of its own for at most ``seconds``
    (a test holding a process at a lock reads pg_stat_activity so), or None."""
    watch = psycopg2.connect(dsn)
    watch.autocommit = True
    deadline = time.monotonic() + seconds
    try:
        with watch.cursor() as cur:
            while time.monotonic() < deadline:
                cur.execute(sql, args)
                if row := cur.fetchone():
                    return row
                time.sleep(0.01)
        return None
    finally:
        watch.close()
