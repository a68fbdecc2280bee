"""redrive_failed_partitions: relaunches exactly the failed partitions, bounded, with a report."""

import datetime as dt
import json
import logging
from pathlib import Path

import dagster as dg
import pytest
import yaml

from pipelines.common import iso
from pipelines.common.params import ParamsError, parse_params
from pipelines.definitions import ROOT_DIR, build_definitions
from pipelines.redrive.params import RedriveParams
from pipelines.redrive.plan import FAILED, GONE, IN_PROGRESS, MISSING, plan
from pipelines.retry.tags import POLICY_TAG
from resources import resources_for
from tests.batching_helpers import put_receiver, put_records

DEFS = build_definitions("local")
BATCH_JOB = DEFS.resolve_job_def("receiver_batches_job")
REDRIVE_JOB = DEFS.resolve_job_def("redrive_failed_partitions")
T10 = dt.datetime(2026, 11, 20, 10, 0, tzinfo=dt.UTC)


def test_plan_takes_failed_then_missing_up_to_max_runs():
    states = {"b": FAILED, "a": FAILED, "m": MISSING, "p": IN_PROGRESS, "g": GONE}
    out = plan(states, RedriveParams(include_missing=True, max_runs=2, dry_run=False))
    assert [(o.partition, o.outcome) for o in out] == [
        ("a", "launched"),
        ("b", "launched"),
        ("m", "skipped"),
        ("p", "skipped"),
        ("g", "skipped"),
    ]
    assert out[2].detail == "over max_runs (2)"
    only_failed = plan(states, RedriveParams(include_missing=False, max_runs=5, dry_run=True))
    assert [(o.partition, o.outcome) for o in only_failed if o.outcome != "skipped"] == [
        ("a", "would_launch"),
        ("b", "would_launch"),
    ]
    assert "m" not in {o.partition for o in only_failed}


def test_params_are_bounded():
    with pytest.raises(ParamsError, match="max_runs"):
        parse_params(RedriveParams, {"max_runs": 0})
    with pytest.raises(ParamsError, match="asset must name"):
        parse_params(RedriveParams, {"asset": "/"})


def _redrive(instance, **config):
    return REDRIVE_JOB.execute_in_process(
        run_config=config, instance=instance, resources=resources_for("local"), raise_on_error=False
    )


@pytest.mark.slow
def test_redrive_relaunches_exactly_the_failed_partitions(aws):
    put_receiver(aws, "broken", initial_time="25:00")  # an invalid receiver: its partitions fail
    put_receiver(aws, "fine")
    put_records(aws, "fine", [T10 - dt.timedelta(minutes=1)])
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("receivers", ["broken", "fine", "ghost"])
        runs = {
            key: BATCH_JOB.execute_in_process(
                partition_key=key, instance=instance, resources=resources_for("local"), raise_on_error=False
            ).success
            for key in ("2026-11-19|broken", "2026-11-20|broken", "2026-11-20|ghost", "2026-11-20|fine")
        }
        assert runs == {
            "2026-11-19|broken": False,
            "2026-11-20|broken": False,
            "2026-11-20|ghost": False,
            "2026-11-20|fine": True,
        }
        result = _redrive(instance, asset="receiver_batches", since_hours=1, max_runs=2)
        assert result.success
        [backfill] = instance.get_backfills()
        assert backfill.tags["groundskeeper/redrive"] == result.run_id
        targeted = {str(p.partition_key) for p in backfill.asset_backfill_data.target_subset.iterate_asset_partitions()}
        assert targeted == {"2026-11-19|broken", "2026-11-20|broken"}  # bounded: ghost waits for the next redrive

        [output] = [e for e in result.all_events if e.event_type_value == "STEP_OUTPUT"]
        table = output.event_specific_data.metadata["partitions"]
        assert isinstance(table, dg.TableMetadataValue)
        rows = {r.data["partition"]: (r.data["state"], r.data["outcome"]) for r in table.records}
        assert rows == {
            "2026-11-19|broken": ("failed", "launched"),
            "2026-11-20|broken": ("failed", "launched"),
            "2026-11-20|ghost": ("failed", "skipped"),
        }
        body = (
            aws.client("s3")
            .get_object(
                Bucket=aws.env["RUNS_FLEET_ARCHIVE_BUCKET"], Key=f"redrives/receiver_batches/{result.run_id}.json"
            )["Body"]
            .read()
        )
        report = json.loads(body)
        assert report["backfill_id"] == backfill.backfill_id
        assert report["counts"] == {"launched": 2, "would_launch": 0, "skipped": 1}
        assert {p["partition"] for p in report["partitions"]} == set(rows)

        # The receiver is fixed and its partitions succeed; the deleted one is reported, not launched.
        put_receiver(aws, "broken")
        for key in ("2026-11-19|broken", "2026-11-20|broken"):
            BATCH_JOB.execute_in_process(partition_key=key, instance=instance, resources=resources_for("local"))
        instance.delete_dynamic_partition("receivers", "ghost")
        dry = _redrive(instance, since_hours=1, dry_run=True)
        [output] = [e for e in dry.all_events if e.event_type_value == "STEP_OUTPUT"]
        rows = {
            r.data["partition"]: r.data["outcome"] for r in output.event_specific_data.metadata["partitions"].records
        }
        assert rows == {"2026-11-20|ghost": "skipped"}
        assert len(instance.get_backfills()) == 1


