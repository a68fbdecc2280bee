"""Metrics published after a committed change: the deployment's sink (CloudWatch or none), and a failed
publish is a warning in the run log plus ``metrics_published: false``, never a failed run."""

from __future__ import annotations

import dagster as dg
import psycopg2
import pytest

from infra.demo import progressor_engine as engine
from infra.demo.progressor_schema import create_namespace
from pipelines.progressor.defs import collect_zombies_job
from resources import resources_for
from tests.progressor_support import scratch_database, unique_namespace
from tests.reclaim_support import PROGRESS_TABLE, items_by_id, seed_mixed

CLOSED_PORT = "http://127.0.0.1:9"  # nothing listens: every AWS call fails at once
NOT_PUBLISHED = "metrics not published to CloudWatch"


@pytest.fixture(scope="module")
def dsn():
    with scratch_database() as url:
        yield url


def _zombie_namespace(dsn) -> str:
    ns = unique_namespace("sink")
    conn = psycopg2.connect(dsn)
    try:
        t = create_namespace(conn, ns)
        with conn, conn.cursor() as cur:
            engine.start_process(cur, t, "p-zombie", age_seconds=300)
            engine.start_process(cur, t, "p-live", age_seconds=5)
    finally:
        conn.close()
    return ns


def _collect_with_the_deployments_resources(dsn, monkeypatch, ns: str):
    """``collect_zombies`` with the local deployment's own resources, AWS at a closed port."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", CLOSED_PORT)
    monkeypatch.setenv("PROGRESSOR_DSN", dsn)
    resources = resources_for("local")
    instance = dg.DagsterInstance.ephemeral()
    result = collect_zombies_job.execute_in_process(
        run_config={"namespace": ns},
        resources={"progressor_db": resources["progressor_db"], "cloudwatch": resources["cloudwatch"]},
        instance=instance,
        raise_on_error=False,
    )
    logs = [(e.level, e.user_message) for e in instance.all_logs(result.run_id) if e.user_message]
    return result, logs


def _statuses(dsn, ns) -> dict[str, str]:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(f'SELECT process_id, status::text FROM "{ns}_processes"')
            return dict(cur.fetchall())
    finally:
        conn.close()


def test_collect_zombies_without_any_aws_and_sink_none(dsn, monkeypatch):
    ns = _zombie_namespace(dsn)
    monkeypatch.setenv("METRICS_SINK", "none")
    result, logs = _collect_with_the_deployments_resources(dsn, monkeypatch, ns)
    assert result.success, logs
    out = result.output_for_node("collect_namespace_zombies")
    assert (out["errored"], out["metrics_published"]) == (1, False)
    assert _statuses(dsn, ns) == {"p-zombie": "error", "p-live": "running"}
    assert not [m for _, m in logs if NOT_PUBLISHED in m or "AWS" in m], logs


def test_collect_zombies_with_cloudwatch_unreachable_warns_and_succeeds(dsn, monkeypatch):
    ns = _zombie_namespace(dsn)
    monkeypatch.delenv("METRICS_SINK", raising=False)  # the default: cloudwatch
    result, logs = _collect_with_the_deployments_resources(dsn, monkeypatch, ns)
    assert result.success, logs
    out = result.output_for_node("collect_namespace_zombies")
    assert (out["errored"], out["metrics_published"]) == (1, False)
    assert _statuses(dsn, ns) == {"p-zombie": "error", "p-live": "running"}
    warnings = [m for level, m in logs if level == 30 and NOT_PUBLISHED in m]
    assert len(warnings) == 1, logs
    assert f"progressor {ns}" in warnings[0], logs
    assert CLOSED_PORT in warnings[0], logs


def test_metrics_sink_must_be_known(monkeypatch):
    monkeypatch.setenv("METRICS_SINK", "statsd")
    with pytest.raises(ValueError, match="METRICS_SINK='statsd' is not one of cloudwatch, none"):
        resources_for("local")


@pytest.mark.slow
def test_reclaim_with_cloudwatch_unreachable_warns_and_succeeds(aws, monkeypatch):
    """Another capability through the same rule: DynamoDB on the moto server, CloudWatch at a closed port."""
    from pipelines.definitions import build_definitions

    ddb = aws.client("dynamodb")
    stale = seed_mixed(ddb)["stale"]
    before = items_by_id(ddb)
    monkeypatch.setenv("AWS_ENDPOINT_URL_CLOUDWATCH", CLOSED_PORT)
    job = build_definitions("local").resolve_job_def("reclaim_agendas")
    instance = dg.DagsterInstance.ephemeral()
    config = {"tableName": PROGRESS_TABLE, "idFieldName": "id", "timeFieldName": "updatedTime", "reclaimAgeMinutes": 60}
    result = job.execute_in_process(run_config=config, instance=instance, raise_on_error=False)
    logs = [(e.level, e.user_message) for e in instance.all_logs(result.run_id) if e.user_message]
    assert result.success, logs
    summary = result.output_for_node("report_reclaim")
    assert (summary["reclaimed"], summary["metrics_published"]) == (7, False)
    after = items_by_id(ddb)
    assert [i for i in stale if after[i] != before[i]] == stale, "the reclaim itself is committed"
    assert [m for level, m in logs if level == 30 and f"reclaim {PROGRESS_TABLE}: {NOT_PUBLISHED}" in m], logs


def test_progressor_dimension_values_are_cleaned_as_the_fleets():
    from pipelines.progressor.health import collection_datums

    [datum] = collection_datums("naïve/défaut", 3)
    assert datum["Dimensions"] == [{"Name": "Namespace", "Value": "na?ve/d?faut"}]


@pytest.mark.slow
def test_fleet_housekeeping_with_cloudwatch_unreachable_warns_and_succeeds(aws, monkeypatch):
    """The fleet's plain code publishes through the same client: the stale parameter is deleted, the run succeeds."""
    from pipelines.definitions import build_definitions
    from tests import fleet_support as fs

    aws.client("ssm").put_parameter(Name="/runs-fleet/runners/i-00000000000000001/config", Type="String", Value="{}")
    fs.past_stale_ssm_grace(monkeypatch)
    monkeypatch.setenv("AWS_ENDPOINT_URL_CLOUDWATCH", CLOSED_PORT)
    job = build_definitions("local").resolve_job_def("housekeeping")
    instance = dg.DagsterInstance.ephemeral()
    message = {"task_type": "stale_ssm", "timestamp": "2026-11-22T10:00:00Z", "params": {}}
    result = job.execute_in_process(run_config=message, instance=instance, raise_on_error=False)
    logs = [(e.level, e.user_message) for e in instance.all_logs(result.run_id) if e.user_message]
    assert result.success, logs
    assert fs.runner_parameters(aws) == set()
    [output] = [e for e in result.all_node_events if e.event_type_value == "STEP_OUTPUT"]
    assert output.event_specific_data.metadata["metrics_published"].value is False
    assert [m for level, m in logs if level == 30 and f"fleet: {NOT_PUBLISHED}" in m], logs


