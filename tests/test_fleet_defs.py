"""The Dagster layer of the fleet processors: jobs in process with their flat config (and runs-fleet's
camelCase names, deprecated), sensors, schedules, the dead-letter asset checks and the redrive job."""

import datetime as dt
import json
import time
from types import SimpleNamespace

import dagster as dg
import pytest

from pipelines.common.summary import COUNTS_TAG, DRY_RUN_TAG
from pipelines.definitions import build_definitions
from pipelines.fleet.defs import QUEUE_TAG
from pipelines.fleet.defs.sensors import MAX_WAIT_SECONDS
from resources import SQSResource, fleet_settings_from_env
from tests import fleet_support as fs

TQ, DLQ = "RUNS_FLEET_TERMINATION_QUEUE_URL", "RUNS_FLEET_TERMINATION_DLQ_URL"
HOUSEKEEPING_DLQ = "RUNS_FLEET_HOUSEKEEPING_DLQ_URL"


@pytest.fixture
def defs():
    return build_definitions("local")


def test_the_fleet_definitions_are_in_every_deployment():
    for deployment in ("local", "prod"):
        d = build_definitions(deployment)
        jobs = {j.name for j in d.resolve_all_job_defs()}
        assert {
            "process_termination_queue",
            "process_housekeeping_queue",
            "housekeeping",
            "redrive_dead_letters",
        } <= jobs
        assert d.resolve_sensor_def("termination_queue_sensor").default_status == dg.DefaultSensorStatus.RUNNING
        assert d.resolve_sensor_def("housekeeping_queue_sensor")
        for task in ("orphaned_instances", "stale_ssm", "old_jobs"):
            assert d.resolve_schedule_def(f"housekeeping_{task}_schedule")
    tags = build_definitions("local").resolve_job_def("process_termination_queue").tags
    assert tags[QUEUE_TAG] == "runs-fleet-termination"


@pytest.mark.parametrize("label", ["termination", "housekeeping"])
def test_a_queue_sensor_names_the_variable_that_sets_its_drain_runs(defs, label):
    description = defs.resolve_sensor_def(f"{label}_queue_sensor").description
    assert f"up to RUNS_FLEET_{label.upper()}_DRAIN_RUNS at once" in description


@pytest.mark.slow
def test_the_termination_job_runs_with_runs_fleets_camel_case_config_and_warns_that_it_is_deprecated(aws, defs):
    jobs = fs.start_jobs(aws, 12)
    fs.send(aws, [fs.termination_body(j) for j in jobs] + ["not json"])
    instance = dg.DagsterInstance.ephemeral()
    result = defs.resolve_job_def("process_termination_queue").execute_in_process(
        run_config={"concurrency": 5, "maxMessages": 0, "maxSeconds": 300}, instance=instance
    )
    out = result.output_for_node("drain_termination_queue")
    assert out["applied"] == 12
    assert out["dead_lettered"] == 1
    assert out["stopped_by"] == "queue empty"
    (output,) = [e for e in result.all_events if e.event_type_value == "STEP_OUTPUT"]
    metadata = output.event_specific_data.metadata
    assert metadata["applied"].value == 12
    assert metadata["raw_archive"].value.startswith("s3://")
    warnings = [e.user_message for e in instance.all_logs(result.run_id) if "deprecated" in e.user_message]
    assert warnings == [
        "run config: maxMessages is deprecated: use max_messages",
        "run config: maxSeconds is deprecated: use max_seconds",
    ], warnings


def test_an_invalid_drain_config_fails_with_one_line(aws, defs):
    result = defs.resolve_job_def("process_termination_queue").execute_in_process(
        run_config={"concurrency": 50}, instance=dg.DagsterInstance.ephemeral(), raise_on_error=False
    )
    assert not result.success
    assert "concurrency must be at most 10, got 50" in str(
        result.get_step_failure_events()[0].event_specific_data.error
    )


