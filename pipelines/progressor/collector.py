"""Zombie collection beside live workers. No Dagster: functions over a psycopg2 connection.

A zombie is a row of ``"<ns>_running"`` whose ``running_time`` is older than
``process_step_timeout + task_scan_timeout + 5 s`` before the database's ``now()``.

The collector first lists the candidates without locking (``found``), then works through them in
batches. Each batch is one transaction with ``SET LOCAL lock_timeout`` that re-selects its
candidates with ``FOR UPDATE OF <processes>, <running> SKIP LOCKED``: a process whose row a live
worker holds (progressor locks the process row, then the running row) is skipped and left for a
later run instead of deadlocking. A lock timeout or a deadlock on the other rows costs only that
batch (rolled back, counted), and the run goes on. A row the database refuses (a data or integrity
error: out of range, a constraint) rolls its batch back, and the batch's zombies are then collected
one per transaction: the refused zombie is left as it is with one warning line (``failed``), every
other zombie is collected, and later runs go on past it.

Actions (see :func:`collect_zombies`): ``error`` does what progressor's ``collect_zombies`` does
(and also sets ``previous_status``/``status_changed_at``); ``retry`` re-schedules zombie timers
within their attempts, like progressor's worker does for a failed timer.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time
from dataclasses import asdict, dataclass

import psycopg2
import psycopg2.errors
from psycopg2 import sql

from pipelines.common import first_line
from pipelines.common.looks import Look
from pipelines.progressor.params import ZOMBIE_ERROR, CollectParams, ProgressorRetryPolicy
from pipelines.progressor.schema import Tables, process_columns, require_tables, tables_for

UTC_NAMES = frozenset(
    name.lower()
    for name in (
        "UTC",
        "Etc/UTC",
        "UCT",
        "Etc/UCT",
        "GMT",
        "Etc/GMT",
        "GMT0",
        "Etc/GMT0",
        "GMT+0",
        "GMT-0",
        "Etc/GMT+0",
        "Etc/GMT-0",
        "Greenwich",
        "Etc/Greenwich",
        "Universal",
        "Etc/Universal",
        "Zulu",
        "Etc/Zulu",
    )
)
# Errors that cost one batch: lock_timeout, deadlock, serialization failure.
BATCH_ERRORS = (
    psycopg2.errors.LockNotAvailable,
    psycopg2.errors.DeadlockDetected,
    psycopg2.errors.SerializationFailure,
)
# Errors caused by one row's data: they cost that row only (its batch is retried one zombie at a time).
ROW_ERRORS = (psycopg2.DataError, psycopg2.IntegrityError)


@dataclass
class Counts:
    found: int = 0
    errored: int = 0
    retried: int = 0
    skipped_locked: int = 0
    vanished: int = 0  # finished by their worker between the listing and the batch
    batches: int = 0
    batches_rolled_back: int = 0
    rolled_back_zombies: int = 0
    failed: int = 0  # refused by the database (data or integrity error), left as they are
    would_error: int = 0
    would_retry: int = 0

    @property
    def collected(self) -> int:
        return self.errored + self.retried

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class Zombie:
    process_id: str
    task_id: int
    task_type: str
    attempts_count: int
    last_retry_interval: int
    age_seconds: float


class ClockError(ValueError):
    """The time zone of progressor's sessions cannot be told; one line."""


