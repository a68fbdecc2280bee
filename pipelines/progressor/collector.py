"""Zombie collection beside live workers (docs/progressor.md, "How it works"), over psycopg2; no Dagster. Batches
lock process and running rows first, skipping those held, so a worker that updates its process first is skipped
or waits; one completing a task without a process update takes its task row first, and can deadlock with a
batch (PostgreSQL ends one of the two)."""

import contextlib
import datetime as dt
import time
from dataclasses import dataclass

import psycopg2
from psycopg2 import sql
from psycopg2.errors import DeadlockDetected, InsufficientPrivilege, LockNotAvailable, SerializationFailure

from pipelines.common import first_line
from pipelines.progressor.params import ZOMBIE_ERROR, CollectParams
from pipelines.progressor.schema import Tables, process_columns, require_tables, tables_for

_UTC = ("utc", "uct", "gmt", "gmt0", "gmt+0", "gmt-0", "greenwich", "universal", "zulu")
UTC_NAMES = frozenset([*_UTC, *(f"etc/{name}" for name in _UTC)])  # PostgreSQL's names of UTC, lowercased


@dataclass
class Counts:
    found: int = 0
    errored: int = 0
    retried: int = 0
    skipped_locked: int = 0
    vanished: int = 0  # gone meanwhile: finished by a worker, or collected by progressor's own collector or another run
    batches: int = 0
    batches_rolled_back: int = 0
    rolled_back_zombies: int = 0
    failed: int = 0  # refused by the database (data or integrity error), left as they are
    would_error: int = 0
    would_retry: int = 0


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
    """The time zones progressor's sessions may use: each ``running_time`` (a wall clock in its writer's zone) is
    read back in every one (:meth:`started`), the latest reading counting (docs/progressor.md, "Time zone")."""

    writer_zones: tuple[tuple[str, int], ...]  # (zone, UTC offset in seconds now)
    explicit: bool = False  # writer_time_zone was set

    @property
    def shifted_zones(self) -> tuple[str, ...]:
        return tuple(zone for zone, _ in self.writer_zones if zone.lower() not in UTC_NAMES)

    def started(self, column: sql.Composable) -> sql.Composable:
        """The latest instant a ``running_time`` value can stand for: as stored, or that wall clock in a
        shifted zone taken as UTC."""
        readings = [
            sql.SQL("(({} AT TIME ZONE {}) AT TIME ZONE 'UTC')").format(column, sql.Literal(zone))
            for zone in self.shifted_zones
        ]
        if not readings:
            return column
        return sql.SQL("GREATEST({})").format(sql.SQL(", ").join([column, *readings]))

    def describe(self) -> str:
        return ", ".join(f"{zone!r} ({offset:+d}s)" for zone, offset in self.writer_zones)

    def warn(self, log) -> None:
        if self.shifted_zones:
            source = "writer_time_zone is" if self.explicit else "progressor's sessions may use TimeZone"
            log.warning(
                f"{source} {self.describe()}, not UTC (offsets now): progressor's TO_TIMESTAMP running times are "
                "shifted by the offset in force at the time they were written; each running time is read back in "
                "those zones and the latest reading counts, so that no live task is collected. "
                "Set the database's TimeZone to UTC."
            )


def _writer_zone_names(cur, session_zone: str) -> list[str]:
    """The zones a progressor session may get without asking: every role's setting (role-wide or for this
    database), then the database's setting or, without one, the server's default; this session's last."""
    cur.execute(
        "SELECT s.setrole <> 0, substr(c, strpos(c, '=') + 1) FROM pg_db_role_setting s, unnest(s.setconfig) c "
        "WHERE s.setdatabase IN (0, (SELECT oid FROM pg_database WHERE datname = current_database())) "
        "AND lower(split_part(c, '=', 1)) = 'timezone' ORDER BY 1, 2"
    )
    rows = cur.fetchall()
    role_zones = [zone for role_level, zone in rows if role_level]
    database_zones = [zone for role_level, zone in rows if not role_level] or [_server_default_zone(cur)]
    return list(dict.fromkeys([*role_zones, *database_zones, session_zone]))


def _server_default_zone(cur) -> str:
    """The server's TimeZone (postgresql.conf or ALTER SYSTEM; GMT when neither sets it)."""
    cur.execute("SAVEPOINT server_zone")
    try:
        cur.execute("SELECT setting FROM pg_file_settings WHERE lower(name) = 'timezone' AND applied")
        row = cur.fetchone()
        cur.execute("RELEASE SAVEPOINT server_zone")
        return row[0] if row else "GMT"
    except InsufficientPrivilege:
        cur.execute("ROLLBACK TO SAVEPOINT server_zone")
    cur.execute("SELECT source, setting FROM pg_settings WHERE name = 'TimeZone'")
    source, setting = cur.fetchone()
    if source in ("default", "configuration file", "command line", "environment variable"):
        return setting
    raise ClockError(
        f"cannot tell the server's default TimeZone (this session's comes from {source!r} and pg_file_settings "
        "is not readable): set writer_time_zone to the TimeZone progressor's sessions use"
    )


