"""Batching against moto: file sizes, empty batches, cancellation, crash recovery, concurrency, backfill."""

import contextlib
import dataclasses
import datetime as dt
import json
import random
import threading
import time
from decimal import Decimal

import boto3
import pytest
from boto3.dynamodb.types import Binary
from botocore.exceptions import ClientError

from pipelines.batching import decider, minute, store
from pipelines.batching.batcher import record_problem
from pipelines.batching.decider import decide, look_at_receivers, malformed_pending, orphaned_pending
from pipelines.common import iso, to_item
from pipelines.retry import STOP
from tests import fleet_support as fs
from tests.batching_helpers import (
    batcher,
    get_record,
    outbox,
    pending_ids,
    put_items,
    put_receiver,
    put_records,
    record,
    set_enabled,
    settings,
)
from tests.conftest import PATIENCE

UTC = dt.UTC
DAY = "2026-11-20"
T10 = dt.datetime(2026, 11, 20, 10, 0, tzinfo=UTC)


def _minutes_before(moment, count, spacing_s=7):
    return [moment - dt.timedelta(seconds=spacing_s * (i + 1)) for i in range(count)]


def test_files_are_ceil_pending_over_max_batch_size(aws):
    put_receiver(aws, "acme", max_batch_size=10)
    before = put_records(aws, "acme", _minutes_before(T10, 25))  # all in (09:00, 10:00)
    after = put_records(aws, "acme", [T10 + dt.timedelta(seconds=5)], prefix="late")
    report = batcher(aws).run("acme", DAY, now=T10 + dt.timedelta(seconds=30))

    assert report.status == "ok"
    assert [b.batch_time for b in report.batches][-1] == "2026-11-20T10:00Z"
    last = report.batches[-1]
    assert [f.records for f in last.files] == [10, 10, 5]  # ceil(25 / 10) files
    files = outbox(aws, "acme")
    assert sorted(files) == [f"batches/acme/2026-11-20T10:00Z/{n}.jsonl" for n in (1, 2, 3)]
    written = [line["record_id"] for lines in files.values() for line in lines]
    assert sorted(written) == sorted(before)
    assert len(written) == len(set(written))
    assert pending_ids(aws, "acme") == set(after)  # created after T: waits for 11:00
    rec = get_record(aws, before[0])
    assert "next_action" not in rec
    assert "pending_receiver" not in rec
    assert rec["batch_id"].startswith("acme/2026-11-20T10:00Z/")
    # Earlier batch times of the day had nothing pending; they are done, without files.
    assert len(report.batches) == 11
    assert all(not b.files for b in report.batches[:-1])

    again = batcher(aws).run("acme", DAY, now=T10 + dt.timedelta(seconds=45))
    assert again.batches == []
    assert "2026-11-20T10:00Z" in again.already_done
    assert outbox(aws, "acme") == files  # the same batch twice writes nothing new


def test_empty_batch_written_once_when_flag_set(aws):
    put_receiver(aws, "quiet", send_if_empty_batch=True, number_per_day=4)
    put_receiver(aws, "silent", send_if_empty_batch=False, number_per_day=4)
    now = dt.datetime(2026, 11, 20, 12, 30, tzinfo=UTC)
    for _ in range(2):
        batcher(aws).run("quiet", DAY, now=now)
        batcher(aws).run("silent", DAY, now=now)
    files = outbox(aws, "quiet")
    assert sorted(files) == [
        "batches/quiet/2026-11-20T00:00Z/1.jsonl",
        "batches/quiet/2026-11-20T06:00Z/1.jsonl",
        "batches/quiet/2026-11-20T12:00Z/1.jsonl",
    ]
    assert all(lines == [] for lines in files.values())
    assert outbox(aws, "silent") == {}


def test_cancellation_stops_before_the_next_file_and_resumes(aws):
    put_receiver(aws, "acme", max_batch_size=10)
    ids = put_records(aws, "acme", _minutes_before(T10, 30))
    messages = []

    def log(msg):
        messages.append(msg)
        if "wrote" in msg:  # an operator switches the receiver off while the run writes its first file
            set_enabled(aws, "acme", False)

    b = batcher(aws)
    b.log = log
    report = b.run("acme", DAY, now=T10)
    assert report.status == "cancelled"
    assert [f.records for f in report.files] == [10]
    assert len(pending_ids(aws, "acme")) == 20
    assert any("stopping before the next file" in m for m in messages)

    disabled = batcher(aws).run("acme", DAY, now=T10)
    assert disabled.status == "disabled"
    assert disabled.files == []

    set_enabled(aws, "acme", True)
    resumed = batcher(aws).run("acme", DAY, now=T10)
    assert resumed.status == "ok"
    assert [(f.key.rsplit("/", 1)[1], f.records) for f in resumed.files] == [("2.jsonl", 10), ("3.jsonl", 10)]
    written = [line["record_id"] for lines in outbox(aws, "acme").values() for line in lines]
    assert sorted(written) == sorted(ids)


class CrashingS3:
    """Delegates to a real S3 client but dies on the n-th PutObject of a batch file."""

    def __init__(self, real, crash_on: int):
        self._real, self._crash_on, self._puts = real, crash_on, 0

    def put_object(self, **kwargs):
        if kwargs["Key"].startswith("batches/"):
            self._puts += 1
            if self._puts == self._crash_on:
                raise ConnectionError("simulated crash between locking and upload")
        return self._real.put_object(**kwargs)

    def __getattr__(self, name):
        return getattr(self._real, name)


