"""Parallel drains of one queue: the sensor launches up to the queue's number of drain runs, each in
a consumer slot of its own, and three drains at once apply every message exactly once."""

import json
import threading
import time

import dagster as dg
import pytest

from pipelines.definitions import build_definitions
from pipelines.fleet.defs import QUEUE_TAG
from pipelines.fleet.defs.sensors import MAX_WAIT_SECONDS
from resources import SQSResource, fleet_settings_from_env
from tests import fleet_support as fs
from tests.conftest import PATIENCE

TQ, DLQ = "RUNS_FLEET_TERMINATION_QUEUE_URL", "RUNS_FLEET_TERMINATION_DLQ_URL"


def _tick(sensor, instance, cursor=None):
    context = dg.build_sensor_context(
        instance=instance, cursor=cursor, resources={"sqs": SQSResource(), "fleet": fleet_settings_from_env()}
    )
    return sensor.evaluate_tick(context)


@pytest.mark.slow
def test_the_sensor_fills_free_drain_slots_with_distinct_run_keys(aws, monkeypatch):
    monkeypatch.setenv("RUNS_FLEET_TERMINATION_DRAIN_RUNS", "3")
    defs = build_definitions("local")
    sensor = defs.resolve_sensor_def("termination_queue_sensor")
    job = defs.resolve_job_def("process_termination_queue")
    with dg.instance_for_test() as instance:
        fs.send(aws, ["{}"] * 50)
        few = _tick(sensor, instance)
        assert "a drain run starts at 100 waiting or after 300 s" in few.skip_message
        waited = json.dumps({"sequence": 0, "since": time.time() - MAX_WAIT_SECONDS})
        late = _tick(sensor, instance, cursor=waited)
        assert [r.tags[QUEUE_TAG] for r in late.run_requests] == ["runs-fleet-termination"]  # 50 waited: one run
        fs.send(aws, ["{}"] * 200)
        tick = _tick(sensor, instance, cursor="1")  # a cursor of before the wait: the run keys' sequence
        assert [r.run_key for r in tick.run_requests] == [f"termination-drain-{k}" for k in (2, 3, 4)]
        assert [r.tags[QUEUE_TAG] for r in tick.run_requests] == [
            "runs-fleet-termination",
            "runs-fleet-termination#2",
            "runs-fleet-termination#3",
        ]
        assert json.loads(tick.cursor) == {"sequence": 4, "since": None}
        # Slot 2 busy (a queued run): the next tick fills slots 1 and 3 only.
        instance.create_run_for_job(job, run_config={}, tags={QUEUE_TAG: "runs-fleet-termination#2"})
        tick = _tick(sensor, instance, cursor=tick.cursor)
        assert [r.tags[QUEUE_TAG] for r in tick.run_requests] == ["runs-fleet-termination", "runs-fleet-termination#3"]
        assert [r.run_key for r in tick.run_requests] == ["termination-drain-5", "termination-drain-6"]
        # Every slot busy: skip, naming the runs.
        instance.create_run_for_job(job, run_config={})  # a run launched by hand takes slot 1
        instance.create_run_for_job(job, run_config={}, tags={QUEUE_TAG: "runs-fleet-termination#3"})
        busy = _tick(sensor, instance, cursor=tick.cursor)
        assert not busy.run_requests
        assert "all 3 drain slots busy" in busy.skip_message
        assert busy.skip_message.count("is still queued") == 3


@pytest.mark.slow
def test_three_drains_at_once_apply_every_message_exactly_once(atomic_aws):
    """200 jobs, 40 of their messages sent twice, 4 poison messages: three drains of one queue at
    once (competing consumers, as three drain runs are), until the queue is empty. On a moto server
    whose DynamoDB writes are isolated as DynamoDB's are (the ``atomic_aws`` fixture)."""
    _three_drains(atomic_aws)


class _FirstReceiveTogether:
    """A drain's SQS client whose first receive returns once every drain of its wave has received:
    each holds its first messages while the others take theirs."""

    def __init__(self, sqs, together: threading.Barrier) -> None:
        self._sqs, self._together, self._first = sqs, together, True

    def receive_message(self, **kwargs):
        got = self._sqs.receive_message(**kwargs)
        if self._first:
            self._first = False
            self._together.wait(PATIENCE)
        return got

    def __getattr__(self, name: str):
        return getattr(self._sqs, name)