def _iana_zone(cur, writer_time_zone: str) -> str:
    """``writer_time_zone`` if it names an IANA zone PostgreSQL has, else ClockError (an offset is refused)."""
    cur.execute("SELECT name FROM pg_timezone_names WHERE lower(name) = lower(%s) LIMIT 1", (writer_time_zone,))
    row = cur.fetchone()
    if row is not None:
        return row[0]
    raise ClockError(
        f"writer_time_zone {writer_time_zone!r} is not an IANA time zone name PostgreSQL knows (such as "
        "Asia/Tokyo or Europe/Berlin; offsets such as '+09:00' or 'UTC+9' are read with POSIX signs, "
        "west of UTC)"
    )


def _rollback(conn) -> None:
    """End the transaction, unless the connection is gone: then the error that lost it stands (a rollback
    would replace it by psycopg2's "connection already closed")."""
    if not conn.closed:
        conn.rollback()


@contextlib.contextmanager
def _transaction(conn):
    """A cursor in one transaction, as psycopg2's ``with conn`` but a lost connection's own error surfaces."""
    try:
        with conn.cursor() as cur:
            yield cur
        conn.commit()
    except BaseException:
        _rollback(conn)
        raise


_RUNNING_TIME = sql.SQL("r.running_time")


@dataclass(frozen=True)
class Threshold:
    """Which running tasks (rows ``r`` of the running table) are zombies: those that started
    (:meth:`Clock.started`) more than ``seconds`` before ``now`` (the database's ``now()`` unless given)."""

    clock: Clock
    seconds: int
    now: dt.datetime | None = None

    def _now(self) -> sql.Composable:
        return sql.SQL("now()") if self.now is None else sql.SQL("{}::timestamptz").format(sql.Literal(self.now))

    @property
    def age(self) -> sql.Composable:
        """Seconds since the task started, read the youngest way."""
        # epochs, not an interval: an infinite running_time (a legal timestamptz) is an infinite age, not an error
        started = self.clock.started(_RUNNING_TIME)
        return sql.SQL("(extract(epoch FROM {}) - extract(epoch FROM {}))::float8").format(self._now(), started)

    @property
    def older(self) -> sql.Composable:
        return sql.SQL("{} < {} - make_interval(secs => {})").format(
            self.clock.started(_RUNNING_TIME), self._now(), sql.Literal(self.seconds)
        )


def _keys(zombies: list[Zombie]) -> sql.Composable:
    """The zombies' keys as a table ``z (process_id, task_id)``."""
    return sql.SQL("unnest({}::text[], {}::bigint[]) AS z(process_id, task_id)").format(
        sql.Literal([z.process_id for z in zombies]), sql.Literal([z.task_id for z in zombies])
    )


def _select_zombies(cur, tables: Tables, threshold: Threshold, rest: str, **extra: sql.Composable) -> list[Zombie]:
    """The zombies among the running rows ``r`` that ``rest`` (joins, ``WHERE {older}``, order) selects."""
    cur.execute(
        tables.sql(
            "SELECT r.process_id, r.task_id, r.task_type::text, r.attempts_count, r.last_retry_interval, {age} "
            "FROM {running} r " + rest,
            age=threshold.age,
            older=threshold.older,
            **extra,
        )
    )
    return [Zombie(*row) for row in cur.fetchall()]


@dataclass(frozen=True)
class Action:
    """What the collector does with one zombie: retry it (in ``timeout`` seconds) or error it, and why."""

    zombie: Zombie
    retry: bool
    timeout: int
    reason: str

    @property
    def verb(self) -> str:
        return "retry" if self.retry else "error"


