"""Dagster integration of retries: the declared retry policy and the one-line failures of op
bodies, the ``delayed_run_retries`` sensor end to end on a persistent test instance, and the
``retry_policies`` asset."""

import json
import time
from pathlib import Path

import dagster as dg
import pytest
from botocore.exceptions import ClientError

from infra.demo.defs import RetryDemoParams, throttled_until_attempt
from pipelines.common.defs.failures import (
    AWS_RETRY_POLICY,
    DEFAULT_OP_POLICY,
    dagster_retry_policy,
    one_line_failures,
)
from pipelines.retry import PRESETS, RetryPolicyError, exponential, fixed, none
from pipelines.retry.defs import RetryPoliciesParams, build_defs
from pipelines.retry.tags import ATTEMPT_TAG, PARTITION_TAG, POLICY_TAG, RETRY_OF_TAG, ROOT_TAG
from sensors.run_retries import build_delayed_run_retries

THROTTLED = {"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded"}}
INVALID = {"Error": {"Code": "ValidationException", "Message": "bad key"}}


class FlakyConfig(dg.Config):
    counter: str  # a file counting calls, so the op fails the first `failures` times
    failures: int = 2
    error: str = "throttled"  # throttled, invalid (permanent), other (not AWS), failure, interrupt


def _call_aws(config: FlakyConfig) -> int:
    path = Path(config.counter)
    calls = int(path.read_text()) + 1 if path.exists() else 1
    path.write_text(str(calls))
    if calls <= config.failures:
        if config.error == "other":
            raise ValueError("not an AWS error")
        if config.error == "failure":
            raise dg.Failure(description="the body's own failure")
        if config.error == "interrupt":
            raise dg.DagsterExecutionInterruptedError()
        raise ClientError(THROTTLED if config.error == "throttled" else INVALID, "Query")
    return calls


@dg.op
@one_line_failures
def flaky_aws_call(context: dg.OpExecutionContext, config: FlakyConfig) -> int:
    return _call_aws(config)


@dg.op(out=dg.Out(int))
@one_line_failures
def flaky_aws_outputs(context: dg.OpExecutionContext, config: FlakyConfig):
    context.log.info("a generator body")
    yield dg.Output(_call_aws(config))


@dg.job(tags={POLICY_TAG: json.dumps({"kind": "exponential", "initial": 1, "coefficient": 2, "maxAttempts": 5})})
def flaky_job():
    """No retry policy: a failed run is retried by the run-level policy of its tag (the sensor)."""
    flaky_aws_call()


RETRY_AT_ONCE = dg.RetryPolicy(max_retries=AWS_RETRY_POLICY.max_retries)
"""The declared policy's retries, without its waits."""


@dg.job(op_retry_policy=RETRY_AT_ONCE)
def retried_job():
    flaky_aws_call()


@dg.job(op_retry_policy=RETRY_AT_ONCE)
def retried_generator_job():
    flaky_aws_outputs()


def _config(tmp_path, op="flaky_aws_call", **extra):
    return {"ops": {op: {"config": {"counter": str(tmp_path / "calls"), **extra}}}}


def _retries(result) -> int:
    return sum(1 for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_UP_FOR_RETRY)


def _failure(result):
    (event,) = result.get_step_failure_events()
    return event.step_failure_data


# -- op level: Dagster's retry policy, declared -------------------------------------------------


def test_the_declared_policy_is_the_default_op_policy_in_dagsters_terms():
    assert AWS_RETRY_POLICY.max_retries == DEFAULT_OP_POLICY.max_attempts - 1
    assert AWS_RETRY_POLICY.jitter == dg.Jitter.FULL
    nominal = AWS_RETRY_POLICY._replace(jitter=None)
    for n in range(1, AWS_RETRY_POLICY.max_retries + 1):
        assert nominal.calculate_delay(n) == DEFAULT_OP_POLICY.nominal(n)  # 2 s, then 4 s
        assert 0 <= AWS_RETRY_POLICY.calculate_delay(n) <= DEFAULT_OP_POLICY.bounds(n)[1]

    assert dagster_retry_policy(none()) is None
    assert dagster_retry_policy(fixed(5, 4)) == dg.RetryPolicy(max_retries=3, delay=5.0)
    with pytest.raises(RetryPolicyError, match="number of attempts"):
        dagster_retry_policy(fixed(5, None))
    with pytest.raises(RetryPolicyError, match="no jitter 'plus-minus'"):
        dagster_retry_policy(exponential(initial=1, coefficient=2, max_attempts=3, jitter="plus-minus"))


