"""The alerts sensor evaluated against a real Dagster instance, with the template deployed into moto:
what reaches the alerts topic is read back from an SQS queue subscribed to it (raw delivery)."""

import contextlib
import datetime as dt
import io
import json
import logging
import threading
import time
import urllib.request
from types import SimpleNamespace

import dagster as dg
import pytest
from botocore.exceptions import ClientError
from dagster._core.definitions.run_request import InstigatorType
from dagster._core.execution.build_resources import wrap_resources_for_execution
from dagster._core.remote_origin import RegisteredCodeLocationOrigin, RemoteInstigatorOrigin, RemoteRepositoryOrigin
from dagster._core.scheduler.instigation import InstigatorState, InstigatorStatus, TickData, TickStatus
from dagster_shared.error import SerializableErrorInfo

from infra.demo.defs import retry_demo
from pipelines.alerts import defs as alerts_defs
from pipelines.alerts import sources
from pipelines.alerts.defs import ASSET_KEY, HEARTBEAT_METRIC, build_alerts_sensor, close_incident, incidents, load_book
from pipelines.alerts.incidents import KINDS
from pipelines.common.defs.summary import run_summary
from pipelines.common.summary import COUNTS_TAG, DRY_RUN_TAG
from pipelines.definitions import build_definitions
from pipelines.retry.runs import RETRY_MARGIN_SECONDS, run_retry
from pipelines.retry.tags import ATTEMPT_TAG, POLICY_TAG, RETRY_OF_TAG, ROOT_TAG
from resources import CloudWatchResource, SNSResource, SQSResource
from resources.settings import AlertSettings, fleet_settings_from_env
from tests.alerts_support import HoldingEndpoint, tick_in_a_new_process, webhook_receiver
from tests.conftest import PATIENCE
from tests.fleet_support import metric_sum
from tests.reclaim_support import PROGRESS_TABLE, reexecute_reclaim, seed_mixed

pytestmark = pytest.mark.slow  # each test runs jobs and evaluates the sensor against a real instance

SENSOR = build_alerts_sensor(demo_jobs=frozenset({"retry_demo"}))  # as the local demo's code location builds it
NO_WAIT = '{"kind": "fixed", "delay": 0, "maxAttempts": 100}'  # a sink that is down is tried at the next tick


def resources(aws, **settings) -> dict:
    settings.setdefault("sns_topic_arn", aws.env["ALERTS_SNS_TOPIC_ARN"])
    return {
        "alerts": AlertSettings(**settings),
        "fleet": fleet_settings_from_env(),
        "sns": SNSResource(region_name="us-east-1"),
        "sqs": SQSResource(region_name="us-east-1"),
        "cloudwatch": CloudWatchResource(region_name="us-east-1"),
    }


def tick(
    instance: dg.DagsterInstance, res: dict, definitions: dg.Definitions | None = None, location: str | None = None
) -> str:
    """One evaluation of the sensor, as the daemon's (in the code location named ``location``, when given; as
    ``dg.build_sensor_context`` builds it, with the origin that it cannot take); returns its skip reason."""
    with dg.SensorEvaluationContext(
        instance_ref=None,
        instance=instance,
        resources=wrap_resources_for_execution(res),
        definitions=definitions,
        code_location_origin=RegisteredCodeLocationOrigin(location) if location else None,
    ) as context:
        data = SENSOR.evaluate_tick(context)
    assert not data.run_requests
    return data.skip_message or ""


