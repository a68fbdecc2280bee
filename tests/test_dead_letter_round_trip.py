"""A dead letter goes back as the message it was: poison -> fixed -> redriven -> processed, for a
plain dead letter and for each envelope kind (``attributes``: attributes beyond SQS's 10 in the
body; ``s3``: the whole message in the archive bucket)."""

import json

import pytest

from pipelines.common import to_item
from pipelines.common.sqs import queue_name
from pipelines.fleet import calls as fleet_calls
from pipelines.fleet import dead_letter_redrive
from pipelines.fleet.dead_letter_redrive import RedriveSettings, redrive_dead_letters
from pipelines.fleet.messages import fingerprint
from pipelines.retry import fixed
from tests import fleet_support as fs

TQ, DLQ = "RUNS_FLEET_TERMINATION_QUEUE_URL", "RUNS_FLEET_TERMINATION_DLQ_URL"


@pytest.fixture(autouse=True)
def _no_retry_waits(monkeypatch):
    monkeypatch.setattr(fleet_calls, "POLICY", fixed(0, max_attempts=4))


def _redrive(aws, **settings) -> dict:
    return redrive_dead_letters(fs.redrive_run(aws), None, RedriveSettings(rate_per_second=100, **settings))


def _peek(aws, queue_env: str) -> dict:
    """The queue's one message, left visible for the next reader."""
    [message] = (
        aws.client("sqs")
        .receive_message(
            QueueUrl=aws.env[queue_env],
            MaxNumberOfMessages=10,
            VisibilityTimeout=0,
            MessageAttributeNames=["All"],
        )
        .get("Messages", [])
    )
    return message


ATTRIBUTES = {
    "none": {},
    "attributes": {f"attr-{n}": {"DataType": "String", "StringValue": f"value {n}"} for n in range(9)}
    | {"blob": {"DataType": "Binary", "BinaryValue": b"\x00\x01\xff"}},
    # 10 binary attributes of 26,000 bytes: with the reason, the envelope would pass 256 KiB
    "s3": {f"blob-{n}": {"DataType": "Binary", "BinaryValue": bytes([n]) * 26_000} for n in range(10)},
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["none", "attributes", "s3"])
def test_a_redriven_dead_letter_is_the_original_message_and_is_processed_once_its_cause_is_fixed(aws, kind):
    (job,) = fs.start_jobs(aws, 1)
    table = aws.env["RUNS_FLEET_JOBS_TABLE"]
    ddb = aws.client("dynamodb")
    ddb.delete_item(TableName=table, Key={"job_id": {"S": job["job_id"]}})  # poison: a job not written yet
    body, originals = fs.termination_body(job), ATTRIBUTES[kind]
    aws.client("sqs").send_message(QueueUrl=aws.env[TQ], MessageBody=body, MessageAttributes=originals)

    poisoned = fs.drain(aws)
    assert poisoned.counts["dead_lettered"] == 1, poisoned.counts
    dead = _peek(aws, DLQ)
    assert "unknown job_id" in dead["MessageAttributes"]["groundskeeper-reason"]["StringValue"]
    envelope = dead["MessageAttributes"].get("groundskeeper-envelope", {}).get("StringValue", "none")
    assert envelope == kind
    if kind != "none":
        assert json.loads(dead["Body"])["envelope"] == "groundskeeper-dead-letter"

    ddb.put_item(TableName=table, Item=to_item(job))  # the cause is fixed: the job exists now
    out = _redrive(aws)
    assert out["redriven"] == 1, out
    assert fs.depth(aws, DLQ) == 0
    back = _peek(aws, TQ)
    assert back["Body"] == body
    restored = {k: v for k, v in back.get("MessageAttributes", {}).items() if k != "groundskeeper-redrive-count"}
    assert restored == originals  # the originals, the dead-letter attributes left behind
    if len(originals) < 10:
        assert back["MessageAttributes"]["groundskeeper-redrive-count"]["StringValue"] == "1"

    processed = fs.drain(aws)
    assert processed.counts["applied"] == 1, processed.counts
    assert processed.counts["dead_lettered"] == 0, processed.counts
    assert fs.jobs_state(aws)[job["job_id"]]["status"] == "completed"
    assert fs.depth(aws, TQ) == 0
    assert fs.depth(aws, DLQ) == 0
    listed = aws.client("s3").list_objects_v2(Bucket=aws.env["RUNS_FLEET_ARCHIVE_BUCKET"], Prefix="dead-letters/")
    assert not [o["Key"] for o in listed.get("Contents", []) if "/quarantine/" in o["Key"]]