def test_a_transient_aws_error_is_retried_by_the_declared_policy_until_success(tmp_path, instance):
    result = retried_job.execute_in_process(run_config=_config(tmp_path), instance=instance)
    assert result.output_for_node("flaky_aws_call") == 3
    assert _retries(result) == 2
    messages = [e.user_message for e in instance.all_logs(result.run_id)]
    warnings = [m for m in messages if "failed with a transient AWS error" in m]
    assert [w.split(" failed", 1)[0] for w in warnings] == ["attempt 1", "attempt 2"]
    assert "(Query was throttled (ThrottlingException))" in warnings[0]


def test_a_generator_body_is_retried_the_same_way(tmp_path):
    result = retried_generator_job.execute_in_process(run_config=_config(tmp_path, op="flaky_aws_outputs"))
    assert result.output_for_node("flaky_aws_outputs") == 3
    assert _retries(result) == 2


def test_the_last_attempt_gives_up_in_one_line(tmp_path):
    result = retried_job.execute_in_process(run_config=_config(tmp_path, failures=5), raise_on_error=False)
    assert not result.success
    description = _failure(result).user_failure_data.description
    assert description.startswith("gave up after 3 attempt(s) (2 retries): Query was throttled")
    assert "\n" not in description
    assert (tmp_path / "calls").read_text() == "3"


def test_a_permanent_aws_error_fails_in_one_line_without_a_retry(tmp_path):
    result = retried_job.execute_in_process(run_config=_config(tmp_path, error="invalid"), raise_on_error=False)
    assert not result.success
    assert "Query: ValidationException" in _failure(result).user_failure_data.description
    assert _retries(result) == 0
    assert (tmp_path / "calls").read_text() == "1"


@pytest.mark.parametrize("error", ["other", "failure", "interrupt"])
def test_an_error_that_is_not_aws_is_never_retried(tmp_path, error):
    # a retry policy retries any error; the body's decorator leaves it only the transient AWS ones
    # (an interrupt is how a run's termination reaches the op: Dagster would start it again)
    result = retried_job.execute_in_process(run_config=_config(tmp_path, error=error), raise_on_error=False)
    assert not result.success
    assert _retries(result) == 0
    assert (tmp_path / "calls").read_text() == "1"
    failure = _failure(result)
    if error == "other":  # the error itself is the cause, with its traceback
        assert failure.user_failure_data.description == "ValueError: not an AWS error"
        assert failure.error.cause.cls_name == "ValueError"


def test_without_a_retry_policy_a_transient_error_fails_at_once_in_one_line(tmp_path):
    result = flaky_job.execute_in_process(run_config=_config(tmp_path), raise_on_error=False)
    assert not result.success
    assert _failure(result).user_failure_data.description == "Query was throttled (ThrottlingException)"
    assert _retries(result) == 0


def test_a_body_must_take_the_context_first():
    with pytest.raises(TypeError, match="the context as the first parameter"):

        @one_line_failures
        def no_context(config: FlakyConfig) -> int:
            return 0


@pytest.mark.parametrize("deployment", ["make dev", "local", "prod"])
def test_every_op_asset_and_check_with_an_aws_client_declares_the_retry_policy(deployment):
    """So that a new one cannot forget it: every op of every job (the asset jobs, Dagster's
    ``__ASSET_JOB`` of every asset and check included) that requires an AWS client resource runs
    under ``one_line_failures`` with ``AWS_RETRY_POLICY``. The ``cloudwatch`` resource aside: only
    ``CommittedChangeMetrics`` uses it, and a metric never fails a step."""
    import resources.clients
    from infra.demo.definitions import build_local_definitions
    from pipelines.definitions import build_definitions
    from resources import resources_for

    aws = tuple(getattr(resources.clients, name) for name in resources.clients.__all__)  # one per AWS service
    defs = build_local_definitions() if deployment == "make dev" else build_definitions(deployment)
    given = resources_for("local" if deployment == "make dev" else deployment)  # what definitions.py hands Dagster
    assert set(defs.resources) >= set(given)
    clients = {key for key, r in given.items() if isinstance(r, aws)} - {"cloudwatch"}
    assert {"dynamodb", "s3", "sqs"} <= clients
    jobs = defs.resolve_all_job_defs()
    assert "__ASSET_JOB" in {job.name for job in jobs}  # every asset and check, also those in no job of ours
    checked, missing = set(), []
    for job in jobs:
        for handle in job.graph.iterate_node_handles():
            op_def = job.get_node(handle).definition
            if not isinstance(op_def, dg.OpDefinition) or not op_def.required_resource_keys & clients:
                continue
            checked.add(op_def.name)
            if not _has_one_line_failures(op_def.compute_fn):
                missing.append(f"{job.name}/{handle}: its body lacks @one_line_failures")
            if job.get_retry_policy_for_handle(handle) != AWS_RETRY_POLICY:
                missing.append(f"{job.name}/{handle}: retry policy {job.get_retry_policy_for_handle(handle)}")
    assert not missing, "\n".join(missing)
    assert {"receiver_batches", "drain_termination_queue", "plan_reclaim", "reclaim_segment"} <= checked