def _three_drains(aws):
    # A copy held by one drain's unflushed rounds comes back to the others after this. Long enough that
    # no clean-up outlasts a whole timeout after its round began or was renewed, even on a loaded
    # machine: past that, a take-over before its marker may count a job twice (docs/fleet.md).
    visibility = 60
    aws.client("sqs").set_queue_attributes(QueueUrl=aws.env[TQ], Attributes={"VisibilityTimeout": str(visibility)})
    jobs = fs.start_jobs(aws, 200)
    bodies = [fs.termination_body(j, "success") for j in jobs]
    poison = [json.dumps({"job_id": f"bad-{k}", "status": "exploded"}) for k in range(4)]
    # The copies right behind their originals: the drains' first rounds (30 messages each) share
    # them, so the copies a drain leaves to another's unflushed round are received at the start,
    # and the wait for them to come back ends one visibility timeout after the start.
    fs.send(aws, bodies[:40] + bodies[:40] + poison + bodies[40:])

    results, errors = [], []

    def run(wave, drain):
        try:
            results.append((wave, drain.run()))
        except BaseException as exc:
            errors.append(exc)

    for wave in range(4):  # what one wave leaves in flight (held elsewhere, lost deletes) comes back
        drains = [fs.make_drain(aws, concurrency=3, wait_seconds=1) for _ in range(3)]
        together = threading.Barrier(len(drains))
        for drain in drains:  # the drains compete at once: none goes on past its first receive alone
            drain.sqs = _FirstReceiveTogether(drain.sqs, together)
        threads = [threading.Thread(target=run, args=(wave, drain)) for drain in drains]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=PATIENCE)
        assert not errors, errors
        if fs.depth(aws, TQ) == 0:
            break
        fs.wait_until_visible(aws, TQ, timeout=PATIENCE)
    assert fs.depth(aws, TQ) == 0
    first_wave = [r for w, r in results if w == 0]
    assert [r.counts["received"] > 0 for r in first_wave] == [True] * 3, [r.counts for r in first_wave]
    total = sum((r.counts for _, r in results), start=type(results[0][1].counts)())
    assert total["applied"] == 200, total  # none twice, none lost
    assert total["failed"] == 0, total
    assert total["dead_lettered"] >= 4, total
    state = fs.jobs_state(aws)
    done = fs.rounds_done(aws)
    assert all(state[j["job_id"]]["status"] == "completed" for j in jobs)
    unmarked = [state[j["job_id"]] for j in jobs if not fs.round_done(aws, state[j["job_id"]], done)]
    assert not unmarked, (total, unmarked[:3])
    assert fs.metric_sum(aws, "JobSuccess") == 200  # each job counted once: applied once
    assert fs.runner_parameters(aws) == set()
    # Poison is dead-lettered at least once (a copy that came back to another drain may be twice).
    assert {m["Body"] for m in fs.read_all(aws, DLQ)} == set(poison)


@pytest.mark.slow
def test_a_flush_later_than_the_visibility_timeout_leaves_jobs_taken_over_to_their_new_run(aws):
    """Drain A writes a round, then stalls past the visibility timeout; drain B receives the messages
    again and takes the jobs over. A's late flush checks that the jobs are still its own: they are
    not, so it neither counts nor cleans them up again (B did)."""
    from concurrent.futures import ThreadPoolExecutor

    from pipelines.fleet.queues import receive

    aws.client("sqs").set_queue_attributes(QueueUrl=aws.env[TQ], Attributes={"VisibilityTimeout": "1"})
    jobs = fs.start_jobs(aws, 5)
    fs.send(aws, [fs.termination_body(j, "success") for j in jobs])
    a = fs.make_drain(aws).handler
    with ThreadPoolExecutor(1) as pool:
        began = time.time()  # as the drain does: a round begins when its receive does
        a(receive(aws.client("sqs"), aws.env[TQ], max_messages=10), pool, started_at=began)
        fs.wait_until_visible(aws, TQ)  # and A's round, begun before the receive, is older than the timeout
        b = fs.drain(aws)
        assert b.counts["taken_over"] == 5
        late = a.flush(pool)
    assert late["lost_to_takeover"] == 5
    assert late["applied"] == 0
    assert fs.metric_sum(aws, "JobSuccess") == 5
    assert fs.depth(aws, TQ) == 0


@pytest.mark.slow
def test_a_late_flush_renews_its_round_so_a_copy_received_during_its_clean_up_is_left_to_it(aws):
    """Drain A writes a round, then flushes it later than the visibility timeout. Its flush renews
    the round before its clean-up; drain B, run while A is held in that clean-up, receives the
    messages again and leaves them (held elsewhere): the jobs are applied and counted once."""
    from concurrent.futures import ThreadPoolExecutor

    from pipelines.fleet.queues import receive

    visibility = 10  # B runs right after A's renewal: well inside a fresh timeout, even on a loaded machine
    aws.client("sqs").set_queue_attributes(QueueUrl=aws.env[TQ], Attributes={"VisibilityTimeout": str(visibility)})
    jobs = fs.start_jobs(aws, 5)
    fs.send(aws, [fs.termination_body(j, "success") for j in jobs])
    a = fs.make_drain(aws).handler
    during_clean_up: list = []

    class HoldingSSM:  # A's SSM client: the first DeleteParameters of A's clean-up runs drain B first
        def __init__(self, client):
            self.client = client

        def __getattr__(self, name):
            return getattr(self.client, name)

        def delete_parameters(self, **kwargs):
            if not during_clean_up:
                during_clean_up.append(fs.drain(aws))
            return self.client.delete_parameters(**kwargs)

    a.ctx.ssm = HoldingSSM(a.ctx.ssm)
    with ThreadPoolExecutor(1) as pool:
        a(receive(aws.client("sqs"), aws.env[TQ], max_messages=10), pool, started_at=time.time())
        fs.wait_until_visible(aws, TQ)  # A's round is now older than the timeout: its flush is late
        late = a.flush(pool)
    (b,) = during_clean_up
    assert b.counts["held_elsewhere"] == 5
    assert b.counts["taken_over"] == 0
    assert late["applied"] == 5
    assert late["lost_to_takeover"] == 0
    fs.wait_until_visible(aws, TQ)  # B's copies, unless A's acknowledgement removed them, come back
    after = fs.drain(aws)
    assert after.counts["applied"] == 0  # a copy of a done round is a duplicate
    assert fs.metric_sum(aws, "JobSuccess") == 5
    assert fs.depth(aws, TQ) == 0