class _Log:
    """Where the after-commit client writes its run-log lines."""

    def __init__(self) -> None:
        self.warnings: list[str] = []

    def warning(self, message: str) -> None:
        self.warnings.append(message)


def _after_commit(**cloudwatch):
    from types import SimpleNamespace

    from pipelines.common.defs.metrics import CommittedChangeMetrics
    from resources import CloudWatchResource

    log = _Log()
    client = CommittedChangeMetrics(
        SimpleNamespace(log=log), CloudWatchResource(region_name="us-east-1", **cloudwatch), "test"
    )
    return client, log


DATUMS = [{"MetricName": "Collected", "Value": 1.0, "Unit": "Count"}]


def test_a_throttled_metrics_call_is_retried_once_by_put_metrics_and_published(aws_shared, caplog):
    """One layer retries a metrics call, the toolkit's put_metrics: its retry note is the one line of
    the retry, the second try goes through and the run's flag stays true."""
    from pipelines.common.aws_batches import put_metrics
    from tests.test_aws_batches import THROTTLED, failing

    namespace = "AfterCommitRetry"
    metrics, log = _after_commit()
    with failing(metrics._client, "PutMetricData", THROTTLED, times=1) as calls:
        with caplog.at_level("WARNING", logger="pipelines.common.aws_batches"):
            put_metrics(metrics, namespace, DATUMS)
    assert calls["all"] == 2
    assert len([r for r in caplog.records if r.getMessage().startswith("PutMetricData failed")]) == 1
    assert metrics.published
    assert log.warnings == []
    cw = aws_shared.client("cloudwatch")
    assert {m["MetricName"] for m in cw.list_metrics(Namespace=namespace)["Metrics"]} == {"Collected"}


def test_the_put_metrics_policy_is_the_only_retry_of_a_metrics_call(aws_shared):
    """With one attempt allowed, a throttled call is not tried again behind put_metrics' back."""
    from pipelines.common.aws_batches import put_metrics
    from pipelines.retry import fixed
    from tests.test_aws_batches import THROTTLED, failing

    metrics, log = _after_commit()
    with failing(metrics._client, "PutMetricData", THROTTLED, times=1) as calls:
        put_metrics(metrics, "AfterCommitOneTry", DATUMS, policy=fixed(0, max_attempts=1))
    assert calls["all"] == 1
    assert not metrics.published


def test_cloudwatch_unreachable_after_a_commit_is_one_line_after_the_policys_tries_and_no_error():
    """CloudWatch at a closed port: put_metrics tries as its policy says (2 attempts, each one
    botocore attempt), then the after-commit client says so in one line; nothing is raised."""
    from pipelines.common.aws_batches import put_metrics
    from pipelines.retry import fixed
    from tests.test_aws_batches import failing

    metrics, log = _after_commit(endpoint_url=CLOSED_PORT, max_attempts=1)
    with failing(metrics._client, "PutMetricData", {}, times=0) as calls:
        put_metrics(metrics, "AfterCommitDown", DATUMS + DATUMS, policy=fixed(0, max_attempts=2), per_call=1)
    assert calls["all"] == 4  # two calls of one datum, each tried twice
    assert len(log.warnings) == 1
    assert log.warnings[0].startswith(f"test: {NOT_PUBLISHED} (cannot reach the AWS endpoint {CLOSED_PORT}")
    assert not metrics.published