def _has_one_line_failures(fn) -> bool:
    """Whether ``fn`` (an op's compute function) is a body under ``one_line_failures``."""
    return getattr(getattr(fn, "decorated_fn", fn), "one_line_failures", False) is True


# -- run level: delayed_run_retries ------------------------------------------------------------


@pytest.fixture
def instance():
    with dg.instance_for_test() as inst:
        yield inst


def _tick(sensor, instance, defs, cursor):
    data = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, cursor=cursor, definitions=defs))
    return data, data.cursor


def _failure_time(instance, run_id) -> float:
    records = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.RUN_FAILURE).records
    return records[0].timestamp


def _first_failure(instance, tmp_path, policy: dict, failures: int, **tags):
    """The sensor over flaky_job, its definitions, and a first run that failed under ``policy``."""
    sensor = build_delayed_run_retries([flaky_job])
    defs = dg.Definitions(jobs=[flaky_job], sensors=[sensor])
    first = flaky_job.execute_in_process(
        run_config=_config(tmp_path, failures=failures),
        tags={POLICY_TAG: json.dumps(policy), **tags},
        instance=instance,
        raise_on_error=False,
    )
    return sensor, defs, first


@pytest.mark.slow
def test_delayed_run_retries_relaunches_after_the_policy_delays_until_success(instance, tmp_path, monkeypatch):
    import sensors.run_retries as run_retries

    sensor = build_delayed_run_retries([flaky_job])
    defs = dg.Definitions(jobs=[flaky_job], sensors=[sensor])
    config = _config(tmp_path)  # fails twice with a throttling error, then succeeds

    first = flaky_job.execute_in_process(run_config=config, instance=instance, raise_on_error=False)
    assert not first.success
    data, cursor = _tick(sensor, instance, defs, None)
    assert not data.run_requests
    assert "waiting" in data.skip_message

    launched = []
    failed = first.dagster_run
    for expected_delay, expected_attempt in ((1.0, 2), (2.0, 3)):  # exponential 1 s, 2 s
        due = _failure_time(instance, failed.run_id) + expected_delay
        # A controlled clock: a tick just before the delay launches nothing, a tick at it launches.
        monkeypatch.setattr(run_retries, "now", lambda at=due - 0.01: at)
        data, cursor = _tick(sensor, instance, defs, cursor)
        assert not data.run_requests, "re-launched before the computed delay"
        monkeypatch.setattr(run_retries, "now", lambda at=due: at)
        data, cursor = _tick(sensor, instance, defs, cursor)
        (request,) = data.run_requests
        assert request.run_key == failed.run_id
        assert request.tags[ATTEMPT_TAG] == str(expected_attempt)
        assert request.tags[RETRY_OF_TAG] == failed.run_id
        assert request.tags[ROOT_TAG] == first.run_id
        assert request.tags[POLICY_TAG] == flaky_job.tags[POLICY_TAG]
        run = flaky_job.execute_in_process(
            run_config=request.run_config, tags=request.tags, instance=instance, raise_on_error=False
        )
        launched.append(run)
        failed = run.dagster_run

    assert [r.success for r in launched] == [False, True]
    final = instance.get_run_by_id(launched[-1].run_id)
    assert final.status == dg.DagsterRunStatus.SUCCESS
    assert final.tags[ATTEMPT_TAG] == "3"
    assert final.tags[RETRY_OF_TAG] == launched[0].run_id
    # nothing more to do, and no failed run is ever re-launched twice
    data, cursor = _tick(sensor, instance, defs, cursor)
    assert not data.run_requests
    assert data.skip_message == "no failed run to retry"
    assert json.loads(cursor)["pending"] == {}


@pytest.mark.slow
def test_the_maximum_number_of_attempts_is_kept(instance, tmp_path):
    sensor, defs, first = _first_failure(instance, tmp_path, {"kind": "fixed", "delay": 0, "maxAttempts": 2}, 9)
    data, cursor = _tick(sensor, instance, defs, None)
    (request,) = data.run_requests
    assert request.run_key == first.run_id
    assert request.tags[ATTEMPT_TAG] == "2"
    flaky_job.execute_in_process(
        run_config=request.run_config, tags=request.tags, instance=instance, raise_on_error=False
    )
    data, cursor = _tick(sensor, instance, defs, cursor)
    assert not data.run_requests  # attempt 2 of 2 failed: STOP