def test_crash_between_lock_and_upload_is_finished_by_the_next_run(aws):
    put_receiver(aws, "acme", max_batch_size=10)
    ids = put_records(aws, "acme", _minutes_before(T10, 25))
    with pytest.raises(ConnectionError):
        batcher(aws, s3=CrashingS3(aws.client("s3"), crash_on=2)).run("acme", DAY, now=T10)

    locked = {rid for rid in ids if "batch_id" in (r := get_record(aws, rid)) and "next_action" in r}
    assert len(locked) == 10  # file 2 was locked, never uploaded
    assert {get_record(aws, rid)["batch_id"] for rid in locked} == {"acme/2026-11-20T10:00Z/2"}
    assert list(outbox(aws, "acme")) == ["batches/acme/2026-11-20T10:00Z/1.jsonl"]

    # The next run is for the next day's partition; it still finishes exactly that batch first.
    report = batcher(aws).run("acme", "2026-11-21", now=T10 + dt.timedelta(minutes=5))
    assert [r["batch_id"] for r in report.recovered] == ["acme/2026-11-20T10:00Z/2"]
    files = outbox(aws, "acme")
    assert {line["record_id"] for line in files["batches/acme/2026-11-20T10:00Z/2.jsonl"]} == locked
    assert len(files["batches/acme/2026-11-20T10:00Z/3.jsonl"]) == 5  # the batch time then completes
    written = [line["record_id"] for lines in files.values() for line in lines]
    assert sorted(written) == sorted(ids)
    assert pending_ids(aws, "acme") == set()


def _crash_after_upload(aws) -> list[str]:
    """acme's 10 records, uploaded to their file by a run that died before finalizing them: their ids."""
    put_receiver(aws, "acme", max_batch_size=10)
    ids = put_records(aws, "acme", _minutes_before(T10, 10))
    b = batcher(aws)
    original = store.finalize_records

    def dying_finalize(*args, **kwargs):
        raise ConnectionError("died after the upload")

    store.finalize_records = dying_finalize
    try:
        with pytest.raises(ConnectionError):
            b.run("acme", DAY, now=T10)
    finally:
        store.finalize_records = original
    return ids


def test_crash_after_upload_only_finalizes(aws):
    ids = _crash_after_upload(aws)
    assert len(pending_ids(aws, "acme")) == 10
    report = batcher(aws).run("acme", DAY, now=T10)
    assert report.recovered[0]["file_was_in_s3"] is True
    assert pending_ids(aws, "acme") == set()
    files = outbox(aws, "acme")
    assert list(files) == ["batches/acme/2026-11-20T10:00Z/1.jsonl"]
    assert sorted(line["record_id"] for line in files["batches/acme/2026-11-20T10:00Z/1.jsonl"]) == sorted(ids)


def test_a_recovery_whose_file_check_is_refused_fails_and_the_next_run_finalizes_the_file(aws):
    """A refused HeadObject says nothing of the file: the run fails (and is retried), it does not
    upload the file again and report it as missing."""
    _crash_after_upload(aws)
    refusing = batcher(aws)
    with fs.refused(refusing.s3, "HeadObject", "AccessDenied", "Access Denied", lambda params: True):
        with pytest.raises(ClientError):
            refusing.run("acme", DAY, now=T10)
    assert len(pending_ids(aws, "acme")) == 10
    report = batcher(aws).run("acme", DAY, now=T10)
    assert report.recovered[0]["file_was_in_s3"] is True


def test_a_recovered_file_does_not_hide_the_days_other_files(aws):
    """Finishing a crashed 09:00 file does not hide the day's other files: 10:00 already has file 1 in S3
    (its records finalized, its ledger entry never written); that file is kept and new records go to file 2."""
    put_receiver(aws, "acme", max_batch_size=10)
    t9 = T10 - dt.timedelta(hours=1)
    locked = [
        {**record("acme", f"locked-{i}", t9 - dt.timedelta(minutes=5)), "batch_id": "acme/2026-11-20T09:00Z/1"}
        for i in range(2)
    ]
    sent = [record("acme", f"sent-{i}", t9 + dt.timedelta(minutes=10)) for i in range(2)]
    finalized = [
        {k: v for k, v in r.items() if k not in ("next_action", "pending_receiver")}
        | {"batch_id": "acme/2026-11-20T10:00Z/1", "batched_at": iso(t9 + dt.timedelta(minutes=59))}
        for r in sent
    ]
    put_items(aws, locked + finalized)
    store.put_file(
        aws.client("s3"),
        aws.env["BATCH_OUTBOX_BUCKET"],
        "batches/acme/2026-11-20T10:00Z/1.jsonl",
        [store.record_line(r, "acme/2026-11-20T10:00Z/1") for r in sent],
    )
    new = put_records(aws, "acme", [t9 + dt.timedelta(minutes=30)], prefix="new")

    batcher(aws).run("acme", DAY, now=T10)

    files = outbox(aws, "acme")
    assert [line["record_id"] for line in files["batches/acme/2026-11-20T10:00Z/1.jsonl"]] == ["sent-0", "sent-1"]
    assert [line["record_id"] for line in files["batches/acme/2026-11-20T10:00Z/2.jsonl"]] == new


def test_lease_of_a_dead_run_expires(aws):
    put_receiver(aws, "acme")
    ddb = aws.client("dynamodb")
    table = aws.env["RECEIVERS_TABLE"]
    store.acquire_lease(ddb, table, "acme", "dead-run", lease_seconds=600, wait_seconds=0)
    with pytest.raises(store.ReceiverBusy):
        batcher(aws, lease_wait_seconds=0).run("acme", DAY, now=T10)
    # The run dies; its lease runs out (renewed by its owner with a clock 20 minutes back: no sleeping
    # on a short lease, which a busy machine outlives before the first check above).
    store.acquire_lease(
        ddb, table, "acme", "dead-run", lease_seconds=600, wait_seconds=0, clock=lambda: time.time() - 1200
    )
    report = batcher(aws, lease_wait_seconds=10).run("acme", DAY, now=T10)
    assert report.status == "ok"


RECORDS = 60


