"""One poison message must never fail its drain round: each kind the adversarial pass found (a lone
UTF-16 surrogate, non-ASCII text for a CloudWatch dimension, bodies too big for a dead-letter batch,
a write refused for one item, an unavailable dead-letter queue, a message with SQS's 10 attributes
already) among good messages. Every good message is applied and acknowledged; every poison message
is in the dead-letter queue with its reason (or, when that queue cannot be written, still in its
source queue)."""

import base64
import json

import pytest

from pipelines.fleet import calls as fleet_calls
from pipelines.fleet.drain import DrainLimits, queue_drain
from pipelines.fleet.housekeeping import HousekeepingHandler
from pipelines.retry import fixed
from tests import fleet_support as fs

TQ, DLQ = "RUNS_FLEET_TERMINATION_QUEUE_URL", "RUNS_FLEET_TERMINATION_DLQ_URL"
HQ, HDLQ = "RUNS_FLEET_HOUSEKEEPING_QUEUE_URL", "RUNS_FLEET_HOUSEKEEPING_DLQ_URL"


@pytest.fixture(autouse=True)
def _no_retry_waits(monkeypatch):
    # runs-fleet's 4 attempts, without the waits (their timeline is tested on the policy itself).
    monkeypatch.setattr(fleet_calls, "POLICY", fixed(0, max_attempts=4))


def _assert_good_applied(aws, result, good: list[dict]) -> None:
    assert result.counts["applied"] == len(good), result.counts
    assert result.counts["failed"] == 0, result.counts
    state = fs.jobs_state(aws)
    assert all(state[j["job_id"]]["status"] == "completed" for j in good)
    assert fs.metric_sum(aws, "JobSuccess") == len(good)
    assert not fs.runner_parameters(aws) & {f"/runs-fleet/runners/{j['instance_id']}/config" for j in good}


def _dead_letters(aws, queue_env: str = DLQ) -> list[tuple[str, dict]]:
    """(reason, message) of each dead letter (each must carry its reason attribute)."""
    out = []
    for message in fs.read_all(aws, queue_env):
        attrs = message.get("MessageAttributes") or {}
        assert "groundskeeper-reason" in attrs, f"a dead letter without its reason: {message['Body'][:200]}"
        assert len(attrs) <= 10
        out.append((attrs["groundskeeper-reason"]["StringValue"], message))
    return out


def _one_poison_dead_lettered(aws, result, good: list[dict], poison_job: dict) -> str:
    """The good jobs applied, the poison one untouched and its message dead-lettered: its reason."""
    _assert_good_applied(aws, result, good)
    assert result.counts["dead_lettered"] == 1
    ((reason, _),) = _dead_letters(aws)
    assert fs.jobs_state(aws)[poison_job["job_id"]]["status"] == "running"
    assert fs.depth(aws, TQ) == 0
    return reason


@pytest.mark.slow
def test_a_lone_surrogate_in_a_field_is_dead_lettered_and_the_good_messages_of_its_round_are_applied(aws):
    jobs = fs.start_jobs(aws, 21)
    poison_job, good = jobs[0], jobs[1:]
    poison = fs.termination_body(poison_job, "failure", error="boom \ud800")
    assert "\\ud800" in poison  # valid JSON text; the decoded value cannot be encoded as UTF-8
    fs.send(aws, [poison] + [fs.termination_body(j) for j in good])
    result = fs.drain(aws)
    reason = _one_poison_dead_lettered(aws, result, good, poison_job)
    assert "surrogate" in reason
    assert "error" in reason