@pytest.mark.slow
def test_terminated_untagged_and_badly_tagged_runs_are_not_relaunched(instance, tmp_path):
    @dg.job
    def plain_job():
        flaky_aws_call()

    sensor = build_delayed_run_retries([flaky_job, plain_job])
    defs = dg.Definitions(jobs=[flaky_job, plain_job], sensors=[sensor])
    zero = json.dumps({"kind": "fixed", "delay": 0, "maxAttempts": 3})

    terminated = instance.create_run_for_job(job_def=flaky_job, run_config=_config(tmp_path), tags={POLICY_TAG: zero})
    instance.report_run_canceling(terminated)
    instance.report_run_failed(terminated)
    plain_job.execute_in_process(run_config=_config(tmp_path, failures=9), instance=instance, raise_on_error=False)
    never = '{"kind": "fixed", "delay": 0, "maxAttempts": 3, "nonRetryable": ["ValidationException"]}'  # not read
    for bad in ('{"kind": "fixed", "delay": -1, "maxAttempts": 3}', "resque", never):
        flaky_job.execute_in_process(
            run_config=_config(tmp_path, failures=99), tags={POLICY_TAG: bad}, instance=instance, raise_on_error=False
        )
    data, cursor = _tick(sensor, instance, defs, None)
    assert not data.run_requests
    assert json.loads(cursor)["pending"] == {}


def test_a_run_already_reexecuted_by_an_operator_is_not_relaunched(instance, tmp_path, monkeypatch):
    import sensors.run_retries as run_retries

    sensor, defs, first = _first_failure(instance, tmp_path, {"kind": "fixed", "delay": 60, "maxAttempts": 3}, 1)
    start = time.time()
    # A controlled clock: the first tick comes before the 60 s delay however slow the machine is.
    monkeypatch.setattr(run_retries, "now", lambda: start)
    data, cursor = _tick(sensor, instance, defs, None)
    assert not data.run_requests
    instance.create_run_for_job(
        job_def=flaky_job, run_config=_config(tmp_path), tags={"dagster/parent_run_id": first.run_id}
    )
    monkeypatch.setattr(run_retries, "now", lambda: start + 61)  # the retry is due now
    data, cursor = _tick(sensor, instance, defs, cursor)
    assert not data.run_requests


def test_a_failure_while_the_daemon_was_down_for_hours_is_retried_though_no_run_had_ever_failed(
    instance, tmp_path, monkeypatch
):
    """The sensor has ticked with no failure ever; a run fails while the daemon is down, and the next tick
    comes two hours later: the failure is still read (a read position, not the last hour's)."""
    import sensors.run_retries as run_retries

    sensor = build_delayed_run_retries([flaky_job])
    defs = dg.Definitions(jobs=[flaky_job], sensors=[sensor])
    _, cursor = _tick(sensor, instance, defs, None)
    policy = {"kind": "fixed", "delay": 0, "maxAttempts": 2}
    first = flaky_job.execute_in_process(
        run_config=_config(tmp_path, failures=9),
        tags={POLICY_TAG: json.dumps(policy)},
        instance=instance,
        raise_on_error=False,
    )
    later = time.time() + 2 * 3600
    monkeypatch.setattr(run_retries, "now", lambda: later)
    data, _ = _tick(sensor, instance, defs, cursor)
    assert [r.run_key for r in data.run_requests] == [first.run_id]


# -- the retry_policies asset ----------------------------------------------------------------------


def test_retry_policies_asset_renders_every_preset_tagged_and_configured_policy():
    asset = build_defs([flaky_job]).get_assets_def("retry_policies")
    result = dg.materialize(
        [asset],
        run_config={
            "ops": {
                "retry_policies": {
                    "config": {
                        "policies": {
                            "exponential, 5 attempts": '{"kind": "exponential", "initial": 60, "coefficient": 3, '
                            '"maxAttempts": 5, "jitter": "plus-minus"}',
                            "typo": '{"kind": "fixed", "delay": 30}',
                        }
                    }
                }
            }
        },
    )
    metadata = result.asset_materializations_for_node("retry_policies")[0].metadata
    table = metadata["timelines"].value
    assert isinstance(table, dg.TableMetadataValue)
    assert len(table.schema.columns) <= 4  # inline on the page
    rows = {r.data["policy"]: r.data for r in table.records}
    assert rows["exponential, 5 attempts"]["attempts"] == "5"
    assert rows["exponential, 5 attempts"]["over (worst case)"].startswith("40m (")
    sketch = rows["exponential, 5 attempts"]["timeline"]
    assert sketch[0] == sketch[-1] == "●"  # attempts 1 and 5 at the ends
    assert len(sketch) == 20
    assert rows["typo"]["timeline"].startswith("invalid policy")
    assert set(rows) >= {f"preset {name}" for name in PRESETS} | {"job flaky_job"}
    document = metadata["waits"].value
    for name in PRESETS:
        assert f"### preset {name}" in document
    assert "### job flaky_job" in document
    assert "5 attempts over 40m" in document  # 60 + 180 + 540 + 1620 s = 2400 s
    assert "**invalid policy**" in document
    assert "maxAttempts" in document
    assert metadata["policies"].value == len(PRESETS) + 3, "every preset, the job's policy and the two configured"


