"""Termination queue processor against the moto server: the happy path, duplicates, bad input,
path traversal, transient failures and SQS's redrive, graceful stop, and API calls per message."""

import datetime as dt
import json
import logging
import os
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import dagster as dg
import pytest
from botocore.exceptions import ClientError

from pipelines.common import to_item
from pipelines.fleet import calls as fleet_calls
from pipelines.fleet import drain as drain_module
from pipelines.fleet import queues
from pipelines.fleet.drain import STATUS_UNREADABLE, run_with_graceful_stop
from pipelines.fleet.messages import InvalidMessage, instance_of_parameter, parse_termination, runner_parameter
from pipelines.retry import fixed, preset, timeline
from tests import fleet_support as fs
from tests.conftest import PATIENCE

TQ, DLQ = "RUNS_FLEET_TERMINATION_QUEUE_URL", "RUNS_FLEET_TERMINATION_DLQ_URL"
STATUSES = ["success", "failure", "timeout", "interrupted"]


def _expected_metrics(bodies):
    parsed = [json.loads(b) for b in bodies]
    return {
        "JobSuccess": sum(1 for p in parsed if p["status"] == "success"),
        "JobFailure": sum(1 for p in parsed if p["status"] != "success"),
        "JobDuration": sum(p["duration_seconds"] for p in parsed),
    }


def _metrics(aws):
    failure = sum(
        fs.metric_sum(aws, "JobFailure", [{"Name": "Error", "Value": e}]) for e in ("exit code 1", "OOMKilled")
    )
    duration = sum(fs.metric_sum(aws, "JobDuration", [{"Name": "Status", "Value": s}]) for s in STATUSES)
    return {"JobSuccess": fs.metric_sum(aws, "JobSuccess"), "JobFailure": failure, "JobDuration": duration}


@pytest.mark.slow
def test_a_drain_applies_jobs_deletes_parameters_publishes_metrics_and_acks(aws):
    jobs = fs.start_jobs(aws, 27)
    bodies = [fs.termination_body(j, STATUSES[k % 4], duration_seconds=60 + k) for k, j in enumerate(jobs)]
    fs.send(aws, bodies)
    result = fs.drain(aws, run_id="happy")
    assert result.counts["received"] == 27
    assert result.counts["applied"] == 27
    assert result.counts["deleted"] == 27
    assert result.stopped_by == "queue empty"
    state = fs.jobs_state(aws)
    for k, job in enumerate(jobs):
        item = state[job["job_id"]]
        assert item["status"] == ["completed", "failed", "timeout", "interrupted"][k % 4]
        assert item["duration_seconds"] == 60 + k
        assert item["instance_id"] == job["instance_id"]
        assert item["exit_code"] == (0 if k % 4 == 0 else 1)
        assert item["completed_at"].endswith("Z")
        assert "termination_pending" not in item
        assert fs.round_done(aws, item)  # the round's clean-up is marked done
    assert fs.runner_parameters(aws) == set()
    assert _metrics(aws) == _expected_metrics(bodies)
    assert fs.depth(aws, TQ) == 0
    assert fs.depth(aws, DLQ) == 0
    # The raw messages were archived, as received, in one object for the run.
    s3 = aws.client("s3")
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=aws.env["RUNS_FLEET_ARCHIVE_BUCKET"])["Contents"]]
    raw = [k for k in keys if k.startswith("raw/")]
    assert len(raw) == 1
    assert raw[0].endswith("/happy.jsonl")
    assert len(keys) == 2  # and the marker of its one round
    keys = raw
    lines = s3.get_object(Bucket=aws.env["RUNS_FLEET_ARCHIVE_BUCKET"], Key=keys[0])["Body"].read().splitlines()
    assert sorted(json.loads(line)["body"] for line in lines) == sorted(bodies)


@pytest.mark.slow
def test_every_message_delivered_twice_gives_the_state_and_metrics_of_single_delivery(aws):
    jobs = fs.start_jobs(aws, 24)
    bodies = [fs.termination_body(j, STATUSES[k % 4]) for k, j in enumerate(jobs)]
    # Half the copies arrive in the same round as the original, the rest in a later run.
    fs.send(aws, bodies + bodies[:12])
    first = fs.drain(aws)
    assert first.counts["applied"] == 24
    single_state = fs.jobs_state(aws)
    fs.send(aws, bodies[12:] + bodies[:3])
    second = fs.drain(aws)
    assert second.counts["applied"] == 0
    assert second.counts["duplicates"] == 15
    assert second.counts["deleted"] == 15
    assert fs.jobs_state(aws) == single_state
    assert _metrics(aws) == _expected_metrics(bodies)
    assert fs.depth(aws, TQ) == 0
    assert fs.depth(aws, DLQ) == 0  # duplicates are acknowledged, never dead-lettered


def _valid_body(job):
    return fs.termination_body(job, "success")


def _started_body(job):
    """What runs-fleet's agent sends at a job's start (its JobStatus: no error, zero completed_at)."""
    return json.dumps(
        {
            "instance_id": job["instance_id"],
            "job_id": job["job_id"],
            "status": "started",
            "exit_code": 0,
            "duration_seconds": 0,
            "started_at": job["started_at"],
            "completed_at": "0001-01-01T00:00:00Z",
        }
    )


