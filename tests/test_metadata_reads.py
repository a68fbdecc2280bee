"""Metadata an operator cannot misread: a list of batch times written holds only those that wrote a
file, the count of pools with problems is the number of problem rows shown beside it, and durations
in seconds are rounded (no microseconds after the point)."""

from __future__ import annotations

import datetime as dt

import pytest

from infra.demo import progressor_engine as engine
from infra.demo.progressor_schema import create_namespace
from pipelines.batching.batcher import BatchWritten, FileWritten, RunReport
from pipelines.batching.defs import report_metadata
from pipelines.common.defs.metadata import metadata_from, rounded
from pipelines.fleet.defs.pool_audit import audit_metadata
from pipelines.fleet.pool_audit.audit import AuditRun
from pipelines.fleet.pool_audit.compute import PriceList, audit_pools
from pipelines.progressor.defs import health_asset
from pipelines.progressor.params import collect_params
from pipelines.progressor.targets import Target, dagster_name
from resources.postgres import ProgressorDatabase
from tests.progressor_support import scratch_database, unique_namespace
from tests.test_progressor_defs import RecordingCloudWatch

# ---------------------------------------------------------------- batching: batch_times_written


def _batch(time: str, records: int) -> BatchWritten:
    """A batch time done by a run: one file of ``records``, or no file when nothing was pending."""
    files = [FileWritten(key=f"batches/acme/{time}/1.jsonl", records=records)] if records else []
    return BatchWritten(batch_time=time, files=files)


def test_batch_times_written_lists_only_the_batch_times_that_wrote_a_file():
    times = [f"2026-11-20T{h:02d}:00" for h in range(6)]
    report = RunReport(receiver="acme", day="2026-11-20", batches=[_batch(t, 3 if t == times[5] else 0) for t in times])
    meta = report_metadata(report)
    assert meta["files_written"].value == 1
    assert meta["batch_times_written"].value == [times[5]]
    assert meta["batch_times_without_records"].value == times[:5]  # done (their ledger entries), no file


def test_no_batch_time_written_beside_no_file_written():
    report = RunReport(receiver="acme", day="2026-11-20", batches=[_batch("2026-11-20T08:00", 0)])
    meta = report_metadata(report)
    assert meta["files_written"].value == 0
    assert meta["batch_times_written"].value == []


def test_an_empty_file_sent_on_purpose_is_a_batch_time_written():
    empty = BatchWritten(
        batch_time="2026-11-20T08:00",
        files=[FileWritten(key="batches/acme/2026-11-20T08:00/1.jsonl", records=0)],
    )
    meta = report_metadata(RunReport(receiver="acme", day="2026-11-20", batches=[empty]))
    assert meta["batch_times_written"].value == ["2026-11-20T08:00"]
    assert meta["batch_times_without_records"].value == []


# ---------------------------------------------------------------- pool audit: pools_with_problems

PRICES = PriceList(source="test list", as_of="2026-01-01", spot_factor=0.35, on_demand_usd_per_hour={"t3.small": 0.02})
FINE_POOL = {"pool_name": "small", "instance_type": "t3.small", "desired_idle": 0, "spot": False}


def _audit_run(pools: list[dict], instances: list[dict]) -> AuditRun:
    audit = audit_pools(pools, instances, set(), PRICES)
    taken = dt.datetime(2026, 11, 20, 10, tzinfo=dt.UTC)
    return AuditRun(audit=audit, taken_at=taken, instances=len(instances), running_jobs=0, compute_seconds=0.01,
                    prices=PRICES, dry_run=True)  # fmt: skip


def _instance(iid: str, pool: str | None) -> dict:
    return {"instance_id": iid, "state": "running", "pool": pool, "instance_type": "t3.small"}


def test_pools_with_problems_counts_the_problem_rows_shown():
    """Every pool is fine; an untagged instance and a retired pool tag are two problems shown."""
    run = _audit_run([FINE_POOL], [_instance("i-1", "small"), _instance("i-2", None), _instance("i-3", "retired")])
    meta = audit_metadata(run)
    shown = [r.data["pool"] for r in meta["problems"].value.records]
    assert len(shown) == 2
    assert meta["pools_with_problems"].value == len(shown)


def test_pools_with_problems_is_zero_when_no_problem_is_shown():
    meta = audit_metadata(_audit_run([FINE_POOL], [_instance("i-1", "small")]))
    assert "problems" not in meta
    assert meta["pools_with_problems"].value == 0


# ---------------------------------------------------------------- seconds in metadata


@pytest.mark.parametrize(
    ("value", "shown"),
    [(86399.123456, 86399.1), (12.349999, 12.3), (1.0, 1.0), (0.034567, 0.035), (0.0, 0.0)],
)
def test_seconds_are_rounded_to_a_tenth_or_two_significant_digits_under_one(value, shown):
    assert rounded("oldest_pending_age_seconds", value) == shown
    assert rounded("seconds", value) == shown
    assert metadata_from({"compute_seconds": value})["compute_seconds"].value == shown


def test_a_key_that_only_contains_seconds_is_not_a_duration():
    assert rounded("seconds_per_message", 0.123456) == 0.123456


def test_the_batching_age_of_the_oldest_pending_record_is_rounded():
    report = RunReport(receiver="acme", day="2026-11-20", oldest_pending_age_seconds=3723.456789)
    assert report_metadata(report)["oldest_pending_age_seconds"].value == 3723.5


@pytest.mark.postgres
def test_the_progressor_age_of_the_oldest_running_task_is_rounded():
    """PostgreSQL's ``extract(epoch FROM now() - running_time)`` has microseconds: shown to 0.1 s."""
    import dagster as dg
    import psycopg2

    ns = unique_namespace("meta")
    with scratch_database() as dsn:
        conn = psycopg2.connect(dsn)
        tables = create_namespace(conn, ns)
        with conn, conn.cursor() as cur:
            engine.start_process(cur, tables, "p-old", age_seconds=300)
        conn.close()
        target = Target(name=dagster_name(ns), cron="* * * * *", config={"namespace": ns},
                        params=collect_params({"namespace": ns}))  # fmt: skip
        result = dg.materialize(
            [health_asset(target)],
            resources={"progressor_db": ProgressorDatabase(dsn=dsn), "cloudwatch": RecordingCloudWatch()},
            raise_on_error=False,
        )
    [materialization] = result.asset_materializations_for_node(health_asset(target).op.name)
    seconds = materialization.metadata["oldest_running_seconds"].value
    assert seconds >= 300
    assert seconds == round(seconds, 1)