def test_retry_policies_shows_a_job_tag_policy_with_non_retryable_as_invalid():
    tag = {POLICY_TAG: '{"kind": "fixed", "delay": 30, "maxAttempts": 3, "nonRetryable": ["ValidationException"]}'}
    asset = build_defs([dg.JobDefinition(graph_def=flaky_job.graph, name="strict_job", tags=tag)]).get_assets_def(
        "retry_policies"
    )
    result = dg.materialize([asset])
    table = result.asset_materializations_for_node("retry_policies")[0].metadata["timelines"].value
    rows = {r.data["policy"]: r.data for r in table.records}
    assert rows["job strict_job"]["timeline"].startswith("invalid policy")


@pytest.mark.slow
def test_the_code_location_wires_the_sensor_to_every_job_and_the_local_demo(instance):
    from infra.demo.definitions import build_local_definitions
    from pipelines.definitions import build_definitions

    local = build_local_definitions()
    sensor = local.resolve_sensor_def("delayed_run_retries")
    assert {"demo_traffic", "retry_demo"} <= {target.job_name for target in sensor.targets}
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
    local.resolve_assets_def("retry_policies")
    assert "retry_demo" not in {job.name for job in build_definitions("prod").resolve_all_job_defs()}

    # the demo job fails with a transient error until its third attempt, read from the run tag
    demo = local.resolve_job_def("retry_demo")
    assert demo.op_retry_policy is None
    assert throttled_until_attempt.retry_policy is None  # the run is retried
    first = demo.execute_in_process(instance=instance, raise_on_error=False)
    assert not first.success
    assert "throttled" in first.get_step_failure_events()[0].step_failure_data.user_failure_data.description
    third = demo.execute_in_process(instance=instance, tags={ATTEMPT_TAG: "3"})
    assert third.output_for_node("throttled_until_attempt") == 3


@pytest.mark.slow
def test_a_relaunch_keeps_settings_and_partition_tags_and_a_retried_run_is_never_relaunched_again(instance, tmp_path):
    extra = {
        "team": "payments",
        "dagster/priority": "5",
        "dagster/asset_partition_range_start": "2026-01-01",
        "dagster/asset_partition_range_end": "2026-01-07",
        "dagster/backfill": "abc",
        "groundskeeper/counts": '{"dead_lettered":4}',
        "groundskeeper/dry_run": "true",
    }
    policy = {"kind": "fixed", "delay": 0, "maxAttempts": 3}
    sensor, defs, first = _first_failure(instance, tmp_path, policy, 9, **extra)
    data, _ = _tick(sensor, instance, defs, None)
    (request,) = data.run_requests
    assert request.tags["team"] == "payments"
    assert request.tags["dagster/priority"] == "5"
    assert request.tags["dagster/asset_partition_range_end"] == "2026-01-07"
    assert "dagster/backfill" not in request.tags  # a backfill the instance does not hold goes on no more
    assert "groundskeeper/counts" not in request.tags  # what the failed run did is not the retry's
    assert "groundskeeper/dry_run" not in request.tags  # the retry's own config says whether it is one
    flaky_job.execute_in_process(
        run_config=request.run_config, tags=request.tags, instance=instance, raise_on_error=False
    )
    # the sensor's cursor is lost (reset by an operator): the first failure is seen again, but
    # its retry exists, so only the retry's own failure is re-launched
    data, _ = _tick(sensor, instance, defs, None)
    assert [r.run_key for r in data.run_requests] == [
        r.run_id for r in instance.get_runs(dg.RunsFilter(tags={RETRY_OF_TAG: first.run_id}))
    ]
    assert data.run_requests[0].tags[ATTEMPT_TAG] == "3"


def test_an_unreadable_cursor_starts_over_instead_of_failing_the_tick(instance, tmp_path):
    sensor, defs, first = _first_failure(instance, tmp_path, {"kind": "fixed", "delay": 0, "maxAttempts": 2}, 9)
    item = {"attempt": 2, "job": "flaky_job"}
    corrupt = [
        *({"r": {**item, "due": due}} for due in ("5", float("inf"), True)),  # a string, Infinity, a boolean
        {"r": {**item, "due": 5}, "s": {**item, "due": "6"}},
        {"r": ["due"]},
    ]
    cursors = ["not json", '{"after": "x"}', '{"pending": {"r": {"due": "soon"}}}', "[]"]
    cursors += ['{"pending": {"r": {"due": 1%s, "attempt": 2, "job": "flaky_job"}}}' % ("0" * 400)]  # past a float
    cursors += ['{"pending": {"r": {"due": 5, "attempt": 1e999, "job": "flaky_job"}}}']  # an infinite attempt
    for cursor in cursors + [json.dumps({"after": None, "pending": pending}) for pending in corrupt]:
        data, new_cursor = _tick(sensor, instance, defs, cursor)
        assert [r.run_key for r in data.run_requests] == [first.run_id]
        assert json.loads(new_cursor)["pending"] == {}


