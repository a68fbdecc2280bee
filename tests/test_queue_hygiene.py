"""Queue hygiene: one run at a time is the instance's tag concurrency limits (``dagster.yaml``); a
schedule whose run would only wait on one (a run holding the same tag value is still queued or
running) skips its tick and says which run (the fleet's queue sensors check per consumer slot)."""

from __future__ import annotations

import time
from pathlib import Path

import dagster as dg
import pytest
import yaml
from dagster._core.remote_origin import InProcessCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._core.utils import make_new_run_id

from infra.demo.definitions import build_local_definitions
from pipelines.common.defs.active_runs import ACTIVE_STATUSES
from pipelines.common.defs.schedules import ONE_AT_A_TIME_TAG
from pipelines.definitions import build_definitions
from pipelines.progressor.defs import NAMESPACE_TAG
from tests.progressor_support import local_run_limits

EXCLUSIVE = ["demo_traffic_schedule", "progressor_demo_traffic_schedule", "collect_zombies_default_default"]
ROOT = Path(__file__).resolve().parent.parent
LIMITS = local_run_limits()
"""The local instance's run concurrency (its tag concurrency limits: the one overlap rule)."""


def _run(instance: dg.DagsterInstance, job_name: str, status: dg.DagsterRunStatus, tags: dict) -> dg.DagsterRun:
    """A run record as the queue holds it (no plan: the jobs need the deployment's environment)."""
    location = InProcessCodeLocationOrigin(LoadableTargetOrigin(module_name="infra.demo.definitions"))
    origin = RemoteJobOrigin(RemoteRepositoryOrigin(location, "__repository__"), job_name)
    run = dg.DagsterRun(job_name=job_name, run_id=make_new_run_id(), status=status, tags=tags, remote_job_origin=origin)
    return instance.add_run(run)


@pytest.fixture(scope="module")
def defs():
    return build_local_definitions()


def active_run(instance: dg.DagsterInstance, job_name: str, tags: dict[str, str]):
    """The newest run of ``job_name`` (with all of ``tags``) that is still queued or running, or None."""
    runs = instance.get_runs(filters=dg.RunsFilter(job_name=job_name, statuses=ACTIVE_STATUSES, tags=tags), limit=1)
    return runs[0] if runs else None


@pytest.mark.slow
@pytest.mark.parametrize("name", EXCLUSIVE)
@pytest.mark.parametrize(  # Dagster's run queue counts a run being cancelled against the limits, as a queued one
    ("status", "still"), [(dg.DagsterRunStatus.QUEUED, "queued"), (dg.DagsterRunStatus.CANCELING, "being cancelled")]
)
def test_a_schedule_skips_while_its_previous_run_is_queued_or_being_cancelled_and_launches_after(
    defs, name, status, still
):
    schedule = defs.resolve_schedule_def(name)
    job = defs.resolve_job_def(schedule.job_name)
    with dg.instance_for_test(overrides=LIMITS) as instance:
        [first] = schedule.evaluate_tick(dg.build_schedule_context(instance=instance)).run_requests
        run = _run(instance, job.name, status, {**job.tags, **first.tags})  # as launched
        busy = schedule.evaluate_tick(dg.build_schedule_context(instance=instance))
        assert not busy.run_requests
        assert busy.skip_message == f"the previous {job.name} run {run.run_id} is still {still}: not queueing another"
        instance.report_run_failed(run)
        [again] = schedule.evaluate_tick(dg.build_schedule_context(instance=instance)).run_requests
        assert again.tags == first.tags


def test_a_started_run_is_running_and_a_run_of_another_namespace_does_not_count(defs):
    schedule = defs.resolve_schedule_def("collect_zombies_default_default")
    job = defs.resolve_job_def(schedule.job_name)
    with dg.instance_for_test(overrides=LIMITS) as instance:
        _run(instance, job.name, dg.DagsterRunStatus.STARTED, {NAMESPACE_TAG: "other/ns"})
        assert len(schedule.evaluate_tick(dg.build_schedule_context(instance=instance)).run_requests) == 1
        assert active_run(instance, job.name, {NAMESPACE_TAG: "default/default"}) is None
        mine = _run(instance, job.name, dg.DagsterRunStatus.STARTED, {NAMESPACE_TAG: "default/default"})
        busy = schedule.evaluate_tick(dg.build_schedule_context(instance=instance))
        assert f"{mine.run_id} is still running" in busy.skip_message


def test_loading_the_definitions_shows_no_beta_or_preview_warning():
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.filterwarnings("always", append=True)  # after the package's own filters
        build_definitions("local")
        build_definitions("prod")
    noisy = [str(w.message) for w in caught if type(w.message).__name__ in ("BetaWarning", "PreviewWarning")]
    assert noisy == []


@pytest.mark.slow
def test_the_batch_decider_skips_its_tick_while_the_previous_minute_run_is_queued_not_while_it_runs(aws):
    import datetime as dt

    from pipelines.batching.defs import MINUTE_JOB
    from resources import resources_for
    from tests.batching_helpers import decider_tick, put_receiver, put_records

    t10 = dt.datetime(2026, 11, 20, 10, 0, tzinfo=dt.UTC)
    for name in ("acme", "globex"):
        put_receiver(aws, name, number_per_day=24)
        put_records(aws, name, [t10 - dt.timedelta(minutes=1)])
    with dg.instance_for_test() as instance:

        def tick():
            context = dg.build_schedule_context(
                instance=instance, scheduled_execution_time=t10, resources=resources_for("local")
            )
            return decider_tick(context)

        ticked = {"dagster/schedule_name": "batch_decider"}  # its own runs: a handoff's re-run holds no tick
        running = _run(instance, MINUTE_JOB, dg.DagsterRunStatus.STARTED, ticked)
        assert tick().run_config["partitions"] == ["2026-11-20|acme", "2026-11-20|globex"]  # the lease keeps them apart
        instance.report_run_canceled(running)
        queued = _run(instance, MINUTE_JOB, dg.DagsterRunStatus.QUEUED, ticked)
        skipped = tick()
        assert isinstance(skipped, dg.SkipReason)
        assert f"the previous minute run {queued.run_id} is still queued" in skipped.skip_message


