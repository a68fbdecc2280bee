"""A drain run through the dagster CLI, killed (SIGKILL) or stopped (SIGTERM) in the middle.

SIGKILL: nothing half-applied (each job is untouched, or updated in a round whose clean-up is not
marked done), and a second run finishes the work. SIGTERM: the run stops receiving, finishes the round in
flight, and nothing is lost or applied twice.

The job runs its one op in the run's own process (in-process executor), so the signal reaches the
drain directly. The run starts first and long-polls the empty queue while the test builds the
backlog (the run's start-up is most of the time). One round holds 10 messages (concurrency 1), and
a flush finishes 3 rounds (flush_rounds 3, the default). The run reaches moto through a proxy that
holds it at its first receive once 30 jobs are written (``fs.ReceiveHold``): it is stopped there, with
most of the backlog still to come however fast it is, and released once it has stopped receiving.
"""

import json
import os
import signal
import subprocess
import sys
import time

import dagster as dg
import pytest

from pipelines.definitions import ROOT_DIR
from tests import fleet_support as fs
from tests.conftest import PATIENCE

pytestmark = pytest.mark.cli  # dagster job execute in a subprocess

TQ, DLQ = "RUNS_FLEET_TERMINATION_QUEUE_URL", "RUNS_FLEET_TERMINATION_DLQ_URL"
N = 100
STOP_AFTER = 30  # jobs done before the run is stopped: one flush of 3 rounds of 10, its clean-up marked done
# Short, so that what the stopped run held comes back within seconds; long beside the three rounds and
# their flush that a message waits for its delete, even on a loaded machine: a message received three
# times undeleted (maxReceiveCount 3) is dead-lettered, which the tests rightly count as a loss.
VISIBILITY_SECONDS = 10


def _start_drain_run(aws, tmp_path, endpoint: str):
    cfg = tmp_path / "drain.json"
    # A 20 s long poll: the run waits for the backlog instead of finding the queue empty.
    cfg.write_text(json.dumps({"concurrency": 1, "max_messages": 0, "max_seconds": 300, "wait_seconds": 20}))
    log = open(tmp_path / "run.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dagster", "job", "execute", "-m", "pipelines.definitions"]
        + ["-j", "process_termination_queue", "-c", str(cfg)],
        cwd=ROOT_DIR,
        env={**aws.subprocess_env(), "DAGSTER_HOME": str(tmp_path), "AWS_ENDPOINT_URL": endpoint},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return proc, log


def _held(aws) -> fs.ReceiveHold:
    """Holds the run at its first receive once STOP_AFTER jobs are done."""
    return fs.ReceiveHold(aws.endpoint, until=lambda: fs.jobs_done(aws) >= STOP_AFTER)


def _run_with_backlog(aws, tmp_path, endpoint: str):
    """Start the drain run (its AWS at ``endpoint``), then build the backlog it drains: N running jobs
    and their messages."""
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    aws.client("sqs").set_queue_attributes(
        QueueUrl=aws.env[TQ], Attributes={"VisibilityTimeout": str(VISIBILITY_SECONDS)}
    )
    proc, log = _start_drain_run(aws, tmp_path, endpoint)
    try:
        jobs = fs.start_jobs(aws, N)
        fs.send(aws, [fs.termination_body(j, "success") for j in jobs])
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    return jobs, proc, log


def _assert_all_done(aws, jobs):
    state = fs.jobs_state(aws)
    done = fs.rounds_done(aws)
    assert all(state[j["job_id"]]["status"] == "completed" for j in jobs), "a job is not completed"
    assert all(fs.round_done(aws, state[j["job_id"]], done) for j in jobs), "a job's round is not marked done"
    assert fs.runner_parameters(aws) == set()
    assert fs.depth(aws, TQ) == 0
    assert fs.depth(aws, DLQ) == 0