@pytest.mark.parametrize("params", [RetryPoliciesParams, RetryDemoParams])
def test_every_retry_config_key_has_a_description(params):
    from pipelines.common.params import specs

    for spec in specs(params):
        assert spec.description, spec.name


@pytest.mark.slow
def test_a_bad_retry_demo_config_fails_with_one_line(instance):
    from infra.demo.defs import retry_demo

    result = retry_demo.execute_in_process(
        run_config={"ops": {"throttled_until_attempt": {"config": {"seconds": -1.0}}}},
        instance=instance,
        raise_on_error=False,
    )
    description = result.get_step_failure_events()[0].step_failure_data.user_failure_data.description
    assert description == "invalid run config: seconds must be at least 0, got -1.0"


@pytest.mark.slow
def test_a_run_tag_naming_an_unregistered_function_is_refused_before_import(instance, tmp_path):
    # math:sqrt takes n and returns seconds: without the allow-list the sensor would call it (and os:_exit
    # would have killed the daemon); with it the run is not retried, and the sensor says why in one line.
    sensor, defs, first = _first_failure(
        instance, tmp_path, {"kind": "function", "path": "math:sqrt", "maxAttempts": 3}, failures=9
    )
    assert not first.success
    context = dg.build_sensor_context(instance=instance, cursor=None, definitions=defs)
    data = sensor.evaluate_tick(context)
    assert not data.run_requests
    assert json.loads(data.cursor)["pending"] == {}


@pytest.mark.parametrize("path", ["tests.retry_delay_functions:sys.exit", "tests.retry_delay_functions:exits"])
def test_a_run_tag_whose_delay_function_would_exit_leaves_the_sensor_running(instance, tmp_path, path):
    # The sensor calls the delay function with the attempt number from the run's tag: sys.exit(n) (or a
    # registered function raising SystemExit) would end the daemon. The path is refused, or the raise
    # is a policy error: the run is not retried and the tick completes.
    sensor, defs, first = _first_failure(
        instance, tmp_path, {"kind": "function", "path": path, "maxAttempts": 3}, failures=9, **{ATTEMPT_TAG: "1"}
    )
    assert not first.success
    data = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, cursor=None, definitions=defs))
    assert not data.run_requests
    assert json.loads(data.cursor)["pending"] == {}


def _a_bad_failure_and_a_good_one(instance, tmp_path, policy: dict):
    """A failed run tagged ``policy`` and one tagged a policy that retries it: (sensor, defs, the first, the
    second)."""
    (tmp_path / "bad").mkdir()
    (tmp_path / "good").mkdir()
    sensor, defs, bad = _first_failure(instance, tmp_path / "bad", policy, failures=9)
    good = flaky_job.execute_in_process(
        run_config=_config(tmp_path / "good", failures=9),
        tags={POLICY_TAG: json.dumps({"kind": "fixed", "delay": 0, "maxAttempts": 3})},
        instance=instance,
        raise_on_error=False,
    )
    return sensor, defs, bad, good


@pytest.mark.parametrize(
    "bad", [{"kind": []}, {"kind": {}}, {"kind": "exponential", "initial": 5, "maxAttempts": 5, "jitter": {}}]
)
def test_a_run_tag_of_the_wrong_json_type_leaves_the_sensor_retrying_other_runs(instance, tmp_path, bad):
    sensor, defs, _, good = _a_bad_failure_and_a_good_one(instance, tmp_path, bad)
    data, cursor = _tick(sensor, instance, defs, None)
    assert [r.run_key for r in data.run_requests] == [good.run_id]
    assert json.loads(cursor)["pending"] == {}


def test_a_run_of_an_unpartitioned_job_with_an_asset_selection_is_retried(instance):
    @dg.asset
    def a() -> None:
        raise RuntimeError("boom")

    @dg.asset
    def b() -> None:
        pass

    sensor = build_delayed_run_retries([dg.define_asset_job("ab_job", [a, b])])
    defs = dg.Definitions(assets=[a, b], jobs=sensor.jobs, sensors=[sensor])
    zero = json.dumps({"kind": "fixed", "delay": 0, "maxAttempts": 3})
    run = instance.create_run_for_job(
        job_def=defs.resolve_job_def("ab_job"), tags={POLICY_TAG: zero}, asset_selection=frozenset({dg.AssetKey("a")})
    )
    instance.report_run_failed(run)
    context = dg.build_sensor_context(instance=instance, instance_ref=instance.get_ref(), definitions=defs)
    data = sensor.evaluate_tick(context)
    assert [(r.job_name, r.asset_selection) for r in data.run_requests] == [("ab_job", [dg.AssetKey("a")])]