def write_actions(cur, tables: Tables, actions: list[Action], with_status_columns: bool) -> None:
    """Error or retry the locked zombies as docs/progressor.md ("How it works", ``error`` and ``retry``) says."""
    zombies = [a.zombie for a in actions]
    error = [a.zombie for a in actions if not a.retry]
    retry = [a for a in actions if a.retry]
    cur.execute(
        tables.sql(
            "UPDATE {tasks} SET status = 'error', finished_time = now() WHERE task_id = ANY({})",
            [z.task_id for z in zombies],
        )
    )
    if error:
        pids = [z.process_id for z in error]
        cur.execute(
            tables.sql(
                "UPDATE {tasks} SET status = 'cancelled' "
                "WHERE process_id = ANY({}) AND status IN ('waiting', 'blocked')",
                pids,
            )
        )
        cur.execute(tables.sql("DELETE FROM {schedule} WHERE process_id = ANY({})", pids))
        # a process already in error keeps them (and its detail and corrupted_by), as progressor's worker leaves
        # a broken process as it is
        extra = (
            ", previous_status = CASE WHEN p.status <> 'error' THEN p.status ELSE p.previous_status END, "
            "status_changed_at = CASE WHEN p.status <> 'error' THEN now() ELSE p.status_changed_at END"
            if with_status_columns
            else ""
        )
        cur.execute(
            tables.sql(
                "UPDATE {processes} p SET status = 'error', "
                "detail = CASE WHEN p.status <> 'error' THEN {} ELSE p.detail END, "
                "corrupted_by = CASE WHEN p.status <> 'error' THEN z.task_id ELSE p.corrupted_by END" + extra + " "
                "FROM {keys} WHERE p.process_id = z.process_id",
                ZOMBIE_ERROR,
                keys=_keys(error),
            )
        )
    if retry:
        cur.execute(
            tables.sql(
                "WITH dropped AS (DELETE FROM {schedule} WHERE process_id = ANY({}) "
                "AND task_type IN ('timeout', 'remove') AND status IN ('waiting', 'blocked') RETURNING task_id) "
                "UPDATE {tasks} SET status = 'cancelled' WHERE task_id IN (SELECT task_id FROM dropped)",
                [a.zombie.process_id for a in retry],
            )
        )
        cur.execute(
            tables.sql(
                "WITH new AS ("
                "  INSERT INTO {tasks} (process_id, task_type, status, scheduled_time, args, metadata, "
                "    last_retry_interval, attempts_count, context) "
                "  SELECT r.process_id, r.task_type, 'waiting', now() + make_interval(secs => z.timeout), r.args, "
                "    r.metadata, z.timeout, r.attempts_count + 1, r.context "
                "  FROM {running} r "
                "  JOIN unnest({}::bigint[], {}::int[]) AS z(task_id, timeout) ON z.task_id = r.task_id "
                "  RETURNING task_id, process_id, task_type, status, scheduled_time, args, metadata, "
                "    last_retry_interval, attempts_count, context) "
                "INSERT INTO {schedule} (task_id, process_id, task_type, status, scheduled_time, args, metadata, "
                "  last_retry_interval, attempts_count, context) SELECT * FROM new",
                [a.zombie.task_id for a in retry],
                [a.timeout for a in retry],
            )
        )
    cur.execute(
        tables.sql(
            "DELETE FROM {running} r USING {keys} WHERE r.process_id = z.process_id AND r.task_id = z.task_id",
            keys=_keys(zombies),
        )
    )


def plan(zombies: list[Zombie], params: CollectParams) -> list[Action]:
    """One action per zombie, in input order."""
    if params.action != "retry":
        return [Action(z, False, 0, "action error") for z in zombies]
    policy = params.policy
    return [Action(z, *policy.decide(z.task_type, z.attempts_count, z.last_retry_interval)) for z in zombies]


def _describe(z: Zombie) -> str:
    return (
        f"process {z.process_id!r} task {z.task_id} ({z.task_type}, attempts_count {z.attempts_count}, "
        f"running for {z.age_seconds:.0f}s)"
    )


def prepare(conn, params: CollectParams, now: dt.datetime | None = None) -> tuple[Tables, Threshold, set[str]]:
    """Check the namespace's tables, then read the processes table's columns and the clock of progressor's sessions
    (``writer_time_zone`` if given, else every zone they may use) in one read-only transaction."""
    tables = tables_for(params.namespace)
    try:
        with conn.cursor() as cur:
            require_tables(cur, tables)
            columns = process_columns(cur, tables)
            cur.execute("SELECT current_setting('TimeZone')")
            session_zone = cur.fetchone()[0]
            explicit = params.writer_time_zone is not None
            zones = [_iana_zone(cur, params.writer_time_zone)] if explicit else _writer_zone_names(cur, session_zone)
            cur.execute(
                "SELECT z, extract(epoch FROM (now() AT TIME ZONE z) - (now() AT TIME ZONE 'UTC'))::int "
                "FROM unnest(%s::text[]) WITH ORDINALITY AS u(z, n) ORDER BY n",
                (zones,),
            )
            clock = Clock(tuple(cur.fetchall()), explicit)
        return tables, Threshold(clock, params.threshold_seconds, now), columns
    finally:
        _rollback(conn)


