"""Zombie collection logic on a real PostgreSQL: the error and retry actions row by row, dry run, bad input."""

from __future__ import annotations

import contextlib
import datetime as dt

import psycopg2
import pytest
from psycopg2 import sql

from infra.demo import progressor_engine as engine
from infra.demo.progressor_schema import create_namespace, progressor_statement
from pipelines.progressor.collector import ClockError, collect_zombies
from pipelines.progressor.health import checks, measure
from pipelines.progressor.params import ParamsError, collect_params
from pipelines.progressor.schema import NamespaceError
from tests.progressor_support import ListLog, add_event, finished_task, scratch_database, unique_namespace

pytestmark = pytest.mark.postgres

ZOMBIE_AGE = 200  # seconds; the default threshold is 60 + 31 + 5 = 96 s


@pytest.fixture(scope="module")
def dsn():
    with scratch_database() as url:
        yield url


@pytest.fixture
def conn(dsn):
    connection = psycopg2.connect(dsn)
    yield connection
    connection.close()


def _rows(conn, tables, template: str, *args):
    with conn.cursor() as cur:
        cur.execute(tables.sql(template, *args))
        rows = cur.fetchall()
    conn.rollback()
    return rows


def _one(conn, tables, template: str, *args):
    rows = _rows(conn, tables, template, *args)
    assert len(rows) == 1, rows
    return rows[0]


def _collect(conn, namespace: str, **config):
    log = ListLog()
    counts = collect_zombies(conn, collect_params({"namespace": namespace, **config}), log)
    return counts, log


@pytest.fixture
def error_world(conn):
    """A zombie process with history, events, a waiting timer, a blocked timer and a waiting call; a live
    process; an idle process; and the same zombie in another namespace."""
    ns, other_ns = unique_namespace("err"), unique_namespace("other")
    t = create_namespace(conn, ns)
    other = create_namespace(conn, other_ns)
    ids = {}
    with conn, conn.cursor() as cur:
        ids["zombie_task"] = engine.start_process(cur, t, "p-zombie", age_seconds=ZOMBIE_AGE, task_type="call")
        ids["history"] = finished_task(cur, t, "p-zombie", "init", duration_ms=120, ago=300)
        add_event(cur, t, "p-zombie", ids["history"], 1)
        ids["waiting_timer"] = engine.schedule_task(cur, t, "p-zombie", "timeout", in_seconds=30)
        ids["blocked_timer"] = engine.schedule_task(cur, t, "p-zombie", "timeout", in_seconds=30, status="blocked")
        ids["fresh_task"] = engine.start_process(cur, t, "p-fresh", age_seconds=10)
        engine.start_process(cur, t, "p-idle", age_seconds=500)
        cur.execute(t.sql("DELETE FROM {running} WHERE process_id = 'p-idle'"))
        cur.execute(t.sql("UPDATE {tasks} SET status = 'finished', finished_time = now() WHERE process_id = 'p-idle'"))
        ids["idle_timer"] = engine.schedule_task(cur, t, "p-idle", "timeout", in_seconds=600)
        ids["other_zombie"] = engine.start_process(cur, other, "p-zombie", age_seconds=ZOMBIE_AGE)
    return ns, t, other, ids


def test_error_action_counts_one_zombie(conn, error_world):
    ns, _, _, _ = error_world
    counts, _ = _collect(conn, ns)
    assert (counts.found, counts.errored, counts.retried) == (1, 1, 0)


def test_error_action_rows(conn, error_world):
    ns, t, _, ids = error_world
    _collect(conn, ns)
    running = _rows(conn, t, "SELECT process_id FROM {running} ORDER BY 1")
    assert running == [("p-fresh",)], "only the live task still runs"
    status, finished = _one(conn, t, "SELECT status, finished_time FROM {tasks} WHERE task_id = {}", ids["zombie_task"])
    assert status == "error"
    assert finished is not None, "the zombie task gets a finished_time"
    timers = _rows(
        conn, t, "SELECT status FROM {tasks} WHERE task_id IN ({}, {})", ids["waiting_timer"], ids["blocked_timer"]
    )
    assert timers == [("cancelled",), ("cancelled",)]
    assert _rows(conn, t, "SELECT task_id FROM {schedule} WHERE process_id = 'p-zombie'") == []
    process = _one(
        conn,
        t,
        "SELECT status, detail, corrupted_by, previous_status, now() - status_changed_at < interval '1 minute' "
        "FROM {processes} WHERE process_id = 'p-zombie'",
    )
    assert process == ("error", "zombie detected", ids["zombie_task"], "running", True)