@dg.op
def boom() -> None:
    raise RuntimeError("boom")


@dg.job
def boom_job():
    """An op job with no partitions, its runs only created and reported failed."""
    boom()


def test_a_retry_of_a_partition_of_a_job_no_longer_partitioned_is_dropped(instance):
    sensor = build_delayed_run_retries([boom_job])
    defs = dg.Definitions(jobs=sensor.jobs, sensors=[sensor])
    zero = json.dumps({"kind": "fixed", "delay": 0, "maxAttempts": 3})
    run = instance.create_run_for_job(job_def=boom_job, tags={POLICY_TAG: zero, PARTITION_TAG: "2024-01-01"})
    instance.report_run_failed(run)
    context = dg.build_sensor_context(instance=instance, instance_ref=instance.get_ref(), definitions=defs)
    data = sensor.evaluate_tick(context)
    assert data.run_requests == []


@pytest.mark.parametrize("kind", ["static", "dynamic"])
def test_a_retry_whose_partition_is_gone_is_dropped_and_the_other_retries_go_on(instance, tmp_path, kind):
    """Partition a is gone since its run failed (a dynamic partition deleted, a window that moved on): a run
    request for it would fail the whole tick, its cursor unsaved, and so every retry after it."""
    if kind == "dynamic":
        parts = dg.DynamicPartitionsDefinition(name="receivers")
        instance.add_dynamic_partitions("receivers", ["b"])
    else:
        parts = dg.StaticPartitionsDefinition(["b"])

    @dg.asset(partitions_def=parts)
    def per_receiver() -> None:
        raise RuntimeError("boom")

    sensor = build_delayed_run_retries([dg.define_asset_job("per_receiver_job", [per_receiver]), flaky_job])
    defs = dg.Definitions(assets=[per_receiver], jobs=sensor.jobs, sensors=[sensor])
    zero = json.dumps({"kind": "fixed", "delay": 0, "maxAttempts": 3})
    for partition in ("a", "b"):
        run = instance.create_run_for_job(
            job_def=defs.resolve_job_def("per_receiver_job"), tags={POLICY_TAG: zero, PARTITION_TAG: partition}
        )
        instance.report_run_failed(run)
    flaky_job.execute_in_process(
        run_config=_config(tmp_path, failures=9), tags={POLICY_TAG: zero}, instance=instance, raise_on_error=False
    )
    # as the daemon's: with the instance's ref, the run requests' dynamic partitions are read from it
    context = dg.build_sensor_context(instance=instance, instance_ref=instance.get_ref(), definitions=defs)
    data = sensor.evaluate_tick(context)
    assert sorted((r.job_name, r.partition_key) for r in data.run_requests) == [
        ("flaky_job", None),
        ("per_receiver_job", "b"),
    ]
    assert json.loads(data.cursor)["pending"] == {}


def test_a_partition_materialized_since_its_run_failed_is_not_retried(instance, monkeypatch):
    """Completion cancels a scheduled attempt (the retry RFC): partition a succeeds before its retry is due."""
    import sensors.run_retries as run_retries

    failing = {"a", "b"}

    @dg.asset(partitions_def=dg.StaticPartitionsDefinition(["a", "b"]))
    def per_receiver(context: dg.AssetExecutionContext) -> None:
        if context.partition_key in failing:
            raise RuntimeError("boom")

    sensor = build_delayed_run_retries([dg.define_asset_job("per_receiver_job", [per_receiver])])
    defs = dg.Definitions(assets=[per_receiver], jobs=sensor.jobs, sensors=[sensor])
    job = defs.resolve_job_def("per_receiver_job")
    wait = {POLICY_TAG: json.dumps({"kind": "fixed", "delay": 60, "maxAttempts": 3})}
    for partition in ("a", "b"):
        job.execute_in_process(partition_key=partition, tags=wait, instance=instance, raise_on_error=False)
    start = time.time()
    monkeypatch.setattr(run_retries, "now", lambda: start)
    _, cursor = _tick(sensor, instance, defs, None)
    failing.discard("a")
    job.execute_in_process(partition_key="a", instance=instance)  # by hand, or by another job's run
    monkeypatch.setattr(run_retries, "now", lambda: start + 61)  # both retries are due now
    data, _ = _tick(sensor, instance, defs, cursor)
    assert [r.partition_key for r in data.run_requests] == ["b"]