@dataclass(frozen=True)
class Clock:
    """The time zones progressor's sessions may use, and how a ``running_time`` value is read back.

    Progressor writes ``running_time`` with ``TO_TIMESTAMP(<UTC text>)``, which reads the text as a wall
    clock in the writing session's ``TimeZone``: east of UTC a task looks older by the offset that zone
    had *at that wall-clock time* (after a daylight-saving fall-back that is an hour more than its offset
    now). Its other writes store the instant itself. That zone is the database's or the role's default
    (or the server's), not the collector's session zone, so the collector takes every zone a progressor
    session may have (``writer_zones``: the explicit ``writer_time_zone``, or else the role settings, the
    database setting or the server default, and this session's zone) and reads each ``running_time``
    back in each of them (:meth:`started`): the task's wall clock in that zone, taken as UTC. The latest
    of these readings and the value as stored is when the task may have started: when they disagree a
    zombie is collected later, a live task never."""

    time_zone: str  # this session's
    writer_zones: tuple[tuple[str, int], ...]  # (zone, UTC offset in seconds now)
    explicit: bool = False  # writer_time_zone was set

    @property
    def shifted_zones(self) -> tuple[str, ...]:
        return tuple(zone for zone, _ in self.writer_zones if zone.lower() not in UTC_NAMES)

    @property
    def is_utc(self) -> bool:
        return not self.shifted_zones

    def started(self, column: sql.Composable) -> sql.Composable:
        """The latest instant a ``running_time`` value can stand for (see the class)."""
        readings = [
            sql.SQL("(({} AT TIME ZONE {}) AT TIME ZONE 'UTC')").format(column, sql.Literal(zone))
            for zone in self.shifted_zones
        ]
        if not readings:
            return column
        return sql.SQL("GREATEST({})").format(sql.SQL(", ").join([column, *readings]))

    def describe(self) -> str:
        return ", ".join(f"{zone!r} ({offset:+d}s)" for zone, offset in self.writer_zones)

    def warning(self) -> str | None:
        if self.is_utc:
            return None
        source = "writer_time_zone is" if self.explicit else "progressor's sessions may use TimeZone"
        return (
            f"{source} {self.describe()}, not UTC (offsets now): progressor's TO_TIMESTAMP running times are "
            "shifted by the offset in force at the time they were written; each running time is read back in "
            "those zones and the latest reading counts, so that no live task is collected. "
            "Set the database's TimeZone to UTC."
        )


def _writer_zone_names(cur) -> list[str]:
    """The zones a progressor session may get without asking: every role's setting (role-wide or for this
    database), then the database's setting or, without one, the server's default; this session's last."""
    cur.execute(
        "SELECT s.setrole <> 0, substr(c, strpos(c, '=') + 1) FROM pg_db_role_setting s, unnest(s.setconfig) c "
        "WHERE s.setdatabase IN (0, (SELECT oid FROM pg_database WHERE datname = current_database())) "
        "AND lower(split_part(c, '=', 1)) = 'timezone' ORDER BY 1, 2"
    )
    rows = cur.fetchall()
    zones = [zone for role_level, zone in rows if role_level]
    database_zones = [zone for role_level, zone in rows if not role_level]
    if not database_zones:
        database_zones = [_server_default_zone(cur)]
    cur.execute("SELECT current_setting('TimeZone')")
    return list(dict.fromkeys([*zones, *database_zones, cur.fetchone()[0]]))


def _server_default_zone(cur) -> str:
    """The server's TimeZone (postgresql.conf or ALTER SYSTEM; GMT when neither sets it)."""
    cur.execute("SAVEPOINT server_zone")
    try:
        cur.execute("SELECT setting FROM pg_file_settings WHERE lower(name) = 'timezone' AND applied")
        row = cur.fetchone()
        cur.execute("RELEASE SAVEPOINT server_zone")
        return row[0] if row else "GMT"
    except psycopg2.errors.InsufficientPrivilege:
        cur.execute("ROLLBACK TO SAVEPOINT server_zone")
    cur.execute("SELECT source, setting FROM pg_settings WHERE name = 'TimeZone'")
    source, setting = cur.fetchone()
    if source in ("default", "configuration file", "command line", "environment variable"):
        return setting
    raise ClockError(
        f"cannot tell the server's default TimeZone (this session's comes from {source!r} and pg_file_settings "
        "is not readable): set writer_time_zone to the TimeZone progressor's sessions use"
    )


def _offsets(cur, zones: list[str]) -> tuple[tuple[str, int], ...]:
    cur.execute(
        "SELECT z, extract(epoch FROM (now() AT TIME ZONE z) - (now() AT TIME ZONE 'UTC'))::int "
        "FROM unnest(%s::text[]) WITH ORDINALITY AS u(z, n) ORDER BY n",
        (zones,),
    )
    return tuple(cur.fetchall())