@pytest.mark.slow
def test_the_housekeeping_job_takes_runs_fleets_message_as_config(aws, defs, monkeypatch):
    aws.client("ssm").put_parameter(Name="/runs-fleet/runners/i-00000000000000001/config", Type="String", Value="{}")
    fs.past_stale_ssm_grace(monkeypatch)
    job = defs.resolve_job_def("housekeeping")
    message = {"task_type": "stale_ssm", "timestamp": "2026-11-22T10:00:00Z", "params": {"dryRun": True}}
    result = job.execute_in_process(run_config=message, instance=dg.DagsterInstance.ephemeral())
    assert result.output_for_node("run_housekeeping_task")["stale"] == 1
    assert len(fs.runner_parameters(aws)) == 1  # dry run
    message["params"] = {}
    job.execute_in_process(run_config=message, instance=dg.DagsterInstance.ephemeral())  # raises on failure
    assert fs.runner_parameters(aws) == set()

    bad = job.execute_in_process(
        run_config={"task_type": "pool_audit", "params": {"idle_cost_threshold_usd_per_hour": "high"}},
        instance=dg.DagsterInstance.ephemeral(),
        raise_on_error=False,
    )
    assert not bad.success
    assert "idle_cost_threshold_usd_per_hour" in str(bad.get_step_failure_events()[0].event_specific_data.error)


def _output_metadata(result) -> dict:
    (output,) = [e for e in result.all_events if e.event_type_value == "STEP_OUTPUT"]
    return {key: value.value for key, value in output.event_specific_data.metadata.items()}


@pytest.mark.slow
def test_a_housekeeping_dry_run_says_that_it_published_no_metrics(aws, defs):
    job = defs.resolve_job_def("housekeeping")
    run = {"task_type": "stale_ssm", "params": {"dryRun": True}}
    dry = job.execute_in_process(run_config=run, instance=dg.DagsterInstance.ephemeral())
    assert _output_metadata(dry)["metrics_published"] is False
    done = job.execute_in_process(run_config={**run, "params": {}}, instance=dg.DagsterInstance.ephemeral())
    assert _output_metadata(done)["metrics_published"] is True


@pytest.mark.slow
def test_the_housekeeping_job_ends_with_a_summary_line_and_its_counts_and_a_pool_audit_dry_run_is_tagged(
    aws, defs, monkeypatch
):
    aws.client("ssm").put_parameter(Name="/runs-fleet/runners/i-00000000000000001/config", Type="String", Value="{}")
    fs.past_stale_ssm_grace(monkeypatch)
    instance = dg.DagsterInstance.ephemeral()
    task = {"task_type": "stale_ssm", "params": {}}
    housekeeping = defs.resolve_job_def("housekeeping").execute_in_process(run_config=task, instance=instance)
    counts = json.loads(instance.get_run_by_id(housekeeping.run_id).tags[COUNTS_TAG])
    assert counts == {
        "parameters": 1,
        "stale": 1,
        "deleted": 1,
        "already_gone": 0,
        "recently_terminated": 0,
        "unrecognised": 0,
    }
    lines = [r.user_message for r in instance.all_logs(housekeeping.run_id) if r.user_message.startswith("summary:")]
    assert lines == ["summary: housekeeping stale_ssm: " + ", ".join(f"{k}={v}" for k, v in counts.items())]

    dry = {"ops": {"pool_audit": {"config": {"dry_run": True}}}}
    audit = defs.resolve_job_def("pool_audit_job").execute_in_process(run_config=dry, instance=instance)
    tags = instance.get_run_by_id(audit.run_id).tags
    assert COUNTS_TAG not in tags  # a report: its figures are its metadata, and the runs list stays short
    assert tags[DRY_RUN_TAG] == "true"


def test_the_schedules_launch_the_housekeeping_job_with_their_task():
    defs = build_definitions("prod")  # runs-fleet's cadences (make dev's quiet demo slows one: test_demo_cadence)
    moment = dt.datetime(2026, 11, 22, 10, 15, tzinfo=dt.UTC)
    for task, cron in [("orphaned_instances", "*/5 * * * *"), ("stale_ssm", "*/15 * * * *"), ("old_jobs", "0 * * * *")]:
        schedule = defs.resolve_schedule_def(f"housekeeping_{task}_schedule")
        assert schedule.cron_schedule == cron
        assert schedule.job_name == "housekeeping"
        (request,) = schedule.evaluate_tick(dg.build_schedule_context(scheduled_execution_time=moment)).run_requests
        assert request.run_config["task_type"] == task
        assert request.run_config["params"] == {}
        assert request.run_key == f"{task}-{moment.isoformat()}"


