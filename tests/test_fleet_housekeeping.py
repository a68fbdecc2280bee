"""Housekeeping tasks and the housekeeping queue against the moto server."""

import datetime as dt
import json
from collections import Counter

import pytest
from botocore.exceptions import ClientError

from pipelines.common import iso, to_item
from pipelines.fleet import calls as fleet_calls
from pipelines.fleet import messages
from pipelines.fleet.drain import DrainLimits, queue_drain
from pipelines.fleet.housekeeping import Housekeeping, HousekeepingHandler
from pipelines.fleet.messages import FINAL_STATUSES, InvalidMessage
from pipelines.fleet.tasks.orphaned_instances import SUSPECT_TAG
from pipelines.retry import fixed
from tests import fleet_support as fs
from tests.conftest import PATIENCE

# The dispatcher: runs-fleet's tasks and the pool audit's.
HOUSEKEEPING = Housekeeping()

HQ, HDLQ = "RUNS_FLEET_HOUSEKEEPING_QUEUE_URL", "RUNS_FLEET_HOUSEKEEPING_DLQ_URL"


def _ctx(aws):
    return fs.context(aws)


def _run(aws, task_type, **params):
    return HOUSEKEEPING.run(_ctx(aws), HOUSEKEEPING.parse({"task_type": task_type, "params": params})).summary


def _later(**delta) -> str:
    return iso(dt.datetime.now(dt.UTC) + dt.timedelta(**delta))


def _move_clock(monkeypatch, **delta) -> None:
    """The real clock moves on (a message's ``params.now`` may not: that needs ``dryRun``)."""
    at = dt.datetime.now(dt.UTC) + dt.timedelta(**delta)
    monkeypatch.setattr(messages, "utcnow", lambda: at)


def _drain_housekeeping(aws, bodies: list[str], sqs=None):
    fs.send(aws, bodies, queue_env=HQ)
    return queue_drain(
        HousekeepingHandler,
        _ctx(aws),
        sqs=sqs or aws.client("sqs"),
        queue_url=aws.env[HQ],
        dlq_url=aws.env[HDLQ],
        run_id="housekeeping",
        limits=DrainLimits(concurrency=1, wait_seconds=0),
    ).run()


def test_a_housekeeping_message_that_could_not_be_deleted_is_counted_as_such(aws):
    sqs = aws.client("sqs")
    with fs.refused(sqs, "DeleteMessageBatch", "AccessDenied", "not allowed here", lambda params: True):
        result = _drain_housekeeping(aws, [json.dumps({"task_type": "old_jobs"})], sqs=sqs)
    assert result.counts["delete_failed"] == 1
    assert result.counts["deleted"] == 0


def _tags(aws, instance_id):
    inst = aws.client("ec2").describe_instances(InstanceIds=[instance_id])["Reservations"][0]["Instances"][0]
    return inst["State"]["Name"], {t["Key"]: t["Value"] for t in inst.get("Tags", [])}


def _count_calls(client):
    calls = Counter()

    def hook(event_name, **kwargs):
        calls[event_name.rsplit(".", 1)[-1]] += 1

    client.meta.events.register("before-call.*.*", hook)
    return calls, hook


