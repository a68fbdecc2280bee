"""The Dagster layer of batching: receivers_sync, batch_decider, receiver_batches, checks, the CLI."""

import datetime as dt
import json
import subprocess
import sys
import uuid

import dagster as dg
import pytest
from botocore.exceptions import ClientError

from pipelines.batching import decider, store
from pipelines.batching.batcher import RunReport
from pipelines.batching.defs import (
    _log_report,
    no_orphaned_pending_records,
    pending_records_well_formed,
    receiver_batches,
    receiver_configs_valid,
    receivers_partitions,
    receivers_sync,
)
from pipelines.batching.params import ReceiverBatchesParams
from pipelines.common.params import ParamsError, parse_params
from pipelines.definitions import ROOT_DIR, build_definitions
from resources import clients, resources_for
from tests.batching_helpers import decider_tick, outbox, pending_ids, put_items, put_receiver, put_records, record
from tests.conftest import LogLines

UTC = dt.UTC
T10 = dt.datetime(2026, 11, 20, 10, 0, tzinfo=UTC)
# Resolved once at import: resolving inside a test would read Dagster's context-global defs-state
# storage, which an earlier in-process run's (since collected) instance may have left behind.
BATCH_JOB = build_definitions("local").resolve_job_def("receiver_batches_job")


def _resources():
    return resources_for("local")


def test_batching_defs_load_in_every_deployment():
    for deployment in ("local", "prod"):
        defs = build_definitions(deployment)
        dg.Definitions.validate_loadable(defs)
        assert defs.resolve_schedule_def("batch_decider").cron_schedule == "* * * * *"
        assert defs.resolve_job_def("receiver_batches_job").partitions_def is not None


@pytest.mark.slow
def test_receivers_sync_adds_new_and_removes_deleted_receivers(aws):
    with dg.instance_for_test() as instance:
        put_receiver(aws, "acme")
        put_receiver(aws, "globex")
        put_receiver(aws, "bad|name")
        result = receivers_sync(dg.build_sensor_context(instance=instance, resources=_resources()))
        assert isinstance(result, dg.SensorResult)
        [add] = result.dynamic_partitions_requests
        assert sorted(add.partition_keys) == ["acme", "globex"]
        instance.add_dynamic_partitions("receivers", ["acme", "globex", "old"])

        result = receivers_sync(dg.build_sensor_context(instance=instance, resources=_resources()))
        [delete] = result.dynamic_partitions_requests
        assert isinstance(delete, dg.DeleteDynamicPartitionsRequest)
        assert list(delete.partition_keys) == ["old"]
        instance.delete_dynamic_partition("receivers", "old")

        context = dg.build_sensor_context(instance=instance, resources=_resources())
        idle = receivers_sync(context)
        assert isinstance(idle, dg.SkipReason)
        assert "all in sync" in idle.skip_message

        # While the table stays as the last tick read it, the sync does not read the partitions (no instance).
        unchanged = receivers_sync(dg.build_sensor_context(cursor=context.cursor, resources=_resources()))
        assert "the table unchanged since the partitions were in sync" in unchanged.skip_message
        put_receiver(aws, "initech")
        later = dg.build_sensor_context(instance=instance, cursor=context.cursor, resources=_resources())
        with_new = receivers_sync(later)
        [add] = with_new.dynamic_partitions_requests
        assert list(add.partition_keys) == ["initech"]


@pytest.mark.slow
def test_batch_decider_requests_one_minute_run_for_the_due_receivers(aws):
    put_receiver(aws, "acme", number_per_day=24)
    put_receiver(aws, "globex", number_per_day=96, initial_time="00:05", send_if_empty_batch=True)
    put_receiver(aws, "off", batching_enabled=False)
    put_records(aws, "acme", [T10 - dt.timedelta(minutes=1)])
    put_records(aws, "off", [T10 - dt.timedelta(minutes=1)])
    with dg.instance_for_test() as instance:
        _decider_ticks(instance)