def test_the_agents_started_message_is_acknowledged_and_its_interrupted_by_is_read(aws):
    """runs-fleet's agent sends ``started`` at each job's start, and ``interrupted_by`` with an interruption."""
    short, long, interrupted = fs.start_jobs(aws, 3)
    bodies = [
        _started_body(short),
        _valid_body(short),  # the same round: the start is no copy of the completion
        _started_body(long),
        fs.termination_body(interrupted, "interrupted", interrupted_by="spot-interruption"),
    ]
    fs.send(aws, bodies)
    result = fs.drain(aws)
    assert result.counts["started"] == 2
    assert result.counts["applied"] == 2
    assert result.counts["dead_lettered"] == 0
    assert result.counts["deleted"] == 4
    state = fs.jobs_state(aws)
    assert state[short["job_id"]]["status"] == "completed"
    assert state[long["job_id"]]["status"] == "running"
    assert state[interrupted["job_id"]]["status"] == "interrupted"
    assert fs.runner_parameters(aws) == {runner_parameter(long["instance_id"])}
    assert fs.depth(aws, DLQ) == 0


def test_a_message_sent_twice_in_one_round_is_a_duplicate_and_every_message_is_counted_once(aws):
    """The summary's outcomes add up to what was received: a copy in the same round is a duplicate."""
    twice, once = fs.start_jobs(aws, 2)
    fs.send(aws, [_valid_body(twice), _valid_body(twice), _valid_body(once), _started_body(once), "not json"])
    result = fs.drain(aws)
    assert result.counts["duplicates_in_round"] == 1
    assert result.counts["duplicates"] == 1
    outcomes = ("applied", "duplicates", "dead_lettered", "failed", "started")
    assert sum(result.counts[key] for key in outcomes) == result.counts["received"]


def test_a_later_agents_other_fields_are_not_read_and_its_messages_apply(aws):
    """A later runs-fleet agent adds fields (bootstrap timings on ``started``, tool cache and interception
    outcomes on a completion); runs-fleet's handler reads none of them, and neither does the drain."""
    job = fs.start_jobs(aws, 1)[0]
    later = {"tool_cache_misses": ["node/20/x64"], "cache_interception": "engaged"}
    started = json.loads(_started_body(job)) | {"bootstrap_boot_seconds": 12, "bootstrap_total_seconds": 30}
    fs.send(aws, [json.dumps(started), fs.termination_body(job, **later)])
    result = fs.drain(aws)
    assert result.counts["started"] == 1
    assert result.counts["applied"] == 1
    assert result.counts["dead_lettered"] == 0
    assert fs.jobs_state(aws)[job["job_id"]]["status"] == "completed"
    assert "cache_interception" not in fs.jobs_state(aws)[job["job_id"]]


def test_a_job_in_any_status_but_a_final_one_is_ended_by_its_termination(aws):
    """runs-fleet completes a job whatever its status: ``queued`` (the contract's), ``terminating`` (set by
    later runs-fleet versions on a spot interruption, before the agent's ``interrupted``)."""
    queued, terminating = fs.start_jobs(aws, 2)
    table = aws.env["RUNS_FLEET_JOBS_TABLE"]
    for job, status in ((queued, "queued"), (terminating, "terminating")):
        aws.client("dynamodb").put_item(TableName=table, Item=to_item({**job, "status": status}))
    fs.send(aws, [_valid_body(queued), fs.termination_body(terminating, "interrupted")])
    result = fs.drain(aws)
    assert result.counts["applied"] == 2
    assert result.counts["duplicates"] == 0
    state = fs.jobs_state(aws)
    assert state[queued["job_id"]]["status"] == "completed"
    assert state[terminating["job_id"]]["status"] == "interrupted"
    assert fs.runner_parameters(aws) == set()


def test_a_message_naming_another_instance_than_the_jobs_is_dead_lettered_and_changes_nothing(aws):
    a, b, unplaced = fs.start_jobs(aws, 3)
    no_instance = {k: v for k, v in unplaced.items() if k != "instance_id"}  # any instance may end it
    aws.client("dynamodb").put_item(TableName=aws.env["RUNS_FLEET_JOBS_TABLE"], Item=to_item(no_instance))
    forged = fs.termination_body({"job_id": a["job_id"], "instance_id": b["instance_id"]})
    fs.send(aws, [forged, _valid_body(unplaced)])
    result = fs.drain(aws)
    assert result.counts["applied"] == 1
    assert result.counts["dead_lettered"] == 1
    state = fs.jobs_state(aws)
    assert state[a["job_id"]]["status"] == "running"
    assert state[a["job_id"]]["instance_id"] == a["instance_id"]
    assert state[unplaced["job_id"]]["instance_id"] == unplaced["instance_id"]
    assert fs.runner_parameters(aws) == {runner_parameter(a["instance_id"]), runner_parameter(b["instance_id"])}
    (dead,) = fs.read_all(aws, DLQ)
    reason = dead["MessageAttributes"]["groundskeeper-reason"]["StringValue"]
    assert reason == f"job {a['job_id']!r} has instance_id {a['instance_id']}, not {b['instance_id']}"


def test_an_interrupted_by_that_is_not_text_is_refused():
    body = fs.termination_body({"instance_id": "i-0123456789abcdef0", "job_id": "j-1"}, interrupted_by=["spot"])
    with pytest.raises(InvalidMessage, match="^interrupted_by must be a string"):
        parse_termination(body, received_at=dt.datetime.now(dt.UTC))