class Inbox:
    """An SQS queue subscribed to the alerts topic with raw delivery: every message published."""

    def __init__(self, aws) -> None:
        self.sqs = aws.client("sqs")
        self.url = self.sqs.create_queue(QueueName="alerts-inbox")["QueueUrl"]
        arn = self.sqs.get_queue_attributes(QueueUrl=self.url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
        aws.client("sns").subscribe(
            TopicArn=aws.env["ALERTS_SNS_TOPIC_ARN"], Protocol="sqs", Endpoint=arn,
            Attributes={"RawMessageDelivery": "true"},
        )  # fmt: skip
        self.messages: list[dict] = []

    def read(self) -> list[dict]:
        """Everything that arrived since the last read (moto delivers during Publish)."""
        new = []
        while True:
            got = self.sqs.receive_message(QueueUrl=self.url, MaxNumberOfMessages=10, MessageAttributeNames=["All"])
            batch = got.get("Messages", [])
            if not batch:
                break
            for m in batch:
                body = json.loads(m["Body"])
                body["_attributes"] = {k: v["StringValue"] for k, v in m.get("MessageAttributes", {}).items()}
                new.append(body)
                self.sqs.delete_message(QueueUrl=self.url, ReceiptHandle=m["ReceiptHandle"])
        self.messages += new
        return new


def run_demo(instance, attempt: int, *, succeed_on: int, root: str | None = None, previous: str | None = None):
    """One run of the local retry_demo job with the tags delayed_run_retries gives attempt ``attempt``."""
    tags = {ATTEMPT_TAG: str(attempt)}
    if previous:
        tags.update({RETRY_OF_TAG: previous, ROOT_TAG: root or previous})
    config = {"ops": {"throttled_until_attempt": {"config": {"succeed_on_attempt": succeed_on}}}}
    result = retry_demo.execute_in_process(run_config=config, instance=instance, tags=tags, raise_on_error=False)
    return result.run_id, result.success


@pytest.mark.slow  # runs six jobs
def test_a_lineage_failing_through_its_retries_fires_once_and_a_later_success_resolves_once(aws):
    inbox = Inbox(aws)
    res = resources(aws, ui_url="http://dagster.example:3000")
    with dg.instance_for_test() as instance:
        # retry_demo's policy allows 4 attempts; attempt 5 would succeed, so the whole lineage fails
        root = previous = None
        for attempt in range(1, 5):
            run_id, ok = run_demo(instance, attempt, succeed_on=5, root=root, previous=previous)
            assert not ok
            root, previous = root or run_id, run_id
            tick(instance, res)
            if attempt < 4:
                assert inbox.read() == [], f"attempt {attempt} will be retried: no alert"
        (firing,) = inbox.read()
        assert firing["state"] == "firing"
        assert firing["kind"] == "run_failure"
        assert firing["alert_key"] == "run_failure:retry_demo:ThrottlingException"
        assert firing["job"] == "retry_demo"
        assert firing["attempts"] == 4
        assert firing["run_id"] == previous
        assert "ThrottlingException" in firing["summary"] or "Rate exceeded" in firing["summary"]
        assert firing["url"] == f"http://dagster.example:3000/runs/{previous}"
        assert firing["runbook"] == "docs/runbooks/run_failure.md"
        assert firing["_attributes"] == {
            "severity": "warning",  # retry_demo is the demo's: never critical
            "state": "firing",
            "alert_key": "run_failure:retry_demo:ThrottlingException",
        }

        # a later lineage: its first attempt fails (retried: no alert), its retry succeeds
        first, ok = run_demo(instance, 1, succeed_on=2)
        assert not ok
        tick(instance, res)
        assert inbox.read() == []
        second, ok = run_demo(instance, 2, succeed_on=2, previous=first)
        assert ok
        reason = tick(instance, res)
        (resolved,) = inbox.read()
        assert resolved["state"] == "resolved"
        assert resolved["alert_key"] == "run_failure:retry_demo:ThrottlingException"
        assert resolved["run_id"] == second
        assert resolved["first_seen"] == firing["first_seen"]
        assert "run_failure:retry_demo:ThrottlingException" in reason
        assert "resolved" in reason
        tick(instance, res)
        assert inbox.read() == []
    assert [m["state"] for m in inbox.messages] == ["firing", "resolved"]


@pytest.mark.slow  # a new Python process
def test_a_restart_between_the_failure_and_the_next_tick_neither_loses_nor_repeats_the_alert(aws, tmp_path):
    """The tick after the failure runs in a new process over the same persisted instance storage (as
    a restarted daemon's); the ones after it in new instance objects."""
    inbox = Inbox(aws)
    res = resources(aws)
    with dg.instance_for_test(temp_dir=str(tmp_path)) as instance:
        tick(instance, res)  # the sensor has run before
        run_demo(instance, 4, succeed_on=5, previous="an-earlier-attempt")  # the lineage's last attempt fails
    settings = {"sns_topic_arn": aws.env["ALERTS_SNS_TOPIC_ARN"]}
    reason = tick_in_a_new_process(str(tmp_path), settings, aws.subprocess_env())
    assert "sent run_failure:retry_demo" in reason
    with dg.instance_for_test(temp_dir=str(tmp_path)) as restarted:
        tick(restarted, res)
    with dg.instance_for_test(temp_dir=str(tmp_path)) as again:
        tick(again, res)
    assert [(m["alert_key"], m["state"]) for m in inbox.read()] == [
        ("run_failure:retry_demo:ThrottlingException", "firing")
    ]


@pytest.mark.parametrize("ticks", [1, 4])
def test_more_failures_than_a_tick_reads_are_never_overtaken_by_a_later_success(aws, monkeypatch, ticks):
    """Two lineages fail, then a run succeeds; with one event read per query and kind, the success
    must still come after both failures: one firing, one resolved, resolved at the end, and all of
    it read in the first tick (it reads until caught up)."""
    monkeypatch.setattr(alerts_defs, "EVENTS_PER_TICK", 1)
    inbox = Inbox(aws)
    res = resources(aws)
    with dg.instance_for_test() as instance:
        tick(instance, res)
        run_demo(instance, 4, succeed_on=5, previous="first-lineage")
        run_demo(instance, 4, succeed_on=5, previous="second-lineage")
        run_demo(instance, 1, succeed_on=1)
        for _ in range(ticks):
            tick(instance, res)
        assert load_book(instance).incidents["run_failure:retry_demo:ThrottlingException"]["state"] == "resolved"
    assert [m["state"] for m in inbox.read()] == ["firing", "resolved"]


def test_a_failure_resolved_and_failing_again_after_the_ticks_clock_sends_each_change_with_its_own_id(aws, monkeypatch):
    inbox = Inbox(aws)
    res = resources(aws)
    with dg.instance_for_test() as instance:
        tick(instance, res)
        monkeypatch.setattr(alerts_defs, "now", lambda: time.time() - 30)  # read 30 s before the runs ended
        run_demo(instance, 4, succeed_on=5, previous="first-lineage")
        run_demo(instance, 1, succeed_on=1)
        run_demo(instance, 4, succeed_on=5, previous="second-lineage")
        tick(instance, res)
        monkeypatch.setattr(alerts_defs, "now", time.time)
        run_demo(instance, 1, succeed_on=1)
        tick(instance, res)
    assert len({m["message_id"] for m in inbox.read()}) == 4


def test_a_run_tagged_with_a_registered_packages_command_line_alerts_and_the_ticks_go_on(aws, monkeypatch):
    """Importing the package's __main__ would run its command line, which exits: the tag is a policy
    error (no automatic retry), so that run's failure alerts, and the next ticks resolve it."""
    import sys

    package = "tests.retry_function_package"
    monkeypatch.setenv("GROUNDSKEEPER_RETRY_FUNCTIONS", f"tests.retry_delay_functions,{package}")
    monkeypatch.delitem(sys.modules, f"{package}.__main__", raising=False)
    inbox = Inbox(aws)
    res = resources(aws)
    cli = json.dumps({"kind": "function", "path": f"{package}.__main__:main", "maxAttempts": 3})
    config = {"ops": {"throttled_until_attempt": {"config": {"succeed_on_attempt": 5}}}}
    with dg.instance_for_test() as instance:
        tick(instance, res)
        failed = retry_demo.execute_in_process(
            run_config=config, instance=instance, tags={POLICY_TAG: cli}, raise_on_error=False
        )
        tick(instance, res)
        (firing,) = inbox.read()
        assert (firing["state"], firing["run_id"]) == ("firing", failed.run_id)
        run_demo(instance, 1, succeed_on=1)
        tick(instance, res)
        assert [m["state"] for m in inbox.read()] == ["resolved"]
    assert f"{package}.__main__" not in sys.modules


def test_a_success_tagged_with_a_count_past_any_number_does_not_stop_a_later_failure_from_paging(aws):
    """Run tags are set at launch and may say anything: JSON's 1e400 reads as an infinity."""
    inbox = Inbox(aws)
    res = resources(aws)
    config = {"ops": {"throttled_until_attempt": {"config": {"succeed_on_attempt": 1}}}}
    with dg.instance_for_test() as instance:
        tick(instance, res)
        retry_demo.execute_in_process(run_config=config, instance=instance, tags={COUNTS_TAG: '{"x":1e400}'})
        run_demo(instance, 4, succeed_on=5, previous="an-earlier-attempt")
        tick(instance, res)
    assert [m["state"] for m in inbox.read()] == ["firing"]


def test_a_webhook_answering_500_twice_gets_the_alert_on_the_third_tick_once(aws):
    inbox = Inbox(aws)
    with webhook_receiver() as receiver, dg.instance_for_test() as instance:
        receiver.failures = [500, 500]
        res = resources(aws, webhook_url=receiver.url, retry_policy=NO_WAIT)
        run_demo(instance, 4, succeed_on=5, previous="an-earlier-attempt")
        reasons = [tick(instance, res) for _ in range(4)]
        assert receiver.requests == 3
        (body,) = receiver.received
        assert body["alert_key"] == "run_failure:retry_demo:ThrottlingException"
        assert body["state"] == "firing"
        assert body["text"].startswith("FIRING [warning] [demo] retry_demo failed after 4 attempts: ")
        assert "webhook at http://127.0.0.1" in reasons[0]
        assert "answered HTTP 500" in reasons[0]
        assert "secret-token" not in " ".join(reasons)
        # SNS was not held back by the webhook: one message, at the first tick
        assert [m["state"] for m in inbox.read()] == ["firing"]


@dg.asset(key=["alerts_test", "orders"])
def orders() -> int:
    return 1


@dg.asset_check(asset=orders, name="not_empty")
def not_empty(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
    good = context.run.tags["good"] == "yes"
    return dg.AssetCheckResult(passed=good, description="12 rows" if good else "0 rows")


CHECKED = dg.Definitions(assets=[orders], asset_checks=[not_empty], sensors=[SENSOR])


def test_a_check_passing_failing_failing_passing_fires_once_and_resolves_once(aws):
    inbox = Inbox(aws)
    res = resources(aws)
    with dg.instance_for_test() as instance:
        for good in ("yes", "no", "no", "yes"):
            dg.materialize([orders, not_empty], instance=instance, tags={"good": good})
            tick(instance, res, CHECKED)
    got = [(m["alert_key"], m["state"], m["severity"], m["summary"]) for m in inbox.read()]
    assert got == [
        ("check_failure:alerts_test/orders:not_empty", "firing", "critical", "0 rows"),
        ("check_failure:alerts_test/orders:not_empty", "resolved", "critical", "12 rows (was: 0 rows)"),
    ]


def test_a_check_failing_passing_failing_between_two_ticks_is_sent_firing_resolved_firing(aws):
    """Each failing evaluation opens its incident at its own time, so the second firing has an id of its own."""
    inbox = Inbox(aws)
    res = resources(aws)
    with dg.instance_for_test() as instance:
        dg.materialize([orders, not_empty], instance=instance, tags={"good": "yes"})
        tick(instance, res, CHECKED)
        for good in ("no", "yes", "no"):
            dg.materialize([orders, not_empty], instance=instance, tags={"good": good})
        tick(instance, res, CHECKED)
    got = inbox.read()
    assert [m["state"] for m in got] == ["firing", "resolved", "firing"]
    assert got[0]["message_id"] != got[2]["message_id"]


def test_an_incident_of_a_check_no_longer_defined_resolves_saying_so(aws):
    inbox = Inbox(aws)
    res = resources(aws)
    with dg.instance_for_test() as instance:
        dg.materialize([orders, not_empty], instance=instance, tags={"good": "no"})
        tick(instance, res, CHECKED)
        tick(instance, res, dg.Definitions(assets=[orders], sensors=[SENSOR]))  # the check removed or renamed
    got = inbox.read()
    assert [m["state"] for m in got] == ["firing", "resolved"]
    assert got[1]["summary"] == f"{alerts_defs.CHECK_GONE} (was: 0 rows)"


MID_CHECK: dict = {}


@dg.asset_check(asset=orders, name="not_empty")
def not_empty_ticking(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
    """The sensor ticks while this check is being evaluated: its record is planned, not evaluated."""
    MID_CHECK["skip"] = tick(context.instance, MID_CHECK["resources"], MID_CHECK["definitions"])
    return dg.AssetCheckResult(passed=False, description="0 rows")


def test_a_check_still_being_evaluated_is_read_once_it_is_evaluated(aws):
    """A tick that meets a planned check (its run still going) neither fails nor skips past it."""
    inbox = Inbox(aws)
    MID_CHECK.update(resources=resources(aws))
    MID_CHECK["definitions"] = dg.Definitions(assets=[orders], asset_checks=[not_empty_ticking], sensors=[SENSOR])
    with dg.instance_for_test() as instance:
        dg.materialize([orders, not_empty], instance=instance, tags={"good": "yes"})
        tick(instance, MID_CHECK["resources"], MID_CHECK["definitions"])  # reads the passing evaluation
        dg.materialize([orders, not_empty_ticking], instance=instance)
        assert "skip" in MID_CHECK  # the tick inside the check ran and returned
        assert inbox.read() == []  # the planned evaluation was not read as anything
        tick(instance, MID_CHECK["resources"], MID_CHECK["definitions"])
    got = [(m["alert_key"], m["state"], m["summary"]) for m in inbox.read()]
    assert got == [("check_failure:alerts_test/orders:not_empty", "firing", "0 rows")]


HELD: dict = {}


@dg.asset_check(asset=orders, name="not_empty")
def not_empty_held(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
    """A long run evaluating the check, held here (its record planned) while another run evaluates it and fails."""
    dg.materialize([orders, not_empty], instance=context.instance, tags={"good": "no"})
    if HELD["tick_meanwhile"]:
        tick(context.instance, HELD["resources"], HELD["definitions"])
        HELD["meanwhile"] = HELD["inbox"].read()
    return dg.AssetCheckResult(passed=True, description="12 rows")


def _held_check(aws, tick_meanwhile: bool) -> list[dict]:
    """The check passes, then a long run evaluates it: what reached the topic after the long run ended."""
    HELD.update(inbox=Inbox(aws), resources=resources(aws), tick_meanwhile=tick_meanwhile, meanwhile=None)
    HELD["definitions"] = dg.Definitions(assets=[orders], asset_checks=[not_empty_held], sensors=[SENSOR])
    with dg.instance_for_test() as instance:
        dg.materialize([orders, not_empty], instance=instance, tags={"good": "yes"})
        tick(instance, HELD["resources"], HELD["definitions"])
        dg.materialize([orders, not_empty_held], instance=instance)
        tick(instance, HELD["resources"], HELD["definitions"])
        tick(instance, HELD["resources"], HELD["definitions"])
    return HELD["inbox"].read()


def test_a_check_still_being_evaluated_holds_back_no_later_evaluation_and_is_read_once_evaluated(aws):
    after = _held_check(aws, tick_meanwhile=True)
    assert [m["state"] for m in HELD["meanwhile"]] == ["firing"]
    assert [(m["state"], m["summary"]) for m in after] == [("resolved", "12 rows (was: 0 rows)")]


def test_evaluations_read_in_one_tick_are_observed_in_the_order_they_were_evaluated(aws):
    """The long run's evaluation is planned first and evaluated last: the check passes now."""
    after = _held_check(aws, tick_meanwhile=False)
    assert [m["state"] for m in after] == ["firing", "resolved"]


@dg.asset_check(asset=orders, name="fresh")
def fresh(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
    severity = dg.AssetCheckSeverity[context.run.tags["severity"]]
    return dg.AssetCheckResult(passed=False, severity=severity, description=f"{context.run.tags['lag']} behind")


def test_a_check_failing_at_warn_then_at_error_is_sent_again_once_as_critical(aws):
    inbox = Inbox(aws)
    res = resources(aws)
    definitions = dg.Definitions(assets=[orders], asset_checks=[fresh], sensors=[SENSOR])
    with dg.instance_for_test() as instance:
        for severity, lag in (("WARN", "2 h"), ("ERROR", "3 days"), ("ERROR", "4 days")):
            dg.materialize([orders, fresh], instance=instance, tags={"severity": severity, "lag": lag})
            tick(instance, res, definitions)
    got = [(m["state"], m["severity"], m["summary"], m["reminder"]) for m in inbox.read()]
    assert got == [("firing", "warning", "2 h behind", False), ("firing", "critical", "3 days behind", True)]


@dg.asset(key=["alerts_test", "batches"], partitions_def=dg.StaticPartitionsDefinition(["acme", "zeta"]))
def batches(context: dg.AssetExecutionContext) -> int:
    if context.run.tags["good"] != "yes":
        raise RuntimeError(f"receiver {context.partition_key} is unreachable")
    return 1


def test_a_run_failure_still_open_is_reminded_every_remind_hours_though_its_run_failed_once(aws, monkeypatch):
    inbox = Inbox(aws)
    res = resources(aws, remind_hours="1")
    start = time.time()
    with dg.instance_for_test() as instance:
        run_demo(instance, 4, succeed_on=5, previous="an-earlier-attempt")  # its last attempt fails
        tick(instance, res)
        for hours in (0.5, 2, 5):
            monkeypatch.setattr(alerts_defs, "now", lambda hours=hours: start + hours * 3600)
            tick(instance, res)
    assert [(m["state"], m["reminder"]) for m in inbox.read()] == [
        ("firing", False),
        ("firing", True),
        ("firing", True),
    ]


def test_a_failed_partition_alerts_under_its_asset_and_a_rerun_of_it_resolves(aws):
    """Runs of Dagster's own asset job (the UI, backfills, redrive_failed_partitions) alert under the
    assets they selected and their partition."""
    inbox = Inbox(aws)
    res = resources(aws)
    with dg.instance_for_test() as instance:
        for partition, good in (("acme", "no"), ("zeta", "yes"), ("acme", "yes")):
            result = dg.materialize([batches], instance=instance, partition_key=partition, tags={"good": good},
                                    raise_on_error=False)  # fmt: skip
            assert result.success == (good == "yes")
            tick(instance, res)
    got = [(m["alert_key"], m["state"]) for m in inbox.read()]
    assert got == [
        ("run_failure:alerts_test/batches:acme:RuntimeError", "firing"),
        ("run_failure:alerts_test/batches:acme:RuntimeError", "resolved"),
    ]
    assert inbox.messages[0]["summary"] == "RuntimeError: receiver acme is unreachable"
    assert inbox.messages[0]["title"] == "alerts_test/batches partition acme failed"


def test_a_run_whose_resource_fails_to_start_pages_that_resources_line(aws, monkeypatch):
    """A run that fails before any step (no STEP_FAILURE) pages its resource's error, not Dagster's wrapping."""
    inbox = Inbox(aws)
    drain = build_definitions("local").resolve_job_def("process_termination_queue")
    with dg.instance_for_test() as instance:
        with monkeypatch.context() as unset:
            unset.delenv("RUNS_FLEET_TERMINATION_DLQ_URL")
            result = drain.execute_in_process(run_config={"wait_seconds": 1}, instance=instance, raise_on_error=False)
        assert not result.success
        tick(instance, resources(aws))
    (firing,) = inbox.read()
    assert firing["summary"] == "resource fleet: the environment variable RUNS_FLEET_TERMINATION_DLQ_URL is not set"


@dg.op
def _violates_an_invariant(context):
    raise dg.DagsterInvariantViolationError("the plan's output was not returned")


@dg.job
def invariant_job():
    _violates_an_invariant()


def test_a_dagster_errors_class_is_its_cause_and_left_out_of_its_summary(aws):
    inbox = Inbox(aws)
    with dg.instance_for_test() as instance:
        invariant_job.execute_in_process(instance=instance, raise_on_error=False)
        tick(instance, resources(aws))
    (firing,) = inbox.read()
    assert firing["alert_key"] == "run_failure:invariant_job:dagster._core.errors.DagsterInvariantViolationError"
    assert firing["summary"] == "the plan's output was not returned"


def _minute_run(aws, instance, defs, at):
    """A batch_minute_job run that batches the repaired receiver globex: it materializes 2026-11-20|globex."""
    from pipelines.batching.defs import MINUTE_JOB
    from resources import resources_for
    from tests.batching_helpers import decider_tick, put_receiver, put_records

    put_receiver(aws, "globex", max_batch_size=3)  # repaired
    put_records(aws, "globex", [at - dt.timedelta(seconds=5)])
    schedule = dg.build_schedule_context(
        instance=instance, scheduled_execution_time=at, resources=resources_for("local")
    )
    request = decider_tick(schedule)
    return defs.resolve_job_def(MINUTE_JOB).execute_in_process(
        run_config=request.run_config, instance=instance, tags=request.tags, resources=resources_for("local")
    )


def _failed_partition_run(aws, instance, defs):
    """A receiver_batches_job run of 2026-11-20|globex that fails: its receiver is broken."""
    from pipelines.batching.defs import PARTITION_JOB, receivers_partitions
    from resources import resources_for
    from tests.batching_helpers import put_receiver

    put_receiver(aws, "globex", initial_time="25:00")  # broken
    instance.add_dynamic_partitions(receivers_partitions.name, ["globex"])
    return defs.resolve_job_def(PARTITION_JOB).execute_in_process(
        partition_key="2026-11-20|globex", instance=instance, resources=resources_for("local"), raise_on_error=False
    )


BATCHED_AT = dt.datetime(2026, 11, 20, 10, 0, tzinfo=dt.UTC)
GLOBEX_FAILURE = "run_failure:receiver_batches:2026-11-20|globex:failure"


def test_a_failed_partition_that_a_minute_run_batches_since_is_resolved_by_that_run(aws):
    """The minute run materializes the partition: it is not FAILED any more, so the redrive launches nothing
    for it, and the minute run's materialization resolves the partition's incident."""
    from pipelines.definitions import build_definitions

    defs, inbox, res = build_definitions("local"), Inbox(aws), resources(aws)
    with dg.instance_for_test() as instance:
        failed = _failed_partition_run(aws, instance, defs)
        tick(instance, res)
        minute = _minute_run(aws, instance, defs, BATCHED_AT)
        tick(instance, res)
    assert [(m["alert_key"], m["state"], m["run_id"]) for m in inbox.read()] == [
        (GLOBEX_FAILURE, "firing", failed.run_id),
        (GLOBEX_FAILURE, "resolved", minute.run_id),
    ]


def test_a_partition_that_failed_after_a_minute_run_materialized_it_stays_failed_when_that_run_ends(aws, monkeypatch):
    """The minute run materializes the partition, then a run of the partition fails, then the minute run
    succeeds: the partition is FAILED, its incident stays open."""
    from pipelines.batching import defs as batching_defs
    from pipelines.definitions import build_definitions

    defs, inbox, res = build_definitions("local"), Inbox(aws), resources(aws)
    report, failed = batching_defs._report_minute, []

    def fail_the_partition_then_report(context, *args):
        failed.append(_failed_partition_run(aws, context.instance, defs))
        return report(context, *args)

    monkeypatch.setattr(batching_defs, "_report_minute", fail_the_partition_then_report)
    with dg.instance_for_test() as instance:
        tick(instance, res)
        _minute_run(aws, instance, defs, BATCHED_AT)
        tick(instance, res)
        open_keys = [i["alert_key"] for i in load_book(instance).open_incidents()]
    assert open_keys == [GLOBEX_FAILURE]
    assert [(m["alert_key"], m["state"], m["run_id"]) for m in inbox.read()] == [
        (GLOBEX_FAILURE, "firing", failed[0].run_id)
    ]


def test_a_lost_state_keeps_resolved_a_failed_partition_that_a_minute_run_batched_since(aws):
    from pipelines.definitions import build_definitions

    defs, inbox, res = build_definitions("local"), Inbox(aws), resources(aws)
    with dg.instance_for_test() as instance:
        _failed_partition_run(aws, instance, defs)
        tick(instance, res)
        _minute_run(aws, instance, defs, BATCHED_AT)
        tick(instance, res)
        before = [m["message_id"] for m in inbox.read()]
        _lose_state(instance)
        tick(instance, res)
        assert load_book(instance).open_incidents() == []
    assert set(m["message_id"] for m in inbox.read()) <= set(before)  # sent again as they were: receivers drop them


@dg.asset(key=["alerts_test", "extract"])
def extract(context: dg.AssetExecutionContext) -> None:
    if context.run.tags.get("extract") == "bad":
        raise ValueError("extract is broken")


@dg.asset(key=["alerts_test", "load"], deps=[extract])
def load(context: dg.AssetExecutionContext) -> None:
    if context.run.tags.get("load") != "ok":
        raise RuntimeError("load is broken")


@dg.asset(key=["alerts_test", "report"], deps=[load])
def report(context: dg.AssetExecutionContext) -> None:
    if context.run.tags.get("report") != "ok":
        raise RuntimeError("report is broken")


def pipeline_job() -> dg.JobDefinition:
    """extract, load and report, in one job that Dagster can re-execute from its failure."""
    jobs = [dg.define_asset_job("alerts_test_pipeline")]
    defs = dg.Definitions(assets=[extract, load, report], jobs=jobs, executor=dg.in_process_executor)
    return defs.resolve_job_def("alerts_test_pipeline")


def _reexecuted_until_done(instance, res) -> dict[str, str]:
    """A run fails at load; a re-execution of load alone succeeds; a re-execution from the failure fails at report;
    a re-execution from that failure succeeds. The alerts sensor ticks after each run."""
    runs: dict[str, str] = {}

    def run(name: str, tags: dict, options: dg.ReexecutionOptions | None = None) -> bool:
        with dg.execute_job(dg.reconstructable(pipeline_job), instance, tags=tags, reexecution_options=options) as done:
            runs[name], success = done.run_id, done.success
        tick(instance, res)
        return success

    tick(instance, res)
    assert not run("failed", {})
    assert run("load only", {"load": "ok"}, dg.ReexecutionOptions(runs["failed"], ["alerts_test__load"]))
    assert not run("failed again", {"load": "ok"}, dg.ReexecutionOptions.from_failure(runs["failed"], instance))
    everything_ok = {"load": "ok", "report": "ok"}
    assert run("done", everything_ok, dg.ReexecutionOptions.from_failure(runs["failed again"], instance))
    return runs


def test_a_re_execution_that_completes_a_failed_runs_work_resolves_its_failure_and_one_that_does_not_does_not(aws):
    """Dagster's re-execution from failure runs only what failed, so its unit of work is not the failed run's;
    it resolves the failures up its parent chain whose work it completed, and a re-execution of only some of the
    failed steps resolves nothing."""
    inbox = Inbox(aws)
    res = resources(aws)
    whole = "run_failure:alerts_test/extract,alerts_test/load,alerts_test/report:RuntimeError"
    rest = "run_failure:alerts_test/load,alerts_test/report:RuntimeError"
    with dg.instance_for_test() as instance:
        runs = _reexecuted_until_done(instance, res)
    got = [(m["alert_key"], m["state"], m["run_id"]) for m in inbox.read()]
    assert got == [
        (whole, "firing", runs["failed"]),
        (rest, "firing", runs["failed again"]),
        (whole, "resolved", runs["done"]),
        (rest, "resolved", runs["done"]),
    ]
    assert f"succeeded, re-executing what run {runs['failed']} left undone" in inbox.messages[2]["summary"]


PIPELINE = "alerts_test/extract,alerts_test/load,alerts_test/report"


@pytest.mark.parametrize(
    ("later", "expected"),
    [
        (
            {"extract": "bad"},  # another cause: an incident of its own, left open
            [
                (f"run_failure:{PIPELINE}:RuntimeError", "firing"),
                (f"run_failure:{PIPELINE}:ValueError", "firing"),
                (f"run_failure:{PIPELINE}:RuntimeError", "resolved"),
            ],
        ),
        ({}, [(f"run_failure:{PIPELINE}:RuntimeError", "firing")]),  # the same cause: the same incident, left open
    ],
    ids=["another cause", "the same cause"],
)
def test_a_re_execution_resolves_its_parents_failure_and_not_a_later_failure_of_the_same_work(aws, later, expected):
    """A run fails at load; a later run of the same assets fails too; a re-execution of the first from its failure
    succeeds: the later run's failure still stands."""
    inbox = Inbox(aws)
    res = resources(aws)
    with dg.instance_for_test() as instance:
        tick(instance, res)
        with dg.execute_job(dg.reconstructable(pipeline_job), instance) as first:
            failed = first.run_id
        tick(instance, res)
        with dg.execute_job(dg.reconstructable(pipeline_job), instance, tags=later) as again:
            assert not again.success
        tick(instance, res)
        everything_ok = {"load": "ok", "report": "ok"}
        options = dg.ReexecutionOptions.from_failure(failed, instance)
        with dg.execute_job(
            dg.reconstructable(pipeline_job), instance, tags=everything_ok, reexecution_options=options
        ) as done:
            assert done.success
        tick(instance, res)
    assert [(m["alert_key"], m["state"]) for m in inbox.read()] == expected


@dg.asset(key=["alerts_test", "segment_count"])
def segment_count() -> int:
    return 2


@dg.op(out=dg.DynamicOut(int))
def segments(count: int):
    for i in range(count):
        yield dg.DynamicOutput(i, mapping_key=f"segment_{i}")


@dg.op
def segment_work(context: dg.OpExecutionContext, segment: int) -> int:
    if segment == 1 and context.run.tags.get("segment_1") != "ok":
        raise RuntimeError("segment 1 is broken")
    return segment


@dg.op
def segments_done(done: list) -> int:
    return len(done)


@dg.graph_asset(key=["alerts_test", "fanned"], ins={"count": dg.AssetIn(key=["alerts_test", "segment_count"])})
def fanned(count):
    """Fans out as reclaim_agendas and batch_minute_job do (DynamicOut): its plan holds segment_work[?]."""
    return segments_done(segments(count).map(segment_work).collect())


def fan_out_job() -> dg.JobDefinition:
    jobs = [dg.define_asset_job("alerts_test_fan_out")]
    defs = dg.Definitions(assets=[segment_count, fanned], jobs=jobs, executor=dg.in_process_executor)
    return defs.resolve_job_def("alerts_test_fan_out")


def test_a_re_execution_from_failure_of_a_fan_out_completes_its_parents_work_and_resolves_its_failure(aws):
    """A run fails in one of its fanned-out steps; a re-execution from that failure (that step and what follows,
    fanned alone) succeeds: it resolves the run's failure."""
    inbox = Inbox(aws)
    res = resources(aws)
    key = "run_failure:alerts_test/fanned,alerts_test/segment_count:RuntimeError"
    with dg.instance_for_test() as instance:
        tick(instance, res)
        with dg.execute_job(dg.reconstructable(fan_out_job), instance) as first:
            failed = first.run_id
        tick(instance, res)
        options = dg.ReexecutionOptions.from_failure(failed, instance)
        with dg.execute_job(
            dg.reconstructable(fan_out_job), instance, tags={"segment_1": "ok"}, reexecution_options=options
        ) as done:
            assert done.success
        tick(instance, res)
    assert [(m["alert_key"], m["state"]) for m in inbox.read()] == [(key, "firing"), (key, "resolved")]


def test_a_lost_state_keeps_resolved_the_failures_a_re_execution_resolved(aws):
    inbox = Inbox(aws)
    res = resources(aws)
    with dg.instance_for_test() as instance:
        _reexecuted_until_done(instance, res)
        before = [m["message_id"] for m in inbox.read()]
        _lose_state(instance)
        tick(instance, res)
        assert load_book(instance).open_incidents() == []
    assert [m["message_id"] for m in inbox.read()] == before  # sent again as they were: receivers drop them


def _lose_state(instance) -> None:
    """Both documents of the alert state gone from the instance's key-value store."""
    with instance.run_storage.connect() as conn:
        table = alerts_defs.KEY_VALUES
        conn.execute(table.delete().where(table.c.key.in_([alerts_defs.STATE_KEY, alerts_defs.STATE_COPY_KEY])))


def _failing_sensor_ticks(
    instance, statuses: list[TickStatus], location: str = "groundskeeper", name: str = "queue_watch"
) -> None:
    """Ticks of a sensor ``name`` of the code location ``location`` as the daemon stores them (state and ticks
    in the instance)."""
    repository = RemoteRepositoryOrigin(RegisteredCodeLocationOrigin(location), "__repository__")
    origin = RemoteInstigatorOrigin(repository, name)
    state = InstigatorState(origin, InstigatorType.SENSOR, InstigatorStatus.RUNNING)
    if not instance.get_instigator_state(origin.get_id(), state.selector_id):
        instance.add_instigator_state(state)
    for status in statuses:
        error = SerializableErrorInfo("queue_watch: AccessDenied on ReceiveMessage", [], "ClientError")
        instance.create_tick(
            TickData(
                instigator_origin_id=origin.get_id(),
                instigator_name=name,
                instigator_type=InstigatorType.SENSOR,
                status=status,
                timestamp=time.time(),
                selector_id=state.selector_id,
                error=error if status == TickStatus.FAILURE else None,
            )
        )


@dg.sensor(name="queue_watch")
def queue_watch():
    return dg.SkipReason("a sensor of the code location whose ticks the tests store")


WATCHING = dg.Definitions(sensors=[SENSOR, queue_watch])


def test_three_failing_ticks_of_a_sensor_fire_once_and_its_next_good_tick_resolves(aws):
    inbox = Inbox(aws)
    res = resources(aws)
    with dg.instance_for_test() as instance:
        for _ in range(5):
            _failing_sensor_ticks(instance, [TickStatus.FAILURE])
            tick(instance, res, WATCHING, "groundskeeper")
        _failing_sensor_ticks(instance, [TickStatus.SKIPPED])
        tick(instance, res, WATCHING, "groundskeeper")
    got = [(m["alert_key"], m["state"]) for m in inbox.read()]
    assert got == [("tick_failure:queue_watch", "firing"), ("tick_failure:queue_watch", "resolved")]
    assert inbox.messages[0]["summary"] == "queue_watch: AccessDenied on ReceiveMessage"


def test_a_tick_failure_links_its_sensors_own_page_in_the_ui(aws):
    inbox = Inbox(aws)
    res = resources(aws, ui_url="http://dagster.example:3000")
    with dg.instance_for_test() as instance:
        _failing_sensor_ticks(instance, [TickStatus.FAILURE] * 3)
        tick(instance, res, WATCHING, "groundskeeper")
    (firing,) = inbox.read()
    assert firing["url"] == "http://dagster.example:3000/locations/__repository__@groundskeeper/sensors/queue_watch"


def test_a_tick_failure_threshold_above_ten_fires_at_its_count_of_failed_ticks(aws):
    inbox = Inbox(aws)
    res = resources(aws, tick_failures="15")
    with dg.instance_for_test() as instance:
        _failing_sensor_ticks(instance, [TickStatus.FAILURE] * 14)
        tick(instance, res, WATCHING, "groundskeeper")
        assert inbox.read() == []
        _failing_sensor_ticks(instance, [TickStatus.FAILURE])
        tick(instance, res, WATCHING, "groundskeeper")
    (firing,) = inbox.read()
    assert (firing["alert_key"], firing["state"]) == ("tick_failure:queue_watch", "firing")
    assert firing["title"] == "sensor queue_watch: 15 failed ticks in a row"


def test_a_sensor_of_the_same_name_in_another_code_location_neither_resolves_nor_fires_this_ones(aws):
    """The instance keeps the ticks of a renamed code location's queue_watch, which last did not fail;
    this location's queue_watch fails: one incident, which stays open."""
    inbox = Inbox(aws)
    res = resources(aws)
    with dg.instance_for_test() as instance:
        _failing_sensor_ticks(instance, [TickStatus.SKIPPED], location="groundskeeper-old")
        _failing_sensor_ticks(instance, [TickStatus.FAILURE] * 3)
        for _ in range(3):
            tick(instance, res, WATCHING, "groundskeeper")
    assert [(m["alert_key"], m["state"]) for m in inbox.read()] == [("tick_failure:queue_watch", "firing")]


def test_a_sensor_no_longer_in_the_code_location_does_not_alert_on_its_stored_ticks(aws):
    inbox = Inbox(aws)
    res = resources(aws)
    with dg.instance_for_test() as instance:
        _failing_sensor_ticks(instance, [TickStatus.FAILURE] * 3, name="removed_watch")
        tick(instance, res, WATCHING, "groundskeeper")
    assert inbox.read() == []


def test_a_dead_letter_depth_unread_for_five_minutes_alerts_and_resolves_once_read(aws, monkeypatch):
    """GetQueueAttributes denied on one queue: a tick or two is no signal (a throttled call pages nobody);
    from 5 minutes on, one alert; once the depth is read, it resolves and the dead letters alert."""
    inbox = Inbox(aws)
    res = resources(aws)
    dlq = aws.env["RUNS_FLEET_TERMINATION_DLQ_URL"]
    aws.client("sqs").send_message(QueueUrl=dlq, MessageBody="poison")
    real = alerts_defs.dead_letter_depth

    def denied(sqs, url):
        if url == dlq:
            raise ClientError({"Error": {"Code": "AccessDenied", "Message": "no"}}, "GetQueueAttributes")
        return real(sqs, url)

    start = time.time()
    with dg.instance_for_test() as instance:
        monkeypatch.setattr(alerts_defs, "dead_letter_depth", denied)
        for minutes in (0, 2, 4):
            monkeypatch.setattr(alerts_defs, "now", lambda minutes=minutes: start + minutes * 60)
            tick(instance, res)
        assert inbox.read() == []
        monkeypatch.setattr(alerts_defs, "now", lambda: start + 300)
        tick(instance, res)
        (unread,) = inbox.read()
        monkeypatch.setattr(alerts_defs, "dead_letter_depth", real)
        monkeypatch.setattr(alerts_defs, "now", lambda: start + 360)
        tick(instance, res)
    key = "dead_letters:runs-fleet-termination-dlq-dev"
    assert (unread["alert_key"], unread["state"], unread["kind"]) == (f"{key}:unread", "firing", "dead_letters")
    assert "AccessDenied" in unread["summary"]
    assert [(m["alert_key"], m["state"]) for m in inbox.read()] == [(f"{key}:unread", "resolved"), (key, "firing")]


class HeldQueues:
    """An SQS client (and its resource) whose every GetQueueAttributes is held, unanswered, until ``release``."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def get_client(self):
        return self

    def get_queue_attributes(self, **_):
        self.release.wait(PATIENCE)
        return {"Attributes": {}}


def test_a_dead_letter_queue_that_never_answers_holds_back_no_alert_and_counts_as_unread(aws, monkeypatch):
    monkeypatch.setattr(alerts_defs, "REQUEST_TIMEOUT_SECONDS", 1)
    inbox = Inbox(aws)
    queues = HeldQueues()
    res = {**resources(aws), "sqs": queues}
    try:
        with dg.instance_for_test() as instance:
            run_demo(instance, 4, succeed_on=5, previous="an-earlier-attempt")
            tick(instance, res)
            unread = load_book(instance).positions["dead_letters_unread"]
    finally:
        queues.release.set()
    assert [(m["alert_key"], m["state"]) for m in inbox.read()] == [
        ("run_failure:retry_demo:ThrottlingException", "firing")
    ]
    assert "runs-fleet-termination-dlq-dev" in unread


class EmptyQueues:
    """An SQS client (and its resource) whose every queue is empty, answered at once; it counts the reads."""

    def __init__(self) -> None:
        self.reads = 0

    def get_client(self):
        return self

    def get_queue_attributes(self, **_):
        self.reads += 1
        return {"Attributes": {"ApproximateNumberOfMessages": "0", "ApproximateNumberOfMessagesNotVisible": "0"}}


def test_a_sensor_catching_up_on_run_events_still_reads_the_dead_letter_depths_and_raises_no_unread(aws, monkeypatch):
    """Every tick's run-event reading has more and spends the whole budget (a backlog after a restart):
    the dead-letter depths are read all the same, so an SQS that answers never looks unread."""
    clock = [time.monotonic()]  # the sensor's monotonic clock: only the run-event reading moves it
    monkeypatch.setattr(alerts_defs, "time", SimpleNamespace(monotonic=lambda: clock[0], time=time.time))

    def backlog(instance, book, at):
        clock[0] += 3600.0  # past any tick's budget
        return [(SimpleNamespace(run_id="a-deleted-run", timestamp=at), True)], True

    monkeypatch.setattr(alerts_defs, "status_changes_in_order", backlog)
    queues = EmptyQueues()
    res = {**resources(aws), "sqs": queues}
    start, reads = time.time(), []
    with dg.instance_for_test() as instance:
        for minutes in range(0, 8, 2):
            monkeypatch.setattr(alerts_defs, "now", lambda minutes=minutes: start + minutes * 60)
            before = queues.reads
            tick(instance, res)
            reads.append(queues.reads - before)
        book = load_book(instance)
    assert [key for key in book.incidents if key.endswith(":unread")] == []
    assert reads == [2, 2, 2, 2]


def test_a_dead_letter_read_not_begun_for_want_of_time_leaves_the_unread_clock_as_it_is():
    queues, unread = EmptyQueues(), {}
    fleet = SimpleNamespace(termination_dlq_url="http://sqs/1/a-dlq", housekeeping_dlq_url="http://sqs/1/b-dlq")
    with dg.build_sensor_context() as context:
        signals = list(alerts_defs.dead_letter_signals(context, queues, fleet, None, unread, time.monotonic() - 1))
    assert unread == {}
    assert signals == []
    assert queues.reads == 0


def test_dead_letters_fire_until_the_queue_is_empty_and_the_heartbeat_is_published(aws):
    inbox = Inbox(aws)
    res = resources(aws)
    sqs = aws.client("sqs")
    dlq = aws.env["RUNS_FLEET_TERMINATION_DLQ_URL"]
    with dg.instance_for_test() as instance:
        sqs.send_message(QueueUrl=dlq, MessageBody="not json")
        tick(instance, res)
        tick(instance, res)
        sqs.purge_queue(QueueUrl=dlq)
        tick(instance, res)
        # the incidents asset shows what is open and the day's counts
        result = dg.materialize([incidents], instance=instance)
        metadata = result.asset_materializations_for_node(incidents.op.name)[0].metadata
        assert metadata["opened_24h"].value == 1
        assert metadata["resolved_24h"].value == 1
        assert metadata["open"].value == 0
        assert load_book(instance).incidents["dead_letters:runs-fleet-termination-dlq-dev"]["state"] == "resolved"
    got = [(m["alert_key"], m["state"], m["severity"]) for m in inbox.read()]
    assert got == [
        ("dead_letters:runs-fleet-termination-dlq-dev", "firing", "warning"),
        ("dead_letters:runs-fleet-termination-dlq-dev", "resolved", "warning"),
    ]
    beats = aws.client("cloudwatch").list_metrics(MetricName=HEARTBEAT_METRIC)["Metrics"]
    assert {m["Namespace"] for m in beats} == {aws.env["RUNS_FLEET_METRICS_NAMESPACE"]}
    assert ASSET_KEY.to_user_string() == "alerts/incidents"


def test_a_resolve_after_the_runbook_base_url_moved_links_the_new_one_and_names_the_last_depth_seen(aws):
    inbox = Inbox(aws)
    sqs, dlq = aws.client("sqs"), aws.env["RUNS_FLEET_TERMINATION_DLQ_URL"]
    moved = resources(aws, runbook_base_url="https://docs.example/runbooks")
    with dg.instance_for_test() as instance:
        sqs.send_message(QueueUrl=dlq, MessageBody="poison")
        tick(instance, resources(aws, runbook_base_url="https://docs-old.example/runbooks"))
        sqs.send_message(QueueUrl=dlq, MessageBody="poison")
        tick(instance, moved)
        sqs.purge_queue(QueueUrl=dlq)
        tick(instance, moved)
    resolved = inbox.read()[-1]
    assert resolved["runbook"] == "https://docs.example/runbooks/dead_letters.md"
    assert resolved["title"] == "runs-fleet-termination-dlq-dev holds 2 dead letter(s)"


def test_demo_noise_is_never_sent_though_the_sink_had_taken_nothing_before(aws):
    """make dev: the demo's dead letters are the only incident; a sink that has taken nothing yet is not
    taken for one added since they opened."""
    inbox = Inbox(aws)
    res = resources(aws)
    aws.client("sqs").send_message(QueueUrl=aws.env["RUNS_FLEET_TERMINATION_DLQ_URL"], MessageBody="poison")
    noisy = build_alerts_sensor(demo_noise=frozenset({"dead_letters"}))
    with dg.instance_for_test() as instance:
        for _ in range(3):
            with dg.build_sensor_context(instance=instance, resources=res) as context:
                noisy.evaluate_tick(context)
    assert inbox.read() == []


def test_a_topic_of_another_region_is_one_line_and_the_alert_waits(aws):
    with webhook_receiver() as receiver, dg.instance_for_test() as instance:
        res = resources(aws, sns_topic_arn="arn:aws:sns:eu-west-1:123456789012:alerts", webhook_url=receiver.url)
        run_demo(instance, 4, succeed_on=5, previous="an-earlier-attempt")
        reason = tick(instance, res)
        assert len(receiver.received) == 1  # the webhook still works
    assert "sent run_failure:retry_demo" in reason


def test_a_topic_of_another_region_stops_the_heartbeat_and_its_alert_is_sent_once_it_is_fixed(aws):
    inbox = Inbox(aws)
    bad = resources(aws, sns_topic_arn="arn:aws:sns:eu-west-1:123456789012:alerts", retry_policy=NO_WAIT)
    with dg.instance_for_test() as instance:
        run_demo(instance, 4, succeed_on=5, previous="an-earlier-attempt")
        reason = tick(instance, bad)
        assert _beats(aws) == []
        fixed = tick(instance, resources(aws, retry_policy=NO_WAIT))
    assert "no heartbeat: sns cannot deliver" in reason
    assert "kept for a later tick: 1 for sns" in reason
    assert "sent run_failure:retry_demo" in fixed
    assert [m["state"] for m in inbox.read()] == ["firing"]
    assert _beats(aws) != []


def test_a_topic_arn_that_is_not_one_stops_the_heartbeat_with_nothing_to_send(aws):
    res = resources(aws, sns_topic_arn="arn:aws:sqs:us-east-1:123456789012:alerts")
    with dg.instance_for_test() as instance:
        reason = tick(instance, res)
    assert "no heartbeat: sns cannot deliver" in reason
    assert _beats(aws) == []


def test_a_topic_of_another_account_is_one_line_and_the_alert_is_kept_for_it(aws):
    """The deployment cannot publish there (moto: no such topic; AWS: not authorised): one line per
    tick, the message kept for that sink, the webhook not held back."""
    other = "arn:aws:sns:us-east-1:210987654321:alerts"
    with webhook_receiver() as receiver, dg.instance_for_test() as instance:
        res = resources(aws, sns_topic_arn=other, webhook_url=receiver.url, retry_policy=NO_WAIT)
        run_demo(instance, 4, succeed_on=5, previous="an-earlier-attempt")
        first, second = tick(instance, res), tick(instance, res)
        assert len(receiver.received) == 1
    for reason in (first, second):
        assert "sns did not take run_failure:retry_demo" in reason
        assert f"SNS Publish to {other}: " in reason
        assert "kept for a later tick: 1 for sns" in reason
        assert "Traceback" not in reason


@pytest.mark.parametrize("status", [404, 503])
def test_a_sink_answering_an_error_keeps_the_alert_without_a_traceback(aws, status):
    with webhook_receiver() as receiver, dg.instance_for_test() as instance:
        receiver.failures = [status]
        res = resources(aws, webhook_url=receiver.url, retry_policy=NO_WAIT, sns_topic_arn=None)
        run_demo(instance, 4, succeed_on=5, previous="an-earlier-attempt")
        first = tick(instance, res)
        assert f"answered HTTP {status}" in first
        assert "kept for a later tick: 1 for webhook" in first
        tick(instance, res)
        assert len(receiver.received) == 1


def _demo_with(instance, tags: dict) -> str:
    config = {"ops": {"throttled_until_attempt": {"config": {"succeed_on_attempt": 5}}}}
    result = retry_demo.execute_in_process(run_config=config, instance=instance, tags=tags, raise_on_error=False)
    assert not result.success
    return result.run_id


@pytest.mark.parametrize("attempt", ["abc", "-1"])
def test_a_failure_whose_retry_tags_cannot_be_read_alerts_at_once(aws, attempt):
    """delayed_run_retries does not retry a run whose attempt tag it cannot read: alerting, reading
    the same decision, alerts at once."""
    inbox = Inbox(aws)
    res = resources(aws)
    with dg.instance_for_test() as instance:
        run_id = _demo_with(instance, {ATTEMPT_TAG: attempt})
        tick(instance, res)
    (firing,) = inbox.read()
    assert (firing["state"], firing["run_id"]) == ("firing", run_id)


def test_a_failure_whose_retry_is_never_launched_alerts_once_its_delay_and_margin_are_past(aws, monkeypatch):
    """The retry sensor is stopped (or the job left the code location): no retry run appears, so the
    failure alerts after its delay (10 s for retry_demo's first attempt) plus the margin, not before."""
    inbox = Inbox(aws)
    res = resources(aws)
    with dg.instance_for_test() as instance:
        run_id = _demo_with(instance, {ATTEMPT_TAG: "1"})
        tick(instance, res)
        assert inbox.read() == []
        later = time.time() + 10 + RETRY_MARGIN_SECONDS + 1
        monkeypatch.setattr(alerts_defs, "now", lambda: later)
        tick(instance, res)
        (firing,) = inbox.read()
        assert (firing["state"], firing["run_id"]) == ("firing", run_id)
        assert "no retry launched" in firing["title"]
        assert run_id not in load_book(instance).positions["awaiting_retry"]


def test_a_tick_looks_for_the_retry_of_an_awaited_failure_only_once_it_is_due(aws, monkeypatch):
    """A failure awaits its retry for up to its delay (days, for some policies): ticks before then ask nothing."""
    res = resources(aws)
    asked = []
    child_run = alerts_defs.child_run
    monkeypatch.setattr(
        alerts_defs,
        "child_run",
        lambda instance, run_id, tags: asked.append(run_id) or child_run(instance, run_id, tags),
    )
    with dg.instance_for_test() as instance:
        run_id = _demo_with(instance, {ATTEMPT_TAG: "1"})
        tick(instance, res)
        tick(instance, res)
        assert asked == []
        later = time.time() + 10 + RETRY_MARGIN_SECONDS + 1
        monkeypatch.setattr(alerts_defs, "now", lambda: later)
        tick(instance, res)
    assert asked == [run_id]


def test_a_failure_deleted_while_its_retry_is_awaited_is_one_line_and_no_alert(aws, monkeypatch, capfd):
    inbox = Inbox(aws)
    res = resources(aws)
    with dg.instance_for_test() as instance:
        run_id = _demo_with(instance, {ATTEMPT_TAG: "1"})
        tick(instance, res)
        instance.delete_run(run_id)
        later = time.time() + 10 + RETRY_MARGIN_SECONDS + 1
        monkeypatch.setattr(alerts_defs, "now", lambda: later)
        capfd.readouterr()
        tick(instance, res)
        assert run_id not in load_book(instance).positions["awaiting_retry"]
    assert inbox.read() == []
    assert f"run {run_id} failed and was deleted" in capfd.readouterr().err


def test_a_failure_retried_in_time_never_alerts_even_after_its_deadline(aws, monkeypatch):
    inbox = Inbox(aws)
    res = resources(aws)
    with dg.instance_for_test() as instance:
        first = _demo_with(instance, {ATTEMPT_TAG: "1"})
        tick(instance, res)
        run_demo(instance, 2, succeed_on=2, previous=first)
        later = time.time() + 10 + RETRY_MARGIN_SECONDS + 1
        monkeypatch.setattr(alerts_defs, "now", lambda: later)
        tick(instance, res)
        tick(instance, res)
    assert inbox.read() == []


def test_a_lineage_retried_forever_alerts_once_it_has_failed_long_enough_and_its_success_resolves(aws, monkeypatch):
    """temporal retries without end: the lineage's second failure comes after the bound (here 0 s, the
    default is an hour), so it alerts while its retries go on; the third attempt succeeds and resolves it."""
    monkeypatch.setattr(sources, "STILL_FAILING_SECONDS", 0.0)
    inbox = Inbox(aws)
    res = resources(aws)
    with dg.instance_for_test() as instance:
        first = _demo_with(instance, {POLICY_TAG: "temporal", ATTEMPT_TAG: "1"})
        tick(instance, res)
        assert inbox.read() == []
        second = _demo_with(instance, {POLICY_TAG: "temporal", ATTEMPT_TAG: "2", RETRY_OF_TAG: first, ROOT_TAG: first})
        tick(instance, res)
        (firing,) = inbox.read()
        assert (firing["state"], firing["run_id"]) == ("firing", second)
        assert "retries go on" in firing["title"]
        assert run_retry(instance.get_run_by_id(second).tags, second).wait is not None  # the retry sensor's
        third, ok = run_demo(instance, 3, succeed_on=3, root=first, previous=second)
        assert ok
        tick(instance, res)
        (resolved,) = inbox.read()
    assert (resolved["alert_key"], resolved["state"], resolved["run_id"]) == (firing["alert_key"], "resolved", third)


def test_a_lineage_whose_last_failed_run_was_terminated_alerts_without_saying_that_its_retries_go_on(aws, monkeypatch):
    """delayed_run_retries skips a run that was terminated (an operator, its max runtime): RUN_CANCELING."""
    monkeypatch.setattr(sources, "STILL_FAILING_SECONDS", 0.0)
    inbox = Inbox(aws)
    with dg.instance_for_test() as instance:
        first = _demo_with(instance, {POLICY_TAG: "temporal", ATTEMPT_TAG: "1"})
        tags = {POLICY_TAG: "temporal", ATTEMPT_TAG: "2", RETRY_OF_TAG: first, ROOT_TAG: first}
        second = instance.create_run_for_job(job_def=retry_demo, tags=tags)
        instance.report_run_canceling(second)
        instance.report_run_failed(second)
        tick(instance, resources(aws))
    (firing,) = inbox.read()
    assert firing["run_id"] == second.run_id
    assert "retries go on" not in firing["title"]


def test_a_failed_run_of_part_of_its_job_alerts_at_once_as_not_retried(aws):
    """delayed_run_retries does not re-launch a run of an op or step selection: a run request cannot select them."""
    inbox = Inbox(aws)
    with dg.instance_for_test() as instance:
        tags = {POLICY_TAG: "temporal"}
        part = instance.create_run_for_job(job_def=retry_demo, tags=tags, op_selection=["throttled_until_attempt"])
        instance.report_run_failed(part)
        tick(instance, resources(aws))
    (firing,) = inbox.read()
    assert firing["run_id"] == part.run_id
    assert "not retried, it ran part of its job's ops or steps" in firing["title"]


@dg.op(config_schema={"tableName": str, "errors": int})
def reclaim_stand_in(context: dg.OpExecutionContext) -> None:
    counters = {"reclaimed": 1, "errors": context.op_config["errors"]}
    run_summary(context, f"reclaim {context.op_config['tableName']}", counters)


@dg.job(name="reclaim_agendas", tags={"groundskeeper/capability": "reclaim"})
def reclaim_agendas_stand_in():  # the real job's name, capability tag and run config key
    reclaim_stand_in()


def test_reclaim_item_errors_are_one_incident_per_table(aws):
    """Each table has its own schedule: a clean run on B neither resolves A's item errors nor hides B's."""
    inbox = Inbox(aws)
    res = resources(aws)
    with dg.instance_for_test() as instance:
        tick(instance, res)
        runs = {}
        for name, table, errors in (("a1", "A", 7), ("b1", "B", 0), ("b2", "B", 2), ("a2", "A", 7), ("a3", "A", 0)):
            config = {"ops": {"reclaim_stand_in": {"config": {"tableName": table, "errors": errors}}}}
            runs[name] = reclaim_agendas_stand_in.execute_in_process(run_config=config, instance=instance).run_id
            tick(instance, res)
    assert [(m["alert_key"], m["state"], m["run_id"]) for m in inbox.read()] == [
        ("reclaim_errors:reclaim_agendas@A", "firing", runs["a1"]),
        ("reclaim_errors:reclaim_agendas@B", "firing", runs["b2"]),
        ("reclaim_errors:reclaim_agendas@A", "resolved", runs["a3"]),
    ]


def _reclaim_dry_run(instance) -> str:
    """A real reclaim_agendas run on the deployed table with logReclaimOnly: it reads and writes nothing."""
    from pipelines.definitions import build_definitions

    job = build_definitions("local").resolve_job_def("reclaim_agendas")
    config = {
        "tableName": PROGRESS_TABLE,
        "idFieldName": "id",
        "timeFieldName": "updatedTime",
        "reclaimAgeMinutes": 60,
        "logReclaimOnly": True,
    }
    result = job.execute_in_process(run_config=config, instance=instance)
    assert instance.get_run_by_id(result.run_id).tags[DRY_RUN_TAG] == "true"
    return result.run_id


def _reclaim_with_item_errors(instance) -> None:
    """A reclaim run (its stand-in) of the deployed table that could not write 5 items."""
    config = {"ops": {"reclaim_stand_in": {"config": {"tableName": PROGRESS_TABLE, "errors": 5}}}}
    reclaim_agendas_stand_in.execute_in_process(run_config=config, instance=instance)


def test_a_reclaim_dry_run_resolves_neither_its_tables_item_errors_nor_its_failures(aws):
    """A dry run writes nothing, so its errors (0) say nothing of the items that could not be written."""
    inbox = Inbox(aws)
    res = resources(aws)
    seed_mixed(aws.client("dynamodb"))
    with dg.instance_for_test() as instance:
        tick(instance, res)
        _reclaim_with_item_errors(instance)
        tick(instance, res)
        _reclaim_dry_run(instance)
        tick(instance, res)
        open_keys = [i["alert_key"] for i in load_book(instance).open_incidents()]
    assert open_keys == [f"reclaim_errors:reclaim_agendas@{PROGRESS_TABLE}"]
    assert [m["state"] for m in inbox.read()] == ["firing"]


def test_a_redrive_dry_run_does_not_resolve_a_failed_redrive_of_the_same_asset(aws):
    from pipelines.definitions import build_definitions
    from resources import resources_for

    job = build_definitions("local").resolve_job_def("redrive_failed_partitions")
    res = resources(aws)
    with dg.instance_for_test() as instance:
        tick(instance, res)
        job.execute_in_process(  # fails: without its own one_at_a_time tag
            run_config={"asset": "receiver_batches"},
            instance=instance,
            resources=resources_for("local"),
            tags={"groundskeeper/one_at_a_time": "mine"},
            raise_on_error=False,
        )
        tick(instance, res)
        job.execute_in_process(  # raises unless it succeeds
            run_config={"asset": "receiver_batches", "dry_run": True},
            instance=instance,
            resources=resources_for("local"),
        )
        tick(instance, res)
        open_keys = [i["alert_key"] for i in load_book(instance).open_incidents()]
    assert open_keys == ["run_failure:redrive_failed_partitions@receiver_batches:failure"]


RECLAIM_CONFIG = {"tableName": PROGRESS_TABLE, "idFieldName": "id", "timeFieldName": "updatedTime"}


def _table_errors_open(aws, instance, res) -> dg.JobDefinition:
    """The deployed table seeded, its reclaim_errors incident open: the real reclaim_agendas job."""
    seed_mixed(aws.client("dynamodb"))
    tick(instance, res)
    _reclaim_with_item_errors(instance)
    tick(instance, res)
    return build_definitions("local").resolve_job_def("reclaim_agendas")


def test_a_reclaim_run_that_does_nothing_while_another_holds_its_table_resolves_nothing(aws):
    """A run launched by hand while an older one still works on the table does nothing: its success says
    nothing of the table's items."""
    res = resources(aws)
    with dg.instance_for_test() as instance:
        job = _table_errors_open(aws, instance, res)
        instance.create_run_for_job(job, run_config=RECLAIM_CONFIG, status=dg.DagsterRunStatus.STARTED)  # holds it
        job.execute_in_process(run_config=RECLAIM_CONFIG, instance=instance)
        tick(instance, res)
        open_keys = [i["alert_key"] for i in load_book(instance).open_incidents()]
    assert open_keys == [f"reclaim_errors:reclaim_agendas@{PROGRESS_TABLE}"]


def test_a_re_execution_of_a_reclaim_run_that_did_nothing_resolves_what_it_did_once_the_table_is_free(aws):
    """The re-execution starts with its parent's tags, a dry run's among them: the work it did is its own."""
    inbox = Inbox(aws)
    res = resources(aws)
    with dg.instance_for_test() as instance:
        job = _table_errors_open(aws, instance, res)
        older = instance.create_run_for_job(job, run_config=RECLAIM_CONFIG, status=dg.DagsterRunStatus.STARTED)
        parent = job.execute_in_process(run_config=RECLAIM_CONFIG, instance=instance)  # does nothing: table held
        instance.report_run_canceled(older)  # the table is free
        child = reexecute_reclaim(instance, parent.run_id).run_id
        tick(instance, res)
    assert [m["run_id"] for m in inbox.read() if m["state"] == "resolved"] == [child]


def test_a_dry_run_is_not_the_latest_run_of_its_unit_when_a_lost_state_is_rebuilt(aws, monkeypatch):
    inbox = Inbox(aws)
    res = resources(aws)
    seed_mixed(aws.client("dynamodb"))
    with dg.instance_for_test() as instance:
        tick(instance, res)
        _reclaim_with_item_errors(instance)
        _reclaim_dry_run(instance)
        _lose_state(instance)
        later = time.time() + 2 * 3600
        monkeypatch.setattr(alerts_defs, "now", lambda: later)
        tick(instance, res)
        open_keys = [i["alert_key"] for i in load_book(instance).open_incidents()]
    assert open_keys == [f"reclaim_errors:reclaim_agendas@{PROGRESS_TABLE}"]
    assert [m["state"] for m in inbox.read()] == ["firing"]


def test_each_housekeeping_task_is_its_own_unit_of_work_and_only_its_own_success_resolves_it(aws):
    """The housekeeping job runs one task per run (run config task_type): a failing pool_audit stays open while
    stale_ssm succeeds, and while pool_audit succeeds as a dry run (it did nothing); pool_audit's own success
    resolves it."""
    from pipelines.definitions import build_definitions

    inbox = Inbox(aws)
    res = resources(aws)
    job = build_definitions("local").resolve_job_def("housekeeping")
    with dg.instance_for_test() as instance:

        def run(task: str, dry: bool = True, **params) -> tuple[str, bool]:
            config = {"task_type": task, "params": {**params, "dryRun": dry}}
            tags = {"groundskeeper/one_at_a_time": f"housekeeping:{task}"}  # as its schedule's runs carry
            result = job.execute_in_process(run_config=config, instance=instance, tags=tags, raise_on_error=False)
            tick(instance, res)
            return result.run_id, result.success

        tick(instance, res)
        bad, ok = run("pool_audit", idle_cost_threshold_usd_per_hour="high")
        assert not ok
        _, ok = run("stale_ssm")
        assert ok
        _, ok = run("pool_audit")
        assert ok
        assert sorted(load_book(instance).open_units().values()) == ["housekeeping@pool_audit"]
        good, ok = run("pool_audit", dry=False)
        assert ok
    got = [(m["alert_key"].rsplit(":", 1)[0], m["state"], m["run_id"]) for m in inbox.read()]
    assert got == [
        ("run_failure:housekeeping@pool_audit", "firing", bad),
        ("run_failure:housekeeping@pool_audit", "resolved", good),
    ]


def test_close_incident_closes_an_incident_until_a_new_failure_fires_it_again(aws):
    inbox = Inbox(aws)
    res = resources(aws)
    key = "run_failure:retry_demo:ThrottlingException"
    with dg.instance_for_test() as instance:
        run_demo(instance, 4, succeed_on=5, previous="first-lineage")
        tick(instance, res)
        wrong = close_incident.execute_in_process(run_config={"key": "run_failure:nope", "action": "close"},
                                                  instance=instance, raise_on_error=False)  # fmt: skip
        assert not wrong.success
        closed = close_incident.execute_in_process(run_config={"key": key, "action": "close", "note": "known"},
                                                   instance=instance)  # fmt: skip
        tick(instance, res)
        assert load_book(instance).open_incidents() == []
        run_demo(instance, 4, succeed_on=5, previous="second-lineage")
        tick(instance, res)
    got = [(m["alert_key"], m["state"]) for m in inbox.read()]
    assert got == [(key, "firing"), (key, "closed"), (key, "firing")]
    assert inbox.messages[1]["summary"].startswith(f"closed by hand (run {closed.run_id}): known")


def test_a_close_asked_for_before_an_incident_opened_again_leaves_the_new_opening_firing(aws):
    sqs, dlq = aws.client("sqs"), aws.env["RUNS_FLEET_TERMINATION_DLQ_URL"]
    key = "dead_letters:runs-fleet-termination-dlq-dev"
    res = resources(aws)
    with dg.instance_for_test() as instance:
        sqs.send_message(QueueUrl=dlq, MessageBody="poison")
        tick(instance, res)
        close = instance.create_run_for_job(job_def=close_incident, run_config={"key": key, "action": "close"})
        sqs.purge_queue(QueueUrl=dlq)
        tick(instance, res)  # resolved while the close run waits in the queue
        sqs.send_message(QueueUrl=dlq, MessageBody="poison")
        tick(instance, res)  # open again, after the close was asked for
        success = dg.DagsterEvent(event_type_value=dg.DagsterEventType.RUN_SUCCESS.value, job_name=close.job_name)
        instance.report_dagster_event(success, run_id=close.run_id, log_level=logging.INFO)
        tick(instance, res)
        assert load_book(instance).incidents[key]["state"] == "firing"


def test_a_close_asked_for_before_a_resolve_and_a_reopen_read_in_its_own_tick_leaves_the_new_opening_firing(aws):
    inbox = Inbox(aws)
    res = resources(aws)
    key = "run_failure:retry_demo:ThrottlingException"
    with dg.instance_for_test() as instance:
        run_demo(instance, 4, succeed_on=5, previous="first-lineage")
        tick(instance, res)
        close = instance.create_run_for_job(job_def=close_incident, run_config={"key": key, "action": "close"})
        # while the close run waits: a success resolves the incident and a new lineage fails, all read in one tick
        run_demo(instance, 1, succeed_on=1)
        run_demo(instance, 4, succeed_on=5, previous="second-lineage")
        success = dg.DagsterEvent(event_type_value=dg.DagsterEventType.RUN_SUCCESS.value, job_name=close.job_name)
        instance.report_dagster_event(success, run_id=close.run_id, log_level=logging.INFO)
        tick(instance, res)
        assert load_book(instance).incidents[key]["state"] == "firing"
    assert [m["state"] for m in inbox.read()] == ["firing", "resolved", "firing"]


def test_each_message_links_its_page_in_the_ui_and_a_runbook_that_opens(aws):
    """Under make dev the receiver serves docs/runbooks (ALERTS_RUNBOOK_BASE_URL); the terminal's
    ALERT line and the receiver's page show both links."""
    out = io.StringIO()
    with webhook_receiver() as receiver, dg.instance_for_test() as instance:
        receiver._out = out
        res = resources(aws, webhook_url=receiver.url, runbook_base_url=receiver.runbooks,
                        ui_url="http://127.0.0.1:3000")  # fmt: skip
        run_id, _ = run_demo(instance, 4, succeed_on=5, previous="an-earlier-attempt")
        tick(instance, res)
        (alert,) = receiver.received
        assert alert["url"] == f"http://127.0.0.1:3000/runs/{run_id}"
        assert alert["runbook"] == f"{receiver.runbooks}/run_failure.md"
        assert urllib.request.urlopen(alert["runbook"], timeout=60).status == 200
        for kind in KINDS:
            assert urllib.request.urlopen(f"{receiver.runbooks}/{kind}.md", timeout=60).status == 200, kind
        page = urllib.request.urlopen(receiver.page, timeout=60).read().decode()
    assert f'href="{alert["runbook"]}"' in page
    assert f'href="{alert["url"]}"' in page
    assert out.getvalue().strip().endswith(f"| {alert['url']} | runbook {alert['runbook']}")


@dg.asset(key=["alerts_test", "pools"])
def pools() -> int:
    return 1


@dg.asset_check(asset=pools, name="tagged_pools_exist")
def tagged_pools_exist() -> dg.AssetCheckResult:
    return dg.AssetCheckResult(passed=False, severity=dg.AssetCheckSeverity.ERROR, description="1 unknown pool",
                               metadata={"demo": "the demo seeds this on purpose: a pool removed"})  # fmt: skip


def test_demo_alerts_are_marked_on_every_surface_and_never_critical(aws):
    inbox = Inbox(aws)
    with webhook_receiver() as receiver, dg.instance_for_test() as instance:
        res = resources(aws, webhook_url=receiver.url)
        definitions = dg.Definitions(assets=[pools], asset_checks=[tagged_pools_exist])
        dg.materialize([pools, tagged_pools_exist], instance=instance)
        run_demo(instance, 4, succeed_on=5, previous="an-earlier-attempt")
        tick(instance, res, definitions)
        page = urllib.request.urlopen(receiver.page, timeout=60).read().decode()
        result = dg.materialize([incidents], instance=instance)
    sent = inbox.read()
    assert len(sent) == 2
    for message in sent:
        assert message["title"].startswith("[demo] "), message["alert_key"]
        assert message["_attributes"]["severity"] == "warning", message["alert_key"]
    assert [a["text"].startswith("FIRING [warning] [demo] ") for a in receiver.received] == [True, True]
    assert page.count("[demo]") == 2
    table = result.asset_materializations_for_node(incidents.op.name)[0].metadata["incidents"]
    assert len(table.schema.columns) <= 4
    assert sorted(r.data["alert"].startswith("[demo] ") for r in table.records) == [True, True]


def test_a_webhook_url_with_a_bad_port_is_one_line_sns_goes_on_and_the_heartbeat_stops(aws):
    inbox = Inbox(aws)
    res = resources(aws, webhook_url="http://hooks.example:99999/services/T000/B000/secret-token")
    with dg.instance_for_test() as instance:
        run_demo(instance, 4, succeed_on=5, previous="an-earlier-attempt")
        reason = tick(instance, res)
    assert "sent run_failure:retry_demo" in reason
    assert [m["state"] for m in inbox.read()] == ["firing"]
    assert "no heartbeat: webhook cannot deliver" in reason
    assert "secret-token" not in reason
    assert _beats(aws) == []


@pytest.mark.parametrize(
    "state",
    [
        '{"incidents": []}',
        '{"positions": {"RUN_FAILURE": "abc"}}',
        '{"positions": {"checks": []}}',
        '{"outbox": {"sns": [1]}}',
        '{"history": [1]}',
        "[1]",
    ],  # fmt: skip
)
def test_a_state_of_another_shape_starts_afresh_with_one_state_reset_alert(aws, state):
    inbox = Inbox(aws)
    res = resources(aws)
    with dg.instance_for_test() as instance:
        instance.run_storage.set_cursor_values({alerts_defs.STATE_KEY: state})
        run_demo(instance, 4, succeed_on=5, previous="an-earlier-attempt")
        tick(instance, res, CHECKED)
        tick(instance, res, CHECKED)
    got = sorted((m["kind"], m["state"]) for m in inbox.read())
    assert got == [("run_failure", "firing"), ("state_reset", "firing")]


def test_a_missing_state_whose_copy_is_unreadable_starts_afresh_with_one_state_reset_alert(aws, capfd):
    inbox = Inbox(aws)
    res = resources(aws)
    with dg.instance_for_test() as instance:
        instance.run_storage.set_cursor_values({alerts_defs.STATE_COPY_KEY: "{not json"})
        run_demo(instance, 4, succeed_on=5, previous="an-earlier-attempt")
        capfd.readouterr()
        tick(instance, res)
        tick(instance, res)
    assert sorted((m["kind"], m["state"]) for m in inbox.read()) == [
        ("run_failure", "firing"),
        ("state_reset", "firing"),
    ]
    assert "alert state unreadable (Expecting property name" in capfd.readouterr().err


def test_a_tick_whose_budget_is_spent_sends_nothing_more_and_the_next_tick_sends_it(aws, monkeypatch):
    inbox = Inbox(aws)
    res = resources(aws)
    with dg.instance_for_test() as instance:
        run_demo(instance, 4, succeed_on=5, previous="an-earlier-attempt")
        budget = [-1.0]
        monkeypatch.setattr(alerts_defs, "tick_budget_seconds", lambda: budget[0])
        reason = tick(instance, res)
        assert "time budget is spent" in reason
        assert inbox.read() == []
        budget[0] = 20.0
        tick(instance, res)
    assert [m["state"] for m in inbox.read()] == ["firing"]


@pytest.mark.slow
def test_a_tick_catching_up_on_run_events_stops_reading_in_time_to_send(aws, monkeypatch):
    """The run events never run out (a backlog read the whole tick long): the tick stops reading at half its
    budget and sends what it has (10 s left: one publish to moto, however loaded the machine)."""
    inbox = Inbox(aws)
    res = resources(aws)
    read = alerts_defs.status_changes_in_order
    with dg.instance_for_test() as instance:
        tick(instance, res)
        run_demo(instance, 4, succeed_on=5, previous="an-earlier-attempt")
        monkeypatch.setattr(alerts_defs, "tick_budget_seconds", lambda: 20.0)
        monkeypatch.setattr(alerts_defs, "status_changes_in_order", lambda *args: (read(*args)[0], True))
        tick(instance, res)
    assert [m["state"] for m in inbox.read()] == ["firing"]


def test_no_heartbeat_at_a_tick_whose_budget_was_spent_before_it_sent_anything_waiting(aws, monkeypatch):
    res = resources(aws, heartbeat_env="dev")
    beats = [{"Name": "Env", "Value": "dev"}]
    with dg.instance_for_test() as instance:
        run_demo(instance, 4, succeed_on=5, previous="an-earlier-attempt")
        tick(instance, res)  # the sink takes the firing: a heartbeat
        run_demo(instance, 1, succeed_on=1)
        monkeypatch.setattr(alerts_defs, "tick_budget_seconds", lambda: -1.0)
        tick(instance, res)  # the resolution waits
        assert metric_sum(aws, HEARTBEAT_METRIC, beats) == 1
        monkeypatch.setattr(alerts_defs, "tick_budget_seconds", lambda: 20.0)
        tick(instance, res)
    assert metric_sum(aws, HEARTBEAT_METRIC, beats) == 2


def test_the_tick_budget_ends_well_inside_the_daemons_sensor_timeout(monkeypatch):
    from pipelines.alerts.sinks import REQUEST_TIMEOUT_SECONDS

    monkeypatch.setenv("DAGSTER_SENSOR_GRPC_TIMEOUT_SECONDS", "60")
    assert alerts_defs.tick_budget_seconds() + REQUEST_TIMEOUT_SECONDS <= 30


def _beats(aws) -> list[dict]:
    return aws.client("cloudwatch").list_metrics(MetricName=HEARTBEAT_METRIC)["Metrics"]


def test_the_heartbeat_is_a_datum_of_its_deployment_and_so_is_the_alarm(aws):
    res = resources(aws, heartbeat_env="prod")
    with dg.instance_for_test() as instance:
        tick(instance, res)
    assert [m["Dimensions"] for m in _beats(aws)] == [[{"Name": "Env", "Value": "prod"}]]
    alarm = aws.client("cloudwatch").describe_alarms(AlarmNames=["groundskeeper-alerts-heartbeat-dev"])
    assert alarm["MetricAlarms"][0]["Dimensions"] == [{"Name": "Env", "Value": "dev"}]


def test_no_heartbeat_while_the_only_sink_is_a_topic_the_deployment_cannot_publish_to(aws):
    other = "arn:aws:sns:us-east-1:210987654321:alerts"
    res = resources(aws, sns_topic_arn=other, retry_policy=NO_WAIT)
    with dg.instance_for_test() as instance:
        run_demo(instance, 4, succeed_on=5, previous="an-earlier-attempt")
        reasons = [tick(instance, res) for _ in range(3)]
    assert _beats(aws) == []
    assert all("no heartbeat" in reason for reason in reasons)
    assert "210987654321" in reasons[0]


def test_no_heartbeat_while_no_sink_is_configured(aws):
    with dg.instance_for_test() as instance:
        reason = tick(instance, resources(aws, sns_topic_arn=None))
    assert _beats(aws) == []
    assert "no heartbeat: no sink configured" in reason


def test_an_incident_open_before_its_sink_was_configured_goes_to_it_once_it_is(aws):
    inbox = Inbox(aws)
    with dg.instance_for_test() as instance:
        run_demo(instance, 4, succeed_on=5, previous="an-earlier-attempt")  # its last attempt failed
        tick(instance, resources(aws, sns_topic_arn=None))
        tick(instance, resources(aws))
        tick(instance, resources(aws))
    assert [(m["kind"], m["state"]) for m in inbox.read()] == [("run_failure", "firing")]


def test_a_webhook_unset_and_set_again_gets_the_firing_of_what_opened_meanwhile_before_its_resolution(aws):
    sqs, dlq = aws.client("sqs"), aws.env["RUNS_FLEET_TERMINATION_DLQ_URL"]
    key = "dead_letters:runs-fleet-termination-dlq-dev"
    with webhook_receiver() as receiver, dg.instance_for_test() as instance:
        both = resources(aws, webhook_url=receiver.url)
        run_demo(instance, 4, succeed_on=5, previous="an-earlier-attempt")
        tick(instance, both)  # the webhook takes the run failure
        sqs.send_message(QueueUrl=dlq, MessageBody="poison")
        tick(instance, resources(aws))  # the webhook unset: the dead letters go to SNS only
        sqs.purge_queue(QueueUrl=dlq)
        tick(instance, both)
        got = [m["state"] for m in receiver.received if m["alert_key"] == key]
    assert got == ["firing", "resolved"]


def test_a_tick_that_outlived_its_lease_sends_nothing_beside_the_tick_that_took_it(aws, monkeypatch):
    """A tick held in a read past its lease (the daemon gave up on it and ticked again): the later tick
    takes the lease and sends; the held one, once it goes on, neither saves nor sends."""
    inbox, res, sqs = Inbox(aws), resources(aws), aws.client("sqs")
    sqs.send_message(QueueUrl=aws.env["RUNS_FLEET_TERMINATION_DLQ_URL"], MessageBody="poison")
    later = [0.0]
    monkeypatch.setattr(alerts_defs, "now", lambda: time.time() + later[0])
    held, go, read_ticks = threading.Event(), threading.Event(), alerts_defs.tick_signals

    def held_ticks(*args):
        if threading.current_thread().name == "held" and not go.is_set():
            held.set()
            go.wait(PATIENCE)
        return read_ticks(*args)

    monkeypatch.setattr(alerts_defs, "tick_signals", held_ticks)
    with dg.instance_for_test() as instance:
        reasons = {}
        first = threading.Thread(name="held", target=lambda: reasons.setdefault("held", tick(instance, res)))
        first.start()
        assert held.wait(PATIENCE)
        later[0] = 600.0  # past the held tick's lease
        reasons["next"] = tick(instance, res)
        go.set()
        first.join(PATIENCE)
    assert "lease lapsed" in reasons["held"]
    assert [m["state"] for m in inbox.read()] == ["firing"]


def test_the_heartbeat_comes_back_once_the_sink_takes_its_messages(aws):
    with webhook_receiver() as receiver, dg.instance_for_test() as instance:
        receiver.failures = [500]
        res = resources(aws, webhook_url=receiver.url, retry_policy=NO_WAIT, sns_topic_arn=None)
        run_demo(instance, 4, succeed_on=5, previous="an-earlier-attempt")
        tick(instance, res)
        assert _beats(aws) == []
        tick(instance, res)
        assert len(receiver.received) == 1
    assert len(_beats(aws)) == 1


@contextlib.contextmanager
def _sns_gone_a_failure_open(aws):
    """The alerts topic deleted, a webhook beside it, and a run failure to send: (receiver, instance, resources)."""
    aws.client("sns").delete_topic(TopicArn=aws.env["ALERTS_SNS_TOPIC_ARN"])
    with webhook_receiver() as receiver, dg.instance_for_test() as instance:
        res = resources(aws, webhook_url=receiver.url, retry_policy=NO_WAIT)
        run_demo(instance, 4, succeed_on=5, previous="an-earlier-attempt")
        yield receiver, instance, res


def test_a_sink_that_delivers_nothing_for_ten_ticks_is_reported_once_to_the_sink_that_delivers(aws):
    """The alerts topic deleted: the heartbeat alarm, which publishes to it, reaches nobody; the webhook hears."""
    with _sns_gone_a_failure_open(aws) as (receiver, instance, res):
        for _ in range(13):
            tick(instance, res)
        got = [(m["kind"], m["title"].split(" (")[0]) for m in receiver.received]
    assert got == [
        ("run_failure", "[demo] retry_demo failed after 4 attempts"),
        ("heartbeat", "sns has delivered no alert for 10 ticks"),
    ]


def test_a_sink_stuck_while_no_other_delivers_at_its_tenth_tick_is_reported_once_another_does(aws):
    """The webhook refuses the tenth tick's message, delivers again from the eleventh: it hears of SNS then."""
    with _sns_gone_a_failure_open(aws) as (receiver, instance, res):
        for _ in range(9):
            tick(instance, res)
        run_demo(instance, 1, succeed_on=1)  # a resolve to send at the tenth tick, which the webhook refuses
        receiver.failures.append(503)
        tick(instance, res)
        for _ in range(3):
            tick(instance, res)
        got = [(m["kind"], m["title"].split(" (")[0]) for m in receiver.received]
    assert got.count(("heartbeat", "sns has delivered no alert for 11 ticks")) == 1


class HeldSink:
    """A sink whose first send holds until ``release`` is set (``reached`` says it got there)."""

    name = "held"

    def __init__(self) -> None:
        import threading

        self.reached, self.release, self.messages = threading.Event(), threading.Event(), []

    def send(self, message):
        if not self.reached.is_set():
            self.reached.set()
            assert self.release.wait(PATIENCE)
        self.messages.append(dict(message))


def test_a_second_evaluation_while_one_is_sending_sends_nothing(aws, monkeypatch):
    import threading

    held = HeldSink()
    real = alerts_defs.alert_config

    def with_held_sink(*args, **kwargs):
        cfg = real(*args, **kwargs)
        cfg.sinks.append(held)
        return cfg

    monkeypatch.setattr(alerts_defs, "alert_config", with_held_sink)
    inbox = Inbox(aws)
    res = resources(aws)
    with dg.instance_for_test() as instance:
        run_demo(instance, 4, succeed_on=5, previous="an-earlier-attempt")
        first = threading.Thread(target=tick, args=(instance, res))
        first.start()
        assert held.reached.wait(PATIENCE)  # the first evaluation is sending
        second = tick(instance, res)
        held.release.set()
        first.join(PATIENCE)
        assert "another evaluation" in second
        assert len(held.messages) == 1
        tick(instance, res)  # the next one, after the first ended, is not held back
    assert [m["state"] for m in inbox.read()] == ["firing"]
    assert len(held.messages) == 1


def test_of_two_compare_and_sets_from_the_same_value_one_only_wins():
    with dg.instance_for_test() as instance:
        assert alerts_defs.compare_and_set(instance, "k", None, "a")
        assert not alerts_defs.compare_and_set(instance, "k", None, "b")
        assert alerts_defs.compare_and_set(instance, "k", "a", "c")
        assert not alerts_defs.compare_and_set(instance, "k", "a", "d")
        assert instance.run_storage.get_cursor_values({"k"}) == {"k": "c"}


def test_a_tick_out_of_time_says_how_far_behind_it_is(aws, monkeypatch):
    monkeypatch.setattr(alerts_defs, "EVENTS_PER_TICK", 1)
    monkeypatch.setattr(alerts_defs, "tick_budget_seconds", lambda: -1.0)
    res = resources(aws)
    with dg.instance_for_test() as instance:
        tick(instance, res)
        run_demo(instance, 4, succeed_on=5, previous="first-lineage")
        run_demo(instance, 1, succeed_on=1)
        reason = tick(instance, res)
    assert "run events: 1 read this tick, more remain, behind by" in reason


def test_a_deleted_state_document_repeats_nothing_and_forgets_no_open_incident(aws):
    inbox = Inbox(aws)
    res = resources(aws)
    with dg.instance_for_test() as instance:
        run_demo(instance, 4, succeed_on=5, previous="an-earlier-attempt")
        tick(instance, res)
        with instance.run_storage.connect() as conn:
            table = alerts_defs.KEY_VALUES
            conn.execute(table.delete().where(table.c.key == alerts_defs.STATE_KEY))
        tick(instance, res)
        open_keys = [i["alert_key"] for i in load_book(instance).open_incidents()]
        assert open_keys == ["run_failure:retry_demo:ThrottlingException"]
    (firing,) = inbox.read()
    assert firing["message_id"].startswith("run_failure:retry_demo:ThrottlingException#")


@pytest.mark.parametrize("saved", [None, '{"positions": {}}'], ids=["first tick", "saved without positions"])
def test_a_failure_while_the_daemon_was_down_for_hours_alerts_though_no_run_had_ever_failed(aws, monkeypatch, saved):
    """The sensor has ticked (afresh, or with a state saved before it read any run event), no run has
    ever failed; a run fails while the daemon is down, and the next tick comes two hours later."""
    inbox = Inbox(aws)
    res = resources(aws)
    with dg.instance_for_test() as instance:
        if saved:
            instance.run_storage.set_cursor_values({alerts_defs.STATE_KEY: saved})
        tick(instance, res)
        run_demo(instance, 4, succeed_on=5, previous="an-earlier-attempt")  # its last attempt fails
        later = time.time() + 2 * 3600
        monkeypatch.setattr(alerts_defs, "now", lambda: later)
        tick(instance, res)
    assert [(m["kind"], m["state"]) for m in inbox.read()] == [("run_failure", "firing")]


def test_a_lost_state_rebuilds_its_open_incidents_from_the_runs_with_their_message_ids(aws, monkeypatch):
    """Both state documents are deleted, and the next tick comes two hours after the failures (past
    a first tick's look back): the failure still open is rebuilt from the runs, sent again with the
    message_id it had (receivers drop it), and a later success resolves it; the failure that was
    resolved before stays resolved."""
    inbox = Inbox(aws)
    res = resources(aws)
    key = "run_failure:retry_demo:ThrottlingException"
    partition = "run_failure:alerts_test/batches:acme:RuntimeError"
    with dg.instance_for_test() as instance:
        tick(instance, res)
        run_demo(instance, 4, succeed_on=5, previous="an-earlier-attempt")
        dg.materialize([batches], instance=instance, partition_key="acme", tags={"good": "no"}, raise_on_error=False)
        tick(instance, res)
        dg.materialize([batches], instance=instance, partition_key="acme", tags={"good": "yes"})
        tick(instance, res)
        before = {(m["alert_key"], m["state"]): m["message_id"] for m in inbox.read()}
        assert sorted(before) == [(partition, "firing"), (partition, "resolved"), (key, "firing")]
        _lose_state(instance)
        later = time.time() + 2 * 3600
        monkeypatch.setattr(alerts_defs, "now", lambda: later)
        tick(instance, res)
        assert [i["alert_key"] for i in load_book(instance).open_incidents()] == [key]
        assert [m["message_id"] for m in inbox.read()] == [before[(key, "firing")]]
        run_demo(instance, 1, succeed_on=1)
        tick(instance, res)
    assert [(m["alert_key"], m["state"]) for m in inbox.read()] == [(key, "resolved")]


def test_an_sns_endpoint_that_never_answers_holds_no_tick_and_the_alert_waits_for_it(aws):
    """SNS (and STS, asked the deployment's account) at an endpoint that holds every request: the
    tick ends while its requests are still held, says so in one line and keeps the message for SNS;
    the webhook, which that tick's budget may not reach, gets it by the next tick."""
    endpoint = HoldingEndpoint()
    try:
        with webhook_receiver() as receiver, dg.instance_for_test() as instance:
            res = resources(aws, webhook_url=receiver.url)
            res["sns"] = SNSResource(region_name="us-east-1", endpoint_url=endpoint.url)
            run_demo(instance, 4, succeed_on=5, previous="an-earlier-attempt")
            reason = tick(instance, res)
            still_held = endpoint.held
            tick(instance, res)
            webhook = [m["alert_key"] for m in receiver.received]
    finally:
        endpoint.close()
    assert still_held >= 1  # the tick ended while the endpoint still held its requests
    assert "sns did not take run_failure:retry_demo" in reason
    assert "no answer within 10 s" in reason
    assert "kept for a later tick: 1 for sns" in reason
    assert webhook == ["run_failure:retry_demo:ThrottlingException"]


def test_the_demos_jobs_are_those_its_additions_add_and_production_has_none():
    from infra.demo.definitions import demo_additions
    from pipelines.definitions import Additions

    assert Additions().demo_jobs == frozenset()
    assert demo_additions({}).demo_jobs == {"retry_demo", "demo_traffic", "progressor_demo_traffic"}


def test_alerting_names_no_job_of_the_demo():
    from pathlib import Path

    from infra.demo.definitions import demo_additions

    alerting = Path(alerts_defs.__file__).parent
    text = "".join(path.read_text() for path in sorted(alerting.glob("*.py")))
    assert sorted(job for job in demo_additions({}).demo_jobs if job in text) == []


@pytest.mark.parametrize("location", ["make dev", "production"])
def test_a_failure_of_a_demo_job_is_a_demo_alert_under_make_dev_only(aws, location):
    from infra.demo.definitions import build_local_definitions
    from pipelines.definitions import build_definitions

    defs = build_local_definitions({}) if location == "make dev" else build_definitions("local")
    inbox = Inbox(aws)
    with dg.instance_for_test() as instance:
        run_demo(instance, 4, succeed_on=5, previous="an-earlier-attempt")
        with dg.build_sensor_context(instance=instance, resources=resources(aws), definitions=defs) as context:
            defs.resolve_sensor_def("alerts").evaluate_tick(context)
    (firing,) = inbox.read()
    demo = location == "make dev"
    assert firing["title"].startswith("[demo] ") == demo
    assert firing["severity"] == ("warning" if demo else "critical")
