"""Runs sized by the work: one batch_minute_job run for all receivers due in a decider minute, a
materialization for each partition whose status it changes or that holds something to look at, a
failing receiver handed to a run of its own partition."""

import datetime as dt
import json
import threading
import time
import uuid

import dagster as dg
import pytest

from pipelines.alerts.defs import build_alerts_sensor
from pipelines.batching.defs import (
    BATCH_TIME_TAG,
    FAILED_TAG,
    HANDOFF_OF_TAG,
    HANDOFF_TAG,
    MINUTE_JOB,
    PARTITION_JOB,
    batch_failures_handoff,
    minute_job,
    receiver_batches,
    receivers_partitions,
)
from pipelines.batching.minute import parse_partitions, shares
from pipelines.common.defs.schedules import SCHEDULE_TAG
from pipelines.definitions import build_definitions
from resources import clients, resources_for
from resources.settings import AlertSettings
from tests.alerts_support import webhook_receiver
from tests.batching_helpers import (
    decider_tick,
    outbox,
    pending_ids,
    put_items,
    put_receiver,
    put_records,
    record,
)
from tests.conftest import PATIENCE

UTC = dt.UTC
T10 = dt.datetime(2026, 11, 20, 10, 0, tzinfo=UTC)
DEFS = build_definitions("local")
MINUTE = DEFS.resolve_job_def(MINUTE_JOB)
BATCH_JOB = DEFS.resolve_job_def("receiver_batches_job")
RECEIVERS = ["acme", "globex", "initech"]


def _tick(instance, at):
    return decider_tick(
        dg.build_schedule_context(instance=instance, scheduled_execution_time=at, resources=resources_for("local"))
    )


def _statuses(instance, partitions):
    status = instance.get_status_by_partition(receiver_batches.key, partitions, receiver_batches.partitions_def)
    return {k: (v.value if v is not None else None) for k, v in status.items()}


def _ledger(aws, name):
    s3 = aws.client("s3")
    listed = s3.list_objects_v2(Bucket=aws.env["BATCH_OUTBOX_BUCKET"], Prefix=f"ledger/{name}/")
    return [o["Key"] for o in listed.get("Contents", [])]


def _run_minute(instance, request, job=None):
    return (job or MINUTE).execute_in_process(
        run_config=request.run_config,
        instance=instance,
        tags={**request.tags, "dagster/schedule_name": "batch_decider"},
        resources=resources_for("local"),
        raise_on_error=False,
    )


def _put_due(aws):
    for name in RECEIVERS:
        put_receiver(aws, name, number_per_day=24, max_batch_size=3)
        put_records(aws, name, [T10 - dt.timedelta(seconds=s) for s in range(1, 6)])


@pytest.mark.slow
def test_the_decider_requests_one_minute_run_for_every_due_receiver(aws):
    _put_due(aws)
    with dg.instance_for_test() as instance:
        request = _tick(instance, T10)
        assert isinstance(request, dg.RunRequest)
        assert request.run_config["partitions"] == [f"2026-11-20|{n}" for n in RECEIVERS]
        assert request.run_key == "minute@2026-11-20T10:00Z"
        assert request.tags[BATCH_TIME_TAG] == "2026-11-20T10:00:00.000Z"
        assert set(instance.get_dynamic_partitions(receivers_partitions.name)) == set(RECEIVERS)


FAN_OUT = minute_job(dg.in_process_executor)
"""The cluster's shape of the minute job (a step for each share), here on the in-process executor."""


@pytest.mark.slow
@pytest.mark.parametrize("job", [MINUTE, FAN_OUT], ids=["one step", "a step for each share"])
def test_a_minute_run_batches_each_due_receiver_once_with_a_materialization_per_partition(aws, job):
    _put_due(aws)
    with dg.instance_for_test() as instance:
        result = _run_minute(instance, _tick(instance, T10), job)
        assert result.success
        materialized = _materialized(result)
        assert sorted(m.partition for m in materialized) == [f"2026-11-20|{n}" for n in RECEIVERS]
        assert {m.metadata["records_batched"].value for m in materialized} == {5}
        assert _statuses(instance, [f"2026-11-20|{n}" for n in RECEIVERS]) == dict.fromkeys(
            [f"2026-11-20|{n}" for n in RECEIVERS], "MATERIALIZED"
        )
        for name in RECEIVERS:
            lines = [line["record_id"] for lines in outbox(aws, name).values() for line in lines]
            assert sorted(lines) == sorted(set(lines))  # none batched twice
            assert len(lines) == 5
            assert pending_ids(aws, name) == set()
            assert len(_ledger(aws, name)) == 24  # every batch time of the (past) day, once
        counts = json.loads(instance.get_run_by_id(result.run_id).tags["groundskeeper/counts"])
        assert counts["records_batched"] == 15