@pytest.mark.slow
def test_orphaned_instances_are_suspected_on_one_pass_and_terminated_on_a_later_one(aws, monkeypatch):
    busy = fs.start_jobs(aws, 2)  # running jobs: never orphans
    idle = fs.start_jobs(aws, 3)
    unmanaged = fs.start_jobs(aws, 1, tag_managed=False)
    ddb = aws.client("dynamodb")
    for job in idle + unmanaged:  # their jobs finished long ago; the instances stayed
        ddb.put_item(TableName=aws.env["RUNS_FLEET_JOBS_TABLE"], Item=to_item({**job, "status": "completed"}))

    # Launched just now: not past max_runtime + 10 min yet.
    assert _run(aws, "orphaned_instances")["candidates"] == 0
    # What-if: the same pass 7 hours from now, as a dry run, changes nothing.
    dry = _run(aws, "orphaned_instances", now=_later(hours=7), dryRun=True)
    assert dry["candidates"] == 5
    assert dry["suspected"] == 3
    assert dry["terminated"] == 0
    assert all(SUSPECT_TAG not in _tags(aws, j["instance_id"])[1] for j in idle)

    _move_clock(monkeypatch, hours=7)
    first = _run(aws, "orphaned_instances")
    assert first["suspected"] == 3
    assert first["terminated"] == 0
    assert all(SUSPECT_TAG in _tags(aws, j["instance_id"])[1] for j in idle)
    # Before the next pass, one of them picks up a job again: it is no longer suspect.
    ddb.put_item(
        TableName=aws.env["RUNS_FLEET_JOBS_TABLE"],
        Item=to_item({"job_id": "job-new", "instance_id": idle[0]["instance_id"], "status": "running"}),
    )
    ec2 = aws.client("ec2")
    calls, hook = _count_calls(ec2)
    _move_clock(monkeypatch, hours=7, minutes=5)
    second = _run(aws, "orphaned_instances")
    ec2.meta.events.unregister("before-call.*.*", hook)
    assert second["terminated"] == 2
    assert second["cleared"] == 1
    assert calls["TerminateInstances"] == 1  # batched
    assert [_tags(aws, j["instance_id"])[0] for j in idle] == ["running", "terminated", "terminated"]
    assert SUSPECT_TAG not in _tags(aws, idle[0]["instance_id"])[1]
    assert all(_tags(aws, j["instance_id"])[0] == "running" for j in busy + unmanaged)
    assert fs.metric_sum(aws, "OrphanedInstancesTerminated") == 2


def test_a_suspect_mark_with_no_time_zone_is_renewed_with_a_warning_and_the_other_orphans_are_handled(
    aws, monkeypatch, caplog
):
    idle = fs.start_jobs(aws, 3)
    for job in idle:
        aws.client("dynamodb").put_item(
            TableName=aws.env["RUNS_FLEET_JOBS_TABLE"], Item=to_item({**job, "status": "completed"})
        )
    marked, others = idle[0]["instance_id"], [job["instance_id"] for job in idle[1:]]
    # Set by hand (an operator, another tool): a date with no time zone.
    aws.client("ec2").create_tags(Resources=[marked], Tags=[{"Key": SUSPECT_TAG, "Value": "2026-01-01"}])
    _move_clock(monkeypatch, hours=7)
    result = _drain_housekeeping(aws, [json.dumps({"task_type": "orphaned_instances"})])
    assert result.counts["tasks_run"] == 1
    assert _tags(aws, marked)[1][SUSPECT_TAG] != "2026-01-01"
    assert all(SUSPECT_TAG in _tags(aws, i)[1] for i in others)
    (warning,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("orphaned_instances: i-")]
    assert warning == (
        f"orphaned_instances: {marked}'s {SUSPECT_TAG} '2026-01-01' is no ISO-8601 time with a time zone: "
        "it counts as a new suspect (its mark is renewed), not as one to terminate"
    )
    _move_clock(monkeypatch, hours=7, minutes=5)
    assert _run(aws, "orphaned_instances")["terminated"] == 3


@pytest.mark.slow
def test_stale_ssm_deletes_parameters_of_gone_or_long_terminated_instances_in_tens(aws, monkeypatch):
    live = fs.start_jobs(aws, 2)
    ended = fs.start_jobs(aws, 3)
    aws.client("ec2").terminate_instances(InstanceIds=[j["instance_id"] for j in ended])
    ssm = aws.client("ssm")
    gone = [f"i-{n:017x}" for n in range(1, 24)]  # 23 instances that do not exist
    for iid in gone:
        ssm.put_parameter(Name=f"/runs-fleet/runners/{iid}/config", Type="String", Value="{}")
    ssm.put_parameter(Name="/runs-fleet/runners/not-an-instance/config", Type="String", Value="{}")

    recent = _run(aws, "stale_ssm")  # terminated, or their parameters written, just now: kept for 10 minutes
    assert recent["deleted"] == 0
    assert recent["recently_terminated"] == 3
    assert recent["unrecognised"] == 1

    calls, hook = _count_calls(ssm)
    _move_clock(monkeypatch, minutes=11)
    later = _run(aws, "stale_ssm")
    ssm.meta.events.unregister("before-call.*.*", hook)
    assert later["deleted"] == 26
    assert later["recently_terminated"] == 0
    assert calls["DeleteParameters"] == 3
    assert fs.runner_parameters(aws) == {f"/runs-fleet/runners/{j['instance_id']}/config" for j in live} | {
        "/runs-fleet/runners/not-an-instance/config"
    }
    assert fs.metric_sum(aws, "SSMParametersDeleted") == 26