def test_error_action_keeps_history(conn, error_world):
    ns, t, _, ids = error_world
    _collect(conn, ns)
    assert _one(conn, t, "SELECT status FROM {tasks} WHERE task_id = {}", ids["history"]) == ("finished",)
    assert _one(conn, t, "SELECT count(*) FROM {events} WHERE process_id = 'p-zombie'") == (1,)


def test_error_action_leaves_live_and_idle_processes(conn, error_world):
    ns, t, _, ids = error_world
    _collect(conn, ns)
    statuses = _rows(conn, t, "SELECT process_id, status FROM {processes} WHERE process_id <> 'p-zombie' ORDER BY 1")
    assert statuses == [("p-fresh", "running"), ("p-idle", "running")]
    assert _one(conn, t, "SELECT status FROM {schedule} WHERE task_id = {}", ids["idle_timer"]) == ("waiting",)


def test_error_action_leaves_other_namespace(conn, error_world):
    ns, _, other, ids = error_world
    _collect(conn, ns)
    assert _one(conn, other, "SELECT task_id FROM {running}") == (ids["other_zombie"],)
    assert _one(conn, other, "SELECT status, detail FROM {processes}") == ("running", None)


def test_error_action_keeps_when_a_process_already_in_error_went_to_error(conn):
    """A repair of a process broken three days ago runs on a node that dies: the process stays as it was."""
    ns = unique_namespace("repair")
    t = create_namespace(conn, ns)
    with conn, conn.cursor() as cur:
        broken_by = engine.start_process(cur, t, "p-broken", age_seconds=3 * 86400)
        cur.execute(t.sql("DELETE FROM {running}"))
        cur.execute(t.sql("UPDATE {tasks} SET status = 'error', finished_time = now() - interval '3 days'"))
        cur.execute(
            t.sql(
                "UPDATE {processes} SET status = 'error', previous_status = 'running', corrupted_by = {}, "
                "status_changed_at = now() - interval '3 days'",
                broken_by,
            )
        )
        engine.run_task(cur, t, "p-broken", "repair", age_seconds=ZOMBIE_AGE)
    went_to_error = "SELECT previous_status, status_changed_at, detail, corrupted_by FROM {processes}"
    before = _one(conn, t, went_to_error)
    _collect(conn, ns)
    assert _one(conn, t, went_to_error) == before


def test_second_run_is_idempotent(conn, error_world):
    ns, t, _, _ = error_world
    _collect(conn, ns)
    before = _rows(conn, t, "SELECT task_id, status, finished_time FROM {tasks} ORDER BY 1")
    counts, _ = _collect(conn, ns)
    assert (counts.found, counts.errored) == (0, 0)
    assert _rows(conn, t, "SELECT task_id, status, finished_time FROM {tasks} ORDER BY 1") == before


@pytest.fixture
def retry_world(conn):
    ns = unique_namespace("retry")
    t = create_namespace(conn, ns)
    ids = {}
    with conn, conn.cursor() as cur:
        ids["timer"] = engine.start_process(cur, t, "p-timer", age_seconds=ZOMBIE_AGE, task_type="timeout")
        engine.schedule_task(cur, t, "p-timer", "call", in_seconds=-1)  # a call that waits for the timer
        ids["remove"] = engine.start_process(cur, t, "p-remove", age_seconds=ZOMBIE_AGE)
        cur.execute(t.sql("DELETE FROM {running} WHERE process_id = 'p-remove'"))
        cur.execute(t.sql("UPDATE {tasks} SET status = 'finished' WHERE process_id = 'p-remove'"))
        ids["remove"] = engine.run_task(
            cur, t, "p-remove", "remove", age_seconds=ZOMBIE_AGE, attempts_count=1, last_retry_interval=5
        )
        ids["exhausted"] = engine.start_process(cur, t, "p-exhausted", age_seconds=ZOMBIE_AGE, task_type="timeout")
        cur.execute(t.sql("UPDATE {running} SET attempts_count = 2 WHERE process_id = 'p-exhausted'"))
        ids["call"] = engine.start_process(cur, t, "p-call", age_seconds=ZOMBIE_AGE, task_type="call")
    return ns, t, ids