def test_non_ascii_error_text_reaches_cloudwatch_as_an_ascii_dimension_value(aws):
    jobs = fs.start_jobs(aws, 10)
    failed_job, good = jobs[0], jobs[1:]
    bodies = [fs.termination_body(failed_job, "failure", error="Speicher \u00fcberlaufen\ntrace")]
    fs.send(aws, bodies + [fs.termination_body(j) for j in good])
    dimension_values = []

    def not_ascii(params):  # AWS refuses non-ASCII dimension values; moto does not
        values = [d["Value"] for datum in params["MetricData"] for d in datum.get("Dimensions", [])]
        dimension_values.extend(values)
        return not all(v.isascii() for v in values)

    with fs.refused(aws.client("cloudwatch"), "PutMetricData", "InvalidParameterValue", "not ASCII", not_ascii):
        result = fs.drain(aws)
    assert result.counts["applied"] == 10  # the failed job too: its text is data, not poison
    assert result.counts["failed"] == 0
    assert all(j["status"] != "running" for j in fs.jobs_state(aws).values())
    assert fs.metric_sum(aws, "JobSuccess") == 9
    assert fs.metric_sum(aws, "JobFailure", [{"Name": "Error", "Value": "Speicher ?berlaufen"}]) == 1
    assert "Speicher ?berlaufen" in dimension_values
    assert all(v.isascii() for v in dimension_values)
    assert fs.jobs_state(aws)[failed_job["job_id"]]["error"] == "Speicher \u00fcberlaufen\ntrace"  # stored as sent
    assert fs.depth(aws, TQ) == 0
    assert fs.depth(aws, DLQ) == 0


@pytest.mark.slow
def test_two_600_kb_poison_bodies_go_to_the_dead_letter_archive_with_a_pointer(aws):
    jobs = fs.start_jobs(aws, 10)
    big = [
        json.dumps({"instance_id": "i-0123456789abcdef0", "job_id": f"big-{n}", "status": "x", "pad": "x" * 600_000})
        for n in range(2)
    ]
    sqs = aws.client("sqs")
    for body in big:
        sqs.send_message(QueueUrl=aws.env[TQ], MessageBody=body)
    fs.send(aws, [fs.termination_body(j) for j in jobs])
    result = fs.drain(aws)
    _assert_good_applied(aws, result, jobs)
    assert result.counts["dead_lettered"] == 2
    dead = _dead_letters(aws)
    assert len(dead) == 2
    s3, bucket = aws.client("s3"), aws.env["RUNS_FLEET_ARCHIVE_BUCKET"]
    kept = []
    for reason, message in dead:
        assert "unknown status 'x'" in reason
        assert message["MessageAttributes"]["groundskeeper-envelope"]["StringValue"] == "s3"
        envelope = json.loads(message["Body"])
        assert envelope["body_bytes"] > 600_000
        bucket_name, key = envelope["body_s3"].removeprefix("s3://").split("/", 1)
        assert bucket_name == bucket
        kept.append(json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())["body"])
    assert sorted(kept) == sorted(big)
    assert fs.depth(aws, TQ) == 0


@pytest.mark.slow
def test_a_write_refused_for_one_job_fails_that_job_only(aws):
    jobs = fs.start_jobs(aws, 12)
    refused_job, good = jobs[0], jobs[1:]
    fs.send(aws, [fs.termination_body(j) for j in jobs])

    def with_the_refused_job(params):  # e.g. an item over DynamoDB's size limit
        return refused_job["job_id"] in json.dumps(params["TransactItems"])

    with fs.refused(
        aws.client("dynamodb"),
        "TransactWriteItems",
        "ValidationException",
        "Item size has exceeded the maximum",
        with_the_refused_job,
    ):
        result = fs.drain(aws)
    reason = _one_poison_dead_lettered(aws, result, good, refused_job)
    assert "ValidationException" in reason
    assert "Item size" in reason


def test_when_the_dead_letter_queue_is_unavailable_poison_stays_in_the_source_queue_and_good_is_applied(aws):
    jobs = fs.start_jobs(aws, 10)
    fs.send(aws, ["not json", '{"job_id": 1}'] + [fs.termination_body(j) for j in jobs])
    result = fs.drain(aws, dlq_url=aws.env[DLQ] + "-gone")
    assert result.counts["applied"] == 10
    assert result.counts["dead_lettered"] == 0
    assert result.counts["dead_letter_failed"] == 2
    assert result.counts["deleted"] == 10
    assert all(j["status"] == "completed" for j in fs.jobs_state(aws).values())
    assert fs.depth(aws, TQ) == 2  # not deleted: its redrive policy moves it after 3 receives
    assert fs.depth(aws, DLQ) == 0


