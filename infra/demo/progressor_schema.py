"""Progressor's own DDL for a namespace (written from its four migrations) and its own collect_zombies
statement: for the demo, the tests and the benchmark; the product never creates a namespace. No Dagster."""

from __future__ import annotations

from psycopg2 import sql

from pipelines.progressor.schema import TASK_STATUSES, Tables, tables_for

_ENUMS = (
    ("process_status", ("running", "error", "init")),
    ("task_status", TASK_STATUSES),
    ("task_type", ("init", "timeout", "call", "notify", "repair", "remove")),
)

_TABLES_DDL = """
CREATE TABLE IF NOT EXISTS {processes} (
    process_id VARCHAR(256) PRIMARY KEY,
    status process_status NOT NULL,
    detail TEXT,
    aux_state BYTEA,
    created_at TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
    metadata JSONB,
    previous_status process_status NOT NULL,
    status_changed_at TIMESTAMP WITH TIME ZONE NOT NULL
);
CREATE TABLE IF NOT EXISTS {tasks} (
    task_id BIGSERIAL PRIMARY KEY,
    process_id VARCHAR(256) NOT NULL REFERENCES {processes} (process_id),
    task_type task_type NOT NULL,
    status task_status NOT NULL,
    scheduled_time TIMESTAMP WITH TIME ZONE NOT NULL,
    running_time TIMESTAMP WITH TIME ZONE,
    finished_time TIMESTAMP WITH TIME ZONE,
    args BYTEA,
    metadata JSONB,
    idempotency_key VARCHAR(80) UNIQUE,
    response BYTEA,
    blocked_task BIGINT REFERENCES {tasks} (task_id),
    last_retry_interval INTEGER NOT NULL,
    attempts_count SMALLINT NOT NULL,
    context BYTEA
);
ALTER TABLE {processes} ADD COLUMN IF NOT EXISTS corrupted_by BIGINT REFERENCES {tasks} (task_id);
CREATE TABLE IF NOT EXISTS {schedule} (
    task_id BIGINT PRIMARY KEY REFERENCES {tasks} (task_id),
    process_id VARCHAR(256) NOT NULL REFERENCES {processes} (process_id),
    task_type task_type NOT NULL,
    status task_status NOT NULL,
    scheduled_time TIMESTAMP WITH TIME ZONE NOT NULL,
    args BYTEA,
    metadata JSONB,
    last_retry_interval INTEGER NOT NULL,
    attempts_count SMALLINT NOT NULL,
    context BYTEA
);
CREATE TABLE IF NOT EXISTS {running} (
    process_id VARCHAR(256) PRIMARY KEY REFERENCES {processes} (process_id),
    task_id BIGINT NOT NULL REFERENCES {tasks} (task_id),
    task_type task_type NOT NULL,
    status task_status NOT NULL,
    scheduled_time TIMESTAMP WITH TIME ZONE NOT NULL,
    running_time TIMESTAMP WITH TIME ZONE NOT NULL,
    args BYTEA,
    metadata JSONB,
    last_retry_interval INTEGER NOT NULL,
    attempts_count SMALLINT NOT NULL,
    context BYTEA
);
CREATE TABLE IF NOT EXISTS {events} (
    process_id VARCHAR(256) NOT NULL REFERENCES {processes} (process_id),
    task_id BIGINT NOT NULL REFERENCES {tasks} (task_id),
    event_id SMALLINT NOT NULL,
    timestamp TIMESTAMP WITH TIME ZONE DEFAULT now(),
    metadata JSONB,
    payload BYTEA NOT NULL,
    PRIMARY KEY (process_id, event_id)
);
CREATE INDEX IF NOT EXISTS {events_process_idx} ON {events} USING HASH (process_id);
CREATE INDEX IF NOT EXISTS {tasks_process_idx} ON {tasks} USING HASH (process_id);
CREATE INDEX IF NOT EXISTS {schedule_process_idx} ON {schedule} USING HASH (process_id);
CREATE INDEX IF NOT EXISTS {running_task_idx} ON {running} USING HASH (task_id);
"""


def create_namespace(conn, namespace: str) -> Tables:
    """Create the shared enums (if missing) and the namespace's tables and indexes, in one transaction."""
    tables = tables_for(namespace)
    with conn, conn.cursor() as cur:
        # Serialize concurrent creators of the shared enums (tests run on two workers).
        cur.execute("SELECT pg_advisory_xact_lock(hashtext('groundskeeper.progressor.schema'))")
        for name, labels in _ENUMS:
            cur.execute("SELECT 1 FROM pg_type WHERE typname = %s", (name,))
            if cur.fetchone() is None:
                values = sql.SQL(", ").join(map(sql.Literal, labels))
                cur.execute(sql.SQL("CREATE TYPE {} AS ENUM ({})").format(sql.Identifier(name), values))
        indexes = ("events_process_idx", "tasks_process_idx", "schedule_process_idx", "running_task_idx")
        cur.execute(tables.sql(_TABLES_DDL, **{index: tables.ident(index) for index in indexes}))
    return tables


def progressor_sql(tables: Tables, seconds: int) -> sql.Composed:
    """Progressor's own ``collect_zombies`` statement (master 6033631, only waiting/blocked tasks cancelled,
    schedule deleted), which takes no row locks first: for the benchmark and the tests that compare."""
    return tables.sql(
        "WITH zombie_tasks AS ("
        "  DELETE FROM {running} WHERE running_time < now() - {age} RETURNING process_id, task_id), "
        " t1 AS (UPDATE {tasks} SET status = 'cancelled' WHERE status IN ('waiting', 'blocked') "
        "   AND process_id IN (SELECT process_id FROM zombie_tasks)), "
        " t2 AS (UPDATE {tasks} SET status = 'error', finished_time = now() "
        "   WHERE task_id IN (SELECT task_id FROM zombie_tasks)), "
        " t3 AS (DELETE FROM {schedule} WHERE process_id IN (SELECT process_id FROM zombie_tasks)) "
        "MERGE INTO {processes} AS pt USING zombie_tasks AS zt ON pt.process_id = zt.process_id "
        "  WHEN MATCHED THEN UPDATE SET status = 'error', detail = 'zombie detected', corrupted_by = zt.task_id",
        age=sql.SQL("make_interval(secs => {})").format(sql.Literal(seconds)),
    )


def progressor_statement(conn, tables: Tables, seconds: int) -> None:
    """Run :func:`progressor_sql` in one transaction, as progressor does."""
    with conn, conn.cursor() as cur:
        cur.execute(progressor_sql(tables, seconds))