def test_retry_action_counts(conn, retry_world):
    ns, _, _ = retry_world
    counts, _ = _collect(conn, ns, action="retry")
    assert (counts.found, counts.retried, counts.errored) == (4, 2, 2)


def test_retry_action_reschedules_the_timer(conn, retry_world):
    ns, t, ids = retry_world
    _collect(conn, ns, action="retry")
    assert _one(conn, t, "SELECT status FROM {tasks} WHERE task_id = {}", ids["timer"]) == ("error",)
    new = _one(
        conn,
        t,
        "SELECT s.task_type, s.status, s.attempts_count, s.last_retry_interval, "
        "round(extract(epoch FROM s.scheduled_time - now())), t.status "
        "FROM {schedule} s JOIN {tasks} t USING (task_id) WHERE s.process_id = 'p-timer' AND s.task_type = 'timeout'",
    )
    assert new == ("timeout", "waiting", 1, 5, 5, "waiting"), "initial_timeout 5 s, attempts_count + 1"
    assert _one(conn, t, "SELECT status, detail FROM {processes} WHERE process_id = 'p-timer'") == ("running", None)
    assert _rows(conn, t, "SELECT 1 FROM {running} WHERE process_id = 'p-timer'") == []


def test_retry_action_keeps_the_waiting_call(conn, retry_world):
    ns, t, _ = retry_world
    _collect(conn, ns, action="retry")
    assert _one(conn, t, "SELECT status FROM {schedule} WHERE process_id = 'p-timer' AND task_type = 'call'") == (
        "waiting",
    )


def test_retry_action_uses_the_backoff(conn, retry_world):
    ns, t, _ = retry_world
    _collect(conn, ns, action="retry", retry_policy={"backoff_coefficient": 2.5, "max_attempts": 5})
    assert _one(
        conn, t, "SELECT attempts_count, last_retry_interval FROM {schedule} WHERE process_id = 'p-remove'"
    ) == (2, 12), "trunc(5 x 2.5) = 12"


def test_retry_action_errors_exhausted_timers(conn, retry_world):
    ns, t, ids = retry_world
    _, log = _collect(conn, ns, action="retry")
    assert _one(conn, t, "SELECT status, corrupted_by FROM {processes} WHERE process_id = 'p-exhausted'") == (
        "error",
        ids["exhausted"],
    )
    assert "attempts exhausted (3 of 3)" in log.text()


def test_retry_action_errors_non_timer_tasks(conn, retry_world):
    ns, t, ids = retry_world
    _collect(conn, ns, action="retry")
    assert _one(conn, t, "SELECT status, corrupted_by FROM {processes} WHERE process_id = 'p-call'") == (
        "error",
        ids["call"],
    )


def test_retry_action_honours_non_retryable_errors(conn, retry_world):
    ns, _, _ = retry_world
    counts, _ = _collect(conn, ns, action="retry", retry_policy={"non_retryable_errors": ["zombie detected"]})
    assert (counts.retried, counts.errored) == (0, 4)


def test_retry_action_honours_max_timeout(conn, retry_world):
    ns, _, _ = retry_world
    counts, _ = _collect(conn, ns, action="retry", retry_policy={"max_timeout": 5})
    assert counts.retried == 0, "a timeout of 5 s is not below max_timeout 5 s"


def _snapshot(conn, t):
    return [
        _rows(conn, t, f"SELECT * FROM {{{name}}} ORDER BY 1, 2")
        for name in ("processes", "tasks", "schedule", "running", "events")
    ]


def test_dry_run_writes_nothing(conn, retry_world):
    ns, t, _ = retry_world
    before = _snapshot(conn, t)
    _collect(conn, ns, action="retry", dry_run=True)
    assert _snapshot(conn, t) == before


