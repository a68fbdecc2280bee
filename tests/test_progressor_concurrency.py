"""The collector beside live workers that use progressor's lock order (process row, then running row)."""

from __future__ import annotations

import threading
import time

import psycopg2
import psycopg2.errors
import pytest

from infra.demo import progressor_engine as engine
from infra.demo.progressor_schema import create_namespace, progressor_statement
from pipelines.progressor.collector import collect_zombies
from pipelines.progressor.params import collect_params
from tests.conftest import PATIENCE
from tests.progressor_support import ListLog, first_row_within, scratch_database, unique_namespace

pytestmark = pytest.mark.postgres

ZOMBIES = 40


@pytest.fixture(scope="module")
def dsn():
    with scratch_database() as url:
        yield url


def _world(dsn, label: str):
    conn = psycopg2.connect(dsn)
    ns = unique_namespace(label)
    t = create_namespace(conn, ns)
    with conn, conn.cursor() as cur:
        for n in range(ZOMBIES):
            engine.start_process(cur, t, f"p{n:03d}", age_seconds=200)
    return conn, ns, t


def _statuses(conn, t):
    with conn.cursor() as cur:
        cur.execute(
            t.sql(
                "SELECT p.process_id, p.status, p.corrupted_by, t.task_id, t.status FROM {processes} p "
                "JOIN {tasks} t USING (process_id) ORDER BY 1"
            )
        )
        rows = cur.fetchall()
    conn.rollback()
    return rows


def _waits_on_a_lock(dsn, pid: int) -> bool:
    """Whether the backend ``pid`` comes to wait on a lock (polled; at most PATIENCE seconds)."""
    wait = "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'"
    return first_row_within(dsn, wait, (pid,), PATIENCE) is not None


@pytest.fixture(scope="module")
def raced(dsn):
    """Workers finish every third process while the collector runs in batches of 5; one worker holds a
    process row through the whole run and then crashes (rolls back), leaving a zombie."""
    conn, ns, t = _world(dsn, "race")
    params = collect_params({"namespace": ns, "batch_size": 5})
    crashed = "p001"  # in the first batch
    held, release = threading.Event(), threading.Event()
    finished: list[str] = []

    def crashing_worker():
        worker = psycopg2.connect(dsn)
        try:
            with worker.cursor() as cur:
                cur.execute(t.sql("UPDATE {processes} SET status = 'running' WHERE process_id = {}", crashed))
                held.set()
                release.wait(PATIENCE)
            worker.rollback()  # the node dies: nothing of its work is saved
        finally:
            worker.close()

    one_finished = threading.Event()

    def completing_worker():
        worker = psycopg2.connect(dsn)
        try:
            for n in reversed(range(0, ZOMBIES, 3)):  # from the end: ahead of the collector
                if f"p{n:03d}" != crashed and engine.complete_running(worker, t, f"p{n:03d}", hold_seconds=0.02):
                    finished.append(f"p{n:03d}")
                    one_finished.set()
        finally:
            worker.close()

    threads = [threading.Thread(target=crashing_worker), threading.Thread(target=completing_worker)]
    threads[0].start()
    assert held.wait(PATIENCE), "the crashing worker never took its row lock"

    def on_batch(n: int) -> None:
        # The collector has listed every zombie and holds its first batch: the worker starts now, and the
        # collector goes on once the worker has finished one (from the end: a zombie listed, not yet
        # collected), so the race happens whatever the machine's speed.
        if n == 1:
            threads[1].start()
            assert one_finished.wait(PATIENCE), "the completing worker finished nothing"
        time.sleep(0.05)  # let the worker get further ahead (more races; none is needed for the asserts)

    log = ListLog()
    first = collect_zombies(conn, params, log, on_batch=on_batch)
    release.set()
    for thread in threads:
        thread.join(PATIENCE)
    second = collect_zombies(conn, params, ListLog())
    rows = _statuses(conn, t)
    yield {"first": first, "second": second, "rows": rows, "finished": finished, "crashed": crashed, "log": log}
    conn.close()


def test_no_batch_lost_to_a_deadlock(raced):
    assert raced["first"].batches_rolled_back == 0, raced["log"].text()


def test_every_zombie_accounted_for(raced):
    first = raced["first"]
    assert first.errored + first.skipped_locked + first.vanished == first.found == ZOMBIES, first


def test_workers_really_raced_the_collector(raced):
    assert raced["first"].vanished >= 1, "some listed zombies were finished by their worker before their batch"