def _sensor_context(instance, cursor=None):
    return dg.build_sensor_context(
        instance=instance, cursor=cursor, resources={"sqs": SQSResource(), "fleet": fleet_settings_from_env()}
    )


@pytest.mark.slow
def test_the_termination_sensor_launches_one_drain_run_when_messages_wait(aws, defs):
    sensor = defs.resolve_sensor_def("termination_queue_sensor")
    with dg.instance_for_test() as instance:
        idle = sensor.evaluate_tick(_sensor_context(instance))
        assert not idle.run_requests
        assert "is empty" in idle.skip_message
        fs.send(aws, ["{}"] * 3)
        first = sensor.evaluate_tick(_sensor_context(instance, cursor=idle.cursor))
        assert first.run_requests == []  # 3 waiting: not a run for 3 messages yet
        since = json.loads(first.cursor)["since"]
        waited = json.dumps({"sequence": 0, "since": since - MAX_WAIT_SECONDS})  # as if 5 minutes had passed
        tick = sensor.evaluate_tick(_sensor_context(instance, cursor=waited))
        (request,) = tick.run_requests
        assert request.run_key == "termination-drain-1"
        assert request.tags[QUEUE_TAG] == "runs-fleet-termination"
        assert json.loads(tick.cursor) == {"sequence": 1, "since": None}
        # While a drain run is queued or going, the sensor does not pile up more.
        instance.create_run_for_job(defs.resolve_job_def("process_termination_queue"), run_config={})
        busy = sensor.evaluate_tick(_sensor_context(instance, cursor=waited))
        assert not busy.run_requests
        assert "is still queued" in busy.skip_message


def test_a_deleted_cursor_never_gives_a_run_key_used_before(aws, defs):
    """Dagster skips a request whose run key the sensor used before: a sequence starting again at 1 would
    skip drain after drain."""
    sensor = defs.resolve_sensor_def("termination_queue_sensor")
    fs.send(aws, ["{}"] * 100)
    with dg.instance_for_test() as instance:
        (before,) = sensor.evaluate_tick(_sensor_context(instance, cursor="3")).run_requests
        (after,) = sensor.evaluate_tick(_sensor_context(instance)).run_requests
    assert int(after.run_key.rsplit("-", 1)[1]) > int(before.run_key.rsplit("-", 1)[1])


@pytest.mark.parametrize(
    ("sequence", "since"),
    [(5, "yesterday"), (5, float("inf")), (5, 4e9), (5, [1]), (float("inf"), None)],
    ids=["text", "infinity", "later than now", "a list", "an infinite sequence"],
)
def test_a_cursor_set_to_something_else_starts_the_wait_over(aws, defs, sequence, since):
    sensor = defs.resolve_sensor_def("termination_queue_sensor")
    fs.send(aws, ["{}"] * 3)
    cursor = json.dumps({"sequence": sequence, "since": since})
    with dg.instance_for_test() as instance:
        tick = sensor.evaluate_tick(_sensor_context(instance, cursor=cursor))
    assert tick.skip_message == "3 waiting for 0 s: a drain run starts at 100 waiting or after 300 s"


def test_a_wait_saved_by_a_clock_a_little_ahead_goes_on_with_its_sequence(aws, defs):
    """Two code servers' clocks may differ by seconds: a wait saved a minute ahead of this one is not started over,
    and neither is the run keys' sequence."""
    sensor = defs.resolve_sensor_def("termination_queue_sensor")
    fs.send(aws, ["{}"] * 3)
    with dg.instance_for_test() as instance:
        context = _sensor_context(instance, cursor=json.dumps({"sequence": 5, "since": time.time() + 60}))
        sensor.evaluate_tick(context)
    assert json.loads(context.cursor)["sequence"] == 5