def collect_zombies(
    conn, params: CollectParams, log, counts: Counts | None = None, *, on_batch=None, now: dt.datetime | None = None
) -> Counts:
    """Collect the namespace's zombies (or, with ``dry_run``, log what would be done), counting into ``counts``
    (the caller's, which keeps what the committed batches did if a later one raises). ``log`` has
    ``info``/``warning``; ``on_batch(n)`` (tests) is called inside each batch's transaction after locking;
    ``now`` (tests) replaces the database's ``now()`` in telling a zombie."""
    counts = Counts() if counts is None else counts
    tables, threshold, columns = prepare(conn, params, now)
    with_status_columns = {"previous_status", "status_changed_at"} <= columns
    threshold.clock.warn(log)
    with conn.cursor() as cur:
        # Candidates, oldest first, read without locks (one pass over the running table).
        zombies = _select_zombies(cur, tables, threshold, "WHERE {older} ORDER BY running_time, process_id")
    conn.rollback()
    counts.found = len(zombies)
    log.info(
        f"progressor namespace {params.namespace!r}: {counts.found} zombie(s) older than {threshold.seconds}s "
        f"(action {params.action}{', DRY RUN' if params.dry_run else ''})"
    )
    if params.dry_run:
        actions = plan(zombies, params)
        for action in actions:
            log.info(f"dry run: would {action.verb} {_describe(action.zombie)}: {action.reason}")
        counts.would_retry = sum(action.retry for action in actions)
        counts.would_error = counts.found - counts.would_retry
        return counts

    def collect(batch: list[Zombie]) -> None:
        with _transaction(conn) as cur:
            cur.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(f"{params.lock_timeout_ms}ms")))
            # The batch's zombies that are still zombies and not locked by anyone, locked.
            locked = _select_zombies(
                cur,
                tables,
                threshold,
                "JOIN {processes} p ON p.process_id = r.process_id "
                "JOIN {keys} ON z.process_id = r.process_id AND z.task_id = r.task_id "
                "WHERE {older} ORDER BY r.process_id FOR UPDATE OF p, r SKIP LOCKED",
                keys=_keys(batch),
            )
            locked_keys = {(z.process_id, z.task_id) for z in locked}
            unlocked = [z for z in batch if (z.process_id, z.task_id) not in locked_keys]
            still = 0
            if unlocked:  # how many are still running (read without waiting for locks)
                cur.execute(
                    tables.sql(
                        "SELECT count(*) FROM {running} r JOIN {keys} "
                        "ON z.process_id = r.process_id AND z.task_id = r.task_id",
                        keys=_keys(unlocked),
                    )
                )
                still = cur.fetchone()[0]
            if on_batch is not None:
                on_batch(counts.batches)
            actions = plan(locked, params)
            if actions:
                write_actions(cur, tables, actions, with_status_columns)
        for action in actions:
            log.info(f"{action.verb} {_describe(action.zombie)}: {action.reason}")
        retried = sum(action.retry for action in actions)
        counts.retried += retried
        counts.errored += len(actions) - retried
        counts.skipped_locked += still
        counts.vanished += len(unlocked) - still
        if still:
            log.info(
                f"batch {counts.batches}: {still} zombie(s) locked meanwhile (by a worker, progressor's own collector "
                "or another run), left for a later run"
            )

    def attempt(batch: list[Zombie]) -> None:
        """One transaction for ``batch``; a row error splits a batch into one transaction per zombie."""
        try:
            collect(batch)
        except (LockNotAvailable, DeadlockDetected, SerializationFailure) as exc:
            counts.batches_rolled_back += 1
            counts.rolled_back_zombies += len(batch)
            log.warning(
                f"batch {counts.batches} ({len(batch)} zombie(s)) rolled back, left for the next run: "
                f"{exc.pgcode} {first_line(exc)}"
            )
            time.sleep(0.05)
        except (psycopg2.DataError, psycopg2.IntegrityError) as exc:  # one row's data: that row only
            if len(batch) > 1:
                log.warning(
                    f"batch {counts.batches} ({len(batch)} zombie(s)) rolled back by a refused row "
                    f"({exc.pgcode} {first_line(exc)}): collecting its zombies one at a time"
                )
                for zombie in batch:
                    attempt([zombie])
                return
            counts.failed += 1
            log.warning(
                f"failed: {_describe(batch[0])} left as it is, the database refused it: {exc.pgcode} {first_line(exc)}"
            )

    for start in range(0, len(zombies), params.batch_size):
        counts.batches += 1
        attempt(zombies[start : start + params.batch_size])
    return counts