def test_dry_run_logs_each_zombie(conn, retry_world):
    ns, _, ids = retry_world
    counts, log = _collect(conn, ns, action="retry", dry_run=True)
    assert (counts.would_retry, counts.would_error, counts.errored, counts.retried) == (2, 2, 0, 0)
    assert f"dry run: would retry process 'p-timer' task {ids['timer']} (timeout" in log.text()
    assert f"dry run: would error process 'p-call' task {ids['call']} (call" in log.text()


def test_namespace_without_tables_is_one_line(conn):
    with pytest.raises(NamespaceError, match=r"^namespace 'nowhere/ns' has no progressor tables in this database$"):
        _collect(conn, "nowhere/ns")


def test_namespace_needing_escaping_is_refused():
    with pytest.raises(ParamsError, match=r"namespace 'bad\"ns' contains a double quote"):
        collect_params({"namespace": 'bad"ns'})


def test_namespace_too_long_is_refused():
    with pytest.raises(ParamsError, match="is too long"):
        collect_params({"namespace": "n" * 60})


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"batch_size": 0}, "batch_size must be at least 1, got 0"),
        ({"process_step_timeout": -1}, "process_step_timeout must be at least 1, got -1"),
        ({"action": "kill"}, "action must be one of error, retry, got 'kill'"),
        ({"retry_policy": {"max_attempts": 0}}, "retry_policy: max_attempts must be at least 1, got 0"),
        ({"retry_policy": {"backoff": 2}}, "retry_policy: unknown retry_policy field(s) backoff"),
        ({"timeout": 3}, "unknown key(s) timeout"),
    ],
)
def test_bad_values_are_one_line(config, message):
    with pytest.raises(ParamsError) as info:
        collect_params({"namespace": "default/default", **config})
    assert str(info.value).startswith(message), str(info.value)
    assert "\n" not in str(info.value), str(info.value)


def test_non_utc_time_zone_warns_and_moves_the_threshold(conn, dsn):
    ns = unique_namespace("tz")
    t = create_namespace(conn, ns)
    with conn, conn.cursor() as cur:
        engine.start_process(cur, t, "p-200s", age_seconds=ZOMBIE_AGE)
    moscow = psycopg2.connect(dsn, options="-c TimeZone=Europe/Moscow")
    try:
        counts, log = _collect(moscow, ns)
    finally:
        moscow.close()
    assert counts.found == 0, "a task 200 s old may be 3 h younger when progressor wrote it in Moscow time"
    assert "'Europe/Moscow' (+10800s), not UTC" in log.text("warning")


def _progressor_running_task(cur, t, process_id: str, started_seconds_ago: float) -> None:
    """A running task whose running_time progressor wrote: TO_TIMESTAMP(<UTC text>) in the writer's session."""
    engine.start_process(cur, t, process_id)
    utc_text = (dt.datetime.now(dt.UTC) - dt.timedelta(seconds=started_seconds_ago)).strftime("%Y-%m-%d %H:%M:%S")
    cur.execute(
        t.sql(
            "UPDATE {running} SET running_time = TO_TIMESTAMP({}, 'YYYY-MM-DD HH24:MI:SS') WHERE process_id = {}",
            utc_text,
            process_id,
        )
    )


@contextlib.contextmanager
def _database_in_zone(zone: str):
    """A scratch database whose default TimeZone (progressor's sessions') is ``zone``."""
    with scratch_database("gk_progressor_dst") as url:
        admin = psycopg2.connect(url)
        admin.autocommit = True
        with admin.cursor() as cur:
            cur.execute("SELECT current_database()")
            cur.execute(
                sql.SQL("ALTER DATABASE {} SET TimeZone = {}").format(
                    sql.Identifier(cur.fetchone()[0]), sql.Literal(zone)
                )
            )
        admin.close()
        yield url


@pytest.fixture(scope="module")
def tokyo_dsn():
    """A database whose default TimeZone is Asia/Tokyo: progressor's sessions (no options) write in it."""
    with _database_in_zone("Asia/Tokyo") as url:
        yield url


