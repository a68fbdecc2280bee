"""Schedules that look before they launch a run (``pipelines.common.defs.schedules``): each skips its tick,
saying why, when the run would do nothing, and launches the run when there is work (or, for the
checks and the pool audit, when what they record changed or is old)."""

import ast
import datetime as dt
import uuid
from pathlib import Path

import dagster as dg
import pytest

from infra.demo.definitions import build_local_definitions
from pipelines.common import iso, to_item
from pipelines.common.defs.schedules import LOOK_TAG, ONE_AT_A_TIME_TAG, SCHEDULE_TAG, schedule
from pipelines.common.looks import Look
from pipelines.definitions import build_definitions
from pipelines.fleet import messages
from pipelines.fleet.messages import HousekeepingRequest
from pipelines.fleet.tasks import orphaned_instances, stale_ssm
from pipelines.fleet.tasks.orphaned_instances import SUSPECT_TAG
from resources import resources_for
from tests import fleet_support as fs
from tests.batching_helpers import put_receiver
from tests.progressor_support import local_run_limits

ROOT = Path(__file__).resolve().parent.parent

DLQ = "RUNS_FLEET_TERMINATION_DLQ_URL"
LIMITS = local_run_limits()
"""The local instance's run concurrency (its tag concurrency limits, as in every instance config)."""


@pytest.fixture
def defs(aws):
    return build_definitions("prod")  # the production cadences, resources from the test's moto


def _tick(defs, name: str, instance=None, at: dt.datetime | None = None):
    schedule = defs.resolve_schedule_def(name)
    context = dg.build_schedule_context(
        instance=instance,
        resources=resources_for("local"),
        scheduled_execution_time=at or dt.datetime.now(dt.UTC).replace(second=0, microsecond=0),
    )
    return schedule.evaluate_tick(context)


def _started(instance, job_name: str, tags: dict) -> dg.DagsterRun:
    """A run of ``job_name`` with ``tags`` that is still running (its process held at its step)."""
    return instance.add_run(
        dg.DagsterRun(job_name=job_name, run_id=str(uuid.uuid4()), status=dg.DagsterRunStatus.STARTED, tags=tags)
    )


def _run(defs, job_name: str, instance, request: dg.RunRequest) -> None:
    """The run a tick asked for, as the daemon would launch it (its tags, in the instance); raises if it fails."""
    defs.resolve_job_def(job_name).execute_in_process(
        instance=instance, tags=request.tags, resources=resources_for("local")
    )


# ---------------------------------------------------------------- housekeeping: work looks


def _drop_job(aws, job: dict) -> None:
    """The instance keeps running without its job: an orphan."""
    aws.client("dynamodb").delete_item(TableName=aws.env["RUNS_FLEET_JOBS_TABLE"], Key={"job_id": {"S": job["job_id"]}})


def test_orphaned_instances_skips_when_no_instance_is_old_enough_and_runs_when_one_is_orphaned(aws, defs, monkeypatch):
    name = "housekeeping_orphaned_instances_schedule"
    fs.start_jobs(aws, 1)  # a young managed instance with a running job
    idle = _tick(defs, name)
    assert idle.run_requests == []
    assert "no managed instance launched before" in idle.skip_message
    assert "(1 running or pending)" in idle.skip_message

    # Seven hours on: the instance is past max_runtime (6 h) + 10 min, but its job still runs.
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=7)
    monkeypatch.setattr(messages, "utcnow", lambda: later)
    busy = _tick(defs, name)
    assert busy.run_requests == []
    assert "none to tag, untag or terminate" in busy.skip_message

    # An instance without a running job is an orphan: the run tags it.
    (orphan,) = fs.start_jobs(aws, 1)
    _drop_job(aws, orphan)
    (request,) = _tick(defs, name).run_requests
    assert request.run_config["task_type"] == "orphaned_instances"
    assert request.tags[SCHEDULE_TAG] == name
    # the runs list shows these and the run's counts: at most 3 tags (Dagster's own are hidden)
    shown = {k for k in {**defs.resolve_job_def("housekeeping").tags, **request.tags} if not k.startswith("dagster/")}
    assert shown == {"groundskeeper/capability", ONE_AT_A_TIME_TAG}