@pytest.mark.slow
def test_two_partitions_of_one_receiver_in_one_minute_run_take_its_lease_in_turn(aws, monkeypatch):
    """A minute run whose window crosses UTC midnight holds both days of a receiver. The first batch file
    upload waits until the other partition's batcher has tried the lease (and waits for it) or given it
    back: each file is written once and neither partition fails."""
    put_receiver(aws, "acme", number_per_day=24, max_batch_size=2)
    put_records(aws, "acme", [dt.datetime(2026, 11, 19, 22, 10 + i, tzinfo=UTC) for i in range(4)])
    put_records(aws, "acme", [dt.datetime(2026, 11, 20, 0, 30, tzinfo=UTC)], prefix="next")
    turn, puts, lease_calls, held = threading.Condition(), [], [], []

    def on_put(params, **_):
        if params.get("Key", "").startswith("batches/"):
            with turn:
                puts.append(params["Key"])
                if len(puts) == 1:
                    me = threading.get_ident()
                    held.append(turn.wait_for(lambda: any(t != me for t in lease_calls), PATIENCE))

    def on_lease(params, **_):  # a lease refused (the batcher then reads the item) or given back
        if "UpdateExpression" not in params or params["UpdateExpression"].startswith("REMOVE batch_lease"):
            with turn:
                lease_calls.append(threading.get_ident())
                turn.notify_all()

    shared = clients._shared_client

    def hooked(service_name, configuration):
        client = shared(service_name, configuration)
        client.meta.events.register("provide-client-params.s3.PutObject", on_put)
        client.meta.events.register("provide-client-params.dynamodb.GetItem", on_lease)
        client.meta.events.register("provide-client-params.dynamodb.UpdateItem", on_lease)
        return client

    monkeypatch.setattr(clients, "_shared_client", hooked)
    partitions = ["2026-11-19|acme", "2026-11-20|acme"]
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(receivers_partitions.name, ["acme"])
        request = dg.RunRequest(run_config={"batch_time": "2026-11-20T00:00:00.000Z", "partitions": partitions})
        result = _run_minute(instance, request)
        tags = instance.get_run_by_id(result.run_id).tags
    assert held == [True]
    assert tags.get(FAILED_TAG) is None
    assert sorted(puts) == sorted(set(puts))  # no file written twice
    assert pending_ids(aws, "acme") == set()


def _materialized(result) -> list:
    return [event.step_materialization_data.materialization for event in result.get_asset_materialization_events()]


def _counted(instance, run_id) -> dict:
    """The partitions the minute run's shares counted without materializing them again."""
    counted = {}
    for event in instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_OUTPUT):
        if event.step_key.startswith(("batch_receivers", "batch_minute")):  # a share's step, or the one step
            counted |= event.dagster_event.step_output_data.metadata["partitions_counted"].value
    return counted


@pytest.mark.slow
@pytest.mark.parametrize("job", [MINUTE, FAN_OUT], ids=["one step", "a step for each share"])
def test_a_partition_batched_as_usual_again_is_counted_by_its_share_not_materialized_again(aws, job):
    _put_due(aws)
    with dg.instance_for_test() as instance:
        _run_minute(instance, _tick(instance, T10), job)
        put_records(aws, "acme", [T10 + dt.timedelta(minutes=30)], prefix="acme-later")  # due again at 11:00
        again = _run_minute(instance, _tick(instance, T10 + dt.timedelta(hours=1)), job)
        assert _materialized(again) == []
        assert list(_counted(instance, again.run_id)) == ["2026-11-20|acme"]
        assert _statuses(instance, ["2026-11-20|acme"]) == {"2026-11-20|acme": "MATERIALIZED"}