def _second_call():
    """A ``when`` for ``fs.refused``: true at the second call it sees only."""
    calls = Counter()

    def when(params) -> bool:
        calls["n"] += 1
        return calls["n"] == 2

    return when


def test_stale_ssm_failing_at_its_second_delete_publishes_the_first_batch(aws, monkeypatch):
    ssm = aws.client("ssm")
    for n in range(1, 24):  # 23 instances that do not exist: three DeleteParameters calls
        ssm.put_parameter(Name=f"/runs-fleet/runners/i-{n:017x}/config", Type="String", Value="{}")
    _move_clock(monkeypatch, minutes=11)
    with fs.refused(ssm, "DeleteParameters", "AccessDeniedException", "not allowed", _second_call()):
        with pytest.raises(ClientError, match="AccessDeniedException"):
            _run(aws, "stale_ssm")
    assert fs.metric_sum(aws, "SSMParametersDeleted") == 10


@pytest.mark.slow
def test_orphaned_instances_failing_at_their_second_terminate_publish_the_first_batch(aws, monkeypatch):
    ec2 = aws.client("ec2")
    managed = [{"ResourceType": "instance", "Tags": [{"Key": "runs-fleet:managed", "Value": "true"}]}]
    ec2.run_instances(ImageId=fs.AMI, MinCount=101, MaxCount=101, InstanceType="t3.small", TagSpecifications=managed)
    _move_clock(monkeypatch, hours=7)
    assert _run(aws, "orphaned_instances")["suspected"] == 101
    _move_clock(monkeypatch, hours=7, minutes=5)
    with fs.refused(ec2, "TerminateInstances", "UnauthorizedOperation", "not allowed", _second_call()):
        with pytest.raises(ClientError, match="UnauthorizedOperation"):
            _run(aws, "orphaned_instances")
    assert fs.metric_sum(aws, "OrphanedInstancesTerminated") == 100


def test_stale_ssm_keeps_a_parameter_written_within_the_grace_for_an_instance_ec2_does_not_describe(aws, monkeypatch):
    name = "/runs-fleet/runners/i-0000000000000abcd/config"  # EC2 may not describe a just-launched one yet
    aws.client("ssm").put_parameter(Name=name, Type="String", Value="{}")
    assert _run(aws, "stale_ssm")["deleted"] == 0
    assert fs.runner_parameters(aws) == {name}
    _move_clock(monkeypatch, minutes=11)
    assert _run(aws, "stale_ssm")["deleted"] == 1


@pytest.mark.slow
def test_old_jobs_are_archived_then_deleted_by_index_queries_never_a_scan(aws):
    now = dt.datetime.now(dt.UTC)
    statuses = ["completed", "failed", "timeout", "interrupted"]
    old, recent = [], []
    for n in range(130):
        old.append({"job_id": f"old-{n}", "status": statuses[n % 4], "completed_at": iso(now - dt.timedelta(days=8))})
    for n in range(6):
        recent.append(
            {"job_id": f"new-{n}", "status": statuses[n % 4], "completed_at": iso(now - dt.timedelta(days=1))}
        )
    running = [{"job_id": "run-1", "status": "running", "started_at": iso(now - dt.timedelta(days=30))}]
    ddb = aws.client("dynamodb")
    for item in old + recent + running:
        ddb.put_item(TableName=aws.env["RUNS_FLEET_JOBS_TABLE"], Item=to_item(item))

    dry = _run(aws, "old_jobs", dryRun=True)
    assert dry["found"] == 130
    assert dry["archived"] == 0
    assert len(fs.jobs_state(aws)) == 137

    calls, hook = _count_calls(ddb)
    result = _run(aws, "old_jobs")
    ddb.meta.events.unregister("before-call.*.*", hook)
    assert result["archived"] == 130
    assert set(fs.jobs_state(aws)) == {j["job_id"] for j in recent + running}
    assert calls["Scan"] == 0
    assert calls["Query"] == 4
    assert sum(calls.values()) / 130 <= 0.1, calls
    s3 = aws.client("s3")
    bucket = aws.env["RUNS_FLEET_ARCHIVE_BUCKET"]
    archived = []
    for obj in s3.list_objects_v2(Bucket=bucket, Prefix="jobs/")["Contents"]:
        archived += [json.loads(line) for line in s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].iter_lines()]
    assert sorted(r["job_id"] for r in archived) == sorted(j["job_id"] for j in old)
    assert fs.metric_sum(aws, "JobRecordsArchived") == 130
    assert _run(aws, "old_jobs", retention_days=2)["archived"] == 0  # the recent ones stay