MALFORMED = {
    "not json": "this is not json",
    "blank": "   ",
    "json list": json.dumps(["a", "list"]),
    "json string": json.dumps("a string"),
    "json number": "42",
    "json null": "null",
    "truncated json": '{"instance_id": "i-0123456789abcdef0", "job_id": "j"',
    "missing instance_id": json.dumps({"job_id": "j-1", "status": "success"}),
    "missing job_id": json.dumps({"instance_id": "i-0123456789abcdef0", "status": "success"}),
    "missing status": json.dumps({"instance_id": "i-0123456789abcdef0", "job_id": "j-2"}),
    "unknown status": json.dumps({"instance_id": "i-0123456789abcdef0", "job_id": "j-3", "status": "exploded"}),
    "status not a string": json.dumps({"instance_id": "i-0123456789abcdef0", "job_id": "j-4", "status": 1}),
    "path traversal": json.dumps({"instance_id": "i-1234/../../other", "job_id": "j-5", "status": "success"}),
    "uppercase instance id": json.dumps({"instance_id": "i-0123456789ABCDEF0", "job_id": "j-6", "status": "success"}),
    "short instance id": json.dumps({"instance_id": "i-123", "job_id": "j-7", "status": "success"}),
    "instance id with a trailing newline": json.dumps(
        {"instance_id": "i-0000000a\n", "job_id": "j-7n", "status": "success"}
    ),
    "instance id number": json.dumps({"instance_id": 123, "job_id": "j-8", "status": "success"}),
    "empty job_id": json.dumps({"instance_id": "i-0123456789abcdef0", "job_id": "", "status": "success"}),
    "long job_id": json.dumps({"instance_id": "i-0123456789abcdef0", "job_id": "x" * 300, "status": "success"}),
    "control char job_id": json.dumps({"instance_id": "i-0123456789abcdef0", "job_id": "a\nb", "status": "success"}),
    "job_id number": json.dumps({"instance_id": "i-0123456789abcdef0", "job_id": 67890, "status": "success"}),
    "exit_code text": json.dumps(
        {"instance_id": "i-0123456789abcdef0", "job_id": "j-9", "status": "success", "exit_code": "zero"}
    ),
    "exit_code bool": json.dumps(
        {"instance_id": "i-0123456789abcdef0", "job_id": "j-10", "status": "success", "exit_code": True}
    ),
    "exit_code fraction": json.dumps(
        {"instance_id": "i-0123456789abcdef0", "job_id": "j-11", "status": "success", "exit_code": 1.5}
    ),
    "negative duration": json.dumps(
        {"instance_id": "i-0123456789abcdef0", "job_id": "j-12", "status": "success", "duration_seconds": -5}
    ),
    "NaN duration": '{"instance_id": "i-0123456789abcdef0", "job_id": "j-13", "status": "success", '
    '"duration_seconds": NaN}',
    "started_at not a time": json.dumps(
        {"instance_id": "i-0123456789abcdef0", "job_id": "j-14", "status": "success", "started_at": "yesterday"}
    ),
    "completed_at without zone": json.dumps(
        {
            "instance_id": "i-0123456789abcdef0",
            "job_id": "j-15",
            "status": "success",
            "completed_at": "2026-11-22T10:00:00",
        }
    ),
    "started after completed": json.dumps(
        {
            "instance_id": "i-0123456789abcdef0",
            "job_id": "j-16",
            "status": "success",
            "started_at": "2026-11-22T10:05:00Z",
            "completed_at": "2026-11-22T10:00:00Z",
        }
    ),
    "completed in the future": json.dumps(
        {
            "instance_id": "i-0123456789abcdef0",
            "job_id": "j-17",
            "status": "success",
            "completed_at": "2099-01-01T00:00:00Z",
        }
    ),
    "interrupted_by not text": json.dumps(
        {"instance_id": "i-0123456789abcdef0", "job_id": "j-18", "status": "interrupted", "interrupted_by": 5}
    ),
    "duplicate key": '{"instance_id": "i-0123456789abcdef0", "job_id": "j-19", '
    '"status": "success", "status": "failure"}',
    "nested too deep": "[" * 5000 + "]" * 5000,
    "error not text": json.dumps(
        {"instance_id": "i-0123456789abcdef0", "job_id": "j-20", "status": "failure", "error": ["x"]}
    ),
}


@pytest.mark.slow
def test_a_corpus_of_malformed_messages_lands_in_the_dead_letter_queue_with_reasons(aws):
    assert len(MALFORMED) >= 20
    jobs = fs.start_jobs(aws, 8)
    valid = [_valid_body(j) for j in jobs]
    bad = list(MALFORMED.values())
    mixed = []
    for k, body in enumerate(bad):  # valid messages among the bad ones
        mixed.append(body)
        if k < len(valid):
            mixed.append(valid[k])
    fs.send(aws, mixed)
    result = fs.drain(aws)
    assert result.counts["applied"] == len(valid)
    assert result.counts["dead_lettered"] == len(bad)
    assert result.counts["failed"] == 0
    assert all(fs.jobs_state(aws)[j["job_id"]]["status"] == "completed" for j in jobs)
    dead = fs.read_all(aws, DLQ)
    assert sorted(m["Body"] for m in dead) == sorted(bad)
    reasons = {m["Body"]: m["MessageAttributes"]["groundskeeper-reason"]["StringValue"] for m in dead}
    assert all(reason.strip() for reason in reasons.values())
    assert "invalid instance_id" in reasons[MALFORMED["path traversal"]]
    assert "unknown status" in reasons[MALFORMED["unknown status"]]
    assert "missing field status" in reasons[MALFORMED["missing status"]]
    assert all(
        m["MessageAttributes"]["groundskeeper-source-queue"]["StringValue"].startswith("runs-fleet-termination")
        for m in dead
    )
    assert fs.depth(aws, TQ) == 0  # removed from the source queue, never silently dropped