def _iana_zone(cur, writer_time_zone: object) -> str:
    """``writer_time_zone`` if it names an IANA zone PostgreSQL has, else ClockError. An offset such as
    ``+09:00`` or ``UTC+9`` is a POSIX zone to PostgreSQL, whose signs count west of UTC: refused."""
    if isinstance(writer_time_zone, str):
        cur.execute("SELECT name FROM pg_timezone_names WHERE lower(name) = lower(%s) LIMIT 1", (writer_time_zone,))
        row = cur.fetchone()
        if row is not None:
            return row[0]
    raise ClockError(
        f"writer_time_zone {writer_time_zone!r} is not an IANA time zone name PostgreSQL knows (such as "
        "Asia/Tokyo or Europe/Berlin; offsets such as '+09:00' or 'UTC+9' are read with POSIX signs, "
        "west of UTC)"
    )


def database_clock(conn, writer_time_zone: str | None = None) -> Clock:
    """The clock of progressor's sessions: ``writer_time_zone`` if given, else every zone they may use."""
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT current_setting('TimeZone')")
            session_zone = cur.fetchone()[0]
            if writer_time_zone is not None:
                return Clock(session_zone, _offsets(cur, [_iana_zone(cur, writer_time_zone)]), explicit=True)
            return Clock(session_zone, _offsets(cur, _writer_zone_names(cur)))
    finally:
        _rollback(conn)


def _rollback(conn) -> None:
    """End the transaction, unless the connection is gone: then the error that lost it stands (a rollback
    would replace it by psycopg2's "connection already closed")."""
    if not conn.closed:
        conn.rollback()


@contextlib.contextmanager
def _transaction(conn):
    """A cursor in one transaction: committed when the block ends, rolled back when it raises (as
    psycopg2's ``with conn``, but a lost connection's own error is the one that surfaces)."""
    try:
        with conn.cursor() as cur:
            yield cur
        conn.commit()
    except BaseException:
        _rollback(conn)
        raise


def _interval(seconds: int) -> sql.Composable:
    return sql.SQL("make_interval(secs => {})").format(sql.Literal(seconds))


@dataclass(frozen=True)
class Threshold:
    """Which running tasks are zombies: those that started (:meth:`Clock.started`) more than ``seconds``
    before ``now`` (the database's ``now()`` unless given)."""

    clock: Clock
    seconds: int
    now: dt.datetime | None = None

    def _now(self) -> sql.Composable:
        return sql.SQL("now()") if self.now is None else sql.SQL("{}::timestamptz").format(sql.Literal(self.now))

    def age(self, column: sql.Composable) -> sql.Composable:
        """Seconds since the task started, read the youngest way."""
        return sql.SQL("extract(epoch FROM {} - {})::float8").format(self._now(), self.clock.started(column))

    def older(self, column: sql.Composable) -> sql.Composable:
        """True for a zombie's ``running_time``."""
        return sql.SQL("{} < {} - {}").format(self.clock.started(column), self._now(), _interval(self.seconds))


_RUNNING_TIME = sql.SQL("r.running_time")


def list_zombies(conn, tables: Tables, threshold: Threshold) -> list[Zombie]:
    """Zombie candidates, oldest first, read without locks (one pass over the running table)."""
    with conn.cursor() as cur:
        cur.execute(
            tables.sql(
                "SELECT process_id, task_id, task_type::text, attempts_count, last_retry_interval, {age} "
                "FROM {running} r WHERE {older} ORDER BY running_time, process_id",
                age=threshold.age(_RUNNING_TIME),
                older=threshold.older(_RUNNING_TIME),
            )
        )
        rows = cur.fetchall()
    conn.rollback()
    return [Zombie(*row) for row in rows]