@pytest.mark.slow
def test_two_concurrent_runs_never_double_or_lose_a_record(atomic_aws):
    # 12 batch times (every 15 min for 3 hours) of about 5 records, 2 files each. moto copies the
    # whole table for every item of a transaction: more records make the test slower, not stronger.
    # On a moto server whose conditional writes are atomic, as DynamoDB's are: on the threaded one,
    # both runs could pass the lease's condition at once, and one then finds its lease gone.
    aws = atomic_aws
    put_receiver(aws, "acme", max_batch_size=3, number_per_day=96)
    rng = random.Random(3)
    created = [T10 - dt.timedelta(seconds=rng.randint(1, 3 * 3600)) for _ in range(RECORDS)]
    ids = put_records(aws, "acme", created)
    reports, errors = [], []

    def run():
        try:
            client = boto3.client("dynamodb", endpoint_url=aws.endpoint, region_name="us-east-1")
            s3 = boto3.client("s3", endpoint_url=aws.endpoint, region_name="us-east-1")
            # The second run waits for the first one's lease (generously: the machine may be busy).
            b = batcher(aws, s3=s3, dynamodb=client, lease_wait_seconds=900)
            reports.append(b.run("acme", DAY, now=T10))
        except Exception as exc:  # pragma: no cover - surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert [r.status for r in reports] == ["ok", "ok"]
    files = outbox(aws, "acme")
    assert len(files) > 12, "some batch times need more than one file"
    written = [line["record_id"] for lines in files.values() for line in lines]
    assert len(written) == len(set(written)), "a record was written twice"
    assert set(written) == set(ids), "a record was lost"
    assert sum(r.records_batched for r in reports) == RECORDS


def test_lock_never_takes_a_record_already_in_a_batch(aws):
    put_receiver(aws, "acme")
    ids = put_records(aws, "acme", _minutes_before(T10, 5))
    ddb = aws.client("dynamodb")
    kw = dict(records_table=aws.env["BATCH_RECORDS_TABLE"], receivers_table=aws.env["RECEIVERS_TABLE"])
    store.acquire_lease(ddb, aws.env["RECEIVERS_TABLE"], "acme", "a", lease_seconds=60, wait_seconds=0)
    assert store.lock_records(ddb, receiver="acme", owner="a", record_ids=ids[:3], batch="acme/x/1", **kw) == ids[:3]
    assert store.lock_records(ddb, receiver="acme", owner="a", record_ids=ids, batch="acme/x/2", **kw) == ids[3:]
    with pytest.raises(store.LeaseLost):  # the fence: a run without the lease takes nothing
        store.lock_records(ddb, receiver="acme", owner="b", record_ids=ids, batch="acme/x/3", **kw)


def _snapshot(aws, name):
    """Batch files of ``name`` with the receiver name taken out (to compare two receivers)."""
    return {
        key.replace(f"/{name}/", "/R/"): [line["record_id"].split("-", 1)[1] for line in lines]
        for key, lines in outbox(aws, name).items()
    }


@pytest.mark.slow
def test_three_missed_days_go_out_first_in_the_next_run_as_the_uninterrupted_schedule_had_them(aws):
    days = [f"2026-11-{d}" for d in (16, 17, 18, 19, 20)]
    rng = random.Random(11)
    start = dt.datetime(2026, 11, 16, tzinfo=UTC)
    # Two batch times a day (03:00, 15:00), about 4 records each, at most 2 per file: empty files,
    # and batch times with several files. moto copies the whole table for every item of a transaction, so
    # the time grows with the square of the records.
    created = sorted(start + dt.timedelta(seconds=rng.randint(0, 4 * 86400 + 5 * 3600)) for _ in range(34))
    created += [start + dt.timedelta(days=2, hours=7)] * 2  # two records at the same instant
    for name in ("ref", "bf"):
        put_receiver(aws, name, number_per_day=2, initial_time="03:00", max_batch_size=2, send_if_empty_batch=True)
        put_records(aws, name, created)

    # Reference: the schedule never stopped. Each batch time runs when it comes.
    ref = batcher(aws)
    end = dt.datetime(2026, 11, 20, 10, 0, tzinfo=UTC)
    moments = [dt.datetime(2026, 11, 16, 3, tzinfo=UTC) + dt.timedelta(hours=12 * k) for k in range(15)]
    moments = [m for m in moments if m <= end]
    for moment in moments:
        ref.run("ref", moment.strftime("%Y-%m-%d"), now=moment)

    # Day 16 ran, 17-19 were missed (outage), the decider ran 20th's first batch before anyone noticed:
    # it writes the missed batch times first; the operator's backfill of 17, 18, 19 then finds them done.
    bf = batcher(aws)
    for moment in moments:
        if moment.strftime("%Y-%m-%d") == days[0]:
            bf.run("bf", days[0], now=moment)
    live = bf.run("bf", days[4], now=dt.datetime(2026, 11, 20, 3, 0, tzinfo=UTC))
    assert live.batches[0].batch_time == "2026-11-17T03:00Z"  # the first batch time missed
    for day in reversed(days[1:4]):
        bf.run("bf", day, now=end)
    bf.run("bf", days[4], now=end)

    reference, backfilled = _snapshot(aws, "ref"), _snapshot(aws, "bf")
    assert backfilled == reference
    batch_times = {key.rsplit("/", 2)[1] for key in reference}
    assert len(batch_times) == len(moments), "every batch time has a file (empty ones included)"
    assert len(reference) > len(batch_times), "some batch times have several files"
    assert sum(len(v) for v in reference.values()) == len(created) - len(pending_ids(aws, "ref"))


def test_a_record_written_late_before_utc_midnight_goes_in_the_next_days_first_run(aws):
    # An hourly receiver batched at 10:00, then had nothing pending: no run, so no ledger entry, for 11:00-23:00.
    put_receiver(aws, "acme", number_per_day=24)
    put_records(aws, "acme", [dt.datetime(2026, 11, 19, 9, 30, tzinfo=UTC)], prefix="early")
    batcher(aws).run("acme", "2026-11-19", now=dt.datetime(2026, 11, 19, 10, 0, 5, tzinfo=UTC))
    # created at 22:59:58, in the table only after the 23:00 tick read the pending-index
    [late] = put_records(aws, "acme", [dt.datetime(2026, 11, 19, 22, 59, 58, tzinfo=UTC)], prefix="late")
    report = batcher(aws).run("acme", "2026-11-20", now=dt.datetime(2026, 11, 20, 0, 0, 5, tzinfo=UTC))
    assert pending_ids(aws, "acme") == set()
    assert [line["record_id"] for line in outbox(aws, "acme")["batches/acme/2026-11-19T23:00Z/1.jsonl"]] == [late]
    assert report.batches[0].batch_time == "2026-11-19T23:00Z"  # 11:00-22:00 had nothing before them: not written