def test_a_path_traversal_instance_id_never_reaches_ssm(aws):
    with pytest.raises(InvalidMessage):
        runner_parameter("i-1234/../../other")
    with pytest.raises(InvalidMessage):  # ``$`` would match before the newline
        runner_parameter("i-0000000a\n")
    assert runner_parameter("i-0000000a") == "/runs-fleet/runners/i-0000000a/config"
    assert instance_of_parameter("/runs-fleet/runners/i-0000000a\n/config") is None
    assert instance_of_parameter("/runs-fleet/runners/i-0000000a/config\n") is None
    jobs = fs.start_jobs(aws, 3)
    evil = [
        json.dumps({"instance_id": "i-1234/../../other", "job_id": jobs[0]["job_id"], "status": "success"}),
        json.dumps({"instance_id": "i-0123456789abcdef0/../x", "job_id": "j-evil", "status": "success"}),
        json.dumps({"instance_id": "../../../etc/passwd", "job_id": "j-evil-2", "status": "success"}),
    ]
    fs.send(aws, evil + [_valid_body(j) for j in jobs])
    names_seen = []

    def spy(params, **kwargs):
        names_seen.extend(params.get("Names", []) + ([params["Name"]] if "Name" in params else []))

    ssm = aws.client("ssm")
    ssm.meta.events.register("provide-client-params.ssm.*", spy)
    try:
        result = fs.drain(aws)
    finally:
        ssm.meta.events.unregister("provide-client-params.ssm.*", spy)
    assert result.counts["dead_lettered"] == 3
    assert result.counts["applied"] == 3
    assert names_seen
    assert all(".." not in n and n.count("/") == 4 for n in names_seen), (
        f"a parameter name outside the runner path: {names_seen}"
    )
    # The job named by the evil message was completed by its valid message only.
    assert fs.jobs_state(aws)[jobs[0]["job_id"]]["instance_id"] == jobs[0]["instance_id"]


def test_a_field_name_with_a_newline_stays_on_the_line_of_the_reason():
    body = fs.termination_body(
        {"instance_id": "i-0123456789abcdef0", "job_id": "j-1"}, **{"a\nFORGED": {"x": "\ud800"}}
    )
    with pytest.raises(InvalidMessage, match="FORGED") as caught:
        parse_termination(body, received_at=dt.datetime.now(dt.UTC))
    assert "\n" not in caught.value.reason


def _fail(client, operation, code="ThrottlingException", times=None):
    """Make ``operation`` fail with ``code`` (all calls, or the first ``times``). Returns the call counter."""
    calls = Counter()

    def hook(**kwargs):
        calls["n"] += 1
        if times is None or calls["n"] <= times:
            raise ClientError({"Error": {"Code": code, "Message": "injected"}}, operation)

    client.meta.events.register(f"before-call.{client.meta.service_model.service_name}.{operation}", hook)
    return calls, hook


def test_runs_fleets_retry_policy_waits_100_ms_500_ms_then_1_s_and_gives_up():
    policy = preset("runs-fleet")
    assert [step.delay for step in timeline(policy).steps] == pytest.approx([0.1, 0.5, 1.0])
    assert timeline(policy).stopped, "the policy stops after its 4th attempt"
    assert policy.max_attempts == 4
    assert "pkg/events/handler.go" in policy.source
    assert fleet_calls.POLICY == policy, "the fleet's AWS calls retry by this preset"


@pytest.mark.slow
def test_transient_errors_retry_with_backoff_then_succeed(aws):
    jobs = fs.start_jobs(aws, 5)
    fs.send(aws, [_valid_body(j) for j in jobs])
    calls, _ = _fail(aws.client("dynamodb"), "TransactWriteItems", times=2)
    ssm_calls, _ = _fail(aws.client("ssm"), "DeleteParameters", code="InternalServerError", times=1)
    result = fs.drain(aws)
    assert result.counts["applied"] == 5
    assert result.counts["failed"] == 0
    assert calls["n"] == 3  # two failures, then the update
    assert ssm_calls["n"] == 2
    assert fs.runner_parameters(aws) == set()


@pytest.mark.slow
def test_a_message_that_keeps_failing_stays_and_sqs_moves_it_to_the_dead_letter_queue(aws, monkeypatch):
    # runs-fleet's 4 attempts, without the waits (their timeline is tested on the policy itself).
    monkeypatch.setattr(fleet_calls, "POLICY", fixed(0, max_attempts=4))
    sqs = aws.client("sqs")
    sqs.set_queue_attributes(QueueUrl=aws.env[TQ], Attributes={"VisibilityTimeout": "1"})
    jobs = fs.start_jobs(aws, 2)
    fs.send(aws, [_valid_body(j) for j in jobs])
    calls, _ = _fail(aws.client("dynamodb"), "TransactWriteItems")
    for receive in range(1, 4):  # one receive per run (max_messages 2)
        result = fs.drain(aws, max_messages=2)
        assert result.counts["failed"] == 2
        assert result.counts["deleted"] == 0
        assert calls["n"] == 4 * receive  # every round tries runs-fleet's 4 attempts
        assert fs.depth(aws, DLQ) == 0  # not dead-lettered by us: it truly failed only after 3 receives
        fs.wait_until_visible(aws, TQ)
    # The fourth receive finds them past maxReceiveCount: SQS's redrive policy moved them.
    assert fs.drain(aws).counts["received"] == 0
    assert fs.depth(aws, DLQ) == 2
    assert fs.depth(aws, TQ) == 0
    assert all(j["status"] == "running" for j in fs.jobs_state(aws).values())