@pytest.mark.slow
def test_a_tick_that_reads_a_backlog_up_to_its_bound_says_its_counts_are_lower_bounds(aws, monkeypatch, capfd):
    monkeypatch.setattr(decider, "PENDING_READ_LIMIT", 3)
    put_receiver(aws, "acme", number_per_day=24, max_batch_size=2)
    put_records(aws, "acme", [T10 - dt.timedelta(minutes=m) for m in range(1, 6)])
    with dg.instance_for_test() as instance:
        context = dg.build_schedule_context(instance=instance, scheduled_execution_time=T10, resources=_resources())
        request = decider_tick(context)
    assert request.run_config["partitions"] == ["2026-11-20|acme"]
    [line] = [line for line in capfd.readouterr().err.splitlines() if "batch time(s) due" in line]
    assert "at least 3 record(s) pending, at least 2 file(s) expected" in line
    assert "more pending records than the 3 a tick reads: acme" in line


@pytest.mark.slow
def test_a_receiver_whose_pending_read_fails_is_due_and_the_others_still_get_their_run(aws, monkeypatch, capfd):
    for name in ("acme", "beta", "gamma"):
        put_receiver(aws, name, number_per_day=24)
        put_records(aws, name, [T10 - dt.timedelta(minutes=5)])

    def throttle_beta(params, **_):
        if params["ExpressionAttributeValues"].get(":r") == {"S": "beta"}:
            raise ClientError({"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}}, "Query")

    shared = clients._shared_client

    def hooked(service_name, configuration):
        client = shared(service_name, configuration)
        client.meta.events.register("provide-client-params.dynamodb.Query", throttle_beta)
        return client

    monkeypatch.setattr(clients, "_shared_client", hooked)
    with dg.instance_for_test() as instance:
        context = dg.build_schedule_context(instance=instance, scheduled_execution_time=T10, resources=_resources())
        request = decider_tick(context)
    assert sorted(request.run_config["partitions"]) == ["2026-11-20|acme", "2026-11-20|beta", "2026-11-20|gamma"]
    [line] = [line for line in capfd.readouterr().err.splitlines() if "batch time(s) due" in line]
    assert "pending not read: beta (" in line


def _decider_ticks(instance):
    context = dg.build_schedule_context(instance=instance, scheduled_execution_time=T10, resources=_resources())
    request = decider_tick(context)
    assert (request.run_key, request.run_config["partitions"]) == ("minute@2026-11-20T10:00Z", ["2026-11-20|acme"])
    assert request.partition_key is None  # a minute run is no partition's run; it reports each partition it writes
    assert "dagster/partition/receiver" not in request.tags  # Dagster's tag of a multi-partition run's receiver
    assert "acme" in instance.get_dynamic_partitions("receivers")  # added so its materialization has a partition

    quiet = dg.build_schedule_context(
        instance=instance, scheduled_execution_time=T10 + dt.timedelta(minutes=1), resources=_resources()
    )
    assert isinstance(decider_tick(quiet), dg.SkipReason)
    at_0505 = dg.build_schedule_context(
        instance=instance, scheduled_execution_time=T10 + dt.timedelta(minutes=5), resources=_resources()
    )
    assert decider_tick(at_0505).run_config["partitions"] == ["2026-11-20|globex"]  # empty, but flagged


def _materialize(instance, partition, **config):
    return BATCH_JOB.execute_in_process(
        partition_key=partition,
        instance=instance,
        run_config={"ops": {"receiver_batches": {"config": config}}} if config else None,
        raise_on_error=False,
    )


@pytest.mark.slow
def test_a_retried_step_takes_back_its_own_lease_of_the_partition(aws):
    put_receiver(aws, "acme")
    put_records(aws, "acme", [T10 - dt.timedelta(seconds=1)])
    run_id = str(uuid.uuid4())
    # the step's first try died holding the lease; its retry is the same run and partition
    owner = f"run-{run_id}:2026-11-20|acme"
    store.acquire_lease(aws.client("dynamodb"), aws.env["RECEIVERS_TABLE"], "acme", owner, 600, 0)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(receivers_partitions.name, ["acme"])
        result = BATCH_JOB.execute_in_process(
            partition_key="2026-11-20|acme",
            instance=instance,
            run_id=run_id,
            run_config={"ops": {"receiver_batches": {"config": {"lease_wait_seconds": 0}}}},
            raise_on_error=False,
        )
    assert result.success
    assert pending_ids(aws, "acme") == set()


@pytest.mark.slow
def test_materializing_a_partition_writes_files_with_metadata(aws):
    put_receiver(aws, "acme", max_batch_size=4)
    ids = put_records(aws, "acme", [T10 - dt.timedelta(seconds=s) for s in range(1, 11)])
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(receivers_partitions.name, ["acme"])

        dry = _materialize(instance, "2026-11-20|acme", dry_run=True)
        assert dry.success
        assert outbox(aws, "acme") == {}
        dry_meta = dry.asset_observations_for_node("receiver_batches")[0].metadata
        assert dry_meta["files_would_write"].value == 3
        assert dry_meta["dry_run"].value is True

        result = _materialize(instance, "2026-11-20|acme")
        assert result.success
        meta = result.asset_materializations_for_node("receiver_batches")[0].metadata
        assert meta["files_written"].value == 3
        assert sorted(meta["records_per_file"].value.values()) == [2, 4, 4]
        assert meta["records_batched"].value == 10
        assert meta["status"].value == "ok"
        assert sum(len(v) for v in outbox(aws, "acme").values()) == len(ids)


def _statuses(instance, partitions):
    status = instance.get_status_by_partition(receiver_batches.key, partitions, receiver_batches.partitions_def)
    return {k: (v.value if v is not None else None) for k, v in status.items()}


@pytest.mark.slow
def test_a_dry_run_records_an_observation_and_leaves_the_partition_status_as_it_was(aws):
    put_receiver(aws, "acme", initial_time="25:00")  # invalid: its partition fails
    put_receiver(aws, "globex")
    put_records(aws, "acme", [T10 - dt.timedelta(minutes=5)])
    put_records(aws, "globex", [T10 - dt.timedelta(minutes=5)])
    keys = ["2026-11-20|acme", "2026-11-20|globex"]
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(receivers_partitions.name, ["acme", "globex"])
        assert not _materialize(instance, keys[0]).success
        shown = {keys[0]: "FAILED", keys[1]: None}
        assert _statuses(instance, keys) == shown  # as the UI shows them
        put_receiver(aws, "acme")  # repaired
        dry = [_materialize(instance, key, dry_run=True) for key in keys]
        assert [r.success for r in dry] == [True, True]
        assert [r.asset_materializations_for_node("receiver_batches") for r in dry] == [[], []]
        assert _statuses(instance, keys) == shown
        observed = dry[0].asset_observations_for_node("receiver_batches")[0]
        assert observed.partition == keys[0]
        assert observed.metadata["files_would_write"].value == 1
        assert "files_written" not in observed.metadata
        tags = [instance.get_run_by_id(r.run_id).tags.get("groundskeeper/dry_run") for r in dry]
        assert tags == ["true", "true"]  # so that its success resolves no incident and its counts are not added up
        counts = json.loads(instance.get_run_by_id(dry[1].run_id).tags["groundskeeper/counts"])
    assert counts == {"files_would_write": 1, "records_would_batch": 1}  # a dry run counts what it would do
    assert pending_ids(aws, "acme") == {"acme-00000"}


@pytest.mark.slow
def test_invalid_or_deleted_receiver_fails_its_partition_only(aws):
    put_receiver(aws, "broken", initial_time="25:00")
    put_receiver(aws, "fine")
    put_records(aws, "fine", [T10 - dt.timedelta(minutes=1)])
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(receivers_partitions.name, ["broken", "fine", "ghost"])
        broken = _materialize(instance, "2026-11-20|broken")
        assert not broken.success
        failure = broken.get_step_failure_events()[0].step_failure_data.error
        assert "initial_time must be HH:MM" in failure.message
        assert not _materialize(instance, "2026-11-20|ghost").success
        assert _materialize(instance, "2026-11-20|fine").success
        assert pending_ids(aws, "fine") == set()


def test_asset_checks_flag_invalid_receivers_orphans_and_malformed_records(aws):
    put_receiver(aws, "ok")
    put_receiver(aws, "too-many", number_per_day=2000)
    put_receiver(aws, "mars", time_zone="Mars/Olympus_Mons")
    put_receiver(aws, "folder", time_zone="Europe")  # a folder of tzdata, not a zone
    put_records(aws, "deleted", [T10])
    no_created = {k: v for k, v in record("ok", "no-created", T10).items() if k != "created_at"}
    put_items(aws, [no_created])
    ctx = dg.build_asset_check_context(resources=_resources())

    configs = receiver_configs_valid(ctx)
    assert not configs.passed
    assert set(configs.metadata["invalid_receivers"].value) == {"too-many", "mars", "folder"}
    orphans = no_orphaned_pending_records(ctx)
    assert not orphans.passed
    assert orphans.metadata["orphaned_pending"].value == {"deleted": 1}
    malformed = pending_records_well_formed(ctx)
    assert not malformed.passed
    assert malformed.metadata["malformed_pending"].value == 1


@pytest.mark.cli
def test_backfill_partition_through_the_cli(aws, tmp_path):
    put_receiver(aws, "acme", number_per_day=4, max_batch_size=100)
    put_records(aws, "acme", [dt.datetime(2026, 11, 18, 5, tzinfo=UTC), dt.datetime(2026, 11, 18, 13, tzinfo=UTC)])
    env = aws.subprocess_env()
    env["DAGSTER_HOME"] = str(tmp_path)
    (tmp_path / "dagster.yaml").write_text("")
    # The receiver's partition, as receivers_sync would add it, in the instance the CLI will use.
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        instance.add_dynamic_partitions(receivers_partitions.name, ["acme"])
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "dagster",
            "asset",
            "materialize",
            "-m",
            "pipelines.definitions",
            "--select",
            "receiver_batches",
            "--partition",
            "2026-11-18|acme",
            "--config-json",
            # the code location's default executor is in-process: one step, no second process
            json.dumps({"ops": {"receiver_batches": {"config": {"lookback_days": 3}}}}),
        ],
        env=env,
        cwd=ROOT_DIR,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert sorted(outbox(aws, "acme")) == [
        "batches/acme/2026-11-18T06:00Z/1.jsonl",
        "batches/acme/2026-11-18T18:00Z/1.jsonl",
    ]


def test_an_out_of_range_run_config_fails_the_run_with_one_line_naming_the_key(aws):
    put_receiver(aws, "acme")
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(receivers_partitions.name, ["acme"])
    result = _materialize(instance, "2026-11-20|acme", lookback_days=10**9)  # was an OverflowError
    assert not result.success
    description = result.get_step_failure_events()[0].step_failure_data.user_failure_data.description
    assert description == "invalid run config: lookback_days must be at most 366, got 1000000000"
    assert outbox(aws, "acme") == {}


def test_a_negative_lease_wait_is_refused():
    with pytest.raises(ParamsError, match="lease_wait_seconds must be at least 0, got -1"):
        parse_params(ReceiverBatchesParams, {"lease_wait_seconds": -1})


def test_every_run_config_key_has_a_description_and_a_range():
    schema = receiver_batches.op.config_schema.config_type.fields
    assert set(schema) == {"dry_run", "lookback_days", "lease_wait_seconds"}
    for key in ("lookback_days", "lease_wait_seconds"):
        assert "Range 0 to" in schema[key].description, key
    assert schema["dry_run"].description


def test_a_record_id_holding_a_newline_stays_on_its_line_of_the_log():
    lines = LogLines()
    invalid = [{"record_id": "r-1\nforged line", "problem": "malformed created_at 'x'"}]
    _log_report(lines, RunReport("lab.elr", "2026-11-27", invalid_records=invalid))
    assert lines.messages[0] == "record r-1\\nforged line left pending: malformed created_at 'x'"