def test_an_idle_minutely_receiver_writes_nothing_for_the_batch_times_of_its_idle_days(aws):
    # Batched once on the 17th at 00:00, then nothing pending until 00:09:30 on the 19th: the 2,879 batch
    # times of the 17th and 18th after it have no ledger entry and nothing to send.
    put_receiver(aws, "acme", number_per_day=1440, send_if_empty_batch=True)
    put_records(aws, "acme", [dt.datetime(2026, 11, 16, 23, 59, 30, tzinfo=UTC)], prefix="early")
    batcher(aws).run("acme", "2026-11-17", now=dt.datetime(2026, 11, 17, 0, 0, 5, tzinfo=UTC))
    put_records(aws, "acme", [dt.datetime(2026, 11, 19, 0, 9, 30, tzinfo=UTC)])
    batcher(aws).run("acme", "2026-11-19", now=dt.datetime(2026, 11, 19, 0, 10, 5, tzinfo=UTC))
    times = [dt.datetime(2026, 11, 17, tzinfo=UTC)] + [dt.datetime(2026, 11, 19, 0, m, tzinfo=UTC) for m in range(11)]
    bucket = aws.env["BATCH_OUTBOX_BUCKET"]
    ledger = set(store.list_keys(aws.client("s3"), bucket, "ledger/acme/"))
    assert ledger == {store.ledger_key("acme", t) for t in times}  # the 19th's own ones, empty ones included
    assert set(outbox(aws, "acme")) == {store.file_key("acme", t, 1) for t in times}


def test_a_run_that_died_in_the_missed_batch_times_is_followed_by_the_rest_of_them_in_order(aws):
    # Hourly, batched on the 19th at 10:00, then records at 14:30, 16:30 and 18:30 with no run for them.
    put_receiver(aws, "acme", number_per_day=24)
    put_records(aws, "acme", [dt.datetime(2026, 11, 19, 9, 30, tzinfo=UTC)], prefix="early")
    batcher(aws).run("acme", "2026-11-19", now=dt.datetime(2026, 11, 19, 10, 0, 5, tzinfo=UTC))
    ids = put_records(aws, "acme", [dt.datetime(2026, 11, 19, h, 30, tzinfo=UTC) for h in (14, 16, 18)])
    # the 20th's first run writes 15:00 and dies on the upload of 17:00's file
    with pytest.raises(ConnectionError):
        batcher(aws, s3=CrashingS3(aws.client("s3"), crash_on=2)).run(
            "acme", "2026-11-20", now=dt.datetime(2026, 11, 20, 0, 0, 5, tzinfo=UTC)
        )
    batcher(aws).run("acme", "2026-11-20", now=dt.datetime(2026, 11, 20, 0, 0, 30, tzinfo=UTC))
    assert {key: [line["record_id"] for line in lines] for key, lines in outbox(aws, "acme").items()} == {
        "batches/acme/2026-11-19T10:00Z/1.jsonl": ["early-00000"],
        "batches/acme/2026-11-19T15:00Z/1.jsonl": ids[:1],
        "batches/acme/2026-11-19T17:00Z/1.jsonl": ids[1:2],
        "batches/acme/2026-11-19T19:00Z/1.jsonl": ids[2:],
    }


def test_a_schedule_change_leaves_no_record_behind(aws):
    # Daily at 00:00 UTC for a week, then the settings import moves initialTime to 12:00: every 12:00 of the
    # week has no ledger entry.
    put_receiver(aws, "acme", number_per_day=1)
    for d in range(13, 20):
        batcher(aws).run("acme", f"2026-11-{d}", now=dt.datetime(2026, 11, d, 0, 0, 5, tzinfo=UTC))
    ids = put_records(
        aws, "acme", [dt.datetime(2026, 11, 19, 3, 0, tzinfo=UTC), dt.datetime(2026, 11, 20, 1, 0, tzinfo=UTC)]
    )
    put_receiver(aws, "acme", number_per_day=1, initial_time="12:00")
    report = batcher(aws).run("acme", "2026-11-20", now=dt.datetime(2026, 11, 20, 12, 0, 5, tzinfo=UTC))
    assert pending_ids(aws, "acme") == set()
    assert {key: [line["record_id"] for line in lines] for key, lines in outbox(aws, "acme").items()} == {
        "batches/acme/2026-11-19T12:00Z/1.jsonl": ids[:1],
        "batches/acme/2026-11-20T12:00Z/1.jsonl": ids[1:],
    }
    assert [b.batch_time for b in report.batches] == ["2026-11-19T12:00Z", "2026-11-20T12:00Z"]


def test_bad_records_are_reported_batched_or_left_pending(aws):
    put_receiver(aws, "acme", max_batch_size=10)
    created = T10 - dt.timedelta(minutes=5)
    good = record("acme", "good", created)
    not_json = record("acme", "not-json", created, payload="{this is not json")
    no_receiver = {k: v for k, v in record("acme", "no-receiver", created).items() if k != "receiver"}
    bad_time = {**record("acme", "bad-time", created), "created_at": "yesterday"}
    no_created = {k: v for k, v in record("acme", "no-created", created).items() if k != "created_at"}
    put_items(aws, [good, not_json, no_receiver, bad_time, no_created])

    report = batcher(aws).run("acme", DAY, now=T10)
    lines = {line["record_id"]: line for lines in outbox(aws, "acme").values() for line in lines}
    assert set(lines) == {"good", "not-json"}
    assert lines["not-json"]["payload"] == "{this is not json"
    assert lines["not-json"]["payload_invalid_json"] is True
    assert lines["good"]["payload"] == {"id": "good"}
    assert "payload_invalid_json" not in lines["good"]
    assert report.files[0].invalid_payloads == 1
    problems = {r["record_id"]: r["problem"] for r in report.invalid_records}
    assert problems == {"no-receiver": "missing receiver", "bad-time": "malformed created_at 'yesterday'"}
    assert pending_ids(aws, "acme") == {"no-receiver", "bad-time"}
    # A record with no created_at is invisible to the pending-index: the audit scan finds it.
    total, sample = malformed_pending(aws.client("dynamodb"), aws.env["BATCH_RECORDS_TABLE"])
    assert total == 2
    assert {s["record_id"] for s in sample} == {"no-created", "no-receiver"}