@pytest.mark.slow
def test_an_interrupt_stops_receiving_and_finishes_the_round_in_flight(aws):
    jobs = fs.start_jobs(aws, 60)
    fs.send(aws, [_valid_body(j) for j in jobs])
    drain = fs.make_drain(aws, run_id="interrupted", concurrency=1)
    handle = drain.handler
    rounds = []

    def handler(messages, pool, **kwargs):
        if not rounds:  # the interrupt arrives (as SIGINT/SIGTERM would) while the first round is in flight
            os.kill(os.getpid(), signal.SIGINT)
            drain.stop.wait(PATIENCE)  # the main thread has turned the interrupt into a stop
        rounds.append(len(messages))
        return handle(messages, pool, **kwargs)

    handler.flush, handler.flush_due = handle.flush, handle.flush_due  # the flushes stay the handler's
    drain.handler = handler
    assert threading.current_thread() is threading.main_thread()
    # As in an op: Dagster turns SIGINT/SIGTERM into DagsterExecutionInterruptedError in the main thread.
    with dg.raise_execution_interrupts():
        result, interrupt = run_with_graceful_stop(drain, logger=fs.log)
    assert isinstance(interrupt, dg.DagsterExecutionInterruptedError)
    assert result.stopped_by == "interrupted"
    assert rounds == [10]
    assert result.counts["received"] == 10
    assert result.counts["applied"] == 10
    assert result.counts["deleted"] == 10
    assert fs.depth(aws, TQ) == 50  # the rest was never received
    rest = fs.drain(aws)
    assert rest.counts["applied"] == 50
    assert rest.counts["duplicates"] == 0
    assert all(j["status"] == "completed" for j in fs.jobs_state(aws).values())
    assert fs.metric_sum(aws, "JobSuccess") == 60


def test_an_interrupt_while_the_drain_thread_starts_leaves_it_nothing_to_do(aws, monkeypatch):
    """SIGINT lands while the calling thread is still inside ``Thread.start``: the interrupt is raised there,
    and the drain thread, which may be running already, receives nothing (it would otherwise drain unwatched)."""
    jobs = fs.start_jobs(aws, 20)
    fs.send(aws, [_valid_body(j) for j in jobs])
    drain = fs.make_drain(aws, concurrency=1)
    started: list[threading.Thread] = []

    class InterruptedStart(threading.Thread):
        def start(self) -> None:
            super().start()
            started.append(self)
            os.kill(os.getpid(), signal.SIGINT)  # handled in this (the main) thread, still inside start()

    monkeypatch.setattr(drain_module.threading, "Thread", InterruptedStart)
    with dg.raise_execution_interrupts(), pytest.raises(dg.DagsterExecutionInterruptedError):
        run_with_graceful_stop(drain, logger=fs.log)
    started[0].join(PATIENCE)
    assert drain.result.stopped_by == "stop requested"
    assert drain.result.counts["received"] == 0
    assert fs.depth(aws, TQ) == 20


def _lines_between(first: str, last: str) -> range:
    """The line numbers of drain.py from the one holding ``first`` to the one holding ``last``."""
    lines = Path(drain_module.__file__).read_text().splitlines()
    start = next(n for n, text in enumerate(lines, 1) if first in text)
    return range(start, next(n for n, text in enumerate(lines, 1) if n > start and last in text) + 1)


def _interrupted_at(drain, line: int) -> tuple[bool, list[str], str | None]:
    """Runs ``drain`` with an interrupt raised before ``line`` of run_with_graceful_stop (as a signal handler
    raises it, between two lines), and waits for the threads it started: (whether the line ran, the threads
    still alive, how the drain stopped when the interrupt was returned)."""
    raised: list[int] = []

    def tracer(frame, event, arg):
        if frame.f_code is not run_with_graceful_stop.__code__:
            return None

        def local(frame, event, arg):
            if event == "line" and frame.f_lineno == line and not raised:
                raised.append(line)
                raise KeyboardInterrupt("SIGTERM")
            return local

        return local

    before = set(threading.enumerate())
    sys.settrace(tracer)
    try:
        result, interrupt = run_with_graceful_stop(drain, logger=fs.log)
        stopped = result.stopped_by if interrupt is not None else None
    except KeyboardInterrupt:
        stopped = None
    finally:
        sys.settrace(None)
    started = set(threading.enumerate()) - before
    for thread in started:
        thread.join(PATIENCE)
    return bool(raised), [t.name for t in started if t.is_alive()], stopped


def test_an_interrupt_wherever_it_lands_while_the_drain_starts_leaves_no_drain_running_unwatched(aws):
    """Before each line from the drain thread's start to the loop: the interrupt is raised before anything is
    received and the drain thread ends, or the drain stops gracefully and the interrupt is returned."""
    lines = _lines_between("threading.Thread(target=target", "finished.wait(0.2)")
    outcomes = {line: _interrupted_at(fs.make_drain(aws, concurrency=1), line) for line in lines}
    assert {line: alive for line, (_, alive, _) in outcomes.items() if alive} == {}
    assert {stopped for _, _, stopped in outcomes.values()} <= {None, "interrupted"}
    assert outcomes[lines[0]][0]  # the thread's start
    assert outcomes[lines[1]][0]  # the line after it