def test_an_unpartitioned_or_unknown_asset_fails_with_one_line(aws):
    with dg.instance_for_test() as instance:
        result = _redrive(instance, asset="no_such_asset")
        assert not result.success
        message = result.get_step_failure_events()[0].step_failure_data.error.message
        assert "asset 'no_such_asset' is not a partitioned asset here; one of:" in message
        assert "receiver_batches" in message


@pytest.mark.slow
def test_the_daemon_turns_a_redrive_into_asset_only_runs_of_exactly_those_partitions(aws):
    """One pass of the daemon's backfill loop over the code location (in a code server, as under
    ``make dev``): the runs are what a UI backfill of receiver_batches launches too."""
    from dagster._core.test_utils import create_test_daemon_workspace_context
    from dagster._core.workspace.load_target import ModuleTarget
    from dagster._daemon.backfill import execute_backfill_iteration

    put_receiver(aws, "broken", initial_time="25:00")
    put_receiver(aws, "fine")
    launcher = {"module": "dagster._core.test_utils", "class": "MockedRunLauncher"}  # create runs, run nothing
    with dg.instance_for_test(overrides={"run_launcher": launcher}) as instance:
        instance.add_dynamic_partitions("receivers", ["broken", "fine"])
        for key in ("2026-11-20|broken", "2026-11-20|fine"):
            BATCH_JOB.execute_in_process(
                partition_key=key, instance=instance, resources=resources_for("local"), raise_on_error=False
            )
        redrive = _redrive(instance, since_hours=1)
        assert redrive.success
        target = ModuleTarget(
            module_name="pipelines.definitions",
            attribute="defs",
            working_directory=str(ROOT_DIR),
            location_name="groundskeeper",
        )
        with create_test_daemon_workspace_context(target, instance) as workspace:
            list(execute_backfill_iteration(workspace, logging.getLogger("test_redrive")))
        [run] = instance.get_runs(dg.RunsFilter(tags={"groundskeeper/redrive": redrive.run_id}))
        assert run.job_name == "__ASSET_JOB"
        assert run.tags["dagster/partition"] == "2026-11-20|broken"
        assert run.asset_selection == {dg.AssetKey("receiver_batches")}
        plan = instance.get_execution_plan_snapshot(run.execution_plan_snapshot_id)
        assert [step.key for step in plan.steps] == ["receiver_batches"]  # no asset check rides along


@pytest.mark.slow
def test_two_redrives_back_to_back_launch_each_partition_once(aws):
    """No daemon between the two: the first backfill's runs do not exist yet, and the second
    redrive sees the partitions in that unfinished backfill and leaves them to it."""
    put_receiver(aws, "broken", initial_time="25:00")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("receivers", ["broken"])
        for key in ("2026-11-19|broken", "2026-11-20|broken"):
            BATCH_JOB.execute_in_process(
                partition_key=key, instance=instance, resources=resources_for("local"), raise_on_error=False
            )
        first = _redrive(instance, since_hours=1)
        second = _redrive(instance, since_hours=1)
        assert first.success
        assert second.success
        [backfill] = instance.get_backfills()
        assert backfill.tags["groundskeeper/redrive"] == first.run_id
        [output] = [e for e in second.all_events if e.event_type_value == "STEP_OUTPUT"]
        rows = {
            r.data["partition"]: (r.data["state"], r.data["outcome"], r.data["detail"])
            for r in output.event_specific_data.metadata["partitions"].records
        }
        detail = f"backfill {backfill.backfill_id} has not finished it yet"
        assert rows == {
            "2026-11-19|broken": ("in_backfill", "skipped", detail),
            "2026-11-20|broken": ("in_backfill", "skipped", detail),
        }
        assert second.output_for_node("find_and_relaunch")["backfill_id"] == ""


