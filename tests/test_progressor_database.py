"""Nothing holds a progressor collection for ever: bounded statements, lock waits and connections on a real
PostgreSQL, a run bounded by run monitoring, and a connection lost mid-batch reported by its own cause."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

import psycopg2
import pytest
import yaml

from infra.demo import progressor_engine as engine
from infra.demo.progressor_schema import create_namespace
from pipelines.progressor.collector import collect_zombies
from pipelines.progressor.defs import collect_zombies_job
from pipelines.progressor.params import collect_params
from resources.postgres import ProgressorDatabase, ProgressorDatabaseError
from tests.conftest import PATIENCE
from tests.progressor_support import ListLog, admin_connection, first_row_within, scratch_database, unique_namespace
from tests.test_progressor_defs import RecordingCloudWatch

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parent.parent
METRIC = "ProgressorZombiesCollected"
GUARD_SECONDS = PATIENCE  # only the unbounded code waits this long: then the hold ends and the test fails


@pytest.fixture(scope="module")
def dsn():
    with scratch_database() as url:
        yield url


@pytest.fixture
def zombies(dsn):
    """A namespace with three zombies."""
    ns = unique_namespace("bounded")
    conn = psycopg2.connect(dsn)
    t = create_namespace(conn, ns)
    with conn, conn.cursor() as cur:
        for n in range(3):
            engine.start_process(cur, t, f"p-{n}", age_seconds=300)
    conn.close()
    return ns, t


def test_a_statement_waiting_on_a_lock_is_cancelled_with_one_line(dsn, zombies):
    ns, t = zombies
    holder = psycopg2.connect(dsn)
    with holder.cursor() as cur:
        cur.execute(t.sql("LOCK TABLE {running} IN ACCESS EXCLUSIVE MODE"))
    guard = threading.Timer(GUARD_SECONDS, holder.rollback)
    guard.start()
    try:
        result = collect_zombies_job.execute_in_process(
            run_config={"namespace": ns},
            resources={
                "progressor_db": ProgressorDatabase(dsn=dsn, lock_timeout=1),
                "cloudwatch": RecordingCloudWatch(),
            },
            raise_on_error=False,
        )
    finally:
        guard.cancel()
        holder.close()
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    line = failure.event_specific_data.error.message.strip()
    assert line.endswith("(PROGRESSOR_DSN) failed: canceling statement due to lock timeout"), line
    assert "\n" not in line


def _end_the_backend_waiting_on(dsn: str, holder_pid: int) -> None:
    """Terminates the first backend that comes to wait on a lock ``holder_pid`` holds (polled; at most PATIENCE
    seconds), as a lost connection would end it."""
    blocked = "SELECT pid FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))"
    if waiting := first_row_within(dsn, blocked, (holder_pid,), PATIENCE):
        with contextlib.closing(psycopg2.connect(dsn)) as conn, conn.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(%s)", waiting)


def test_a_run_cancelled_in_its_second_batch_still_publishes_what_the_first_collected(dsn):
    """Batch 2 waits on the task row of a zombie's timer, which another transaction holds, until its connection
    is lost: the run fails, and the five zombies batch 1 committed are still published."""
    ns = unique_namespace("partway")
    conn = psycopg2.connect(dsn)
    t = create_namespace(conn, ns)
    with conn, conn.cursor() as cur:
        for n in range(10):  # listed p-0 to p-9: batch 2 is p-5 to p-9
            engine.start_process(cur, t, f"p-{n}", age_seconds=300)
        timer = engine.schedule_task(cur, t, "p-7", "timeout")
    conn.close()
    holder = psycopg2.connect(dsn)
    with holder.cursor() as cur:
        cur.execute(t.sql("SELECT 1 FROM {tasks} WHERE task_id = {} FOR UPDATE", timer))
    guard = threading.Timer(GUARD_SECONDS, holder.rollback)
    guard.start()
    ender = threading.Thread(target=_end_the_backend_waiting_on, args=(dsn, holder.get_backend_pid()))
    ender.start()
    cloudwatch = RecordingCloudWatch()
    cloudwatch.get_client().calls.clear()
    try:
        collect_zombies_job.execute_in_process(
            run_config={"namespace": ns, "batch_size": 5, "lock_timeout_ms": 60000},
            resources={"progressor_db": ProgressorDatabase(dsn=dsn), "cloudwatch": cloudwatch},
            raise_on_error=False,
        )
    finally:
        ender.join()
        guard.cancel()
        holder.close()
    calls = cloudwatch.get_client().calls
    assert [d["Value"] for call in calls for d in call["MetricData"] if d["MetricName"] == METRIC] == [5]


def test_a_statement_running_too_long_is_cancelled_with_one_line(dsn):
    db = ProgressorDatabase(dsn=dsn, statement_timeout=1)
    with pytest.raises(ProgressorDatabaseError) as info:
        with db.connection() as conn, conn.cursor() as cur:
            cur.execute("SELECT pg_sleep(%s)", (GUARD_SECONDS,))
    assert str(info.value).endswith(
        "(PROGRESSOR_DSN) was cancelled: canceling statement due to statement timeout (statement_timeout 1s)"
    ), str(info.value)


def test_connection_keeps_tcp_alive(dsn):
    with ProgressorDatabase(dsn=dsn).connection() as conn:
        parameters = conn.info.dsn_parameters
    assert (parameters.get("keepalives"), parameters.get("tcp_user_timeout")) == ("1", "60000")


def test_options_in_the_dsn_are_kept(dsn):
    with ProgressorDatabase(dsn=f"{dsn}?options=-c%20TimeZone%3DAsia/Tokyo").connection() as conn:
        with conn.cursor() as cur:
            cur.execute("SELECT current_setting('TimeZone'), current_setting('statement_timeout')")
            settings = cur.fetchone()
    assert settings == ("Asia/Tokyo", "1min")


def test_a_backend_killed_mid_batch_is_reported_by_its_cause(dsn, zombies):
    ns, _ = zombies
    admin = admin_connection()

    def kill(_batch: int) -> None:
        with admin.cursor() as cur:
            cur.execute("SELECT pg_terminate_backend(%s, 60000)", (conn.get_backend_pid(),))

    try:
        with pytest.raises(ProgressorDatabaseError) as info:
            with ProgressorDatabase(dsn=dsn).connection() as conn:
                collect_zombies(conn, collect_params({"namespace": ns}), ListLog(), on_batch=kill)
    finally:
        admin.close()
    assert "server closed the connection unexpectedly" in str(info.value)
    assert str(info.value).startswith("lost the progressor database at "), str(info.value)


def test_collect_zombies_runs_have_a_max_runtime():
    assert int(collect_zombies_job.tags["dagster/max_runtime"]) > 0


@pytest.mark.parametrize(
    "path", ["dagster.yaml", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "infra").glob("dagster.*.yaml"))]
)
def test_every_instance_monitors_runs(path):
    """dagster/max_runtime is enforced by run monitoring only."""
    assert yaml.safe_load((ROOT / path).read_text())["run_monitoring"]["enabled"] is True