def _settled_state(aws) -> dict:
    """The jobs once the moto server has finished the killed client's last request (a transaction
    keeps being applied, item by item, after its caller died; a scan meanwhile sees part of it)."""
    state = fs.jobs_state(aws)
    while True:
        time.sleep(0.2)
        again = fs.jobs_state(aws)
        if again == state:
            return state
        state = again


def _wait_for_log(tmp_path, text: str, proc) -> None:
    """Until the run's event log has a line with ``text``; the run must still be going."""
    instance = dg.DagsterInstance.from_config(str(tmp_path))
    deadline = time.monotonic() + PATIENCE
    try:
        while not any(text in e.message for run in instance.get_runs() for e in instance.all_logs(run.run_id)):
            assert proc.poll() is None, "the run ended before it logged " + repr(text)
            assert time.monotonic() < deadline, "the run did not log " + repr(text)
            time.sleep(0.1)
    finally:
        instance.dispose()


def test_a_drain_run_killed_with_sigkill_leaves_nothing_half_applied(aws, tmp_path):
    with _held(aws) as hold:
        jobs, proc, log = _run_with_backlog(aws, tmp_path, hold.endpoint)
        try:
            hold.wait_held(lambda: proc.poll() is None)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=PATIENCE)
            log.close()
    state = _settled_state(aws)
    params = fs.runner_parameters(aws)
    done = fs.rounds_done(aws)
    applied = [j for j in jobs if state[j["job_id"]]["status"] == "completed"]
    assert STOP_AFTER <= len(applied) < N, len(applied)
    assert any(fs.round_done(aws, state[j["job_id"]], done) for j in applied), "no finished round to check"
    for job in jobs:
        item = state[job["job_id"]]
        if item["status"] == "running":  # untouched
            assert "termination_round" not in item, item
            assert "completed_at" not in item, item
        elif fs.round_done(aws, item, done):  # finished: its clean-up is done too
            assert f"/runs-fleet/runners/{job['instance_id']}/config" not in params
    fs.wait_until_visible(aws, TQ)  # the killed run's messages are visible again
    second = fs.drain(aws)
    assert second.counts["failed"] == 0
    assert second.counts["dead_lettered"] == 0
    _assert_all_done(aws, jobs)
    assert second.counts["taken_over"] == len(applied) - sum(
        fs.round_done(aws, state[j["job_id"]], done) for j in applied
    )
    # Metrics: every job counted; at most the flush killed between PutMetricData and its marker twice
    # (3 rounds of 10).
    assert N <= fs.metric_sum(aws, "JobSuccess") <= N + 30


def test_sigterm_stops_the_drain_run_gracefully_and_nothing_is_applied_twice(aws, tmp_path):
    with _held(aws) as hold:
        jobs, proc, log = _run_with_backlog(aws, tmp_path, hold.endpoint)
        try:
            hold.wait_held(lambda: proc.poll() is None)
            os.killpg(proc.pid, signal.SIGTERM)
            _wait_for_log(tmp_path, "finishing the messages in flight", proc)  # no more receives
            hold.release()
            proc.wait(timeout=PATIENCE)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            log.close()
    instance = dg.DagsterInstance.from_config(str(tmp_path))
    try:
        (run,) = instance.get_runs()
        messages = [e.message for e in instance.all_logs(run.run_id)]
    finally:
        instance.dispose()
    assert any("finishing the messages in flight" in m for m in messages), messages[-20:]
    assert any(" drain: " in m and "stopped_by=interrupted" in m for m in messages), messages[-20:]
    state = fs.jobs_state(aws)
    rounds = fs.rounds_done(aws)
    finished = [state[j["job_id"]] for j in jobs if state[j["job_id"]]["status"] == "completed"]
    assert all(fs.round_done(aws, item, rounds) for item in finished), "the round in flight did not finish"
    done = len(finished)
    assert STOP_AFTER <= done < N, done
    fs.wait_until_visible(aws, TQ)
    second = fs.drain(aws)
    assert second.counts["applied"] == N - done
    _assert_all_done(aws, jobs)
    assert fs.metric_sum(aws, "JobSuccess") == N  # nothing applied twice