def look_for_zombies(conn, params: CollectParams) -> Look:
    """A schedule's look before a collection: one count of the running table's rows older than the
    zombie threshold. Each ``running_time`` as stored, not read back in the writers' zones
    (:class:`Clock`): it counts at least the zombies a run would find."""
    tables = tables_for(params.namespace)
    seconds = params.threshold_seconds
    with conn.cursor() as cur:
        cur.execute(
            tables.sql("SELECT count(*) FROM {running} WHERE running_time < now() - {age}", age=_interval(seconds))
        )
        found = cur.fetchone()[0]
    conn.rollback()
    if found:
        return Look.work(f"{found} running task(s) of {params.namespace} older than {seconds}s")
    return Look.idle(f"no running task of {params.namespace} older than {seconds}s")


def _lock_batch(cur, tables: Tables, batch: list[Zombie], threshold: Threshold) -> list[Zombie]:
    """Re-select the batch's zombies that are still zombies and not locked by anyone, and lock them."""
    cur.execute(
        tables.sql(
            "SELECT r.process_id, r.task_id, r.task_type::text, r.attempts_count, r.last_retry_interval, {age} "
            "FROM {running} r JOIN {processes} p ON p.process_id = r.process_id "
            "JOIN unnest({}::text[], {}::bigint[]) AS z(process_id, task_id) "
            "  ON z.process_id = r.process_id AND z.task_id = r.task_id "
            "WHERE {older} "
            "ORDER BY r.process_id FOR UPDATE OF p, r SKIP LOCKED",
            [z.process_id for z in batch],
            [z.task_id for z in batch],
            age=threshold.age(_RUNNING_TIME),
            older=threshold.older(_RUNNING_TIME),
        )
    )
    return [Zombie(*row) for row in cur.fetchall()]


def _still_running(cur, tables: Tables, zombies: list[Zombie]) -> int:
    """How many of ``zombies`` are still in the running table (read without waiting for locks)."""
    if not zombies:
        return 0
    cur.execute(
        tables.sql(
            "SELECT count(*) FROM {running} r JOIN unnest({}::text[], {}::bigint[]) AS z(process_id, task_id) "
            "ON z.process_id = r.process_id AND z.task_id = r.task_id",
            [z.process_id for z in zombies],
            [z.task_id for z in zombies],
        )
    )
    return cur.fetchone()[0]


def _delete_running(cur, tables: Tables, pids: list[str], tids: list[int]) -> None:
    """Progressor's running markers of these tasks go (a collected task is no longer running)."""
    cur.execute(
        tables.sql(
            "DELETE FROM {running} r USING unnest({}::text[], {}::bigint[]) AS z(process_id, task_id) "
            "WHERE r.process_id = z.process_id AND r.task_id = z.task_id",
            pids,
            tids,
        )
    )


def error_zombies(cur, tables: Tables, zombies: list[Zombie], with_status_columns: bool) -> None:
    """Progressor's collect_zombies for these (locked) zombies, plus previous_status/status_changed_at."""
    pids = [z.process_id for z in zombies]
    tids = [z.task_id for z in zombies]
    _delete_running(cur, tables, pids, tids)
    cur.execute(
        tables.sql(
            "UPDATE {tasks} SET status = 'cancelled' WHERE process_id = ANY({}) AND status IN ('waiting', 'blocked')",
            pids,
        )
    )
    cur.execute(tables.sql("UPDATE {tasks} SET status = 'error', finished_time = now() WHERE task_id = ANY({})", tids))
    cur.execute(tables.sql("DELETE FROM {schedule} WHERE process_id = ANY({})", pids))
    extra = ", previous_status = p.status, status_changed_at = now()" if with_status_columns else ""
    cur.execute(
        tables.sql(
            "UPDATE {processes} p SET status = 'error', detail = {}, corrupted_by = z.task_id" + extra + " "
            "FROM unnest({}::text[], {}::bigint[]) AS z(process_id, task_id) WHERE p.process_id = z.process_id",
            ZOMBIE_ERROR,
            pids,
            tids,
        )
    )