def test_no_task_ends_both_error_and_finished(raced):
    for process_id, process_status, corrupted_by, task_id, task_status in raced["rows"]:
        if task_status == "finished":
            assert (process_status, corrupted_by) == ("running", None), process_id
        else:
            assert (task_status, process_status, corrupted_by) == ("error", "error", task_id), process_id


def test_finished_tasks_are_the_workers(raced):
    finished = sorted(pid for pid, _, _, _, status in raced["rows"] if status == "finished")
    assert finished == sorted(raced["finished"])


def test_locked_process_skipped_then_collected_later(raced):
    assert raced["first"].skipped_locked >= 1
    assert raced["second"].errored == 1
    crashed_row = next(row for row in raced["rows"] if row[0] == raced["crashed"])
    assert crashed_row[1] == "error", "the crashed worker's zombie is collected on the next run"


@pytest.mark.slow
def test_progressors_statement_deadlocks_with_a_live_worker(dsn):
    """The contrast: progressor's statement locks running rows first, a worker holds the process row first."""
    conn, ns, t = _world(dsn, "deadlock")
    worker_locked, errors, collector = threading.Event(), {}, conn.get_backend_pid()

    def once_the_collector_waits() -> None:
        """The worker holds the process row; it goes on to the running row once the collector waits on it."""
        worker_locked.set()
        _waits_on_a_lock(dsn, collector)

    def worker():
        wconn = psycopg2.connect(dsn)
        try:
            engine.complete_running(wconn, t, "p005", on_locked=once_the_collector_waits)
        except psycopg2.errors.DeadlockDetected as exc:
            errors["worker"] = exc
        finally:
            wconn.close()

    thread = threading.Thread(target=worker)
    thread.start()
    assert worker_locked.wait(PATIENCE)
    try:
        progressor_statement(conn, t, 96)
    except psycopg2.errors.DeadlockDetected as exc:
        errors["collector"] = exc
    thread.join(PATIENCE)
    with conn.cursor() as cur:
        cur.execute(t.sql("SELECT count(*) FROM {running}"))
        left = cur.fetchone()[0]
    conn.close()
    assert len(errors) == 1, errors
    if "collector" in errors:
        assert left == ZOMBIES - 1, "the whole statement rolled back, unrelated zombies included"


def test_a_worker_completing_without_a_process_update_can_deadlock_with_a_batch(dsn):
    """progressor's worker completes a step that changed no process field without an UPDATE of the process: its
    task row first, then its running row, which the batch holds, while the batch goes on to that task row.
    PostgreSQL ends one of the two, and the zombie is either collected or finished, never half of each."""
    conn, ns, t = _world(dsn, "unchanged")
    with conn.cursor() as cur:
        cur.execute(t.sql("SELECT task_id FROM {running} WHERE process_id = 'p005'"))
        [task_id] = cur.fetchone()
    conn.rollback()
    worker, ended = psycopg2.connect(dsn), {}

    def complete() -> None:  # progressor's complete_and_suspend: do_cancel_timer, then do_complete_task
        try:
            with worker, worker.cursor() as cur:
                cur.execute(
                    t.sql(
                        "WITH d AS (DELETE FROM {schedule} WHERE process_id = 'p005' AND task_type IN "
                        "('timeout', 'remove') AND status IN ('waiting', 'blocked') RETURNING task_id) "
                        "MERGE INTO {tasks} tt USING d ON tt.task_id = d.task_id "
                        "WHEN MATCHED THEN UPDATE SET status = 'cancelled'"
                    )
                )
                cur.execute(
                    t.sql(
                        "WITH deleted AS (DELETE FROM {running} WHERE process_id = 'p005') "
                        "UPDATE {tasks} SET status = 'finished', finished_time = now() WHERE task_id = {}",
                        task_id,
                    )
                )
        except psycopg2.errors.DeadlockDetected:
            ended["worker"] = True

    thread = threading.Thread(target=complete)

    def on_batch(_n: int) -> None:  # the batch holds the rows: the worker completes now, up to its wait on one
        thread.start()
        assert _waits_on_a_lock(dsn, worker.get_backend_pid()), "the worker never waited on the batch"

    counts = collect_zombies(conn, collect_params({"namespace": ns}), ListLog(), on_batch=on_batch)
    thread.join(PATIENCE)
    worker.close()
    with conn.cursor() as cur:
        cur.execute(
            t.sql(
                "SELECT t.status, p.status FROM {tasks} t JOIN {processes} p USING (process_id) WHERE t.task_id = {}",
                task_id,
            )
        )
        statuses = cur.fetchone()
    conn.close()
    assert len(ended) + counts.batches_rolled_back == 1, "one side ended: the worker's completion or the batch"
    assert statuses in (("error", "error"), ("finished", "running"))