@pytest.mark.parametrize("created_at", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"])
def test_a_created_at_whose_utc_time_is_outside_the_calendar_is_malformed_and_the_others_are_batched(aws, created_at):
    put_receiver(aws, "acme", max_batch_size=10)
    put_records(aws, "acme", _minutes_before(T10, 2))
    put_items(aws, [{**record("acme", "out-of-range", T10), "created_at": created_at}])
    report = batcher(aws).run("acme", DAY, now=T10)
    assert report.invalid_records == [{"record_id": "out-of-range", "problem": f"malformed created_at {created_at!r}"}]
    assert report.records_batched == 2
    assert pending_ids(aws, "acme") == {"out-of-range"}


def test_deleted_receiver_with_pending_records_is_reported_and_runs_skip_it(aws):
    put_receiver(aws, "acme")
    put_receiver(aws, "gone")
    put_records(aws, "gone", _minutes_before(T10, 3))
    aws.client("dynamodb").delete_item(TableName=aws.env["RECEIVERS_TABLE"], Key={"receiver": {"S": "gone"}})
    orphans = orphaned_pending(aws.client("dynamodb"), settings(aws))
    assert orphans == {"gone": 3}
    report = batcher(aws).run("gone", DAY, now=T10)
    assert report.status == "receiver_missing"
    assert len(pending_ids(aws, "gone")) == 3


def test_the_checks_look_reads_at_most_its_bound_of_pending_index_pages_and_is_a_state_past_it(aws):
    put_receiver(aws, "acme")
    put_records(aws, "gone", _minutes_before(T10, decider.LOOK_READS + 2))
    ddb, index_pages = aws.client("dynamodb"), []

    def one_record_a_page(params, **_):
        params["Limit"] = 1
        if "IndexName" in params:
            index_pages.append(params)

    ddb.meta.events.register("provide-client-params.dynamodb.Scan", one_record_a_page)
    look = look_at_receivers(ddb, settings(aws))
    assert len(index_pages) == decider.LOOK_READS
    assert not look.due  # a state: the checks run when it changes, or on the hourly refresh
    assert look.reason.endswith("over 10 page(s) of the pending-index")


def test_invalid_receiver_is_skipped_and_others_go_on(aws):
    put_receiver(aws, "broken", number_per_day=0)
    put_receiver(aws, "fine")
    put_records(aws, "broken", _minutes_before(T10, 3))
    put_records(aws, "fine", _minutes_before(T10, 3))
    broken = batcher(aws).run("broken", DAY, now=T10)
    fine = batcher(aws).run("fine", DAY, now=T10)
    assert broken.status == "invalid_config"
    assert "number_per_day" in broken.errors[0]
    assert fine.status == "ok"
    assert fine.records_batched == 3


def test_decider_launches_due_receivers_only(aws):
    put_receiver(aws, "hourly", number_per_day=24, max_batch_size=2)
    put_receiver(aws, "quarter", number_per_day=96, initial_time="00:05", time_zone="America/New_York")
    put_receiver(aws, "empty-but-flagged", number_per_day=24, send_if_empty_batch=True)
    put_receiver(aws, "empty", number_per_day=24)
    put_receiver(aws, "off", number_per_day=24, batching_enabled=False)
    put_receiver(aws, "bad", number_per_day=2000)
    put_records(aws, "hourly", _minutes_before(T10, 5))
    put_records(aws, "off", _minutes_before(T10, 5))
    decision = decide(aws.client("dynamodb"), settings(aws), tick=T10)
    due = {d.receiver: d for d in decision.due}
    assert set(due) == {"hourly", "empty-but-flagged"}  # quarter's times are :05, :20, :35, :50
    assert due["hourly"].pending == 5
    assert due["hourly"].expected_files == 3
    assert due["hourly"].batch_time == T10
    assert due["hourly"].day == DAY
    assert due["empty-but-flagged"].expected_files == 1
    assert "batching_enabled is false" in decision.skipped["off"]
    assert "invalid config" in decision.skipped["bad"]
    assert "nothing pending" in decision.skipped["empty"]
    later = decide(aws.client("dynamodb"), settings(aws), tick=T10 + dt.timedelta(minutes=5))
    assert [d.receiver for d in later.due] == []  # quarter is due but has nothing pending


INVALID_PENDING = {
    "no offset": {"created_at": "2026-11-20T09:00:00"},
    "another receiver": {"receiver": "globex"},
    "no receiver": {"receiver": None},
    "another receiver's batch": {"batch_id": "globex/2026-11-20T09:00Z/1"},
    "a batch time after now": {"batch_id": "acme/2027-06-01T23:00Z/1"},
    "a batch time before its created_at": {"batch_id": "acme/2001-01-01T00:00Z/1"},
}


@pytest.mark.parametrize("change", INVALID_PENDING.values(), ids=INVALID_PENDING)
def test_a_pending_record_no_run_batches_makes_no_batch_time_due_and_is_counted(aws, change):
    put_receiver(aws, "acme", number_per_day=1440)
    bad = {**record("acme", "acme-bad", T10 - dt.timedelta(hours=1)), **change}
    put_items(aws, [{k: v for k, v in bad.items() if v is not None}])
    decision = decide(aws.client("dynamodb"), settings(aws), tick=T10)
    assert decision.due == []
    assert decision.invalid_pending == {"acme": 1}
    assert batcher(aws).run("acme", DAY, now=T10).invalid_records[0]["record_id"] == "acme-bad"


def test_a_record_locked_in_a_batch_time_after_now_is_left_pending_and_writes_nothing_of_that_time(aws):
    put_receiver(aws, "acme", number_per_day=1, initial_time="23:00")
    fresh = put_records(aws, "acme", _minutes_before(T10, 3))
    put_items(aws, [{**record("acme", "locked", T10 - dt.timedelta(hours=1)), "batch_id": "acme/2027-06-01T23:00Z/1"}])
    report = batcher(aws).run("acme", DAY, now=T10)
    s3, bucket = aws.client("s3"), aws.env["BATCH_OUTBOX_BUCKET"]
    assert [r["record_id"] for r in report.invalid_records] == ["locked"]
    assert s3.list_objects_v2(Bucket=bucket, Prefix="batches/acme/2027-").get("Contents") is None
    assert s3.list_objects_v2(Bucket=bucket, Prefix="ledger/acme/2027-").get("Contents") is None
    assert pending_ids(aws, "acme") == {"locked", *fresh}  # their batch time is 23:00
    batcher(aws).run("acme", DAY, now=T10.replace(hour=23))
    assert {k: sorted(r["record_id"] for r in v) for k, v in outbox(aws, "acme").items()} == {
        "batches/acme/2026-11-20T23:00Z/1.jsonl": sorted(fresh)
    }
    assert pending_ids(aws, "acme") == {"locked"}


def test_a_due_receiver_counts_only_the_pending_records_a_run_batches(aws):
    put_receiver(aws, "acme", number_per_day=24, max_batch_size=2)
    put_records(aws, "acme", _minutes_before(T10, 2))
    put_items(aws, [{**record("acme", "acme-bad", T10 - dt.timedelta(hours=1)), **INVALID_PENDING["no offset"]}])
    [due] = decide(aws.client("dynamodb"), settings(aws), tick=T10).due
    assert due.pending == 2
    assert due.expected_files == 1


@pytest.mark.parametrize(
    ("created_at", "pending"),
    [("2026-11-20T11:59:00+02:00", 1), ("2026-11-20T05:30:00-05:00", 0)],
    ids=["before the batch time, after it as text", "after the batch time, before it as text"],
)
def test_the_decider_compares_a_created_at_with_an_offset_as_a_time(aws, created_at, pending):
    put_receiver(aws, "acme", number_per_day=1440, send_if_empty_batch=False)
    put_items(aws, [{**record("acme", "acme-1", T10), "created_at": created_at}])
    decision = decide(aws.client("dynamodb"), settings(aws), tick=T10)
    assert [d.pending for d in decision.due] == ([pending] if pending else [])


def test_a_tick_reads_at_most_the_bound_of_a_receivers_pending_records_and_a_backlog_is_due(aws, monkeypatch):
    monkeypatch.setattr(decider, "PENDING_READ_LIMIT", 5)
    put_receiver(aws, "acme", number_per_day=1440)
    old = T10 - dt.timedelta(hours=1)  # records no run batches: only the bound makes the receiver due
    put_items(aws, [{**record("acme", f"acme-{i}", old), **INVALID_PENDING["another receiver"]} for i in range(8)])
    ddb, read = aws.client("dynamodb"), []
    ddb.meta.events.register("after-call.dynamodb.Query", lambda parsed, **_: read.extend(parsed.get("Items", [])))
    decision = decide(ddb, settings(aws), tick=T10, window_seconds=180)
    assert len(read) == 5
    assert [d.batch_time for d in decision.due] == [T10 - dt.timedelta(minutes=m) for m in (2, 1, 0)]
    assert decision.backlog == {"acme"}
    assert decision.invalid_pending == {"acme": 5}


def test_a_zone_that_is_a_tzdata_folder_skips_its_receiver_and_the_others_are_decided(aws):
    put_receiver(aws, "fine", number_per_day=24)
    put_records(aws, "fine", _minutes_before(T10, 2))
    put_receiver(aws, "folder", time_zone="America")
    put_receiver(aws, "long", time_zone="x" * 256)
    decision = decide(aws.client("dynamodb"), settings(aws), tick=T10)
    assert [d.receiver for d in decision.due] == ["fine"]
    assert "time_zone must be an IANA zone name, got 'America'" in decision.skipped["folder"]
    assert "time_zone must be an IANA zone name" in decision.skipped["long"]


def test_payload_lines_are_json(aws):
    line = store.record_line({"record_id": "a", "receiver": "r", "created_at": iso(T10), "payload": "[1,2]"}, "r/x/1")
    assert json.loads(line) == {
        "record_id": "a",
        "receiver": "r",
        "created_at": "2026-11-20T10:00:00.000Z",
        "batch_id": "r/x/1",
        "payload": [1, 2],
    }


DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(
    ("payload", "kept"),
    [
        ({"n": Decimal("3"), "x": Decimal("0.5")}, '{"n":3,"x":0.5}'),  # a DynamoDB map: its JSON
        ([Decimal("1"), "a"], '[1,"a"]'),  # a DynamoDB list
        (Binary(b'{"a":1}'), '{"a":1}'),  # DynamoDB binary: its bytes as text
        (DEEP, DEEP),  # JSON nested deeper than a parser goes
        ('{"v": 1e400}', '{"v": 1e400}'),  # a number JSON cannot hold
        ('{"w": NaN}', '{"w": NaN}'),  # not JSON
    ],
    ids=["map", "list", "binary", "nested too deeply", "1e400", "NaN"],
)
def test_a_payload_that_is_not_json_text_is_kept_as_text_with_the_flag(payload, kept):
    line = json.loads(store.record_line({"record_id": "a", "payload": payload}, "r/x/1"), parse_constant=_refuse)
    assert line["payload"] == kept
    assert line["payload_invalid_json"] is True


def _refuse(constant: str):
    raise ValueError(f"{constant} is not JSON")


def test_records_whose_payloads_are_not_json_text_are_batched_and_the_receiver_goes_on(aws):
    put_receiver(aws, "acme", max_batch_size=10)
    created = T10 - dt.timedelta(minutes=5)
    put_items(aws, [record("acme", "good", created), record("acme", "infinite", created, payload='{"v": 1e400}')])
    put_items(aws, [record("acme", "deep", created, payload=DEEP)])
    # A map payload, locked into a batch by a run that died before it wrote the file: recovery writes it.
    before = T10 - dt.timedelta(hours=1)
    locked = {**record("acme", "map", before - dt.timedelta(minutes=5)), "batch_id": store.batch_id("acme", before, 1)}
    item = {**to_item(locked), "payload": {"M": {"count": {"N": "3"}}}}
    aws.client("dynamodb").put_item(TableName=aws.env["BATCH_RECORDS_TABLE"], Item=item)
    report = batcher(aws).run("acme", DAY, now=T10)
    s3, bucket = aws.client("s3"), aws.env["BATCH_OUTBOX_BUCKET"]
    texts = [s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode() for key in outbox(aws, "acme")]
    lines = {
        line["record_id"]: line for line in (json.loads(t, parse_constant=_refuse) for t in "".join(texts).splitlines())
    }
    assert pending_ids(aws, "acme") == set()
    assert [r["batch_id"] for r in report.recovered] == ["acme/2026-11-20T09:00Z/1"]
    assert report.files[0].invalid_payloads == 2
    assert lines["map"]["payload"] == '{"count":3}'
    assert lines["infinite"]["payload_invalid_json"] is True
    assert lines["good"]["payload"] == {"id": "good"}


@contextlib.contextmanager
def cancelled_by_conflicts(client, conflicts: int, reasons=("None", "TransactionConflict")):
    """The first ``conflicts`` TransactWriteItems of ``client`` are cancelled by another writer's
    transaction before they reach the server; counts every call."""
    calls = {"n": 0}

    def hook(params, **kwargs):
        calls["n"] += 1
        if calls["n"] <= conflicts:
            response = {
                "Error": {"Code": "TransactionCanceledException", "Message": "cancelled"},
                "CancellationReasons": [{"Code": code} for code in reasons],
            }
            raise ClientError(response, "TransactWriteItems")

    event = "provide-client-params.dynamodb.TransactWriteItems"
    client.meta.events.register(event, hook)
    try:
        yield calls
    finally:
        client.meta.events.unregister(event, hook)


def _records_table(aws) -> str:
    ddb = aws.client("dynamodb")
    table = f"records-{random.getrandbits(48):012x}"
    ddb.create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "record_id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "record_id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    for rid in ("r1", "r2"):
        ddb.put_item(
            TableName=table,
            Item={"record_id": {"S": rid}, "batch_id": {"S": "b"}, "next_action": {"S": store.BATCH_ACTION}},
        )
    return table


def _finalize(ddb, table: str) -> int:
    return store.finalize_records(ddb, records_table=table, record_ids=["r1", "r2"], batch="b", batched_at="t")


def test_a_transaction_cancelled_by_a_conflict_is_tried_again_by_the_policy(aws_shared):
    ddb, table = aws_shared.client("dynamodb"), _records_table(aws_shared)
    with cancelled_by_conflicts(ddb, conflicts=2) as calls:
        assert _finalize(ddb, table) == 2
    assert calls["n"] == 3


def test_conflicts_stop_after_the_policy_attempts_and_condition_failures_are_not_retried(aws_shared, monkeypatch):
    monkeypatch.setattr(store, "CONFLICT_POLICY", dataclasses.replace(store.CONFLICT_POLICY, formula=lambda n: 0.0))
    ddb, table = aws_shared.client("dynamodb"), _records_table(aws_shared)
    with cancelled_by_conflicts(ddb, conflicts=99) as endless:
        with pytest.raises(ClientError):
            _finalize(ddb, table)
    assert endless["n"] == store.CONFLICT_POLICY.max_attempts

    with cancelled_by_conflicts(ddb, conflicts=1, reasons=("ConditionalCheckFailed", "None")) as condition:
        assert _finalize(ddb, table) == 1  # r1 left out, r2 written at once
    assert condition["n"] == 2


def test_the_conflict_policy_waits_as_before():
    waits = [store.CONFLICT_POLICY.delay(n) for n in range(1, 8)]
    assert waits == pytest.approx([0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35])
    assert store.CONFLICT_POLICY.delay(8) is STOP


def test_a_record_lock_that_landed_although_its_call_failed_is_taken_again_and_batched(aws):
    """A TransactWriteItems that commits but whose answer is lost (a timeout after the server acted) is
    retried as a new call: the records it locked are this batch's, not someone else's."""
    from botocore.exceptions import ReadTimeoutError

    put_receiver(aws, "acme", max_batch_size=3, number_per_day=1, initial_time="10:00")
    ids = put_records(aws, "acme", [T10 - dt.timedelta(minutes=i + 1) for i in range(6)])
    ddb = boto3.client("dynamodb", endpoint_url=aws.endpoint, region_name="us-east-1")
    sent: list[dict] = []  # each TransactWriteItems request (after-call does not see it)
    locks: list[bool] = []
    ddb.meta.events.register("before-call.dynamodb.TransactWriteItems", lambda params, **_: sent.append(params))

    def answer_lost(**_):
        if "SET batch_id" in str(sent[-1].get("body")):
            locks.append(True)
            if len(locks) == 1:  # the first lock: committed, then its answer is lost
                raise ReadTimeoutError(endpoint_url="dynamodb (committed, answer lost)")

    ddb.meta.events.register("after-call.dynamodb.TransactWriteItems", answer_lost)
    batcher(aws, dynamodb=ddb).run("acme", "2026-11-20", now=T10)
    written = sorted(line["record_id"] for lines in outbox(aws, "acme").values() for line in lines)
    assert written == sorted(ids)


def _s3_held_at_first_put(aws, receiver: str):
    """An S3 client whose first PutObject of a batch file of ``receiver`` waits for ``go``: (client, at_put, go)."""
    client = boto3.client("s3", endpoint_url=aws.endpoint, region_name="us-east-1")
    at_put, go = threading.Event(), threading.Event()

    def hold(params, **_):
        if params.get("Key", "").startswith(f"batches/{receiver}/") and not at_put.is_set():
            at_put.set()
            go.wait(PATIENCE)

    client.meta.events.register("provide-client-params.s3.PutObject", hold)
    return client, at_put, go


def _lapse_lease(aws, receiver: str) -> None:
    aws.client("dynamodb").update_item(  # what a lapsed lease looks like
        TableName=aws.env["RECEIVERS_TABLE"],
        Key={"receiver": {"S": receiver}},
        UpdateExpression="SET batch_lease_until = :past",
        ExpressionAttributeValues={":past": {"N": "0"}},
    )


def test_a_run_whose_lease_lapsed_before_its_empty_file_leaves_the_new_owners_file_as_it_is(aws):
    """Run A finds nothing pending for a receiver that sends empty files and is held just before its
    PutObject; its lease lapses; a late record arrives and run B batches it into the same file name; A
    then goes on: the file keeps B's record."""
    put_receiver(aws, "quiet", send_if_empty_batch=True, number_per_day=1, initial_time="10:00")
    s3_of_a, at_put, go = _s3_held_at_first_put(aws, "quiet")
    a = threading.Thread(target=lambda: batcher(aws, s3=s3_of_a).run("quiet", DAY, now=T10))
    a.start()
    try:
        assert at_put.wait(PATIENCE)
        _lapse_lease(aws, "quiet")
        ids = put_records(aws, "quiet", [T10 - dt.timedelta(minutes=1)])
        batcher(aws).run("quiet", DAY, now=T10)
    finally:
        go.set()
        a.join()
    written = [line["record_id"] for lines in outbox(aws, "quiet").values() for line in lines]
    assert written == ids


def test_a_run_whose_lease_lapsed_at_its_upload_leaves_the_new_owners_ledger_entry_as_it_is(aws):
    """Run A locks 3 records for 10:00's 1.jsonl and is held at its PutObject until its lease lapses; run B
    takes the lease, finishes A's file and writes 2 newer records into 2.jsonl. A then goes on: it fails
    with LeaseLost before its ledger entry, which keeps B's files."""
    put_receiver(aws, "acme")
    old = put_records(aws, "acme", _minutes_before(T10, 3), prefix="old")
    s3_of_a, at_put, go = _s3_held_at_first_put(aws, "acme")
    lapsed = threading.Event()
    a = batcher(aws, s3=s3_of_a)
    a.clock = lambda: time.monotonic() + (3600 if lapsed.is_set() else 0)  # A's view of its lease's age
    outcome = {}

    def run_a():
        try:
            outcome["a"] = a.run("acme", DAY, now=T10)
        except store.LeaseLost as exc:
            outcome["a"] = exc

    thread = threading.Thread(target=run_a)
    thread.start()
    try:
        assert at_put.wait(PATIENCE)
        _lapse_lease(aws, "acme")
        lapsed.set()
        new = put_records(aws, "acme", [T10 - dt.timedelta(seconds=2), T10 - dt.timedelta(seconds=1)], prefix="new")
        b = batcher(aws).run("acme", DAY, now=T10)
    finally:
        go.set()
        thread.join(PATIENCE)
    ledger = json.loads(
        aws.client("s3")
        .get_object(Bucket=aws.env["BATCH_OUTBOX_BUCKET"], Key="ledger/acme/2026-11-20T10:00Z.json")["Body"]
        .read()
    )
    assert isinstance(outcome["a"], store.LeaseLost)
    assert ledger["files"] == [{"key": "batches/acme/2026-11-20T10:00Z/2.jsonl", "records": 2}]
    assert [(r["batch_id"], r["records"]) for r in b.recovered] == [("acme/2026-11-20T10:00Z/1", 3)]
    assert b.records_batched == 2
    assert pending_ids(aws, "acme") == set()
    assert sorted(line["record_id"] for lines in outbox(aws, "acme").values() for line in lines) == sorted(old + new)


@pytest.mark.parametrize("field", ["receiver", "created_at", "batch_id"])
def test_a_pending_records_problem_shows_a_long_value_cut_short(field):
    item = {"record_id": "r1", "receiver": "acme.elr", "created_at": "2026-11-20T09:00:00Z", field: "x" * 100_000}
    assert len(record_problem("acme.elr", item, T10)) < 200


def _throttle_release(one, times: int):
    """The lease release (the UpdateItem that REMOVEs ``batch_lease_owner``) throttled its first ``times`` calls."""
    calls = []

    def when(params) -> bool:
        if "REMOVE batch_lease_owner" not in params.get("UpdateExpression", ""):
            return False
        calls.append(params)
        return len(calls) <= times

    return fs.refused(one.dynamodb, "UpdateItem", "ThrottlingException", "Rate exceeded", when)


def test_a_lease_release_that_keeps_failing_leaves_the_batch_done_with_one_line(aws):
    put_receiver(aws, "acme")
    put_records(aws, "acme", [T10 - dt.timedelta(minutes=m + 1) for m in range(5)])
    one = batcher(aws)
    with _throttle_release(one, times=100):
        outcome = minute.batch_one(one, minute.Due("acme", DAY), T10)
    assert outcome.error is None
    assert len(outcome.report.files) == 1
    assert len([line for line in outcome.lines if "lease on acme was not released" in line]) == 1


def test_a_lease_not_given_back_is_shown_in_a_minute_run_even_for_a_partition_batched_before(aws):
    put_receiver(aws, "acme")
    one = batcher(aws)
    with _throttle_release(one, times=100):
        outcome = minute.batch_one(one, minute.Due("acme", DAY), T10)
    assert minute.worth_showing(outcome.report)


def test_a_lease_release_throttled_once_is_released(aws):
    put_receiver(aws, "acme")
    one = batcher(aws)
    with _throttle_release(one, times=1):
        minute.batch_one(one, minute.Due("acme", DAY), T10)
    item = aws.client("dynamodb").get_item(TableName=aws.env["RECEIVERS_TABLE"], Key={"receiver": {"S": "acme"}})
    assert "batch_lease_owner" not in item["Item"]