def _old_jobs(aws, statuses: list[str]) -> None:
    completed_at = iso(dt.datetime.now(dt.UTC) - dt.timedelta(days=8))
    for n, status in enumerate(statuses):
        item = {"job_id": f"old-{n}", "status": status, "completed_at": completed_at}
        aws.client("dynamodb").put_item(TableName=aws.env["RUNS_FLEET_JOBS_TABLE"], Item=to_item(item))


def _after_first_query(ddb, meanwhile) -> None:
    """The next ``Query`` of ``ddb`` returns its page, then ``meanwhile()`` runs before the caller goes on."""

    def hook(**kwargs):
        ddb.meta.events.unregister("after-call.dynamodb.Query", unique_id="old-jobs-hold")
        meanwhile()

    ddb.meta.events.register("after-call.dynamodb.Query", hook, unique_id="old-jobs-hold")


@pytest.mark.slow
def test_two_old_jobs_passes_over_one_page_delete_and_count_each_job_once(aws):
    """Two passes at once (a queue message beside the schedule's run): pass B has read the page when
    pass A archives and deletes it all; B then archives the page again but deletes and counts none of it."""
    _old_jobs(aws, [FINAL_STATUSES[0]] * 5)  # one page, B's first query
    first = {}
    _after_first_query(aws.client("dynamodb"), lambda: first.update(_run(aws, "old_jobs")))
    second = _run(aws, "old_jobs")
    assert second["found"] == 5  # B read the page before A deleted it
    assert first["archived"] + second["archived"] == 5
    assert fs.metric_sum(aws, "JobRecordsArchived") == 5
    assert second["already_deleted"] == 5
    assert fs.jobs_state(aws) == {}


@pytest.mark.slow
def test_old_jobs_keeps_a_job_that_changed_after_its_page_was_read(aws):
    _old_jobs(aws, [FINAL_STATUSES[0]] * 3)
    ddb, table = aws.client("dynamodb"), aws.env["RUNS_FLEET_JOBS_TABLE"]
    later = {"job_id": "old-1", "status": FINAL_STATUSES[0], "completed_at": iso(dt.datetime.now(dt.UTC))}
    _after_first_query(ddb, lambda: ddb.put_item(TableName=table, Item=to_item(later)))
    result = _run(aws, "old_jobs")
    assert result["archived"] == 2
    assert result["changed"] == 1
    assert set(fs.jobs_state(aws)) == {"old-1"}
    assert fs.metric_sum(aws, "JobRecordsArchived") == 2


@pytest.mark.slow
def test_old_jobs_names_a_job_whose_delete_is_refused_in_one_warning_and_deletes_the_others(aws, caplog):
    _old_jobs(aws, [FINAL_STATUSES[0]] * 3)

    def old_1(params):
        return any(action["Delete"]["Key"]["job_id"]["S"] == "old-1" for action in params["TransactItems"])

    with fs.refused(aws.client("dynamodb"), "TransactWriteItems", "ValidationException", "too big", old_1):
        result = _run(aws, "old_jobs")
    assert result["archived"] == 2
    assert result["refused"] == 1
    assert set(fs.jobs_state(aws)) == {"old-1"}
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warning == (
        "old_jobs: 1 archived job(s) not deleted, refused: old-1: ValidationException: "
        "An error occurred (ValidationException) when calling the TransactWriteItems operation: too big"
    )