@pytest.mark.slow
def test_the_dead_letter_checks_warn_when_a_dead_letter_queue_is_not_empty(aws, defs):
    job = defs.resolve_job_def("fleet_dead_letter_checks")
    result = job.execute_in_process(instance=dg.DagsterInstance.ephemeral())
    assert all(e.passed for e in result.get_asset_check_evaluations())
    aws.client("sqs").send_message(QueueUrl=aws.env[DLQ], MessageBody="x")
    result = job.execute_in_process(instance=dg.DagsterInstance.ephemeral())
    by_asset = {e.asset_key.path[-1]: e for e in result.get_asset_check_evaluations()}
    assert not by_asset["termination_dead_letters"].passed
    assert by_asset["termination_dead_letters"].severity == dg.AssetCheckSeverity.WARN
    assert by_asset["termination_dead_letters"].metadata["depth"].value == 1
    assert by_asset["housekeeping_dead_letters"].passed


def test_the_checks_and_the_alerts_read_a_dead_letter_being_looked_at_as_one_depth(aws, defs):
    """A dead letter received (in flight: being redriven or inspected) is still one: the check and the
    alert that watch the queue say the same depth."""
    from pipelines.alerts.defs import dead_letter_signals

    sqs = aws.client("sqs")
    sqs.send_message(QueueUrl=aws.env[DLQ], MessageBody="x")
    assert sqs.receive_message(QueueUrl=aws.env[DLQ], VisibilityTimeout=600)["Messages"]
    result = defs.resolve_job_def("fleet_dead_letter_checks").execute_in_process(
        instance=dg.DagsterInstance.ephemeral()
    )
    by_asset = {e.asset_key.path[-1]: e for e in result.get_asset_check_evaluations()}
    assert by_asset["termination_dead_letters"].metadata["depth"].value == 1
    with dg.build_sensor_context() as context:
        fleet = SimpleNamespace(termination_dlq_url=aws.env[DLQ], housekeeping_dlq_url=aws.env[HOUSEKEEPING_DLQ])
        signals = {s.alert_key: s for s in dead_letter_signals(context, sqs, fleet)}
    assert (
        signals["dead_letters:runs-fleet-termination-dlq-dev"].title
        == "runs-fleet-termination-dlq-dev holds 1 dead letter(s)"
    )


def test_a_queue_is_named_by_the_last_segment_of_its_url_one_way():
    from pipelines.common.sqs import queue_name

    names = [queue_name(url) for url in ("http://127.0.0.1:5000/123456789012/q-dlq", "https://sqs/1/q-dlq/")]
    assert names == ["q-dlq", "q-dlq"]


def test_no_product_module_takes_a_queue_name_apart_itself():
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    copies = [
        str(path.relative_to(root))
        for package in ("pipelines", "resources", "sensors")
        for path in sorted((root / package).rglob("*.py"))
        if path != root / "pipelines/common/sqs.py"
        and any(text in path.read_text() for text in ('rsplit("/", 1)[-1]', "rsplit('/', 1)[-1]"))
    ]
    assert copies == []


def test_a_look_and_a_run_build_their_fleet_context_the_same_way():
    from pipelines.fleet.context import fleet_context

    fleet = SimpleNamespace(
        jobs_table="jobs", archive_bucket="archive", metrics_namespace="RunsFleet", pools_table="pools"
    )
    ctx = fleet_context(fleet, log=None, dynamodb="dynamodb client")
    names = (ctx.jobs_table, ctx.archive_bucket, ctx.namespace, ctx.pools_table)
    assert names == ("jobs", "archive", "RunsFleet", "pools")
    assert (ctx.dynamodb, ctx.ec2, ctx.cloudwatch) == ("dynamodb client", None, None)