def _collect_live_and_dead(url: str, label: str, *, live_seconds: float, collector_options: str = ""):
    """Progressor's sessions (the database's default zone) start a task ``live_seconds`` ago and one 10 h
    ago; the collector (``collector_options``) collects. Returns the counts, the log and the statuses."""
    ns = unique_namespace(label)
    writer = psycopg2.connect(url)
    collector = psycopg2.connect(url, options=collector_options)
    try:
        t = create_namespace(writer, ns)
        with writer, writer.cursor() as cur:
            _progressor_running_task(cur, t, "p-live", started_seconds_ago=live_seconds)
            _progressor_running_task(cur, t, "p-dead", started_seconds_ago=10 * 3600)
        counts, log = _collect(collector, ns)
        statuses = dict(_rows(collector, t, "SELECT process_id, status::text FROM {processes}"))
    finally:
        writer.close()
        collector.close()
    return counts, log, statuses


def test_collector_forcing_utc_does_not_collect_a_live_task_written_in_tokyo(tokyo_dsn):
    counts, log, statuses = _collect_live_and_dead(
        tokyo_dsn, "tokyo", live_seconds=2, collector_options="-c TimeZone=UTC"
    )
    assert statuses == {"p-live": "running", "p-dead": "error"}, log.text()
    assert counts.errored == 1
    assert "'Asia/Tokyo' (+32400s)" in log.text("warning")


def test_writer_time_zone_unknown_to_postgresql_is_one_line(conn):
    ns = unique_namespace("tzname")
    create_namespace(conn, ns)
    with pytest.raises(ClockError) as info:
        _collect(conn, ns, writer_time_zone="Mars/Olympus")
    assert str(info.value).startswith(
        "writer_time_zone 'Mars/Olympus' is not an IANA time zone name PostgreSQL knows"
    ), str(info.value)


@pytest.mark.parametrize("offset", ["+09:00", "UTC+9"])
def test_writer_time_zone_as_an_offset_is_refused_with_one_line(tokyo_dsn, offset):
    """PostgreSQL reads '+09:00' and 'UTC+9' as POSIX zones, 9 h west: on a Tokyo database that shift would be
    0 s and a live task would be collected."""
    ns = unique_namespace("tzoffset")
    writer = psycopg2.connect(tokyo_dsn)
    try:
        t = create_namespace(writer, ns)
        with writer, writer.cursor() as cur:
            _progressor_running_task(cur, t, "p-live", started_seconds_ago=2)
        with pytest.raises(ClockError) as info:
            _collect(writer, ns, writer_time_zone=offset)
        statuses = dict(_rows(writer, t, "SELECT process_id, status::text FROM {processes}"))
    finally:
        writer.close()
    assert str(info.value).startswith(f"writer_time_zone {offset!r} is not an IANA time zone name"), str(info.value)
    assert "\n" not in str(info.value)
    assert statuses == {"p-live": "running"}


def _task_written_at(cur, t, process_id: str, started: dt.datetime) -> None:
    """A running task progressor started at ``started`` (UTC): TO_TIMESTAMP(<UTC text>) in this session."""
    engine.start_process(cur, t, process_id)
    cur.execute(
        t.sql(
            "UPDATE {running} SET running_time = TO_TIMESTAMP({}, 'YYYY-MM-DD HH24:MI:SS') WHERE process_id = {}",
            started.strftime("%Y-%m-%d %H:%M:%S"),
            process_id,
        )
    )


# Daylight-saving fall-backs (UTC) and an instant within "offset now" hours after each.
FALL_BACKS = {
    "Europe/Berlin": dt.datetime(2026, 10, 25, 1, 0, tzinfo=dt.UTC) + dt.timedelta(hours=1),
    "Australia/Sydney": dt.datetime(2026, 4, 4, 16, 0, tzinfo=dt.UTC) + dt.timedelta(hours=5),
}