def test_a_hand_launched_demo_run_holds_the_schedule_too(defs):
    """The rule is the run's tag, which the job itself carries: a run launched from the Launchpad
    (no schedule, no request tags) makes the schedule skip as well."""
    schedule = defs.resolve_schedule_def("demo_traffic_schedule")
    job = defs.resolve_job_def(schedule.job_name)
    with dg.instance_for_test(overrides=LIMITS) as instance:
        run = _run(instance, job.name, dg.DagsterRunStatus.STARTED, dict(job.tags))
        busy = schedule.evaluate_tick(dg.build_schedule_context(instance=instance))
    assert busy.skip_message == f"the previous demo_traffic run {run.run_id} is still running: not queueing another"


def test_every_one_at_a_time_tag_has_its_limit_in_every_instance():
    keys = {"groundskeeper/queue", "groundskeeper/table", "groundskeeper/progressor_namespace", ONE_AT_A_TIME_TAG}
    for name in ("dagster.yaml", "infra/dagster.prod.yaml", "infra/dagster.ecs.yaml", "infra/dagster.cluster.yaml"):
        config = yaml.safe_load((ROOT / name).read_text())
        runs = config["concurrency"]["runs"] if "concurrency" in config else config["run_coordinator"]["config"]
        limits = runs["tag_concurrency_limits"]
        one = {lim["key"] for lim in limits if lim["limit"] == 1 and lim["value"] == {"applyLimitPerUniqueValue": True}}
        assert keys <= one, name


def test_a_drain_leaves_the_run_queue_before_a_batching_backlog_which_keeps_to_its_own_slots(defs):
    """Dagster's own dequeue (one pass of the daemon's run queue) over the instance dagster.yaml
    configures, the runs tagged as the code location's jobs tag them."""
    from pathlib import Path

    import yaml
    from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import QueuedRunCoordinatorDaemon

    from pipelines.definitions import ROOT_DIR

    def queue(instance, job_name: str, n: int = 1) -> list[str]:
        tags = dict(defs.resolve_job_def(job_name).tags)
        return [_run(instance, job_name, dg.DagsterRunStatus.QUEUED, tags).run_id for _ in range(n)]

    config = yaml.safe_load((Path(ROOT_DIR) / "dagster.yaml").read_text())
    with dg.instance_for_test(overrides={"concurrency": config["concurrency"]}) as instance:
        minutes = queue(instance, "batch_minute_job", 6)
        partitions = queue(instance, "receiver_batches_job", 6)
        [drain] = queue(instance, "process_termination_queue")
        daemon = QueuedRunCoordinatorDaemon(interval_seconds=2)
        picked = [r.run_id for r in daemon._get_runs_to_dequeue(instance, instance.get_concurrency_config(), None)]
    assert picked[0] == drain
    assert len([r for r in picked if r in minutes]) == 2
    assert len([r for r in picked if r in partitions]) == 2


def test_a_backfill_takes_at_most_four_run_slots_though_its_runs_carry_no_job_tags():
    """A redrive's backfill, or one launched from an asset's page, runs as ``__ASSET_JOB``: no job's tags."""
    from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import QueuedRunCoordinatorDaemon

    config = yaml.safe_load((ROOT / "dagster.yaml").read_text())
    tags = {"dagster/backfill": "abcdefgh", "groundskeeper/capability": "redrive"}
    with dg.instance_for_test(overrides={"concurrency": config["concurrency"]}) as instance:
        for _ in range(6):
            _run(instance, "__ASSET_JOB", dg.DagsterRunStatus.QUEUED, tags)
        daemon = QueuedRunCoordinatorDaemon(interval_seconds=2)
        picked = daemon._get_runs_to_dequeue(instance, instance.get_concurrency_config(), None)
    assert len(picked) == 4


@pytest.mark.parametrize(("status", "requests"), [("REQUESTED", [{"dagster/backfill": "bf1"}]), ("CANCELED", [])])
def test_a_retry_of_a_backfills_run_is_held_by_its_limit_while_it_goes_on_and_none_once_cancelled(
    tmp_path, status, requests
):
    """As Dagster's own re-execution: the backfill's tag (its run-queue limit) while the backfill goes on."""
    from dagster._core.execution.backfill import BulkActionStatus, PartitionBackfill

    from tests.test_retry_dagster import _first_failure, _tick

    policy = {"kind": "fixed", "delay": 0, "maxAttempts": 3}
    with dg.instance_for_test() as instance:
        sensor, defs, _ = _first_failure(instance, tmp_path, policy, 9, **{"dagster/backfill": "bf1"})
        backfill = PartitionBackfill(
            backfill_id="bf1",
            status=BulkActionStatus[status],
            from_failure=False,
            tags={},
            backfill_timestamp=time.time(),
            asset_selection=[dg.AssetKey("x")],
            partition_names=None,
            partition_set_origin=None,
            last_submitted_partition_name=None,
            reexecution_steps=None,
            serialized_asset_backfill_data=None,
        )
        instance.add_backfill(backfill)
        data, _ = _tick(sensor, instance, defs, None)
    assert [{k: v for k, v in r.tags.items() if k == "dagster/backfill"} for r in data.run_requests] == requests