@pytest.mark.slow
def test_a_partition_with_something_to_look_at_is_materialized_again(aws):
    _put_due(aws)
    with dg.instance_for_test() as instance:
        _run_minute(instance, _tick(instance, T10))
        put_items(aws, [{**record("acme", "acme-malformed", T10 + dt.timedelta(minutes=30)), "receiver": "globex"}])
        put_records(aws, "acme", [T10 + dt.timedelta(minutes=30)], prefix="acme-later")  # due again at 11:00
        again = _run_minute(instance, _tick(instance, T10 + dt.timedelta(hours=1)))
        [shown] = _materialized(again)
        assert shown.partition == "2026-11-20|acme"
        assert shown.metadata["invalid_record_count"].value == 1
        assert _counted(instance, again.run_id) == {}


@pytest.mark.slow
def test_a_minute_runs_console_shows_its_lines_without_the_engines_debug_events(aws, capfd):
    _put_due(aws)
    with dg.instance_for_test() as instance:
        result = _run_minute(instance, _tick(instance, T10))
        err = capfd.readouterr().err
        assert "3 partition(s) in 1 share(s)" in err
        assert "STEP_START" not in err
        assert instance.all_logs(result.run_id, of_type=dg.DagsterEventType.STEP_START) != []


@pytest.mark.slow
def _minute_with_globex_broken(aws, instance):
    """The T10 minute run of the due receivers, globex's settings broken after the decider's look: (its request,
    its result)."""
    _put_due(aws)
    request = _tick(instance, T10)
    put_receiver(aws, "globex", number_per_day=24, initial_time="25:00")
    return request, _run_minute(instance, request)


def test_a_failing_receiver_fails_only_its_own_partition_through_the_handoff(aws):
    with dg.instance_for_test() as instance:
        _, minute = _minute_with_globex_broken(aws, instance)
        assert minute.success  # its neighbours are batched; the failure is globex's own
        errors = [e.message for e in instance.all_logs(minute.run_id) if e.level >= 40]
        assert [m for m in errors if "globex" in m] == [m for m in errors]
        assert len(errors) == 1
        assert "initial_time must be HH:MM" in errors[0]
        assert pending_ids(aws, "acme") == set()
        assert pending_ids(aws, "initech") == set()
        assert len(pending_ids(aws, "globex")) == 5
        assert instance.get_run_by_id(minute.run_id).tags[FAILED_TAG] == "2026-11-20|globex"

        handoff = batch_failures_handoff(dg.build_sensor_context(instance=instance))
        [again] = handoff.run_requests
        assert again.partition_key == "2026-11-20|globex"
        assert again.tags[HANDOFF_OF_TAG] == minute.run_id
        # The daemon launches it as a run of receiver_batches_job for that partition: it fails there.
        run = BATCH_JOB.execute_in_process(
            partition_key=again.partition_key,
            instance=instance,
            tags=again.tags,
            resources=resources_for("local"),
            raise_on_error=False,
        )
        assert not run.success
        assert "initial_time must be HH:MM" in run.get_step_failure_events()[0].step_failure_data.error.message
        assert run.dagster_run.tags["dagster/partition"] == "2026-11-20|globex"  # what the alert names
        statuses = _statuses(instance, ["2026-11-20|acme", "2026-11-20|globex", "2026-11-20|initech"])
        assert statuses == {
            "2026-11-20|acme": "MATERIALIZED",
            "2026-11-20|globex": "FAILED",
            "2026-11-20|initech": "MATERIALIZED",
        }

        # The alerts sensor's one alert names globex's partition, and no other.
        with webhook_receiver() as receiver:
            settings = AlertSettings(webhook_url=receiver.url)
            res = {**resources_for("local"), "alerts": settings}
            with dg.build_sensor_context(instance=instance, resources=res) as context:
                build_alerts_sensor().evaluate_tick(context)
            keys = [body["alert_key"] for body in receiver.received]
    assert keys == ["run_failure:receiver_batches:2026-11-20|globex:failure"]