def test_old_jobs_names_a_refused_job_whose_id_has_a_newline_on_one_line(aws, caplog):
    completed_at = iso(dt.datetime.now(dt.UTC) - dt.timedelta(days=8))
    item = {"job_id": "old\nFORGED", "status": FINAL_STATUSES[0], "completed_at": completed_at}
    aws.client("dynamodb").put_item(TableName=aws.env["RUNS_FLEET_JOBS_TABLE"], Item=to_item(item))
    with fs.refused(aws.client("dynamodb"), "TransactWriteItems", "ValidationException", "too big", lambda p: True):
        assert _run(aws, "old_jobs")["refused"] == 1
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warning.startswith("old_jobs: 1 archived job(s) not deleted, refused: old\\nFORGED: ValidationException")


@pytest.mark.slow
def test_old_jobs_still_failing_to_delete_fails_the_run_and_publishes_what_it_deleted(aws, monkeypatch):
    monkeypatch.setattr(fleet_calls, "POLICY", fixed(0, max_attempts=2))
    _old_jobs(aws, [FINAL_STATUSES[0]] * 3 + [FINAL_STATUSES[1]] * 2)
    ddb = aws.client("dynamodb")

    def second_status(params):
        return params["TransactItems"][0]["Delete"]["ExpressionAttributeValues"][":s"]["S"] == FINAL_STATUSES[1]

    with fs.refused(ddb, "TransactWriteItems", "InternalServerError", "try again", second_status):
        with pytest.raises(ClientError, match="InternalServerError"):
            _run(aws, "old_jobs")
    assert set(fs.jobs_state(aws)) == {"old-3", "old-4"}
    assert fs.metric_sum(aws, "JobRecordsArchived") == 3


@pytest.mark.parametrize(
    "request_data, reason",
    [
        ({"task_type": "pool_audit", "params": {"idle_cost_threshold_usd_per_hour": -1}}, "must be at least 0"),
        ({"task_type": "defragment", "params": {}}, "unknown task_type"),
        ({"params": {}}, "missing field task_type"),
        ({"task_type": "old_jobs", "params": {"retention_days": "seven"}}, "^retention_days must be a whole number"),
        ({"task_type": "old_jobs", "params": {"retention_days": 0}}, "^retention_days must be at least 1, got 0$"),
        ({"task_type": "old_jobs", "params": {"rm": "-rf"}}, "unknown parameter"),
        ({"task_type": "stale_ssm", "params": {"now": "soon"}}, "params.now"),
        ({"task_type": "stale_ssm", "params": {"dryRun": "yes"}}, "dryRun"),
        ({"task_type": "stale_ssm", "params": []}, "params must be an object"),
    ],
)
def test_invalid_housekeeping_requests_are_refused_with_a_reason(aws, request_data, reason):
    with pytest.raises(InvalidMessage, match=reason):
        HOUSEKEEPING.run(_ctx(aws), HOUSEKEEPING.parse(request_data))


def test_the_housekeeping_queue_dispatches_tasks_and_dead_letters_what_it_cannot_run(aws, monkeypatch):
    ssm = aws.client("ssm")
    ssm.put_parameter(Name="/runs-fleet/runners/i-0000000000000abcd/config", Type="String", Value="{}")
    fs.past_stale_ssm_grace(monkeypatch)
    stale = json.dumps({"task_type": "stale_ssm", "timestamp": _later(), "params": {}})
    bad = [
        json.dumps({"task_type": "pool_audit", "timestamp": _later(), "params": {"now": _later()}}),
        json.dumps({"task_type": "reboot_everything", "params": {}}),
        "{not json",
        json.dumps({"task_type": "old_jobs", "params": {"retention_days": -1}}),
    ]
    result = _drain_housekeeping(aws, [stale, stale, json.dumps({"task_type": "old_jobs"})] + bad)
    assert result.counts["tasks_run"] == 2  # the two identical stale_ssm requests ran once
    assert result.counts["dead_lettered"] == 4
    assert result.counts["deleted"] == 7
    assert fs.runner_parameters(aws) == set()
    dead = {m["Body"]: m["MessageAttributes"]["groundskeeper-reason"]["StringValue"] for m in fs.read_all(aws, HDLQ)}
    assert "only allowed with dryRun" in dead[bad[0]]
    assert "unknown task_type" in dead[bad[1]]
    assert "malformed JSON" in dead[bad[2]]
    assert dead[bad[3]] == "retention_days must be at least 1, got -1"
    assert fs.depth(aws, HQ) == 0