def test_a_job_backfill_not_yet_launched_keeps_its_partitions_from_the_redrive(aws):
    """``dagster job backfill -j receiver_batches_job`` (the operator guide's missed-batch recovery): its runs
    do not exist until the daemon submits them, and the redrive must not launch the partition too."""
    from dagster._core.execution.backfill import BulkActionStatus, PartitionBackfill
    from dagster._core.remote_origin import (
        InProcessCodeLocationOrigin,
        RemotePartitionSetOrigin,
        RemoteRepositoryOrigin,
    )
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

    put_receiver(aws, "broken", initial_time="25:00")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("receivers", ["broken"])
        BATCH_JOB.execute_in_process(
            partition_key="2026-11-20|broken", instance=instance, resources=resources_for("local"), raise_on_error=False
        )
        location = InProcessCodeLocationOrigin(
            loadable_target_origin=LoadableTargetOrigin(module_name="pipelines.definitions"),
            location_name="groundskeeper",
        )
        origin = RemotePartitionSetOrigin(
            repository_origin=RemoteRepositoryOrigin(code_location_origin=location, repository_name="__repository__"),
            partition_set_name="receiver_batches_job_partition_set",
        )
        job_backfill = PartitionBackfill(
            backfill_id="jobbf",
            partition_set_origin=origin,
            status=BulkActionStatus.REQUESTED,
            partition_names=["2026-11-20|broken"],
            from_failure=False,
            reexecution_steps=None,
            tags={},
            backfill_timestamp=0.0,
        )
        instance.add_backfill(job_backfill)
        result = _redrive(instance, since_hours=1)
        [output] = [e for e in result.all_events if e.event_type_value == "STEP_OUTPUT"]
        rows = {
            r.data["partition"]: (r.data["state"], r.data["outcome"])
            for r in output.event_specific_data.metadata["partitions"].records
        }
        backfills = [b.backfill_id for b in instance.get_backfills()]
    assert rows == {"2026-11-20|broken": ("in_backfill", "skipped")}
    assert backfills == ["jobbf"]


@pytest.mark.slow
def test_a_run_not_started_yet_of_a_failed_partition_is_not_relaunched(aws):
    put_receiver(aws, "broken", initial_time="25:00")
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("receivers", ["broken"])
        BATCH_JOB.execute_in_process(
            partition_key="2026-11-20|broken", instance=instance, resources=resources_for("local"), raise_on_error=False
        )
        instance.create_run_for_job(
            BATCH_JOB, status=dg.DagsterRunStatus.NOT_STARTED, tags={"dagster/partition": "2026-11-20|broken"}
        )
        result = _redrive(instance, since_hours=1)
        assert result.success
        assert instance.get_backfills() == []
        [output] = [e for e in result.all_events if e.event_type_value == "STEP_OUTPUT"]
        rows = {
            r.data["partition"]: (r.data["state"], r.data["outcome"])
            for r in output.event_specific_data.metadata["partitions"].records
        }
        assert rows == {"2026-11-20|broken": ("in_progress", "skipped")}


@pytest.mark.slow
def test_a_failed_partition_whose_retry_is_due_is_left_to_that_retry(aws):
    """delayed_run_retries relaunches the failed run when its delay is past: a redrive would launch it twice."""
    put_receiver(aws, "broken", initial_time="25:00")
    policy = '{"kind": "fixed", "delay": 600, "maxAttempts": 3}'
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions("receivers", ["broken"])
        failed = BATCH_JOB.execute_in_process(
            partition_key="2026-11-20|broken",
            instance=instance,
            resources=resources_for("local"),
            tags={POLICY_TAG: policy},
            raise_on_error=False,
        )
        ended = instance.get_run_record_by_id(failed.run_id).end_time
        result = _redrive(instance, since_hours=1)
        assert result.success
        assert instance.get_backfills() == []
        [output] = [e for e in result.all_events if e.event_type_value == "STEP_OUTPUT"]
        rows = {
            r.data["partition"]: (r.data["state"], r.data["outcome"], r.data["detail"])
            for r in output.event_specific_data.metadata["partitions"].records
        }
    due = iso(dt.datetime.fromtimestamp(ended + 600, dt.UTC))
    assert rows == {"2026-11-20|broken": ("failed", "skipped", f"a retry is due at {due}")}


INSTANCE_FILES = ("dagster.yaml", "infra/dagster.prod.yaml", "infra/dagster.ecs.yaml", "infra/dagster.cluster.yaml")


def _tag_limits(path: str) -> list[dict]:
    config = yaml.safe_load((Path(ROOT_DIR) / path).read_text())
    runs = config.get("concurrency", {}).get("runs", {})
    return runs.get("tag_concurrency_limits") or config["run_coordinator"]["config"]["tag_concurrency_limits"]


@pytest.mark.parametrize("path", INSTANCE_FILES)
def test_two_redrives_queued_together_run_one_at_a_time(path):
    """The run queue's pass over two queued redrive runs (launched at the same instant): the first is
    dequeued, the second waits for it (and then re-reads the partitions, see the back-to-back test)."""
    from dagster._utils.tags import TagConcurrencyLimitsCounter

    first, second = (dg.DagsterRun(job_name=REDRIVE_JOB.name, tags=REDRIVE_JOB.tags) for _ in range(2))
    counter = TagConcurrencyLimitsCounter(_tag_limits(path), [])
    assert not counter.is_blocked(first)
    counter.update_counters_with_launched_item(first)
    assert counter.is_blocked(second)


def test_a_redrive_without_its_exclusive_tag_fails_with_one_line(aws):
    with dg.instance_for_test() as instance:
        result = REDRIVE_JOB.execute_in_process(
            run_config={},
            instance=instance,
            resources=resources_for("local"),
            tags={"groundskeeper/one_at_a_time": "mine"},
            raise_on_error=False,
        )
        assert instance.get_backfills() == []
    message = result.get_step_failure_events()[0].step_failure_data.error.message
    assert "run tag groundskeeper/one_at_a_time must be 'redrive_failed_partitions'" in message