def _minute_job():
    return build_definitions("local").resolve_job_def(MINUTE_JOB)


@pytest.mark.slow
def test_a_re_execution_of_a_minute_run_that_batches_its_failed_receiver_hands_nothing_off(aws):
    with dg.instance_for_test() as instance:
        request, minute = _minute_with_globex_broken(aws, instance)
        handed = _handoff(instance)
        put_receiver(aws, "globex", number_per_day=24, max_batch_size=3)  # repaired; the UI's re-execution
        tags = {k: v for k, v in instance.get_run_by_id(minute.run_id).tags.items() if not k.startswith("dagster/")}
        child = dg.execute_job(
            dg.build_reconstructable_job("tests.test_batching_minute", "_minute_job"),
            instance,
            run_config=request.run_config,
            tags=tags,
            reexecution_options=dg.ReexecutionOptions(parent_run_id=minute.run_id),
        )
        assert child.success
        again = _handoff(instance, handed.cursor)  # the parent's again (the daemon skips a run key it launched)
    assert [r.run_key for r in again.run_requests if r.run_key.startswith(child.run_id)] == []


def _at(instance, run, kind: dg.DagsterEventType, when: float) -> None:
    """The run's start or end as the run storage records it, at ``when`` (epoch seconds)."""
    event = dg.DagsterEvent(kind.value, job_name=run.job_name)
    instance.handle_run_event(run.run_id, event, update_timestamp=dt.datetime.fromtimestamp(when, UTC))


def _failed_in_minute_run(instance, partitions: list[str], ended: float) -> dg.DagsterRun:
    """A minute run that ended at ``ended`` with ``partitions`` failed (tagged for the handoff); their
    receivers are partitions, as the decider makes them before it launches a minute run."""
    instance.add_dynamic_partitions(receivers_partitions.name, sorted({p.partition("|")[2] for p in partitions}))
    tags = {HANDOFF_TAG: "pending", FAILED_TAG: ",".join(partitions)}
    run = instance.add_run(dg.DagsterRun(job_name=MINUTE_JOB, run_id=str(uuid.uuid4()), tags=tags))
    _at(instance, run, dg.DagsterEventType.RUN_SUCCESS, ended)
    return run


def _partition_run(instance, partition: str, started: float | None = None) -> dg.DagsterRun:
    """A receiver_batches_job run of ``partition``: not started yet, or running since ``started``."""
    tags = {"dagster/partition": partition}
    run = instance.add_run(dg.DagsterRun(job_name=PARTITION_JOB, run_id=str(uuid.uuid4()), tags=tags))  # not started
    if started is not None:
        _at(instance, run, dg.DagsterEventType.RUN_START, started)
    return run


def _handoff(instance, cursor: str | None = None) -> dg.SensorResult:
    return batch_failures_handoff(dg.build_sensor_context(instance=instance, cursor=cursor))


def test_the_handoff_requests_one_run_for_a_partition_that_failed_in_several_minute_runs():
    now = time.time()
    with dg.instance_for_test() as instance:
        minutes = [
            _failed_in_minute_run(instance, ["2026-11-20|acme", "2026-11-20|globex"], now - s) for s in (180, 120, 60)
        ]
        result = _handoff(instance)
    assert sorted(r.run_key for r in result.run_requests) == [
        f"{minutes[-1].run_id}:2026-11-20|acme",  # the newest minute run that failed it
        f"{minutes[-1].run_id}:2026-11-20|globex",
    ]


@pytest.mark.parametrize("started", [None, 30], ids=["not started yet", "begun after the failure"])
def test_the_handoff_requests_no_run_for_a_partition_whose_queued_or_running_run_batches_it(started):
    now = time.time()
    with dg.instance_for_test() as instance:
        _failed_in_minute_run(instance, ["2026-11-20|acme"], now - 60)
        active = _partition_run(instance, "2026-11-20|acme", None if started is None else now - started)
        result = _handoff(instance)
    assert result.run_requests == []
    assert f"2026-11-20|acme: run {active.run_id} batches it" in result.skip_reason.skip_message