def test_a_drain_whose_run_status_cannot_be_read_stops_at_the_round_boundary_without_writing_to_the_run(aws, caplog):
    """The instance's database is gone (the status read fails): the drain stops at the round boundary,
    finishes what it applied, and says so in the process's log only: a write to the run's log would
    only wait out the storage's connection retries."""
    jobs = fs.start_jobs(aws, 30)
    fs.send(aws, [_valid_body(j) for j in jobs])
    drain = fs.make_drain(aws, concurrency=1)
    reads = []

    def status() -> bool:
        reads.append(1)
        if len(reads) > 1:
            raise RuntimeError("too many retries for DB connection")
        return False

    run_log = logging.getLogger("tests.fleet.run-log")
    with caplog.at_level(logging.INFO):
        result, interrupt = run_with_graceful_stop(drain, logger=run_log, terminated=status)
    assert interrupt is None
    assert result.stopped_by == STATUS_UNREADABLE
    assert result.counts["received"] == result.counts["applied"] == result.counts["deleted"] == 10
    lines = [r for r in caplog.records if "status cannot be read" in r.getMessage()]
    assert [r.name for r in lines] == ["pipelines.fleet.drain"], [(r.name, r.getMessage()) for r in caplog.records]
    assert "too many retries for DB connection" in lines[0].getMessage()
    # the summary too goes to the process's log only
    assert not [r.getMessage() for r in caplog.records if r.name == run_log.name]
    (summary,) = [r for r in caplog.records if " drain: " in r.getMessage()]
    assert summary.name == "pipelines.fleet.drain"
    assert "applied=10" in summary.getMessage()
    assert fs.depth(aws, TQ) == 20  # never received: still in the queue
    assert fs.drain(aws).counts["applied"] == 20


@pytest.mark.slow
def test_a_full_round_of_100_costs_one_transaction_and_one_flush(aws):
    """Defaults: a round of 100 (10 receives), one TransactWriteItems; its flush: one archive write,
    one PutMetricData, one marker; 10 DeleteParameters and 10 DeleteMessageBatch."""
    jobs = fs.start_jobs(aws, 100)
    fs.send(aws, [_valid_body(j) for j in jobs])
    calls = Counter()

    def count(event_name, **kwargs):
        calls[event_name.split(".", 2)[2]] += 1

    clients = [aws.client(s) for s in ("sqs", "dynamodb", "ssm", "cloudwatch", "s3")]
    for client in clients:
        client.meta.events.register("before-call.*.*", count)
    try:
        result = fs.drain(aws)
    finally:
        for client in clients:
            client.meta.events.unregister("before-call.*.*", count)
    assert result.counts["applied"] == 100
    assert result.rounds == 1
    assert calls["TransactWriteItems"] == 1
    assert calls["PutObject"] == 2  # the run's archive and the flush's done marker
    assert calls["PutMetricData"] == 1
    assert calls["DeleteParameters"] == 10
    assert calls["DeleteMessageBatch"] == 10
    assert calls["ReceiveMessage"] == 11  # the last one finds the queue empty
    assert calls["GetQueueAttributes"] <= 1  # the visibility timeout, once per run
    assert sum(calls.values()) / 100 <= 0.36, calls


@pytest.mark.slow
def test_a_round_cut_short_before_its_clean_up_is_finished_by_the_redelivery(aws):
    """The update landed but the clean-up failed (no round marker): the message stays, comes back
    after its visibility timeout, and the next run takes the job over and finishes it, once."""
    aws.client("sqs").set_queue_attributes(QueueUrl=aws.env[TQ], Attributes={"VisibilityTimeout": "1"})
    jobs = fs.start_jobs(aws, 4)
    fs.send(aws, [_valid_body(j) for j in jobs])
    _, hook = _fail(aws.client("cloudwatch"), "PutMetricData", code="AccessDeniedException")
    first = fs.drain(aws, max_messages=4)
    aws.client("cloudwatch").meta.events.unregister("before-call.cloudwatch.PutMetricData", hook)
    assert first.counts["failed"] == 4
    assert first.counts["deleted"] == 0
    assert first.counts["applied"] == 0
    state = fs.jobs_state(aws)
    assert all(state[j["job_id"]]["status"] == "completed" for j in jobs), "the update did not land"
    assert not any(fs.round_done(aws, state[j["job_id"]]) for j in jobs), "a round was marked done without clean-up"
    fs.wait_until_visible(aws, TQ)
    second = fs.drain(aws)
    assert second.counts["taken_over"] == 4
    assert second.counts["applied"] == 4
    assert second.counts["deleted"] == 4
    state = fs.jobs_state(aws)
    assert all(fs.round_done(aws, state[j["job_id"]]) for j in jobs)
    assert fs.metric_sum(aws, "JobSuccess") == 4
    assert fs.runner_parameters(aws) == set()
    assert fs.depth(aws, TQ) == 0
    assert fs.depth(aws, DLQ) == 0