@pytest.mark.parametrize("explicit", [False, True], ids=["database_zone", "writer_time_zone"])
@pytest.mark.parametrize("zone", sorted(FALL_BACKS))
def test_live_task_just_after_a_fall_back_is_not_collected(zone, explicit):
    """After a fall-back a task progressor started 30 s ago was written with its summer offset, an hour
    more than the zone's offset now; it is live, and a task started 10 hours ago is a zombie."""
    now = FALL_BACKS[zone]
    ns = unique_namespace("dst")
    with _database_in_zone(zone) as url:
        writer = psycopg2.connect(url)
        try:
            t = create_namespace(writer, ns)
            with writer, writer.cursor() as cur:
                _task_written_at(cur, t, "p-live", now - dt.timedelta(seconds=30))
                _task_written_at(cur, t, "p-dead", now - dt.timedelta(hours=10))
            config = {"namespace": ns, "dry_run": True, **({"writer_time_zone": zone} if explicit else {})}
            log = ListLog()
            counts = collect_zombies(writer, collect_params(config), log, now=now)
        finally:
            writer.close()
    assert counts.would_error == 1, log.text()
    assert "process 'p-dead'" in log.text("info")
    assert "process 'p-live'" not in log.text("info")


def _zone_that_fell_back(ago: dt.timedelta) -> str:
    """A POSIX zone 4 h east in summer and 3 h east in winter whose summer time ended ``ago`` before now."""
    ended = dt.datetime.now(dt.UTC) - ago + dt.timedelta(hours=4)  # the summer wall clock at the change
    end_day = ended.timetuple().tm_yday - 1  # zero-based, leap days counted
    return f"<+03>-3<+04>-4,{(end_day + 180) % 365}/0,{end_day}/{ended:%H:%M:%S}"


def test_database_zone_that_fell_back_two_hours_ago_does_not_collect_a_live_task():
    """The database's TimeZone left summer time 2 h ago: a task started 30 s ago was written with the
    summer offset (4 h), not the offset now (3 h)."""
    with _database_in_zone(_zone_that_fell_back(dt.timedelta(hours=2))) as url:
        counts, log, statuses = _collect_live_and_dead(url, "fellback", live_seconds=30)
    assert statuses == {"p-live": "running", "p-dead": "error"}, log.text()
    assert counts.errored == 1


def _outcome(health, name: str):
    return next(c for c in checks(health) if c.name == name)


def test_health_reads_the_oldest_running_task_written_in_tokyo_as_the_zombies(tokyo_dsn):
    """Progressor wrote a task started 5 s ago in Tokyo time: its raw running_time is 9 h back."""
    ns = unique_namespace("tokyo_health")
    writer = psycopg2.connect(tokyo_dsn)
    collector = psycopg2.connect(tokyo_dsn, options="-c TimeZone=UTC")
    try:
        t = create_namespace(writer, ns)
        with writer, writer.cursor() as cur:
            _progressor_running_task(cur, t, "p-live", started_seconds_ago=5)
        health = measure(collector, collect_params({"namespace": ns}))
    finally:
        writer.close()
        collector.close()
    outcome = _outcome(health, "oldest_running_task")
    assert outcome.passed, outcome.description


def test_health_names_the_oldest_running_task_by_the_zombies_reading():
    """The zone left summer time (+4 h) for winter time (+3 h) 5 h ago: a running_time 30 min before the change
    reads 1 h 30 min ago, one 10 min after it 1 h 50 min ago, the older of the two."""
    ns = unique_namespace("fellback_health")
    with _database_in_zone(_zone_that_fell_back(dt.timedelta(hours=5))) as url:
        conn = psycopg2.connect(url)
        try:
            t = create_namespace(conn, ns)
            with conn, conn.cursor() as cur:
                for process_id, minutes_ago in (("p-summer", 5 * 60 + 30), ("p-winter", 5 * 60 - 10)):
                    engine.start_process(cur, t, process_id)
                    cur.execute(
                        t.sql(
                            "UPDATE {running} SET running_time = now() - make_interval(mins => {}) "
                            "WHERE process_id = {}",
                            minutes_ago,
                            process_id,
                        )
                    )
            health = measure(conn, collect_params({"namespace": ns}))
        finally:
            conn.close()
    assert health.oldest_running.startswith("p-winter task "), health.oldest_running


@pytest.fixture
def percent_world(conn):
    """Namespaces ``pct%s``, ``pct%%`` and ``pct%`` (same suffix), each with one zombie and one live task."""
    suffix = unique_namespace("")  # "/<hex>"
    names = {"s": f"pct%s{suffix}", "double": f"pct%%{suffix}", "single": f"pct%{suffix}"}
    tables = {key: create_namespace(conn, ns) for key, ns in names.items()}
    with conn, conn.cursor() as cur:
        for t in tables.values():
            engine.start_process(cur, t, "p-zombie", age_seconds=ZOMBIE_AGE)
            engine.start_process(cur, t, "p-live", age_seconds=5)
    return names, tables