def test_a_partition_whose_run_began_before_the_failure_gets_its_run_once_that_run_ends():
    now = time.time()
    with dg.instance_for_test() as instance:
        running = _partition_run(instance, "2026-11-20|acme", started=now - 1500)
        failed = _failed_in_minute_run(instance, ["2026-11-20|acme"], now - 1400)  # waiting for its lease, say
        _failed_in_minute_run(instance, ["2026-11-20|globex"], now - 10)  # a later failure moves the cursor on
        first = _handoff(instance)
        _at(instance, running, dg.DagsterEventType.RUN_SUCCESS, now)  # its batch times end before the failure's
        second = _handoff(instance, first.cursor)  # no longer reads that minute run: its cursor carries it
    assert [str(r.partition_key) for r in first.run_requests] == ["2026-11-20|globex"]
    assert f"{failed.run_id}:2026-11-20|acme" in [r.run_key for r in second.run_requests]


@pytest.mark.parametrize(
    "cursor",
    [
        {"at": float("inf"), "waiting": {}},
        {"at": 1e18, "waiting": {}},
        {"at": -1e18, "waiting": {}},
        {"at": 4e9, "waiting": {}},
        {"at": 0, "waiting": {"2026-11-20|globex": 1}},
        {"at": 0, "waiting": {"2026-11-20|globex": [None, 0]}},
        {"at": 0, "waiting": {"2026-11-20|globex": ["run", "yesterday"]}},
    ],
    ids=["infinity", "beyond any date", "before any date", "later than now", "no pair", "no run id", "no time"],
)
def test_a_cursor_set_to_something_else_starts_over_and_hands_off_a_recent_failure(cursor):
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(receivers_partitions.name, ["globex"])  # a receiver, whose run would go
        failed = _failed_in_minute_run(instance, ["2026-11-20|acme"], time.time() - 60)
        result = _handoff(instance, json.dumps(cursor))
    assert [r.run_key for r in result.run_requests] == [f"{failed.run_id}:2026-11-20|acme"]


def test_after_a_gap_the_handoff_reaches_every_failed_partition_over_successive_ticks():
    now = time.time()
    partitions = [f"2026-11-20|r{i:03d}" for i in range(120)]
    with dg.instance_for_test() as instance:
        for i, partition in enumerate(partitions):  # a minute run a second, each failing one partition
            _failed_in_minute_run(instance, [partition], now - 300 + i)
        cursor, handed = json.dumps({"at": now - 3600, "waiting": {}}), set()
        for _ in range(3):
            result = _handoff(instance, cursor)
            cursor, handed = result.cursor, handed | {str(r.partition_key) for r in result.run_requests}
    assert handed == set(partitions)


@pytest.mark.slow
@pytest.mark.parametrize("end", ["report_run_failed", "report_run_canceled"], ids=["died", "cancelled"])
def test_a_minute_run_that_ended_before_its_report_is_run_again_in_one_minute_run(aws, end):
    put_receiver(aws, "hourly", number_per_day=24, max_batch_size=3)
    put_records(aws, "hourly", [T10 - dt.timedelta(minutes=5)])
    with dg.instance_for_test() as instance:
        request = _tick(instance, T10)
        run = instance.create_run_for_job(MINUTE, run_config=request.run_config, tags=request.tags)
        getattr(instance, end)(run)  # out of memory, its task stopped, or cancelled: no tags, no report
        [again] = _handoff_tick(instance).run_requests
        MINUTE.execute_in_process(  # as the daemon launches it
            run_config=again.run_config, instance=instance, tags=again.tags, resources=resources_for("local")
        )
    assert again.run_key == f"rerun:{run.run_id}"
    assert again.run_config == request.run_config
    assert pending_ids(aws, "hourly") == set()


def _ended_minute_run(
    instance, kind: dg.DagsterEventType, partitions: list[str], tags: dict | None = None, **config
) -> dg.DagsterRun:
    """A minute run of ``partitions`` that ended as ``kind`` without the handoff's tags."""
    instance.add_dynamic_partitions(receivers_partitions.name, sorted({p.partition("|")[2] for p in partitions}))
    run_config = {"batch_time": "2026-11-20T10:00:00.000Z", "partitions": partitions, **config}
    run = dg.DagsterRun(job_name=MINUTE_JOB, run_id=str(uuid.uuid4()), run_config=run_config, tags=tags or {})
    _at(instance, instance.add_run(run), kind, time.time() - 60)
    return run