@pytest.mark.slow
def test_the_housekeeping_drain_also_survives_an_unavailable_dead_letter_queue(aws, monkeypatch):
    aws.client("ssm").put_parameter(Name="/runs-fleet/runners/i-0000000000000abcd/config", Type="String", Value="{}")
    fs.past_stale_ssm_grace(monkeypatch)
    fs.send(aws, [json.dumps({"task_type": "stale_ssm"}), json.dumps({"task_type": "reboot"})], queue_env=HQ)
    result = queue_drain(
        HousekeepingHandler,
        fs.context(aws),
        sqs=aws.client("sqs"),
        queue_url=aws.env[HQ],
        dlq_url=aws.env[HDLQ] + "-gone",
        run_id="dlq-down",
        limits=DrainLimits(concurrency=1, wait_seconds=0),
    ).run()
    assert result.counts["tasks_run"] == 1
    assert result.counts["dead_letter_failed"] == 1
    assert result.counts["deleted"] == 1
    assert fs.runner_parameters(aws) == set()
    assert fs.depth(aws, HQ) == 1


def test_the_reason_survives_a_poison_message_that_already_carries_ten_attributes(aws):
    originals = {f"attr-{n}": {"DataType": "String", "StringValue": f"value {n}"} for n in range(9)}
    originals["blob"] = {"DataType": "Binary", "BinaryValue": b"\x00\x01"}
    aws.client("sqs").send_message(QueueUrl=aws.env[TQ], MessageBody="not json", MessageAttributes=originals)
    (job,) = fs.start_jobs(aws, 1)
    fs.send(aws, [fs.termination_body(job)])
    result = fs.drain(aws)
    _assert_good_applied(aws, result, [job])
    ((reason, message),) = _dead_letters(aws)
    assert "malformed JSON" in reason
    attrs = message["MessageAttributes"]
    assert attrs["groundskeeper-source-queue"]["StringValue"].startswith("runs-fleet-termination")
    assert attrs["groundskeeper-envelope"]["StringValue"] == "attributes"
    envelope = json.loads(message["Body"])
    assert envelope["body"] == "not json"
    moved = envelope["message_attributes"]
    kept = {k: v for k, v in attrs.items() if not k.startswith("groundskeeper-")}
    assert set(kept) | set(moved) == set(originals)
    assert not set(kept) & set(moved)
    for name, value in moved.items():
        if value["DataType"] == "Binary":
            assert base64.b64decode(value["BinaryValue"]) == originals[name]["BinaryValue"]
        else:
            assert value["StringValue"] == originals[name]["StringValue"]
    assert fs.depth(aws, TQ) == 0


@pytest.mark.slow
def test_a_time_with_no_utc_value_is_dead_lettered_and_the_good_messages_of_its_round_are_applied(aws):
    jobs = fs.start_jobs(aws, 3)
    poison_job, good = jobs[0], jobs[1:]
    poison = fs.termination_body(poison_job, started_at="0001-01-01T00:00:00+05:00")  # ISO, before year 1 in UTC
    fs.send(aws, [poison] + [fs.termination_body(j) for j in good])
    result = fs.drain(aws)
    reason = _one_poison_dead_lettered(aws, result, good, poison_job)
    assert "started_at is out of range in UTC" in reason


def test_a_duration_past_any_float_is_dead_lettered_and_the_good_messages_of_its_round_are_applied(aws):
    jobs = fs.start_jobs(aws, 3)
    poison_job, good = jobs[0], jobs[1:]
    fs.send(aws, [fs.termination_body(poison_job, duration_seconds=10**400)] + [fs.termination_body(j) for j in good])
    result = fs.drain(aws)
    reason = _one_poison_dead_lettered(aws, result, good, poison_job)
    assert "duration_seconds out of range" in reason


def test_a_housekeeping_parameter_past_any_float_is_dead_lettered_and_the_other_task_runs(aws):
    poison = json.dumps({"task_type": "pool_audit", "params": {"idle_cost_threshold_usd_per_hour": 10**400}})
    fs.send(aws, [json.dumps({"task_type": "cost_report"}), poison], queue_env=HQ)
    result = queue_drain(
        HousekeepingHandler,
        fs.context(aws),
        sqs=aws.client("sqs"),
        queue_url=aws.env[HQ],
        dlq_url=aws.env[HDLQ],
        run_id="past-any-float",
        limits=DrainLimits(concurrency=1, wait_seconds=0),
    ).run()
    assert result.counts["tasks_run"] == 1
    ((reason, _),) = _dead_letters(aws, HDLQ)
    assert reason.startswith("idle_cost_threshold_usd_per_hour must be a number")
    assert fs.depth(aws, HQ) == 0