def test_runs_fleets_cost_report_message_is_acknowledged_with_one_log_line(aws, caplog):
    """runs-fleet's EventBridge rules also send ``cost_report`` (its daily CloudWatch cost report)."""
    caplog.set_level("INFO", logger="tests.fleet")
    result = _drain_housekeeping(aws, [json.dumps({"task_type": "cost_report", "timestamp": _later()})])
    assert result.counts["task_cost_report"] == 1
    assert result.counts["dead_lettered"] == 0
    assert result.counts["deleted"] == 1
    assert [r.message for r in caplog.records if r.message.startswith("cost_report: ")] == [
        "cost_report: runs-fleet's daily cost report is not made here (pool_cost_report is); acknowledged"
    ]
    assert fs.depth(aws, HDLQ) == 0


FUTURE = "2999-01-01T00:00:00Z"


def test_a_message_cannot_move_the_clock_forward_to_delete_old_jobs(aws):
    completed = iso(dt.datetime.now(dt.UTC) - dt.timedelta(hours=1))
    ids = {f"done-{n}" for n in range(5)}
    for job_id in ids:
        aws.client("dynamodb").put_item(
            TableName=aws.env["RUNS_FLEET_JOBS_TABLE"],
            Item=to_item({"job_id": job_id, "status": "completed", "completed_at": completed}),
        )
    request = {"task_type": "old_jobs", "params": {"now": FUTURE, "retention_days": 1}}
    result = _drain_housekeeping(aws, [json.dumps(request)])
    assert result.counts["tasks_run"] == 0
    assert result.counts["dead_lettered"] == 1
    ((message,),) = [fs.read_all(aws, HDLQ)]
    assert "later than the clock plus 5 min" in message["MessageAttributes"]["groundskeeper-reason"]["StringValue"]
    assert set(fs.jobs_state(aws)) == ids
    # The housekeeping job's run config is refused with the same one line.
    with pytest.raises(
        InvalidMessage, match=r"params.now 2999-01-01T00:00:00(.000)?Z is later .* only allowed with dryRun"
    ):
        HOUSEKEEPING.parse(request)
    # A dry run may look ahead: it changes nothing.
    dry = _run(aws, "old_jobs", now=FUTURE, retention_days=1, dryRun=True)
    assert (dry["found"], dry["archived"]) == (5, 0)
    assert set(fs.jobs_state(aws)) == ids
    # A small skew of the sender's clock is fine.
    assert _run(aws, "old_jobs", now=_later(minutes=4), retention_days=1)["found"] == 0


def test_a_message_cannot_move_the_clock_forward_to_terminate_instances(aws):
    jobs = fs.start_jobs(aws, 3)
    for job in jobs:  # their jobs are done: the instances would be orphans, once old enough
        aws.client("dynamodb").put_item(
            TableName=aws.env["RUNS_FLEET_JOBS_TABLE"], Item=to_item({**job, "status": "completed"})
        )
    first = {"task_type": "orphaned_instances", "params": {"now": FUTURE}}
    second = {"task_type": "orphaned_instances", "params": {"now": FUTURE, "confirm_after_minutes": 0}}
    for request in (first, second):
        result = _drain_housekeeping(aws, [json.dumps(request)])
        assert result.counts["dead_lettered"] == 1
        assert result.counts["tasks_run"] == 0
    for job in jobs:
        state, tags = _tags(aws, job["instance_id"])
        assert state == "running"
        assert SUSPECT_TAG not in tags
    assert _run(aws, "orphaned_instances", now=FUTURE, dryRun=True)["would_terminate"] == 0  # suspected only