def test_a_minute_run_handed_off_that_died_too_is_run_again_in_halves():
    """A partition that kills its minute run ends in a run of its own after a few halvings, not 430 runs."""
    partitions = [f"2026-11-20|{n}" for n in RECEIVERS]
    with dg.instance_for_test() as instance:
        rerun = _ended_minute_run(instance, dg.DagsterEventType.RUN_FAILURE, partitions, {HANDOFF_OF_TAG: "dead"})
        requests = _handoff_tick(instance).run_requests
    assert [r.job_name for r in requests] == [MINUTE_JOB] * 2
    assert [r.run_key for r in requests] == [f"rerun:{rerun.run_id}:0", f"rerun:{rerun.run_id}:1"]
    assert [r.run_config["partitions"] for r in requests] == [partitions[:2], partitions[2:]]


def test_a_minute_run_of_one_partition_handed_off_that_died_too_hands_it_off_in_a_run_of_its_own():
    partitions = [f"2026-11-20|{RECEIVERS[0]}"]
    with dg.instance_for_test() as instance:
        rerun = _ended_minute_run(instance, dg.DagsterEventType.RUN_FAILURE, partitions, {HANDOFF_OF_TAG: "dead"})
        requests = _handoff_tick(instance).run_requests
    assert [(r.job_name, r.run_key) for r in requests] == [(PARTITION_JOB, f"{rerun.run_id}:{partitions[0]}")]


def test_a_minute_run_that_succeeded_untagged_or_a_dry_run_that_died_hands_nothing_off():
    with dg.instance_for_test() as instance:
        _ended_minute_run(instance, dg.DagsterEventType.RUN_SUCCESS, ["2026-11-20|acme"])
        _ended_minute_run(instance, dg.DagsterEventType.RUN_FAILURE, ["2026-11-20|globex"], dry_run=True)
        result = _handoff(instance)
    assert result.run_requests == []


def test_a_minute_run_that_died_is_run_again_in_one_minute_run_of_the_partitions_it_had_not_materialized():
    receivers = [f"org{i:03d}.receiver" for i in range(430)]  # ReportStream's receivers at 1440 a day, say
    partitions = [f"2026-11-20|{n}" for n in receivers]

    @dg.op
    def batch_then_die(context: dg.OpExecutionContext) -> None:  # out of memory at its last receiver
        for partition in partitions[:2]:
            day, _, receiver = partition.partition("|")
            key = dg.MultiPartitionKey({"receiver": receiver, "day": day})
            context.log_event(dg.AssetMaterialization(receiver_batches.key, partition=key))
        raise MemoryError("out of memory")

    config = dg.ConfigMapping(config_schema={"partitions": [str]}, config_fn=lambda _: {})

    @dg.job(name=MINUTE_JOB, config=config)
    def died():
        batch_then_die()

    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(receivers_partitions.name, receivers)
        run = died.execute_in_process(run_config={"partitions": partitions}, instance=instance, raise_on_error=False)
        requests = _handoff_tick(instance).run_requests
    assert [r.job_name for r in requests] == [MINUTE_JOB]
    assert requests[0].run_config["partitions"] == partitions[2:]
    assert requests[0].run_key == f"rerun:{run.run_id}"
    assert requests[0].tags[HANDOFF_OF_TAG] == run.run_id


def _handoff_tick(instance) -> dg.SensorResult:
    """One tick of the handoff as the daemon evaluates it: its run requests resolved against its jobs and the
    partitions."""
    context = dg.build_sensor_context(instance=instance, definitions=DEFS)
    with dg.partition_loading_context(dynamic_partitions_store=instance):
        return DEFS.resolve_sensor_def("batch_failures_handoff").evaluate_tick(context)


GONE = ["2026-11-20|gone", "2099-01-01|acme"]
"""Failed partitions that are not partitions of receiver_batches: a deleted receiver's, a day past the last."""