def test_a_tick_handles_a_bounded_number_of_due_retries_the_oldest_first_and_the_rest_next_tick(instance, monkeypatch):
    """Every due retry costs a few instance reads: hundreds in one tick would pass the sensor's timeout, the tick
    failing with its cursor unsaved, again and again."""
    import sensors.run_retries as run_retries

    monkeypatch.setattr(run_retries, "RETRIES_PER_TICK", 2)

    sensor = build_delayed_run_retries([boom_job])
    defs = dg.Definitions(jobs=sensor.jobs, sensors=[sensor])
    zero = json.dumps({"kind": "fixed", "delay": 0, "maxAttempts": 3})
    failed = []
    for _ in range(3):
        run = instance.create_run_for_job(job_def=boom_job, tags={POLICY_TAG: zero})
        instance.report_run_failed(run)
        failed.append(run.run_id)
    data, cursor = _tick(sensor, instance, defs, None)
    assert [r.run_key for r in data.run_requests] == failed[:2]
    assert list(json.loads(cursor)["pending"]) == failed[2:]
    data, cursor = _tick(sensor, instance, defs, cursor)
    assert [r.run_key for r in data.run_requests] == failed[2:]
    assert json.loads(cursor)["pending"] == {}


@dg.op
def prepare() -> None:
    """Succeeds: a re-execution from failure of two_step_job runs flaky_aws_call alone."""


@dg.job(executor_def=dg.in_process_executor)
def two_step_job():
    prepare()
    flaky_aws_call()


def test_a_run_of_part_of_its_job_is_not_relaunched_as_the_whole_job(instance, tmp_path):
    """A run request carries no op or step selection: its re-launch would run prepare again."""
    sensor = build_delayed_run_retries([two_step_job])
    defs = dg.Definitions(jobs=[two_step_job], sensors=[sensor])
    config = _config(tmp_path, failures=9)
    zero = {POLICY_TAG: json.dumps({"kind": "fixed", "delay": 0, "maxAttempts": 3})}
    first = two_step_job.execute_in_process(run_config=config, tags=zero, instance=instance, raise_on_error=False)
    options = dg.ReexecutionOptions.from_failure(first.run_id, instance)
    tags = {**zero, "dagster/parent_run_id": first.run_id}  # the failed run's tags and the parent, as the UI's
    with dg.execute_job(
        dg.reconstructable(two_step_job), instance, tags=tags, reexecution_options=options
    ) as from_failure:
        assert from_failure.dagster_run.step_keys_to_execute == ["flaky_aws_call"]
    ops = instance.create_run_for_job(two_step_job, run_config=config, tags=zero, op_selection=["flaky_aws_call"])
    instance.report_run_failed(ops)  # as a launch of the selected op from the UI that failed
    whole = two_step_job.execute_in_process(run_config=config, tags=zero, instance=instance, raise_on_error=False)
    data, _ = _tick(sensor, instance, defs, None)
    assert [r.run_key for r in data.run_requests] == [whole.run_id]  # first was re-executed: not retried either


CLI_PACKAGE = "tests.retry_function_package"


@pytest.mark.slow
def test_a_run_tag_naming_a_registered_packages_command_line_leaves_the_sensor_retrying_other_runs(
    instance, tmp_path, monkeypatch
):
    # The package is registered; importing its __main__ would run its command line, which exits.
    # That run is not retried (one line in the tick's log) and the tick goes on with the next run.
    import sys

    monkeypatch.setenv("GROUNDSKEEPER_RETRY_FUNCTIONS", f"tests.retry_delay_functions,{CLI_PACKAGE}")
    monkeypatch.delitem(sys.modules, f"{CLI_PACKAGE}.__main__", raising=False)
    cli = {"kind": "function", "path": f"{CLI_PACKAGE}.__main__:main", "maxAttempts": 3}
    sensor, defs, bad, good = _a_bad_failure_and_a_good_one(instance, tmp_path, cli)
    for tick in range(2):  # and on the next tick too
        data, _ = _tick(sensor, instance, defs, None)
        assert [r.run_key for r in data.run_requests] == [good.run_id], f"tick {tick}"
    assert f"{CLI_PACKAGE}.__main__" not in sys.modules


@pytest.mark.slow
def test_locally_retry_policies_is_materialized_once_when_never_materialized(instance):
    from pipelines.definitions import build_definitions

    assert "retry_policies_on_start" not in {s.name for s in build_definitions("prod").sensors or []}
    from infra.demo.definitions import build_local_definitions

    local = build_local_definitions()
    sensor = local.resolve_sensor_def("retry_policies_on_start")
    first = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, definitions=local))
    assert [r.run_key for r in first.run_requests] == ["first-materialization"]
    dg.materialize([local.resolve_assets_def("retry_policies")], instance=instance)
    again = sensor.evaluate_tick(dg.build_sensor_context(instance=instance, definitions=local))
    assert not again.run_requests
    assert "is materialized" in again.skip_message
    # Its cursor remembers it: later ticks do not read the instance again (a context without one).
    later = sensor.evaluate_tick(dg.build_sensor_context(cursor=again.cursor, definitions=local))
    assert not later.run_requests
    assert "is materialized" in later.skip_message
