"""Progressor zombie collection at scale: Groundskeeper's collector vs progressor's own statement.

    PYTHONPATH=. .venv/bin/python benchmarks/progressor.py [--processes 100000] [--tasks-per-process 10] \\
        [--zombies 1000]

Creates a database on the local PostgreSQL (``BENCH_PG_URL``, default ``postgresql://postgres@127.0.0.1:5432``),
two namespaces with the same data (made with the project's DDL), and drops the database at the end.
Per process: history tasks (finished), and its last task either a zombie (running since 300 s), a live
running task (10 s), a waiting timer, or finished. Measures, for each of the two in the same run:

1. the time to collect every zombie, and the rows read (pg_stat_user_tables deltas);
2. ``EXPLAIN (ANALYZE, BUFFERS)`` of the statements (in transactions rolled back);
3. what happens when a live worker holds one zombie's process row (progressor's lock order: process
   row, then running row) while it runs: once with the worker holding it 0.5 s, once for longer than
   the server's ``deadlock_timeout``, which decides which side PostgreSQL's deadlock detector aborts.

The collections run ``--repeat`` rounds, the two in rotating order, each from the zombies put back
as they were, each verified (no zombie left; the collector's own count is the zombies).
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
import uuid
from dataclasses import asdict

import psycopg2
import psycopg2.errors
import trials  # noqa: I001 (benchmarks/trials.py, beside this file)
from psycopg2 import sql

from infra.demo import progressor_engine as engine
from infra.demo.progressor_schema import create_namespace, progressor_sql, progressor_statement
from pipelines.progressor.collector import collect_zombies
from pipelines.progressor.params import collect_params
from pipelines.progressor.schema import SUFFIXES, Tables

BASE_URL = os.environ.get("BENCH_PG_URL", "postgresql://postgres@127.0.0.1:5432")
THRESHOLD = 96


class QuietLog:
    def info(self, message: str) -> None:
        pass

    def warning(self, message: str) -> None:
        print("  warning:", message)


def load(conn, t: Tables, processes: int, per_process: int, zombies: int) -> None:
    live, timers = zombies * 5, processes // 5
    with conn, conn.cursor() as cur:
        cur.execute(
            t.sql(
                "INSERT INTO {processes} (process_id, status, previous_status, status_changed_at) "
                "SELECT 'p' || lpad(i::text, 7, '0'), 'running', 'running', now() FROM generate_series(1, {}) i",
                processes,
            )
        )
        cur.execute(
            t.sql(
                "INSERT INTO {tasks} (task_id, process_id, task_type, status, scheduled_time, running_time, "
                "finished_time, last_retry_interval, attempts_count) "
                "SELECT (i - 1) * {k} + j, 'p' || lpad(i::text, 7, '0'), "
                "  (CASE WHEN j % 3 = 0 THEN 'timeout' ELSE 'call' END)::task_type, "
                "  (CASE WHEN j < {k} THEN 'finished' WHEN i <= {z} + {live} THEN 'running' "
                "        WHEN i <= {z} + {live} + {timers} THEN 'waiting' ELSE 'finished' END)::task_status, "
                "  now() - make_interval(secs => (CASE WHEN i <= {z} THEN 300 WHEN i <= {z} + {live} THEN 10 "
                "        ELSE 3600 - j END)), "
                "  CASE WHEN j = {k} AND i > {z} + {live} AND i <= {z} + {live} + {timers} THEN NULL "
                "       ELSE now() - make_interval(secs => (CASE WHEN i <= {z} THEN 300 "
                "            WHEN i <= {z} + {live} THEN 10 ELSE 3600 - j END)) END, "
                "  CASE WHEN j < {k} OR i > {z} + {live} + {timers} "
                "       THEN now() - make_interval(secs => 3600 - j) + make_interval(secs => random()) END, 0, 0 "
                "FROM generate_series(1, {n}) i, generate_series(1, {k}) j",
                **{
                    name: sql.Literal(value)
                    for name, value in {
                        "k": per_process,
                        "z": zombies,
                        "live": live,
                        "timers": timers,
                        "n": processes,
                    }.items()
                },
            )
        )
        cur.execute(
            t.sql(
                "SELECT setval(pg_get_serial_sequence({}, 'task_id'), (SELECT max(task_id) FROM {tasks}))",
                t.ident("tasks").as_string(conn),
            )
        )
        cur.execute(
            t.sql(
                "INSERT INTO {running} (process_id, task_id, task_type, status, scheduled_time, running_time, "
                "last_retry_interval, attempts_count) SELECT process_id, task_id, task_type, status, scheduled_time, "
                "running_time, 0, 0 FROM {tasks} WHERE status = 'running'"
            )
        )
        cur.execute(
            t.sql(
                "INSERT INTO {schedule} (task_id, process_id, task_type, status, scheduled_time, last_retry_interval, "
                "attempts_count) SELECT task_id, process_id, task_type, status, scheduled_time, 0, 0 FROM {tasks} "
                "WHERE status = 'waiting'"
            )
        )
    conn.autocommit = True
    with conn.cursor() as cur:
        for suffix in SUFFIXES:
            cur.execute(t.sql("VACUUM ANALYZE {table}", table=t.ident(suffix)))
    conn.autocommit = False


def rows_read(conn, t: Tables) -> dict[str, int]:
    """Rows read per table so far, this backend's reads included (every measured read is on ``conn``):
    PostgreSQL 15+ writes a backend's statistics when it goes idle, at most once a second, and
    ``pg_stat_force_next_flush()`` makes the commit below write them before it returns."""
    with conn.cursor() as cur:
        cur.execute("SELECT pg_stat_force_next_flush()")
    conn.commit()
    with conn.cursor() as cur:
        cur.execute("SELECT pg_stat_clear_snapshot()")
        cur.execute(
            "SELECT relname, coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) FROM pg_stat_user_tables "
            "WHERE relname = ANY(%s)",
            ([t.name(s) for s in SUFFIXES],),
        )
        out = dict(cur.fetchall())
    conn.rollback()
    return out


def measured(conn, t: Tables, fn) -> tuple[float, dict[str, int]]:
    before = rows_read(conn, t)
    started = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - started
    after = rows_read(conn, t)
    return elapsed, {k.rsplit("_", 1)[1]: after[k] - before.get(k, 0) for k in after if after[k] - before.get(k, 0)}


def explain(conn, t: Tables, statement) -> str:
    with conn.cursor() as cur:
        cur.execute(t.sql("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) ") + statement)
        plan = "\n".join(row[0] for row in cur.fetchall())
    conn.rollback()
    return plan


def restore_zombies(conn, t: Tables, zombies: int) -> None:
    """Put the zombies back as they were (they have no waiting tasks, so this is the whole state)."""
    with conn, conn.cursor() as cur:
        cur.execute(
            t.sql(
                "UPDATE {tasks} SET status = 'running', finished_time = NULL WHERE task_id IN (SELECT max(task_id) "
                "FROM {tasks} WHERE process_id <= 'p' || lpad({}::text, 7, '0') GROUP BY process_id)",
                zombies,
            )
        )
        cur.execute(
            t.sql(
                "INSERT INTO {running} (process_id, task_id, task_type, status, scheduled_time, running_time, "
                "last_retry_interval, attempts_count) SELECT process_id, task_id, task_type, status, scheduled_time, "
                "running_time, 0, 0 FROM {tasks} WHERE status = 'running' ON CONFLICT (process_id) DO NOTHING"
            )
        )
        cur.execute(
            t.sql(
                "UPDATE {processes} SET status = 'running', detail = NULL, corrupted_by = NULL "
                "WHERE process_id <= 'p' || lpad({}::text, 7, '0')",
                zombies,
            )
        )


def refresh_live(conn, t: Tables, zombies: int) -> None:
    """Live running tasks stay 10 s old however long the loading took (only zombies are older)."""
    with conn, conn.cursor() as cur:
        for table in (t.ident("running"), t.ident("tasks")):
            cur.execute(
                t.sql(
                    "UPDATE {table} SET running_time = now() - interval '10 s' WHERE status = 'running' "
                    "AND process_id > 'p' || lpad({}::text, 7, '0')",
                    zombies,
                    table=table,
                )
            )


def zombie_count(conn, t: Tables) -> int:
    with conn.cursor() as cur:
        cur.execute(t.sql("SELECT count(*) FROM {running} WHERE running_time < now() - interval '96 seconds'"))
        n = cur.fetchone()[0]
    conn.rollback()
    return n


def held_task(conn, t: Tables, process_id: str) -> str:
    """The status of ``process_id``'s last task and of the process, after a live-worker scenario."""
    with conn.cursor() as cur:
        cur.execute(t.sql("SELECT status FROM {tasks} WHERE process_id = {} ORDER BY task_id DESC LIMIT 1", process_id))
        task = cur.fetchone()[0]
        cur.execute(t.sql("SELECT status FROM {processes} WHERE process_id = {}", process_id))
        process = cur.fetchone()[0]
    conn.rollback()
    return f"task {task}, process {process}"