def test_an_instance_two_passes_terminate_at_once_is_counted_once(aws, monkeypatch):
    """Pass A (a drain run's) is held just before its TerminateInstances while pass B (the schedule's)
    terminates the same instance: A's call returns it as already terminated, and A does not count it."""
    import dataclasses
    import threading

    import boto3

    [job] = fs.start_jobs(aws, 1)
    done = {**job, "status": "completed"}
    aws.client("dynamodb").put_item(TableName=aws.env["RUNS_FLEET_JOBS_TABLE"], Item=to_item(done))
    _move_clock(monkeypatch, hours=7)
    assert _run(aws, "orphaned_instances")["suspected"] == 1
    _move_clock(monkeypatch, hours=7, minutes=5)
    ec2_of_a = boto3.client("ec2", endpoint_url=aws.endpoint, region_name="us-east-1")
    at_call, go = threading.Event(), threading.Event()

    def hold(**_) -> None:  # returns None: botocore takes a returned value as the call's parameters
        at_call.set()
        go.wait(PATIENCE)

    ec2_of_a.meta.events.register("provide-client-params.ec2.TerminateInstances", hold)
    counted: dict[str, int] = {}
    request = HOUSEKEEPING.parse({"task_type": "orphaned_instances", "params": {}})
    context_of_a = dataclasses.replace(_ctx(aws), ec2=ec2_of_a)
    a = threading.Thread(target=lambda: counted.update(a=HOUSEKEEPING.run(context_of_a, request).summary["terminated"]))
    a.start()
    try:
        assert at_call.wait(PATIENCE)
        counted["b"] = _run(aws, "orphaned_instances")["terminated"]
    finally:
        go.set()
        a.join()
    assert counted == {"a": 0, "b": 1}
    assert fs.metric_sum(aws, "OrphanedInstancesTerminated") == 1


@pytest.mark.slow
def test_a_housekeeping_timestamp_with_no_utc_value_is_dead_lettered_and_the_good_task_runs(aws, monkeypatch):
    aws.client("ssm").put_parameter(Name="/runs-fleet/runners/i-0000000000000abcd/config", Type="String", Value="{}")
    fs.past_stale_ssm_grace(monkeypatch)
    bad = {"task_type": "stale_ssm", "timestamp": "0001-01-01T00:00:00+01:00"}  # ISO, before year 1 in UTC
    result = _drain_housekeeping(aws, [json.dumps(bad), json.dumps({"task_type": "stale_ssm"})])
    assert result.counts["tasks_run"] == 1
    assert fs.runner_parameters(aws) == set()
    ((message,),) = [fs.read_all(aws, HDLQ)]
    assert "timestamp is out of range in UTC" in message["MessageAttributes"]["groundskeeper-reason"]["StringValue"]


def test_an_iso_time_writes_its_year_with_four_digits():
    assert iso(dt.datetime(5, 1, 1, tzinfo=dt.UTC)) == "0005-01-01T00:00:00.000Z"


@pytest.mark.parametrize("now", ["0500-01-01T00:00:00Z", "0001-01-01T00:00:00Z"])
def test_a_housekeeping_clock_before_2000_is_dead_lettered_with_its_reason_and_deletes_no_job(aws, now):
    job = {"job_id": "done-now", "status": "completed", "completed_at": iso(dt.datetime.now(dt.UTC))}
    aws.client("dynamodb").put_item(TableName=aws.env["RUNS_FLEET_JOBS_TABLE"], Item=to_item(job))
    result = _drain_housekeeping(aws, [json.dumps({"task_type": "old_jobs", "params": {"now": now}})])
    assert result.counts["dead_lettered"] == 1
    ((message,),) = [fs.read_all(aws, HDLQ)]
    reason = message["MessageAttributes"]["groundskeeper-reason"]["StringValue"]
    assert reason == f"params.now is before 2000-01-01T00:00:00.000Z: {now!r}"
    assert set(fs.jobs_state(aws)) == {"done-now"}


def test_a_housekeeping_clock_in_year_1_is_an_invalid_message():
    with pytest.raises(InvalidMessage, match="^params.now is before 2000"):
        HOUSEKEEPING.parse({"task_type": "old_jobs", "params": {"now": "0001-01-01T00:00:00Z"}})


def test_a_started_at_of_gos_zero_time_is_absent():
    """runs-fleet's agent sends Go's zero time.Time for a job that failed before it started."""
    job = {"instance_id": "i-0123456789abcdef0", "job_id": "j-1"}
    body = fs.termination_body(job, status="failure", started_at="0001-01-01T00:00:00Z")
    assert messages.parse_termination(body, received_at=dt.datetime.now(dt.UTC)).started_at is None


def test_a_completed_at_of_gos_zero_time_is_the_time_the_message_was_received():
    job = {"instance_id": "i-0123456789abcdef0", "job_id": "j-1"}
    body = fs.termination_body(job, completed_at="0001-01-01T00:00:00Z")
    received = dt.datetime.now(dt.UTC)
    assert messages.parse_termination(body, received_at=received).completed_at == iso(received)