@pytest.mark.slow
def test_redrive_moves_dead_letters_back_and_quarantines_repeat_offenders(aws, defs):
    sqs = aws.client("sqs")
    bodies = [json.dumps({"n": n}) for n in range(3)]
    for body in bodies:
        sqs.send_message(
            QueueUrl=aws.env[DLQ],
            MessageBody=body,
            MessageAttributes={"groundskeeper-reason": {"DataType": "String", "StringValue": "boom"}},
        )
    job = defs.resolve_job_def("redrive_dead_letters")

    def run(**config):
        result = job.execute_in_process(run_config=config, instance=dg.DagsterInstance.ephemeral())
        return result.output_for_node("redrive_dead_letter_queue")

    assert run(dry_run=True)["would_redrive"] == 3
    assert fs.depth(aws, DLQ) == 3
    first = run(max_redrives=1, rate_per_second=100)
    assert first["redriven"] == 3
    assert fs.depth(aws, DLQ) == 0
    back = fs.read_all(aws, TQ)
    assert sorted(m["Body"] for m in back) == sorted(bodies)
    assert all(m["MessageAttributes"]["groundskeeper-redrive-count"]["StringValue"] == "1" for m in back)
    for message in back:  # they fail again and come back to the dead-letter queue
        sqs.send_message(QueueUrl=aws.env[DLQ], MessageBody=message["Body"])
        sqs.delete_message(QueueUrl=aws.env[TQ], ReceiptHandle=message["ReceiptHandle"])
    second = run(max_redrives=1, rate_per_second=100)
    assert second["quarantined"] == 3
    assert second.get("redriven", 0) == 0
    assert fs.depth(aws, DLQ) == 0
    assert fs.depth(aws, TQ) == 0
    objects = aws.client("s3").list_objects_v2(
        Bucket=aws.env["RUNS_FLEET_ARCHIVE_BUCKET"], Prefix="dead-letters/runs-fleet-termination-dev/quarantine/"
    )["Contents"]
    assert len(objects) == 3


def _throttled_on_second_receive(monkeypatch):
    """``receive`` raises a throttling error that outlasts runs-fleet's retries on its second call only: the
    drain step fails once with a transient AWS error and its retry policy runs it again in the same run."""
    from botocore.exceptions import ClientError

    from pipelines.fleet import drain as drain_module

    real, calls = drain_module.receive, []

    def receive(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise ClientError({"Error": {"Code": "ThrottlingException", "Message": "slow down"}}, "ReceiveMessage")
        return real(*args, **kwargs)

    monkeypatch.setattr(drain_module, "receive", receive)


@pytest.mark.slow
def test_a_retried_drain_step_keeps_the_raw_messages_its_failed_attempt_archived_and_acknowledged(
    aws, defs, monkeypatch
):
    jobs = fs.start_jobs(aws, 20)
    bodies = [fs.termination_body(j) for j in jobs]
    fs.send(aws, bodies)
    _throttled_on_second_receive(monkeypatch)
    result = defs.resolve_job_def("process_termination_queue").execute_in_process(
        run_config={"concurrency": 1, "flush_rounds": 1, "wait_seconds": 0}, instance=dg.DagsterInstance.ephemeral()
    )
    assert len(result.filter_events(lambda e: e.event_type_value == "STEP_RESTARTED")) == 1
    assert fs.jobs_done(aws) == 20
    s3, bucket = aws.client("s3"), aws.env["RUNS_FLEET_ARCHIVE_BUCKET"]
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="raw/")["Contents"]]
    archived = [
        json.loads(line)["body"]
        for key in keys
        for line in s3.get_object(Bucket=bucket, Key=key)["Body"].read().splitlines()
    ]
    assert sorted(archived) == sorted(bodies)


@pytest.mark.slow
def test_a_retried_drain_steps_run_counts_what_its_failed_attempt_applied_too(aws, defs, monkeypatch):
    from pipelines.common.summary import run_counters

    jobs = fs.start_jobs(aws, 20)
    fs.send(aws, [fs.termination_body(j) for j in jobs])
    _throttled_on_second_receive(monkeypatch)
    instance = dg.DagsterInstance.ephemeral()
    result = defs.resolve_job_def("process_termination_queue").execute_in_process(
        run_config={"concurrency": 1, "flush_rounds": 1, "wait_seconds": 0}, instance=instance
    )
    assert result.output_for_node("drain_termination_queue")["applied"] == 10  # the last attempt's own
    counts = run_counters(instance.get_run_by_id(result.run_id).tags)
    assert counts["applied"] == 20
    assert counts["deleted"] == 20