def _process_statuses(conn, t) -> dict[str, str]:
    return dict(_rows(conn, t, "SELECT process_id, status::text FROM {processes}"))


@pytest.mark.parametrize("which", ["s", "double"])
def test_percent_in_namespace_reads_and_writes_only_its_own_tables(conn, percent_world, which):
    names, tables = percent_world
    counts, log = _collect(conn, names[which])
    assert (counts.found, counts.errored) == (1, 1), log.text()
    assert _process_statuses(conn, tables[which]) == {"p-zombie": "error", "p-live": "running"}
    for other in set(tables) - {which}:
        assert _process_statuses(conn, tables[other]) == {"p-zombie": "running", "p-live": "running"}, other


def test_percent_in_namespace_health_reads_its_own_tables(conn, percent_world):
    names, tables = percent_world
    with conn, conn.cursor() as cur:
        engine.start_process(cur, tables["single"], "p-zombie-2", age_seconds=ZOMBIE_AGE)
    zombies = [measure(conn, collect_params({"namespace": names[k]})).zombies for k in ("s", "double", "single")]
    assert zombies == [1, 1, 2]


OVERFLOWING_POLICY = {"initial_timeout": 2_592_000, "backoff_coefficient": 1000, "max_attempts": 5}


@pytest.fixture
def overflow_world(conn):
    """A timer zombie due for its second retry under OVERFLOWING_POLICY (the oldest), and a call zombie."""
    ns = unique_namespace("overflow")
    t = create_namespace(conn, ns)
    with conn, conn.cursor() as cur:
        engine.start_process(cur, t, "p-timer", age_seconds=ZOMBIE_AGE + 100)
        cur.execute(t.sql("DELETE FROM {running} WHERE process_id = 'p-timer'"))
        cur.execute(t.sql("UPDATE {tasks} SET status = 'finished' WHERE process_id = 'p-timer'"))
        timer = engine.run_task(
            cur, t, "p-timer", "timeout", age_seconds=ZOMBIE_AGE + 100, attempts_count=1, last_retry_interval=2_592_000
        )
        call = engine.start_process(cur, t, "p-call", age_seconds=ZOMBIE_AGE, task_type="call")
    return ns, t, timer, call


def test_retry_interval_beyond_integer_is_clamped(conn, overflow_world):
    ns, t, timer, call = overflow_world
    counts, log = _collect(conn, ns, action="retry", retry_policy=OVERFLOWING_POLICY)
    assert (counts.retried, counts.errored, counts.failed) == (1, 1, 0), log.text()
    assert _one(conn, t, "SELECT attempts_count, last_retry_interval FROM {schedule} WHERE process_id = 'p-timer'") == (
        2,
        2**31 - 1,
    )
    assert _one(conn, t, "SELECT status FROM {tasks} WHERE task_id = {}", call) == ("error",)


def test_a_refused_row_costs_that_row_only(conn, overflow_world):
    ns, t, timer, call = overflow_world
    with conn, conn.cursor() as cur:  # the database refuses to error p-timer's task
        cur.execute(
            t.sql(
                "ALTER TABLE {tasks} ADD CONSTRAINT p_timer_never_errors "
                "CHECK (process_id <> 'p-timer' OR status <> 'error')"
            )
        )
    counts, log = _collect(conn, ns)
    assert (counts.found, counts.errored, counts.failed) == (2, 1, 1), log.text()
    assert _one(conn, t, "SELECT status FROM {tasks} WHERE task_id = {}", call) == ("error",)
    assert _one(conn, t, "SELECT status FROM {processes} WHERE process_id = 'p-timer'") == ("running",)
    assert f"failed: process 'p-timer' task {timer}" in log.text("warning")
    with conn, conn.cursor() as cur:  # a later zombie: the next run still gets past the refused one
        later = engine.start_process(cur, t, "p-later", age_seconds=ZOMBIE_AGE)
    counts, log = _collect(conn, ns)
    assert (counts.found, counts.errored, counts.failed) == (2, 1, 1), log.text()
    assert _one(conn, t, "SELECT status FROM {tasks} WHERE task_id = {}", later) == ("error",)