@pytest.mark.slow
def test_a_copy_of_a_message_another_run_is_still_handling_is_left_in_the_queue(aws):
    """A job applied by this same message in a round younger than the visibility timeout and not yet
    done belongs to a run still at work: the copy is neither applied again nor acknowledged. Once
    that round is older than the timeout (its run's hold has lapsed), the copy takes the job over."""
    from pipelines.common import to_item
    from pipelines.fleet.messages import fingerprint
    from pipelines.fleet.termination import new_round_id

    # the drain below must look within the timeout of the round written here: long beside a loaded
    # machine's few calls in between
    aws.client("sqs").set_queue_attributes(QueueUrl=aws.env[TQ], Attributes={"VisibilityTimeout": "10"})
    (job,) = fs.start_jobs(aws, 1)
    body = _valid_body(job)
    # Another run applied this message a moment ago and has not finished its clean-up.
    aws.client("dynamodb").update_item(
        TableName=aws.env["RUNS_FLEET_JOBS_TABLE"],
        Key={"job_id": {"S": job["job_id"]}},
        UpdateExpression="SET #s = :s, termination_digest = :d, termination_round = :r",
        ExpressionAttributeNames={"#s": "status"},
        ExpressionAttributeValues=to_item(
            {":s": "completed", ":d": fingerprint(body), ":r": new_round_id(time.time())}
        ),
    )
    fs.send(aws, [body])
    held = fs.drain(aws)
    assert held.counts["held_elsewhere"] == 1
    assert held.counts["deleted"] == 0
    assert held.counts["applied"] == 0
    assert fs.metric_sum(aws, "JobSuccess") == 0
    assert fs.depth(aws, TQ) == 1
    # visible again: received after the round began, so the other run's hold has lapsed too
    fs.wait_until_visible(aws, TQ)
    taken = fs.drain(aws)
    assert taken.counts["taken_over"] == 1
    assert taken.counts["deleted"] == 1
    assert fs.metric_sum(aws, "JobSuccess") == 1
    assert fs.runner_parameters(aws) == set()
    assert fs.round_done(aws, fs.jobs_state(aws)[job["job_id"]])
    # Delivered once more, it is a plain duplicate now.
    fs.send(aws, [body])
    again = fs.drain(aws)
    assert again.counts["duplicates"] == 1
    assert again.counts["deleted"] == 1
    assert fs.metric_sum(aws, "JobSuccess") == 1


@pytest.mark.slow
def test_a_late_copy_for_an_archived_job_is_a_duplicate_and_an_unknown_job_is_dead_lettered(aws, monkeypatch):
    """old_jobs archived and deleted the job; a late copy of its termination message must not bring it
    back. A termination message for a job that never existed is dead-lettered."""
    from pipelines.fleet import messages
    from pipelines.fleet.housekeeping import Housekeeping

    job, other = fs.start_jobs(aws, 2)
    body = _valid_body(job)
    fs.send(aws, [body])
    assert fs.drain(aws).counts["applied"] == 1
    later = fs.jobs_state(aws)[job["job_id"]]["completed_at"]
    monkeypatch.setattr(messages, "utcnow", lambda: messages.parse_time(later, "t") + messages.dt.timedelta(days=8))
    dispatcher = Housekeeping()
    assert dispatcher.run(fs.context(aws), dispatcher.parse({"task_type": "old_jobs"})).summary["archived"] == 1
    assert job["job_id"] not in fs.jobs_state(aws)

    unknown = fs.termination_body({"job_id": "never-started", "instance_id": other["instance_id"]})
    fs.send(aws, [body, unknown])
    result = fs.drain(aws)
    assert result.counts["applied"] == 0
    assert result.counts["duplicates"] == 1
    assert result.counts["archived_duplicates"] == 1
    assert result.counts["dead_lettered"] == 1
    assert result.counts["deleted"] == 2
    state = fs.jobs_state(aws)
    assert job["job_id"] not in state, "the archived job came back"
    assert "never-started" not in state
    assert state[other["job_id"]]["status"] == "running"
    (dead,) = fs.read_all(aws, DLQ)
    assert dead["Body"] == unknown
    assert "unknown job_id 'never-started'" in dead["MessageAttributes"]["groundskeeper-reason"]["StringValue"]
    assert fs.metric_sum(aws, "JobSuccess") == 1
    assert fs.depth(aws, TQ) == 0


def test_copies_in_later_rounds_of_the_same_flush_are_duplicates_not_held_elsewhere(aws):
    """A copy of a message this run applied in an unflushed round is this run's own: acknowledged
    with the flush, never left in the queue as if another run held it."""
    jobs = fs.start_jobs(aws, 10)
    bodies = [_valid_body(j) for j in jobs]
    fs.send(aws, bodies)
    fs.send(aws, bodies)
    result = fs.drain(aws, concurrency=1, flush_rounds=3)
    assert result.counts["applied"] == 10
    assert result.counts["held_elsewhere"] == 0
    assert result.counts["duplicates"] == 10
    assert result.counts["deleted"] == 20
    assert fs.metric_sum(aws, "JobSuccess") == 10
    assert fs.depth(aws, TQ) == 0


@pytest.mark.slow
def test_a_run_killed_between_rounds_has_acknowledged_nothing_unarchived_or_uncounted(aws):
    """Rounds wait for their flush. A run killed after two rounds (jobs written, no flush) archived,
    counted and acknowledged nothing; the redelivery takes its jobs over and counts each once."""
    from concurrent.futures import ThreadPoolExecutor

    # long beside a loaded machine's first round: the second receive must not get its messages again
    aws.client("sqs").set_queue_attributes(QueueUrl=aws.env[TQ], Attributes={"VisibilityTimeout": "10"})
    jobs = fs.start_jobs(aws, 20)
    bodies = [_valid_body(j) for j in jobs]
    fs.send(aws, bodies + bodies[:5])
    drain = fs.make_drain(aws, concurrency=1, flush_rounds=3)
    with ThreadPoolExecutor(1) as pool:
        for _ in range(2):
            began = time.time()  # as the drain does: a round begins when its receive does
            messages = queues.receive(aws.client("sqs"), aws.env[TQ], max_messages=10)
            drain.handler(messages, pool, started_at=began)
    # Killed here: the handler is dropped before its flush.
    state = fs.jobs_state(aws)
    written = [j for j in jobs if state[j["job_id"]]["status"] == "completed"]
    assert len(written) >= 15
    bucket = aws.env["RUNS_FLEET_ARCHIVE_BUCKET"]
    assert aws.client("s3").list_objects_v2(Bucket=bucket).get("KeyCount", 0) == 0  # no archive, no marker
    assert fs.metric_sum(aws, "JobSuccess") == 0
    assert fs.depth(aws, TQ) == 25  # nothing acknowledged
    assert len(fs.runner_parameters(aws)) == 20
    fs.wait_until_visible(aws, TQ)  # and the killed rounds, begun before their receives, are older than it
    second = fs.drain(aws)
    assert second.counts["applied"] == 20
    assert second.counts["taken_over"] == len(written)
    assert second.counts["duplicates"] == 5
    assert second.counts["held_elsewhere"] == 0
    assert fs.metric_sum(aws, "JobSuccess") == 20
    assert fs.runner_parameters(aws) == set()
    assert fs.depth(aws, TQ) == 0
    state = fs.jobs_state(aws)
    assert all(fs.round_done(aws, state[j["job_id"]]) for j in jobs)
    raw = [o["Key"] for o in aws.client("s3").list_objects_v2(Bucket=bucket, Prefix="raw/")["Contents"]]
    lines = b"".join(aws.client("s3").get_object(Bucket=bucket, Key=k)["Body"].read() for k in raw).splitlines()
    assert sorted(json.loads(line)["body"] for line in lines) == sorted(bodies + bodies[:5])


