"""make dev's progressor demo traffic (``infra/demo/progressor.py``): a step leaves only its crashed
workers' tasks running, so ``collect_zombies`` at the demo's cadence collects those and no live one."""

import json
import logging

import psycopg2
import pytest

from infra.demo.definitions import TARGETS_DIR
from infra.demo.defs import progressor_demo_traffic
from infra.demo.progressor import CRASHED, DemoTraffic, play, seed
from pipelines.progressor.collector import collect_zombies
from pipelines.progressor.params import collect_params
from pipelines.progressor.schema import tables_for
from resources.postgres import ProgressorDatabase
from tests.progressor_support import scratch_database, unique_namespace

pytestmark = pytest.mark.postgres

QUIET_GAP_SECONDS = 10 * 60
"""The quiet demo's time between two progressor demo steps (``*/10``): the longest any task of a step
waits for the next step or for collect_zombies (5 minutes after each step)."""


@pytest.fixture(scope="module")
def dsn():
    with scratch_database() as url:
        yield url


def _demo_target_params(namespace: str):
    """The demo's collect_zombies target (its zombie threshold) for ``namespace``."""
    (entry,) = json.loads((TARGETS_DIR / "progressor.json").read_text())
    return collect_params({k: v for k, v in entry.items() if k != "cron"} | {"namespace": namespace})


def test_collect_zombies_after_a_quiet_gap_collects_only_the_crashed_workers_tasks(dsn):
    traffic = DemoTraffic(namespace=unique_namespace("quietgap"), crash_every=3)
    params = _demo_target_params(traffic.namespace)
    assert params.threshold_seconds < QUIET_GAP_SECONDS  # the gap outlasts the zombie threshold
    conn = psycopg2.connect(dsn)
    try:
        first = play(conn, traffic, tick=3)  # a step with a crash
        second = play(conn, traffic, tick=4)  # and one without
        t = tables_for(traffic.namespace)
        with conn, conn.cursor() as cur:  # the quiet gap passes: everything still running ages by it
            cur.execute(
                t.sql("UPDATE {running} SET running_time = running_time - make_interval(secs => {})", QUIET_GAP_SECONDS)
            )
            cur.execute(t.sql("SELECT count(*) FROM {running} WHERE metadata = {}::jsonb", CRASHED))
            crashed = cur.fetchone()[0]
        counts = collect_zombies(conn, params, logging.getLogger("test"))
    finally:
        conn.close()
    assert first["crashed_workers"] + second["crashed_workers"] == 1
    assert crashed == 1
    assert counts.found == 1


def test_demo_traffic_crashes_a_worker(dsn):
    conn = psycopg2.connect(dsn)
    try:
        counts = play(conn, DemoTraffic(namespace=unique_namespace("demo"), crash_every=1), tick=7)
    finally:
        conn.close()
    assert counts["crashed_workers"] == 1


def test_make_devs_seed_runs_again_on_the_same_database(dsn):
    """A restarted ``make dev`` seeds the database it kept: the same round again adds new processes."""
    traffic = DemoTraffic(namespace=unique_namespace("reseed"))
    conn = psycopg2.connect(dsn)
    try:
        first = seed(conn, traffic)
        again = seed(conn, traffic)
    finally:
        conn.close()
    assert again["new_processes"] == first["new_processes"], "the second seed adds as many processes as the first"
    assert again["crashed_workers"] == 2, "and two crashed workers again"


def test_demo_traffic_job_runs(dsn):
    result = progressor_demo_traffic.execute_in_process(resources={"progressor_db": ProgressorDatabase(dsn=dsn)})
    assert result.output_for_node("play_progressor")["new_processes"] == 6
