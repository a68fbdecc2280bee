"""Backfills of receiver_batches: the asset alone in one process, the day range, receivers by hand."""

import datetime as dt

import dagster as dg
import pytest

from pipelines.batching.defs import receiver_batches, receivers_partitions, receivers_sync
from pipelines.batching.params import batch_start_date
from pipelines.definitions import build_definitions
from resources import resources_for
from tests.batching_helpers import pending_ids, put_receiver, put_records

DEFS = build_definitions("local")
T10 = dt.datetime(2026, 11, 20, 10, 0, tzinfo=dt.UTC)


def _backfill_run_job():
    """The job a UI backfill of receiver_batches runs: the asset backfill daemon names no job, so
    each run is the code location's implicit ``__ASSET_JOB``, subset to the asset with no check
    selection, which Dagster expands to every check of the selected assets."""
    return DEFS.resolve_implicit_global_asset_job_def().get_subset(asset_selection={receiver_batches.key})


@pytest.mark.slow
def test_a_ui_backfill_runs_the_asset_alone_in_process(aws):
    graph = DEFS.resolve_asset_graph()
    assert graph.get_check_keys_for_assets({receiver_batches.key}) == set()
    assert {c.name for c in graph.get_check_keys_for_assets({dg.AssetKey("receiver_records")})} == {
        "receiver_configs_valid",
        "no_orphaned_pending_records",
        "pending_records_well_formed",
    }
    job = _backfill_run_job()
    assert job.name == "__ASSET_JOB"
    assert job.executor_def is dg.in_process_executor
    assert [n.name for n in job.graph.nodes] == ["receiver_batches"]

    put_receiver(aws, "fine")
    put_records(aws, "fine", [T10 - dt.timedelta(minutes=1)])
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(receivers_partitions.name, ["fine"])
        result = job.execute_in_process(
            partition_key="2026-11-20|fine", instance=instance, resources=resources_for("local")
        )
        assert result.get_asset_check_evaluations() == []
        assert [e.step_key for e in result.get_step_success_events()] == ["receiver_batches"]
    assert pending_ids(aws, "fine") == set()


@pytest.mark.slow
def test_a_run_tagged_with_its_partition_alone_batches_that_receiver_and_day(aws):
    # `dagster job launch --tags '{"dagster/partition": ...}'` or GraphQL without the dimension tags the UI adds
    put_receiver(aws, "tagged")
    put_records(aws, "tagged", [T10 - dt.timedelta(minutes=1)])
    job = DEFS.resolve_job_def("receiver_batches_job")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(receivers_partitions.name, ["tagged"])
        job.execute_in_process(
            tags={"dagster/partition": "2026-11-20|tagged"}, instance=instance, resources=resources_for("local")
        )
    assert pending_ids(aws, "tagged") == set()


def test_the_checks_run_in_their_own_job():
    job = DEFS.resolve_job_def("batching_checks_job")
    assert {n.name.removeprefix("receiver_records_") for n in job.graph.nodes} == {
        "receiver_configs_valid",
        "no_orphaned_pending_records",
        "pending_records_well_formed",
    }
    assert DEFS.resolve_schedule_def("batching_checks_schedule").job_name == "batching_checks_job"


def test_the_day_partitions_start_a_month_or_two_back_unless_fixed():
    today = dt.date(2026, 11, 22)
    assert batch_start_date({}, today) == "2026-10-01"  # 30 days back is 2026-10-23
    assert batch_start_date({}, dt.date(2026, 11, 30)) == "2026-10-01"
    assert batch_start_date({}, dt.date(2026, 12, 1)) == "2026-11-01"  # moves on the 1st only
    assert batch_start_date({"BATCH_PARTITIONS_LOOKBACK_DAYS": "90"}, today) == "2026-08-01"
    assert batch_start_date({"BATCH_PARTITIONS_START_DATE": "2026-03-04"}, today) == "2026-03-04"
    # An invalid value counts as unset (the batching settings fail its runs with the line: test_settings_env).
    assert batch_start_date({"BATCH_PARTITIONS_START_DATE": "yesterday"}, today) == "2026-10-01"
    assert batch_start_date({"BATCH_PARTITIONS_LOOKBACK_DAYS": "0"}, today) == "2026-10-01"


@pytest.mark.slow
def test_a_receiver_added_by_hand_fails_with_one_line_and_the_sync_removes_it(aws):
    put_receiver(aws, "acme")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(receivers_partitions.name, ["acme", "typo"])  # "Add a partition"
        result = _backfill_run_job().execute_in_process(
            partition_key="2026-11-20|typo", instance=instance, resources=resources_for("local"), raise_on_error=False
        )
        assert not result.success
        message = result.get_step_failure_events()[0].step_failure_data.error.message
        assert "receiver 'typo' is not in" in message
        assert "receivers_sync removes" in message
        assert "\n" not in message.strip()

        sync = receivers_sync(dg.build_sensor_context(instance=instance, resources=resources_for("local")))
        [delete] = sync.dynamic_partitions_requests
        assert isinstance(delete, dg.DeleteDynamicPartitionsRequest)
        assert list(delete.partition_keys) == ["typo"]