def retry_zombies(cur, tables: Tables, zombies: list[Zombie], timeouts: list[int]) -> None:
    """Zombie timers: task error; other waiting/blocked timers cancelled (as progressor's worker does on a
    retry); a new waiting task (same type, attempts_count + 1, last_retry_interval = timeout, scheduled
    at now() + timeout) in tasks and schedule; the running row deleted. The process stays running."""
    pids = [z.process_id for z in zombies]
    tids = [z.task_id for z in zombies]
    cur.execute(tables.sql("UPDATE {tasks} SET status = 'error', finished_time = now() WHERE task_id = ANY({})", tids))
    cur.execute(
        tables.sql(
            "WITH dropped AS (DELETE FROM {schedule} WHERE process_id = ANY({}) AND task_type IN ('timeout', 'remove') "
            "AND status IN ('waiting', 'blocked') RETURNING task_id) "
            "UPDATE {tasks} SET status = 'cancelled' WHERE task_id IN (SELECT task_id FROM dropped)",
            pids,
        )
    )
    cur.execute(
        tables.sql(
            "WITH new AS ("
            "  INSERT INTO {tasks} (process_id, task_type, status, scheduled_time, args, metadata, "
            "    last_retry_interval, attempts_count, context) "
            "  SELECT r.process_id, r.task_type, 'waiting', now() + make_interval(secs => z.timeout), r.args, "
            "    r.metadata, z.timeout, r.attempts_count + 1, r.context "
            "  FROM {running} r JOIN unnest({}::bigint[], {}::int[]) AS z(task_id, timeout) ON z.task_id = r.task_id "
            "  RETURNING task_id, process_id, task_type, status, scheduled_time, args, metadata, "
            "    last_retry_interval, attempts_count, context) "
            "INSERT INTO {schedule} (task_id, process_id, task_type, status, scheduled_time, args, metadata, "
            "  last_retry_interval, attempts_count, context) SELECT * FROM new",
            tids,
            timeouts,
        )
    )
    _delete_running(cur, tables, pids, tids)


@dataclass(frozen=True)
class Action:
    """What the collector does with one zombie: retry it (with ``timeout``) or error it, and why."""

    zombie: Zombie
    retry: bool
    timeout: int
    reason: str

    @property
    def verb(self) -> str:
        return "retry" if self.retry else "error"


def plan(zombies: list[Zombie], params: CollectParams) -> list[Action]:
    """One action per zombie, in input order."""
    policy: ProgressorRetryPolicy = params.policy
    actions = []
    for z in zombies:
        if params.action == "retry":
            ok, timeout, reason = policy.decide(z.task_type, z.attempts_count, z.last_retry_interval)
        else:
            ok, timeout, reason = False, 0, "action error"
        actions.append(Action(z, ok, timeout if ok else 0, reason))
    return actions


def _describe(z: Zombie) -> str:
    return (
        f"process {z.process_id!r} task {z.task_id} ({z.task_type}, attempts_count {z.attempts_count}, "
        f"running for {z.age_seconds:.0f}s)"
    )


def prepare(conn, namespace: str, writer_time_zone: str | None = None) -> tuple[Tables, Clock, bool]:
    """Check the namespace's tables and the database clock before anything is written."""
    tables = tables_for(namespace)
    require_tables(conn, tables)
    columns = process_columns(conn, tables)
    conn.rollback()
    return tables, database_clock(conn, writer_time_zone), {"previous_status", "status_changed_at"} <= columns