def test_failed_partitions_that_are_no_longer_partitions_are_skipped_and_the_others_handed_off():
    with dg.instance_for_test() as instance:
        _failed_in_minute_run(instance, ["2026-11-20|acme", *GONE], time.time() - 60)
        instance.delete_dynamic_partition(receivers_partitions.name, "gone")  # the receiver was deleted since
        tick = _handoff_tick(instance)
    assert [str(r.partition_key) for r in tick.run_requests] == ["2026-11-20|acme"]


def test_a_failed_partition_that_is_no_longer_a_partition_is_named_with_its_reason():
    with dg.instance_for_test() as instance:
        _failed_in_minute_run(instance, GONE, time.time() - 60)
        instance.delete_dynamic_partition(receivers_partitions.name, "gone")
        tick = _handoff_tick(instance)
    assert tick.run_requests == []
    assert "2026-11-20|gone: not a partition of receiver_batches (its receiver was deleted?)" in tick.skip_message
    assert "2099-01-01|acme: not a partition of receiver_batches (its day is outside" in tick.skip_message
    assert json.loads(tick.cursor)["waiting"] == {}


@pytest.mark.slow
def test_the_handoff_requests_no_run_for_a_partition_failed_already(aws):
    put_receiver(aws, "globex", number_per_day=24, initial_time="25:00")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(receivers_partitions.name, ["globex"])
        BATCH_JOB.execute_in_process(
            partition_key="2026-11-20|globex", instance=instance, resources=resources_for("local"), raise_on_error=False
        )
        _failed_in_minute_run(instance, ["2026-11-20|globex"], time.time())
        result = _handoff(instance)
    assert result.run_requests == []
    assert "2026-11-20|globex: FAILED already" in result.skip_reason.skip_message


@pytest.mark.slow
def test_a_failed_partition_batched_by_a_minute_run_is_materialized_again(aws):
    _put_due(aws)
    with dg.instance_for_test() as instance:
        _run_minute(instance, _tick(instance, T10))
        put_receiver(aws, "globex", number_per_day=24, initial_time="25:00")
        failed = BATCH_JOB.execute_in_process(
            partition_key="2026-11-20|globex", instance=instance, resources=resources_for("local"), raise_on_error=False
        )
        assert not failed.success
        put_receiver(aws, "globex", number_per_day=24, max_batch_size=3)  # repaired
        put_records(aws, "globex", [T10 + dt.timedelta(minutes=30)], prefix="globex-later")  # due again at 11:00
        again = _run_minute(instance, _tick(instance, T10 + dt.timedelta(hours=1)))
        assert [m.partition for m in _materialized(again)] == ["2026-11-20|globex"]
        assert _statuses(instance, ["2026-11-20|globex"]) == {"2026-11-20|globex": "MATERIALIZED"}


@pytest.mark.slow
@pytest.mark.parametrize("job", [MINUTE, FAN_OUT], ids=["one step", "a step for each share"])
def test_a_minute_dry_run_records_observations_and_leaves_every_partition_status_as_it_was(aws, job):
    _put_due(aws)
    keys = [f"2026-11-20|{n}" for n in RECEIVERS]
    with dg.instance_for_test() as instance:
        request = _tick(instance, T10)
        put_receiver(aws, "globex", number_per_day=24, initial_time="25:00")
        failed = BATCH_JOB.execute_in_process(
            partition_key=keys[1], instance=instance, resources=resources_for("local"), raise_on_error=False
        )
        assert not failed.success
        put_receiver(aws, "globex", number_per_day=24, max_batch_size=3)  # repaired
        dry_config = {**request.run_config, "dry_run": True}
        dry = _run_minute(instance, dg.RunRequest(run_config=dry_config, tags=request.tags), job)
        assert dry.success
        assert _materialized(dry) == []
        assert _statuses(instance, keys) == {keys[0]: None, keys[1]: "FAILED", keys[2]: None}
        observed = [e.asset_observation_data.asset_observation for e in dry.all_events if e.is_asset_observation]
        assert sorted(o.partition for o in observed) == keys
        assert {o.metadata["records_would_batch"].value for o in observed} == {5}
        counts = json.loads(instance.get_run_by_id(dry.run_id).tags["groundskeeper/counts"])
        logged = [e.user_message for e in instance.all_logs(dry.run_id) if e.user_message.startswith("summary: ")]
    assert [name for name, value in counts.items() if value and "_would_" not in name] == []
    assert counts["records_would_batch"] == 15
    assert logged == [f"summary: batch minute {request.run_config['batch_time']}: 3 partition(s) would be batched: "
                      f"files_would_write={counts['files_would_write']}, records_would_batch=15 (dry run)"]  # fmt: skip
    assert [len(pending_ids(aws, n)) for n in RECEIVERS] == [5, 5, 5]