def with_live_worker(url: str, t: Tables, process_id: str, run, hold_seconds: float = 0.5) -> dict:
    """A worker holds ``process_id``'s row, then (``hold_seconds`` later) deletes its running row,
    while ``run`` runs."""
    locked, outcome = threading.Event(), {}

    def worker():
        conn = psycopg2.connect(url)
        try:
            finished = engine.complete_running(conn, t, process_id, hold_seconds=hold_seconds, on_locked=locked.set)
            outcome["worker"] = "finished its task" if finished else "found its running row gone (task collected)"
        except psycopg2.errors.DeadlockDetected as exc:
            outcome["worker"] = f"40P01 {str(exc).splitlines()[0]}: the worker's transaction rolled back"
        finally:
            conn.close()

    thread = threading.Thread(target=worker)
    thread.start()
    locked.wait(30)
    try:
        outcome["collector"] = run()
    except psycopg2.errors.DeadlockDetected as exc:
        outcome["collector"] = f"40P01 {str(exc).splitlines()[0]}: statement rolled back"
    thread.join(60)
    return outcome


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=100_000)
    parser.add_argument("--tasks-per-process", type=int, default=10)
    parser.add_argument("--zombies", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=5, help="rounds of the two collections (order rotates)")
    args = parser.parse_args()
    print(trials.machine_line("progressor.py"), flush=True)
    name = f"gk_bench_progressor_{uuid.uuid4().hex[:8]}"
    admin = psycopg2.connect(f"{BASE_URL}/postgres")
    admin.autocommit = True
    admin.cursor().execute(f'CREATE DATABASE "{name}"')
    url = f"{BASE_URL}/{name}"
    report: dict = {
        "processes": args.processes,
        "tasks": args.processes * args.tasks_per_process,
        "zombies": args.zombies,
    }
    try:
        conn = psycopg2.connect(url)
        with conn.cursor() as cur:
            cur.execute("SELECT version()")
            report["server"] = cur.fetchone()[0].split(" on ")[0]
        conn.rollback()
        ours, theirs = create_namespace(conn, "bench/groundskeeper"), create_namespace(conn, "bench/progressor")
        for t in (ours, theirs):
            started = time.perf_counter()
            load(conn, t, args.processes, args.tasks_per_process, args.zombies)
            print(f"loaded {t.namespace} in {time.perf_counter() - started:.1f}s: {zombie_count(conn, t)} zombies")
        params = collect_params({"namespace": ours.namespace})
        for t in (ours, theirs):
            refresh_live(conn, t, args.zombies)
        report["explain_progressor"] = explain(conn, theirs, progressor_sql(theirs, THRESHOLD))
        report["explain_collector_listing"] = explain(
            conn,
            ours,
            ours.sql(
                "SELECT process_id, task_id FROM {running} WHERE running_time < now() - make_interval(secs => 96) "
                "ORDER BY running_time, process_id"
            ),
        )
        report["explain_collector_batch_lock"] = explain(
            conn,
            ours,
            ours.sql(
                "SELECT r.process_id FROM {running} r JOIN {processes} p ON p.process_id = r.process_id "
                "JOIN unnest(ARRAY(SELECT process_id FROM {running} WHERE running_time < now() - interval '96 s' "
                "LIMIT 100)) AS z(process_id) ON z.process_id = r.process_id "
                "WHERE r.running_time < now() - interval '96 s' FOR UPDATE OF p, r SKIP LOCKED"
            ),
        )

        def once(which: str, _round: int) -> trials.Run:
            t = ours if which == "collector" else theirs
            restore_zombies(conn, t, args.zombies)
            refresh_live(conn, t, args.zombies)
            holder: dict = {}
            if which == "collector":
                elapsed, read = measured(conn, t, lambda: holder.update(c=collect_zombies(conn, params, QuietLog())))
            else:
                elapsed, read = measured(conn, t, lambda: progressor_statement(conn, t, THRESHOLD))
            left = zombie_count(conn, t)
            problems = [f"{left} zombies left"] if left else []
            if "c" in holder and (collected := holder["c"].errored + holder["c"].retried) != args.zombies:
                problems.append(f"the collector counted {collected} collected")
            return trials.Run(elapsed, args.zombies - left, problems, detail=read,
                              extra={"counts": asdict(holder["c"]) if "c" in holder else None})  # fmt: skip

        labels = {
            "progressor": "progressor's statement (corrected semantics, one transaction)",
            "collector": "Groundskeeper's collector (error action, batches of 100)",
        }
        results = trials.interleaved(["progressor", "collector"], args.repeat, once, label="collect / ")
        report["table"] = trials.table(results, baseline="progressor", unit="zombies", labels=labels, digits=3)
        report["rows_read"] = {k: runs[0].detail for k, runs in results.items()}
        report["collector_counts"] = results["collector"][0].extra.get("counts")
        report["ok"] = trials.all_ok(results)
        # A live worker holds one zombie's process row, briefly, then past deadlock_timeout.
        with conn.cursor() as cur:
            cur.execute("SHOW deadlock_timeout")
            deadlock_timeout = cur.fetchone()[0]
        conn.rollback()
        timeout_s = float(deadlock_timeout.rstrip("ms")) / (1000 if deadlock_timeout.endswith("ms") else 1)
        report["deadlock_timeout"] = deadlock_timeout
        held = "p" + str(args.zombies // 2).zfill(7)
        report["live_worker"] = []
        for hold in (0.5, timeout_s + 1.0):
            for which, t in (("collector", ours), ("progressor", theirs)):
                restore_zombies(conn, t, args.zombies)
                refresh_live(conn, t, args.zombies)
                if which == "collector":
                    out = with_live_worker(
                        url, t, held, lambda: asdict(collect_zombies(conn, params, QuietLog())), hold
                    )
                else:
                    out = with_live_worker(
                        url, t, held, lambda t=t: progressor_statement(conn, t, THRESHOLD) or "completed", hold
                    )
                out["zombies_left"] = zombie_count(conn, t)
                out["held_process_after"] = held_task(conn, t, held)
                report["live_worker"].append({"hold_seconds": hold, "who": which, **out})
        conn.close()
    finally:
        admin.cursor().execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()
    for key in ("explain_progressor", "explain_collector_listing", "explain_collector_batch_lock"):
        print(f"\n== {key}\n{report.pop(key)}")
    print("\n" + "\n".join(report.pop("table")))
    print(json.dumps(report, indent=1, default=str))
    print(trials.after_line())
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