def collect_zombies(conn, params: CollectParams, log, *, on_batch=None, now: dt.datetime | None = None) -> Counts:
    """Collect the namespace's zombies (or, with ``dry_run``, log what would be done). ``log`` has
    ``info``/``warning``; ``on_batch(n)`` (tests) is called inside each batch's transaction after locking;
    ``now`` (tests) replaces the database's ``now()`` in telling a zombie."""
    tables, clock, with_status_columns = prepare(conn, params.namespace, params.writer_time_zone)
    warning = clock.warning()
    if warning:
        log.warning(warning)
    seconds = params.threshold_seconds
    threshold = Threshold(clock, seconds, now)
    counts = Counts()
    zombies = list_zombies(conn, tables, threshold)
    counts.found = len(zombies)
    log.info(
        f"progressor namespace {params.namespace!r}: {counts.found} zombie(s) older than {seconds}s "
        f"(action {params.action}{', DRY RUN' if params.dry_run else ''})"
    )
    if params.dry_run:
        for action in plan(zombies, params):
            log.info(f"dry run: would {action.verb} {_describe(action.zombie)}: {action.reason}")
            if action.retry:
                counts.would_retry += 1
            else:
                counts.would_error += 1
        return counts
    run = _BatchRunner(conn, tables, params, threshold, with_status_columns, counts, log, on_batch)
    for start in range(0, len(zombies), params.batch_size):
        counts.batches += 1
        run.attempt(zombies[start : start + params.batch_size], split=True)
    return counts


@dataclass
class _BatchRunner:
    conn: object
    tables: Tables
    params: CollectParams
    threshold: Threshold
    with_status_columns: bool
    counts: Counts
    log: object
    on_batch: object

    def attempt(self, batch: list[Zombie], *, split: bool) -> None:
        """One transaction for ``batch``; a row error splits it into one transaction per zombie."""
        counts, log = self.counts, self.log
        try:
            self._collect(batch)
        except BATCH_ERRORS as exc:
            counts.batches_rolled_back += 1
            counts.rolled_back_zombies += len(batch)
            log.warning(
                f"batch {counts.batches} ({len(batch)} zombie(s)) rolled back, left for the next run: "
                f"{exc.pgcode} {first_line(exc)}"
            )
            time.sleep(0.05)
        except ROW_ERRORS as exc:
            if split and len(batch) > 1:
                log.warning(
                    f"batch {counts.batches} ({len(batch)} zombie(s)) rolled back by a refused row "
                    f"({exc.pgcode} {first_line(exc)}): collecting its zombies one at a time"
                )
                for zombie in batch:
                    self.attempt([zombie], split=False)
                return
            counts.failed += len(batch)
            for zombie in batch:
                log.warning(
                    f"failed: {_describe(zombie)} left as it is, the database refused it: "
                    f"{exc.pgcode} {first_line(exc)}"
                )

    def _collect(self, batch: list[Zombie]) -> None:
        counts, log, tables, params = self.counts, self.log, self.tables, self.params
        with _transaction(self.conn) as cur:
            cur.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(f"{params.lock_timeout_ms}ms")))
            locked = _lock_batch(cur, tables, batch, self.threshold)
            locked_keys = {(z.process_id, z.task_id) for z in locked}
            unlocked = [z for z in batch if (z.process_id, z.task_id) not in locked_keys]
            still = _still_running(cur, tables, unlocked)
            if self.on_batch is not None:
                self.on_batch(counts.batches)
            actions = plan(locked, params)
            retry = [a for a in actions if a.retry]
            error = [a.zombie for a in actions if not a.retry]
            if error:
                error_zombies(cur, tables, error, self.with_status_columns)
            if retry:
                retry_zombies(cur, tables, [a.zombie for a in retry], [a.timeout for a in retry])
        for action in actions:
            log.info(f"{action.verb} {_describe(action.zombie)}: {action.reason}")
        counts.errored += len(error)
        counts.retried += len(retry)
        counts.skipped_locked += still
        counts.vanished += len(unlocked) - still
        if still:
            log.info(f"batch {counts.batches}: {still} zombie(s) locked by a live worker, left for a later run")


def progressor_sql(tables: Tables, seconds: int) -> sql.Composed:
    """Progressor's own ``collect_zombies`` statement (master 6033631, with the corrected semantics: only
    waiting/blocked tasks cancelled, schedule deleted), threshold from the database clock. It takes no
    row locks first. For the benchmark and the tests that compare."""
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
        age=_interval(seconds),
    )


def progressor_statement(conn, tables: Tables, seconds: int) -> None:
    """Run :func:`progressor_sql` in one transaction, as progressor does."""
    with conn, conn.cursor() as cur:
        cur.execute(progressor_sql(tables, seconds))