@pytest.mark.slow
def test_a_dead_letter_whose_envelope_cannot_be_opened_is_quarantined_with_the_reason(aws):
    sqs, s3, bucket = aws.client("sqs"), aws.client("s3"), aws.env["RUNS_FLEET_ARCHIVE_BUCKET"]
    envelope = {"DataType": "String", "StringValue": "s3"}
    bodies = {
        "not json": "{",
        "outside the archive": json.dumps(
            {"envelope": "groundskeeper-dead-letter", "body_s3": "s3://elsewhere/x.json", "body_sha256": "0"}
        ),
        "missing": json.dumps(
            {
                "envelope": "groundskeeper-dead-letter",
                "body_s3": f"s3://{bucket}/dead-letters/{queue_name(aws.env[TQ])}/oversized/gone.json",
                "body_sha256": "0",
            }
        ),
        # an archived message that would open, but in another queue's folder
        "another queue's": json.dumps(
            {
                "envelope": "groundskeeper-dead-letter",
                "body_s3": f"s3://{bucket}/dead-letters/runs-fleet-housekeeping/oversized/other.json",
                "body_sha256": fingerprint("{}"),
            }
        ),
    }
    s3.put_object(
        Bucket=bucket,
        Key="dead-letters/runs-fleet-housekeeping/oversized/other.json",
        Body=json.dumps({"body": "{}", "message_attributes": {}}).encode(),
    )
    for body in bodies.values():
        sqs.send_message(
            QueueUrl=aws.env[DLQ], MessageBody=body, MessageAttributes={"groundskeeper-envelope": envelope}
        )
    out = _redrive(aws)
    assert out["quarantined"] == 4, out
    assert out["bad_envelope"] == 4, out
    assert out.get("redriven", 0) == 0
    assert fs.depth(aws, DLQ) == 0
    assert fs.depth(aws, TQ) == 0
    listed = s3.list_objects_v2(Bucket=bucket, Prefix="dead-letters/")
    reasons = sorted(
        json.loads(s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read())["last_reason"]
        for o in listed["Contents"]
        if "/quarantine/" in o["Key"]
    )
    assert len(reasons) == 4
    assert all(r.startswith("envelope cannot be opened: ") for r in reasons)
    assert any("not JSON" in r for r in reasons)
    assert any("does not exist" in r for r in reasons)
    assert any("is not in s3://" in r for r in reasons)


def test_an_envelope_nested_deeper_than_the_parser_goes_is_quarantined_and_the_other_dead_letters_redriven(aws):
    body = fs.termination_body(fs.start_jobs(aws, 1)[0])
    sqs, envelope = aws.client("sqs"), {"DataType": "String", "StringValue": "attributes"}
    sqs.send_message(
        QueueUrl=aws.env[DLQ], MessageBody="[" * 100_000, MessageAttributes={"groundskeeper-envelope": envelope}
    )
    sqs.send_message(QueueUrl=aws.env[DLQ], MessageBody=body)
    out = _redrive(aws)
    assert out["bad_envelope"] == 1, out
    assert out["quarantined"] == 1, out
    assert out["redriven"] == 1, out
    assert fs.depth(aws, DLQ) == 0
    assert _peek(aws, TQ)["Body"] == body


def test_a_dead_letter_that_sqs_moved_is_recorded_as_failing_its_queues_receives_not_a_fixed_count(aws):
    job = fs.start_jobs(aws, 1)[0]
    aws.client("sqs").send_message(QueueUrl=aws.env[DLQ], MessageBody=fs.termination_body(job))
    _redrive(aws)
    s3, bucket = aws.client("s3"), aws.env["RUNS_FLEET_ARCHIVE_BUCKET"]
    (key,) = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="dead-letters/")["Contents"]]
    record = json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    assert record["last_reason"] == "failed its source queue's maxReceiveCount receives (SQS redrive policy)"


def test_a_dead_letter_that_could_not_be_deleted_after_its_redrive_is_counted_as_such(aws):
    job = fs.start_jobs(aws, 1)[0]
    aws.client("sqs").send_message(QueueUrl=aws.env[DLQ], MessageBody=fs.termination_body(job))
    run = fs.redrive_run(aws)
    with fs.refused(run.sqs, "DeleteMessageBatch", "AccessDenied", "not allowed here", lambda params: True):
        out = redrive_dead_letters(run, None, RedriveSettings(rate_per_second=100))
    assert out["delete_failed"] == 1
    assert out["redriven"] == 1


def test_a_dead_letter_its_queue_refuses_stays_a_dead_letter_with_one_line_naming_it(aws, caplog):
    sqs = aws.client("sqs")
    sqs.set_queue_attributes(QueueUrl=aws.env[TQ], Attributes={"MaximumMessageSize": "1024"})
    sent = sqs.send_message(QueueUrl=aws.env[DLQ], MessageBody="x" * 2000)
    with caplog.at_level("WARNING"):
        out = _redrive(aws)
    assert out["send_failed"] == 1
    assert fs.depth(aws, DLQ) == 1
    assert any(f"{sent['MessageId']} not sent back" in r.getMessage() for r in caplog.records)


def test_a_dead_letter_its_queue_refused_max_redrives_times_is_redriven_once_the_queue_takes_it(aws, monkeypatch):
    job = fs.start_jobs(aws, 1)[0]
    aws.client("sqs").send_message(QueueUrl=aws.env[DLQ], MessageBody=fs.termination_body(job))
    # visible again at once: each run sees it (a run still receives it once, by message id)
    receive = dead_letter_redrive.receive
    monkeypatch.setattr(dead_letter_redrive, "receive", lambda *a, **k: receive(*a, **{**k, "visibility": 0}))
    run = fs.redrive_run(aws)
    with fs.refused(run.sqs, "SendMessageBatch", "KMS.AccessDeniedException", "no key", lambda params: True):
        for _ in range(3):
            redrive_dead_letters(run, None, RedriveSettings(rate_per_second=100))
    out = redrive_dead_letters(run, None, RedriveSettings(rate_per_second=100))
    assert out["redriven"] == 1, out
    assert out.get("quarantined", 0) == 0, out
