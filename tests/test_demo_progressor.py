"""make dev's progressor demo traffic (``infra/demo/progressor.py``) and its job."""

import psycopg2
import pytest

from infra.demo.defs import progressor_demo_traffic
from infra.demo.progressor import DemoTraffic, play, seed
from resources.postgres import ProgressorDatabase
from tests.progressor_support import scratch_database, unique_namespace

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def dsn():
    with scratch_database() as url:
        yield url


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