def test_orphaned_instances_runs_for_a_suspect_that_is_due_for_termination(aws, defs, monkeypatch):
    (job,) = fs.start_jobs(aws, 1)
    _drop_job(aws, job)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=7)
    aws.client("ec2").create_tags(
        Resources=[job["instance_id"]], Tags=[{"Key": SUSPECT_TAG, "Value": iso(later - dt.timedelta(minutes=1))}]
    )
    monkeypatch.setattr(messages, "utcnow", lambda: later)
    waiting = _tick(defs, "housekeeping_orphaned_instances_schedule")
    assert "1 suspect(s) waiting for their confirmation" in waiting.skip_message
    monkeypatch.setattr(messages, "utcnow", lambda: later + dt.timedelta(minutes=10))
    (request,) = _tick(defs, "housekeeping_orphaned_instances_schedule").run_requests
    assert request.run_config["task_type"] == "orphaned_instances"


def test_orphaned_instances_past_its_query_bound_runs_when_the_candidates_change_and_at_least_every_30_minutes(
    aws, defs, monkeypatch
):
    """Long jobs still running keep more candidates than the look queries: a run at every tick would change nothing."""
    name = "housekeeping_orphaned_instances_schedule"
    monkeypatch.setattr(orphaned_instances, "LOOK_MAX_QUERIES", 2)
    first_job, *_ = fs.start_jobs(aws, 3)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=7)
    monkeypatch.setattr(messages, "utcnow", lambda: later)
    with dg.instance_for_test() as instance:
        (first,) = _tick(defs, name, instance).run_requests
        defs.resolve_job_def("housekeeping").execute_in_process(
            run_config=first.run_config, instance=instance, tags=first.tags, resources=resources_for("local")
        )
        same = _tick(defs, name, instance)
        assert same.run_requests == []
        assert "3 managed instances launched before" in same.skip_message
        in_30_minutes = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=30)
        assert len(_tick(defs, name, instance, at=in_30_minutes).run_requests) == 1
        aws.client("ec2").create_tags(
            Resources=[first_job["instance_id"]], Tags=[{"Key": SUSPECT_TAG, "Value": iso(later)}]
        )
        in_5_minutes = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=5)
        assert len(_tick(defs, name, instance, at=in_5_minutes).run_requests) == 1


def test_stale_ssm_skips_while_every_parameter_has_its_instance_and_runs_for_a_gone_one(aws, defs, monkeypatch):
    name = "housekeeping_stale_ssm_schedule"
    none = _tick(defs, name)
    assert none.run_requests == []
    assert "no runner parameters" in none.skip_message
    fs.start_jobs(aws, 2)
    live = _tick(defs, name)
    assert "2 instance(s) with runner parameters, none gone" in live.skip_message
    aws.client("ssm").put_parameter(Name="/runs-fleet/runners/i-00000000000000001/config", Type="String", Value="{}")
    assert _tick(defs, name).run_requests == []  # written just now: EC2 may not describe its instance yet
    fs.past_stale_ssm_grace(monkeypatch)
    (request,) = _tick(defs, name).run_requests
    assert request.run_config == {"task_type": "stale_ssm", "timestamp": request.run_config["timestamp"], "params": {}}


LAST_RUNNER = "/runs-fleet/runners/i-fffffffffffffffff/config"
"""A runner parameter whose instance never existed, read last (after every other runner's)."""


def test_stale_ssm_skips_for_a_fleet_of_120_live_runners(aws, defs):
    fs.start_jobs(aws, 120)  # 12 pages of runner parameters, every instance running
    assert _tick(defs, "housekeeping_stale_ssm_schedule").run_requests == []


