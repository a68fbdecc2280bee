"""Local demo traffic that plays a progressor node, so that ``make dev`` shows real collections. No Dagster.

Each call (every 10 minutes under the quiet ``make dev``, every minute under busy) acts like
progressor's workers and scanners in one namespace:

1. the scanners start the due timers and the waiting calls of idle processes;
2. new processes start (``init`` running), half with a timer, half with a call waiting;
3. every ``crash_every``-th call a worker crashes: a new process's task (a ``timeout`` one call, a
   ``call`` the next) is left in the running table for good, and becomes a zombie after 96 s;
4. the live workers finish every task that is running (a duration of 20 ms to 1.2 s), except those
   of crashed workers.

A live worker's task is done within the step that started it, as progressor's are within seconds:
nothing but a crashed worker's task outlives the zombie threshold, whatever the time to the next
step (10 minutes under quiet, much longer than the threshold).
"""

from __future__ import annotations

import random
import time
import uuid
from dataclasses import dataclass

from infra.demo import progressor_engine as engine
from infra.demo.progressor_schema import create_namespace
from pipelines.progressor.schema import Tables

CRASHED = '{"demo": "crashed worker"}'


@dataclass(frozen=True)
class DemoTraffic:
    namespace: str = "default/default"
    new_processes: int = 6
    crash_every: int = 3

    def __post_init__(self) -> None:
        if not 0 <= self.new_processes <= 100:
            raise ValueError(f"new_processes must be from 0 to 100, got {self.new_processes!r}")
        if not 1 <= self.crash_every <= 100:
            raise ValueError(f"crash_every must be from 1 to 100, got {self.crash_every!r}")


def _finish_running(cur, t: Tables) -> int:
    cur.execute(
        t.sql(
            "WITH done AS (DELETE FROM {running} WHERE metadata IS DISTINCT FROM {}::jsonb RETURNING task_id) "
            "UPDATE {tasks} SET status = 'finished', "
            "finished_time = running_time + make_interval(secs => 0.02 + random() * random() * 1.2) "
            "WHERE task_id IN (SELECT task_id FROM done)",
            CRASHED,
        )
    )
    return cur.rowcount


def _scan(cur, t: Tables) -> int:
    """Progressor's SearchTimers/SearchCalls in one: due waiting tasks of idle processes start running."""
    cur.execute(
        t.sql(
            "WITH picked AS (DELETE FROM {schedule} WHERE task_id IN ("
            "  SELECT DISTINCT ON (process_id) task_id FROM {schedule} WHERE status = 'waiting' "
            "  AND scheduled_time <= now() AND process_id NOT IN (SELECT process_id FROM {running}) "
            "  ORDER BY process_id, task_id) "
            "  RETURNING task_id, process_id, task_type, scheduled_time, args, metadata, last_retry_interval, "
            "  attempts_count, context), "
            "started AS (INSERT INTO {running} (task_id, process_id, task_type, status, scheduled_time, running_time, "
            "  args, metadata, last_retry_interval, attempts_count, context) "
            "  SELECT task_id, process_id, task_type, 'running', scheduled_time, now(), args, metadata, "
            "  last_retry_interval, attempts_count, context FROM picked RETURNING task_id) "
            "UPDATE {tasks} SET status = 'running', running_time = now() WHERE task_id IN (SELECT task_id FROM started)"
        )
    )
    return cur.rowcount


def play(conn, traffic: DemoTraffic, tick: int | None = None, rng: random.Random | None = None) -> dict[str, int]:
    """One round of demo traffic; returns what it did. Process ids carry a random part, so a round
    played again (a retried run, a restarted ``make dev`` on the same database) adds new processes
    instead of colliding with the ones of an earlier round."""
    tick = int(time.time() // 60) if tick is None else tick
    rng = rng or random.Random(tick)
    round_id = uuid.uuid4().hex[:8]
    t = create_namespace(conn, traffic.namespace)
    counts = {"finished": 0, "started_from_schedule": 0, "new_processes": 0, "crashed_workers": 0}
    with conn, conn.cursor() as cur:
        counts["started_from_schedule"] = _scan(cur, t)
        for n in range(traffic.new_processes):
            process_id = f"demo-{tick}-{round_id}-{n}"
            engine.start_process(cur, t, process_id)
            if n % 2:
                engine.schedule_task(cur, t, process_id, "timeout", in_seconds=rng.randint(20, 90))
            else:
                engine.schedule_task(cur, t, process_id, "call", in_seconds=rng.randint(0, 30))
            counts["new_processes"] += 1
        if tick % traffic.crash_every == 0:
            process_id = f"demo-{tick}-{round_id}-crashed"
            task_type = "timeout" if (tick // traffic.crash_every) % 2 else "call"
            engine.start_process(cur, t, process_id, task_type=task_type)
            cur.execute(t.sql("UPDATE {running} SET metadata = {}::jsonb WHERE process_id = {}", CRASHED, process_id))
            counts["crashed_workers"] = 1
        counts["finished"] = _finish_running(cur, t)
    return counts


def seed(conn, traffic: DemoTraffic, crashed_minutes_ago: float = 5.0) -> dict[str, int]:
    """``make dev``'s start: one round of traffic, plus two workers that crashed a few minutes ago (a
    timer and a call), so the first ``collect_zombies`` run already has zombies to collect."""
    counts = play(conn, traffic, tick=1)  # tick 1: no crash of its own
    t = create_namespace(conn, traffic.namespace)
    with conn, conn.cursor() as cur:
        for task_type in ("timeout", "call"):
            process_id = f"demo-seed-crashed-{task_type}-{uuid.uuid4().hex[:8]}"
            engine.start_process(cur, t, process_id, age_seconds=crashed_minutes_ago * 60, task_type=task_type)
            cur.execute(t.sql("UPDATE {running} SET metadata = {}::jsonb WHERE process_id = {}", CRASHED, process_id))
    counts["crashed_workers"] += 2
    return counts