@pytest.fixture
def infinite_world(conn):
    """Three zombies and a running row whose running_time is '-infinity' (a legal timestamptz)."""
    ns = unique_namespace("infinite")
    tables = create_namespace(conn, ns)
    with conn, conn.cursor() as cur:
        for name in ("p-zombie-0", "p-zombie-1", "p-zombie-2", "p-odd"):
            engine.start_process(cur, tables, name, age_seconds=200, task_type="call")
        cur.execute(tables.sql("UPDATE {running} SET running_time = '-infinity' WHERE process_id = 'p-odd'"))
    return ns, tables


def test_a_running_row_started_at_minus_infinity_is_collected_with_the_others(conn, infinite_world):
    ns, tables = infinite_world
    counts, _ = _collect(conn, ns)
    assert counts.found == 4
    assert _rows(conn, tables, "SELECT process_id FROM {running}") == []


def test_the_health_figures_pass_over_a_running_row_started_at_minus_infinity(conn, infinite_world):
    ns, _ = infinite_world
    health = measure(conn, collect_params({"namespace": ns}))
    assert health.zombies == 4


def test_the_timer_check_counts_a_timer_scheduled_at_minus_infinity_and_reads_the_others(conn):
    ns = unique_namespace("infinite_timer")
    t = create_namespace(conn, ns)
    with conn, conn.cursor() as cur:
        engine.start_process(cur, t, "p-idle", age_seconds=900)
        cur.execute(t.sql("DELETE FROM {running}"))
        engine.schedule_task(cur, t, "p-idle", "timeout", in_seconds=-700)
        odd = engine.schedule_task(cur, t, "p-idle", "timeout", in_seconds=-70)
        cur.execute(t.sql("UPDATE {schedule} SET scheduled_time = '-infinity' WHERE task_id = {}", odd))
    health = measure(conn, collect_params({"namespace": ns}))
    assert health.overdue_timers == 2
    assert health.most_overdue_seconds >= 700  # the finite one's
    assert not _outcome(health, "timers_on_time").passed


def test_health_counts_the_processes_progressors_own_collector_errored_today(conn):
    """progressor's own collector sets no status_changed_at: its zombie task's finished_time tells when."""
    ns = unique_namespace("own")
    t = create_namespace(conn, ns)
    with conn, conn.cursor() as cur:
        for name in ("p-today", "p-two-days-ago"):  # created two days ago, the first task finished then
            engine.start_process(cur, t, name, age_seconds=2 * 86400)
        cur.execute(t.sql("DELETE FROM {running}"))
        cur.execute(t.sql("UPDATE {tasks} SET status = 'finished', finished_time = now() - interval '2 days'"))
        engine.run_task(cur, t, "p-today", "call", age_seconds=ZOMBIE_AGE)  # its worker node died
    progressor_statement(conn, t, 96)
    with conn, conn.cursor() as cur:  # went to error two days ago: its task finished then
        cur.execute(
            t.sql(
                "UPDATE {processes} p SET status = 'error', corrupted_by = t.task_id FROM {tasks} t "
                "WHERE p.process_id = 'p-two-days-ago' AND t.process_id = p.process_id"
            )
        )
    assert measure(conn, collect_params({"namespace": ns})).errored_24h == 1


def test_health_leaves_out_the_overdue_timers_of_a_process_with_a_running_task(conn):
    """progressor's timer scanner starts no timer of a process with a running task (a zombie's here)."""
    ns = unique_namespace("overdue")
    t = create_namespace(conn, ns)
    with conn, conn.cursor() as cur:
        engine.start_process(cur, t, "p-zombie", age_seconds=100, task_type="call")  # its node died
        engine.start_process(cur, t, "p-idle", age_seconds=500)
        cur.execute(t.sql("DELETE FROM {running} WHERE process_id = 'p-idle'"))
        for name in ("p-zombie", "p-idle"):
            engine.schedule_task(cur, t, name, "timeout", in_seconds=-70)
    assert measure(conn, collect_params({"namespace": ns})).overdue_timers == 1