def test_stale_ssm_runs_for_a_gone_instance_on_the_last_page_of_120_runners(aws, defs, monkeypatch):
    fs.start_jobs(aws, 120)
    aws.client("ssm").put_parameter(Name=LAST_RUNNER, Type="String", Value="{}")
    fs.past_stale_ssm_grace(monkeypatch)
    pages = (
        aws.client("ssm").get_paginator("get_parameters_by_path").paginate(Path="/runs-fleet/runners", Recursive=True)
    )
    assert LAST_RUNNER in [p["Name"] for p in list(pages)[-1]["Parameters"]]
    (request,) = _tick(defs, "housekeeping_stale_ssm_schedule").run_requests
    assert request.run_config["task_type"] == "stale_ssm"


def test_stale_ssm_look_is_due_past_its_page_bound_and_says_so(aws, monkeypatch):
    monkeypatch.setattr(stale_ssm, "LOOK_MAX_PAGES", 2)
    fs.start_jobs(aws, 25)  # 3 pages, every instance running
    request = HousekeepingRequest(task_type="stale_ssm", timestamp=iso(dt.datetime.now(dt.UTC)))
    look = stale_ssm.look_stale_ssm(fs.context(aws), request, stale_ssm.StaleSsmParams())
    assert look.reason.startswith("more than 2 pages of runner parameters, the look's bound")


def test_old_jobs_skips_when_no_finished_job_is_past_the_retention_and_runs_when_one_is(aws, defs):
    name = "housekeeping_old_jobs_schedule"
    table = aws.env["RUNS_FLEET_JOBS_TABLE"]
    now = dt.datetime.now(dt.UTC)
    recent = {"job_id": "recent", "status": "completed", "completed_at": iso(now - dt.timedelta(days=1))}
    aws.client("dynamodb").put_item(TableName=table, Item=to_item(recent))
    idle = _tick(defs, name)
    assert idle.run_requests == []
    assert "no finished job completed before" in idle.skip_message
    old = {"job_id": "old", "status": "timeout", "completed_at": iso(now - dt.timedelta(days=8))}
    aws.client("dynamodb").put_item(TableName=table, Item=to_item(old))
    (request,) = _tick(defs, name).run_requests
    assert request.run_config["task_type"] == "old_jobs"


def test_a_housekeeping_schedule_skips_while_its_task_runs_and_not_while_another_task_runs(aws, defs, monkeypatch):
    stale_ssm, old_jobs = "housekeeping_stale_ssm_schedule", "housekeeping_old_jobs_schedule"
    aws.client("ssm").put_parameter(Name="/runs-fleet/runners/i-00000000000000001/config", Type="String", Value="{}")
    fs.past_stale_ssm_grace(monkeypatch)
    old = {"job_id": "old", "status": "timeout", "completed_at": iso(dt.datetime.now(dt.UTC) - dt.timedelta(days=8))}
    aws.client("dynamodb").put_item(TableName=aws.env["RUNS_FLEET_JOBS_TABLE"], Item=to_item(old))
    with dg.instance_for_test(overrides=LIMITS) as instance:
        (other,) = _tick(defs, old_jobs, instance).run_requests
        _started(instance, "housekeeping", other.tags)  # a long old_jobs run
        (request,) = _tick(defs, stale_ssm, instance).run_requests
        run = _started(instance, "housekeeping", request.tags)
        busy = _tick(defs, stale_ssm, instance)
    assert request.run_config["task_type"] == "stale_ssm"
    assert busy.run_requests == []
    assert busy.skip_message == f"the previous housekeeping run {run.run_id} is still running: not queueing another"


# ---------------------------------------------------------------- state looks: checks and snapshots