def test_a_transaction_that_landed_although_its_call_failed_is_finished_not_taken_for_a_duplicate(aws, monkeypatch):
    """The first TransactWriteItems lands, but its response is lost (read timeout): runs-fleet's
    retry finds every condition failed, with the jobs stamped by this very round. Those jobs are
    this round's own: cleaned up, counted and acknowledged now."""
    from botocore.exceptions import ReadTimeoutError

    monkeypatch.setattr(fleet_calls, "POLICY", fixed(0, max_attempts=4))
    jobs = fs.start_jobs(aws, 5)
    fs.send(aws, [_valid_body(j) for j in jobs])
    lost = Counter()

    def lose_the_response(**kwargs):
        if not lost["n"]:
            lost["n"] += 1
            raise ReadTimeoutError(endpoint_url="http://127.0.0.1")

    ddb = aws.client("dynamodb")
    ddb.meta.events.register("after-call.dynamodb.TransactWriteItems", lose_the_response)
    try:
        result = fs.drain(aws)
    finally:
        ddb.meta.events.unregister("after-call.dynamodb.TransactWriteItems", lose_the_response)
    assert lost["n"] == 1
    assert result.counts["landed_on_retry"] == 5
    assert result.counts["applied"] == 5
    assert result.counts["duplicates"] == 0
    assert fs.metric_sum(aws, "JobSuccess") == 5
    assert fs.runner_parameters(aws) == set()
    assert fs.depth(aws, TQ) == 0
    state = fs.jobs_state(aws)
    assert all(fs.round_done(aws, state[j["job_id"]]) for j in jobs)


def test_a_write_that_landed_but_was_reported_failed_is_taken_over_though_a_later_round_marked_its_round_done(
    aws, monkeypatch
):
    """A's TransactWriteItems lands, but every try is reported failed: A is left in the queue. B,
    applied in a later round of the same flush, has the flush write its round's marker, which lists
    B only. A's message, back in the queue, takes A over and finishes its clean-up; it is no duplicate."""
    from pipelines.fleet import termination

    monkeypatch.setattr(fleet_calls, "POLICY", fixed(0, max_attempts=4))
    a, b = fs.start_jobs(aws, 2)
    body_a = _valid_body(a)
    fs.send(aws, [body_a])
    sqs, ddb = aws.client("sqs"), aws.client("dynamodb")
    receive, write = sqs.receive_message, ddb.transact_write_items
    received, tries = [], Counter()

    def receive_and_keep(**kwargs):
        response = receive(**kwargs)
        received.extend(response.get("Messages", []))
        return response

    def lands_then_fails(**kwargs):
        if tries["a"] < 4 and a["job_id"] in [i["Update"]["Key"]["job_id"]["S"] for i in kwargs["TransactItems"]]:
            tries["a"] += 1
            if tries["a"] == 1:
                write(**kwargs)  # lands, while B arrives for the next round of the same flush
                fs.send(aws, [_valid_body(b)])
            raise ClientError({"Error": {"Code": "InternalServerError", "Message": "timeout"}}, "TransactWriteItems")
        return write(**kwargs)

    with monkeypatch.context() as m:
        m.setattr(sqs, "receive_message", receive_and_keep)
        m.setattr(ddb, "transact_write_items", lands_then_fails)
        # the flush's round began an hour ago: once A's message is back, that round's hold has lapsed
        m.setattr(termination, "new_round_id", lambda began, new=termination.new_round_id: new(began - 3600))
        first = fs.drain(aws, flush_rounds=3)
    assert tries["a"] == 4
    assert first.counts["failed"] == 1
    assert first.counts["applied"] == 1
    state = fs.jobs_state(aws)
    assert state[a["job_id"]]["termination_round"] == state[b["job_id"]]["termination_round"]
    assert fs.round_done(aws, state[a["job_id"]])  # B's clean-up marked the round done
    (held,) = [msg for msg in received if msg["Body"] == body_a]
    # A's visibility timeout runs out: its message comes back
    sqs.change_message_visibility(QueueUrl=aws.env[TQ], ReceiptHandle=held["ReceiptHandle"], VisibilityTimeout=0)
    second = fs.drain(aws)
    assert second.counts["taken_over"] == 1
    assert second.counts["duplicates"] == 0
    assert second.counts["applied"] == 1
    assert fs.runner_parameters(aws) == set()
    assert fs.metric_sum(aws, "JobSuccess") == 2
    assert fs.depth(aws, TQ) == 0