@pytest.mark.parametrize("job", [MINUTE, FAN_OUT], ids=["one step", "a step for each share"])
def test_a_minute_run_without_partitions_ends_with_its_summary(aws_shared, job):
    request = dg.RunRequest(run_config={"batch_time": "2026-11-20T10:00:00.000Z", "partitions": []})
    with dg.instance_for_test() as instance:
        result = _run_minute(instance, request, job)
        tags = instance.get_run_by_id(result.run_id).tags
    assert json.loads(tags["groundskeeper/counts"]) == {"batches_sent": 0, "records_batched": 0}


def test_a_pending_record_no_run_batches_launches_no_minute_run_and_each_tick_names_it(aws):
    put_receiver(aws, "solo", number_per_day=1440, max_batch_size=100)
    bad = {**record("solo", "solo-bad", T10 - dt.timedelta(hours=1)), "created_at": "2026-11-20T09:00:00"}
    put_items(aws, [bad])
    with dg.instance_for_test() as instance:
        ticks = [_tick(instance, T10 + dt.timedelta(minutes=m)) for m in range(3)]
    assert [type(t) for t in ticks] == [dg.SkipReason] * 3
    assert "that no run batches (left pending): solo 1" in ticks[-1].skip_message


@pytest.mark.slow
def test_the_decider_skips_while_the_previous_minute_run_is_queued_and_then_covers_its_minute(aws):
    put_receiver(aws, "hourly", number_per_day=24, initial_time="00:00", max_batch_size=3)
    put_records(aws, "hourly", [T10 - dt.timedelta(minutes=5)])
    with dg.instance_for_test() as instance:
        queued = instance.create_run_for_job(
            MINUTE,
            run_config={"batch_time": "2026-11-20T09:59:00.000Z", "partitions": []},
            tags={BATCH_TIME_TAG: "2026-11-20T09:59:00.000Z", SCHEDULE_TAG: "batch_decider"},
        )
        skipped = _tick(instance, T10)
        assert isinstance(skipped, dg.SkipReason)
        assert queued.run_id in skipped.skip_message
        instance.report_run_canceled(queued)
        later = _tick(instance, T10 + dt.timedelta(minutes=1))  # its window reaches back to 09:59: 10:00 is in it
        assert later.run_config["partitions"] == ["2026-11-20|hourly"]


@pytest.mark.slow
def test_the_decider_does_not_wait_for_a_queued_minute_run_of_the_handoff(aws):
    put_receiver(aws, "hourly", number_per_day=24, initial_time="00:00", max_batch_size=3)
    put_records(aws, "hourly", [T10 - dt.timedelta(minutes=5)])
    with dg.instance_for_test() as instance:
        instance.create_run_for_job(  # the handoff's run of a minute run of 09:00 that died, queued
            MINUTE,
            run_config={"batch_time": "2026-11-20T09:00:00.000Z", "partitions": ["2026-11-20|hourly"]},
            tags={HANDOFF_OF_TAG: "dead"},
        )
        tick = _tick(instance, T10)
    assert tick.run_config["partitions"] == ["2026-11-20|hourly"]


def test_run_config_partitions_that_are_not_keys_are_lines_and_skipped():
    entries = ["2026-11-20|acme", "acme", "2026-13-01|acme", "2026-11-20|a b", 7, "2026-11-20|acme"]
    due, problems = parse_partitions(entries)
    assert [d.partition for d in due] == ["2026-11-20|acme"]
    assert len(problems) == 4


def test_a_minute_is_split_into_shares_of_at_most_25_receivers():
    due, _ = parse_partitions([f"2026-11-20|r{i}" for i in range(60)])
    assert [len(s) for s in shares(due)] == [25, 25, 10]