@pytest.mark.parametrize(
    "name",
    [
        "fleet_dead_letter_checks_schedule",
        "pool_audit_schedule",
        "batching_checks_schedule",
        "progressor_health_schedule",
    ],
)
def test_a_state_look_skips_while_its_previous_run_is_started_even_when_the_state_changed(aws, name):
    """The job carries its one-at-a-time tag: its schedule's run (or one launched from the Launchpad) holds it."""
    defs = build_local_definitions()  # with a progressor target
    job = defs.resolve_job_def(defs.resolve_schedule_def(name).job_name)
    with dg.instance_for_test(overrides=LIMITS) as instance:
        run = _started(instance, job.name, {**job.tags, SCHEDULE_TAG: name, LOOK_TAG: "another state"})
        busy = _tick(defs, name, instance)
        instance.report_run_failed(run)
        (after,) = _tick(defs, name, instance).run_requests
    assert busy.run_requests == []
    assert busy.skip_message == f"the previous {job.name} run {run.run_id} is still running: not queueing another"
    assert after.tags[SCHEDULE_TAG] == name


@pytest.mark.slow
def test_dead_letter_checks_run_when_a_depth_changes_and_at_least_hourly(aws, defs):
    name = "fleet_dead_letter_checks_schedule"
    with dg.instance_for_test() as instance:
        (first,) = _tick(defs, name, instance).run_requests
        _run(defs, "fleet_dead_letter_checks", instance, first)

        same = _tick(defs, name, instance)
        assert same.run_requests == []
        assert "unchanged since run" in same.skip_message

        aws.client("sqs").send_message(QueueUrl=aws.env[DLQ], MessageBody="x")
        (changed,) = _tick(defs, name, instance).run_requests
        assert changed.tags[LOOK_TAG] != first.tags[LOOK_TAG]
        _run(defs, "fleet_dead_letter_checks", instance, changed)
        assert _tick(defs, name, instance).run_requests == []

        an_hour_on = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
        (refresh,) = _tick(defs, name, instance, at=an_hour_on).run_requests
        assert refresh.tags[LOOK_TAG] == changed.tags[LOOK_TAG]


def test_an_unchanged_states_skip_names_a_time_from_which_a_tick_runs(aws, defs):
    name = "fleet_dead_letter_checks_schedule"
    with dg.instance_for_test() as instance:
        (first,) = _tick(defs, name, instance).run_requests
        _run(defs, "fleet_dead_letter_checks", instance, first)
        now = dt.datetime.now(dt.UTC)
        named = _tick(defs, name, instance, at=now).skip_message.rsplit("from ", 1)[1].removesuffix(" UTC")
        at = now.replace(hour=int(named[:2]), minute=int(named[3:]), second=0, microsecond=0)
        at += dt.timedelta(days=1) if at < now else dt.timedelta(0)  # past midnight
        assert len(_tick(defs, name, instance, at=at).run_requests) == 1


@pytest.mark.slow
def test_the_pool_audit_snapshots_a_changed_fleet_and_an_unchanged_one_every_20_minutes(aws, defs):
    name = "pool_audit_schedule"
    fs.start_jobs(aws, 2)
    with dg.instance_for_test() as instance:
        (first,) = _tick(defs, name, instance).run_requests
        _run(defs, "pool_audit_job", instance, first)
        same = _tick(defs, name, instance)
        assert same.run_requests == []
        assert "0 pools, 2 managed instances, 2 with running jobs: unchanged since run" in same.skip_message

        fs.start_jobs(aws, 1)
        (changed,) = _tick(defs, name, instance).run_requests
        _run(defs, "pool_audit_job", instance, changed)
        assert _tick(defs, name, instance).run_requests == []
        later = dt.datetime.now(dt.UTC) + dt.timedelta(minutes=20)
        assert len(_tick(defs, name, instance, at=later).run_requests) == 1


@pytest.mark.slow
def test_the_pool_audit_does_not_snapshot_a_fleet_whose_runners_changed_but_not_its_counts(aws, defs):
    name = "pool_audit_schedule"
    (gone, _) = fs.start_jobs(aws, 2)
    with dg.instance_for_test() as instance:
        (first,) = _tick(defs, name, instance).run_requests
        _run(defs, "pool_audit_job", instance, first)
        _drop_job(aws, gone)  # one runner's job ends and its instance goes; a new runner takes a new job
        aws.client("ec2").terminate_instances(InstanceIds=[gone["instance_id"]])
        fs.start_jobs(aws, 1)
        replaced = _tick(defs, name, instance)
    assert replaced.run_requests == []
    assert "2 managed instances, 2 with running jobs: unchanged since run" in replaced.skip_message


@pytest.mark.slow
def test_batching_checks_run_when_a_receiver_becomes_invalid(aws, defs):
    name = "batching_checks_schedule"
    put_receiver(aws, "fine")
    with dg.instance_for_test() as instance:
        (first,) = _tick(defs, name, instance).run_requests
        _run(defs, "batching_checks_job", instance, first)
        same = _tick(defs, name, instance)
        assert same.run_requests == []
        assert "1 receiver(s), 0 invalid" in same.skip_message

        put_receiver(aws, "broken", number_per_day=0)
        (changed,) = _tick(defs, name, instance).run_requests
        assert changed.tags[SCHEDULE_TAG] == name


# ---------------------------------------------------------------- the looking schedule itself


@dg.op
def _noop():
    return None


@dg.job
def _looked_job():
    _noop()


def _schedule(look, refresh=None) -> dg.ScheduleDefinition:
    return schedule(
        name="looked",
        job=_looked_job,
        cron_schedule="* * * * *",
        description="a test",
        look=look,
        refresh=refresh,
    )


def test_a_look_that_fails_launches_the_run_and_says_why():
    def look(_context):
        raise ConnectionError("endpoint unreachable\nsecond line")

    with dg.instance_for_test() as instance:
        tick = _schedule(look).evaluate_tick(dg.build_schedule_context(instance=instance))
    (request,) = tick.run_requests
    assert request.tags[SCHEDULE_TAG] == "looked"


def test_a_state_look_runs_again_after_a_failed_run_and_skips_while_the_run_is_queued():
    schedule = _schedule(lambda _context: Look.state({"depth": 1}, "depth 1"), refresh=dt.timedelta(hours=1))
    with dg.instance_for_test() as instance:
        (request,) = schedule.evaluate_tick(dg.build_schedule_context(instance=instance)).run_requests
        run = instance.create_run_for_job(_looked_job, tags=request.tags)
        queued = schedule.evaluate_tick(dg.build_schedule_context(instance=instance))
        assert queued.run_requests == []
        assert f"unchanged, and run {run.run_id} is still" in queued.skip_message
        instance.report_run_failed(run)
        (again,) = schedule.evaluate_tick(dg.build_schedule_context(instance=instance)).run_requests
        assert again.tags[LOOK_TAG] == request.tags[LOOK_TAG]


SCHEDULE_MAKERS = {"ScheduleDefinition", "schedule"}
"""Dagster's two ways to make a schedule: the class and the ``@dg.schedule`` decorator."""
OWN_SCHEDULE = {Path("pipelines/common/defs/schedules.py"), Path("pipelines/batching/defs.py")}
"""The factory itself, and the batching decider (one run per due receiver: a schedule of its own)."""


def _dagster_schedule_makers(path: Path) -> list[str]:
    """``path:line dg.<maker>`` for each call of Dagster's schedule class or decorator in ``path``."""
    made = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.FunctionDef):
            made.extend(d for d in node.decorator_list if isinstance(d, ast.Attribute))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            made.append(node.func)
    return [
        f"{path.relative_to(ROOT)}:{m.lineno} {m.value.id}.{m.attr}"
        for m in made
        if m.attr in SCHEDULE_MAKERS and isinstance(m.value, ast.Name) and m.value.id in {"dg", "dagster"}
    ]


def test_every_schedule_is_built_by_the_one_factory():
    sources = [p for top in ("pipelines", "sensors", "infra/demo") for p in sorted((ROOT / top).rglob("*.py"))]
    offending = [
        line
        for path in sources
        if path.relative_to(ROOT) not in OWN_SCHEDULE
        for line in _dagster_schedule_makers(path)
    ]
    assert not offending, "\n".join(offending)
