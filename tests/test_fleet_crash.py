"""A drain run through the dagster CLI, killed (SIGKILL) or stopped (SIGTERM) in the middle.

SIGKILL: nothing half-applied (each job is untouched, or updated in a round whose clean-up is not
marked done), and a second run finishes the work. SIGTERM: the run stops receiving, finishes the round in
flight, and nothing is lost or applied twice.
"""

import json
import os
import signal
import subprocess
import sys
import time

import dagster as dg

from pipelines.definitions import ROOT_DIR
from tests import fleet_support as fs

TQ, DLQ = "RUNS_FLEET_TERMINATION_QUEUE_URL", "RUNS_FLEET_TERMINATION_DLQ_URL"
N = 200


def _start_drain_run(aws, tmp_path):
    cfg = tmp_path / "drain.json"
    cfg.write_text(json.dumps({"concurrency": 1, "maxMessages": 0, "maxSeconds": 300, "waitSeconds": 0}))
    log = open(tmp_path / "run.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dagster", "job", "execute", "-m", "pipelines.definitions"]
        + ["-j", "process_termination_queue", "-c", str(cfg)],
        cwd=ROOT_DIR,
        env={**aws.subprocess_env(), "DAGSTER_HOME": str(tmp_path)},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    return proc, log


def _wait_until_completed(aws, proc, at_least: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = sum(1 for j in fs.jobs_state(aws).values() if j["status"] != "running")
        if done >= at_least:
            return
        assert proc.poll() is None, "the run ended before it could be stopped"
        time.sleep(0.05)
    raise AssertionError("the drain run did not get going")


def _backlog(aws, tmp_path):
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    # Short visibility, so that what the killed run held comes back quickly.
    aws.client("sqs").set_queue_attributes(QueueUrl=aws.env[TQ], Attributes={"VisibilityTimeout": "4"})
    jobs = fs.start_jobs(aws, N)
    fs.send(aws, [fs.termination_body(j, "success") for j in jobs])
    return jobs


def _assert_all_done(aws, jobs):
    state = fs.jobs_state(aws)
    assert all(state[j["job_id"]]["status"] == "completed" for j in jobs)
    assert all(fs.round_done(aws, state[j["job_id"]]) for j in jobs)
    assert fs.runner_parameters(aws) == set()
    assert fs.depth(aws, TQ) == 0 and fs.depth(aws, DLQ) == 0


def _settled_state(aws) -> dict:
    """The jobs once the moto server has finished the killed client's last request (a transaction
    keeps being applied, item by item, after its caller died; a scan meanwhile sees part of it)."""
    state = fs.jobs_state(aws)
    while True:
        time.sleep(0.5)
        again = fs.jobs_state(aws)
        if again == state:
            return state
        state = again


def test_a_drain_run_killed_with_sigkill_leaves_nothing_half_applied(aws, tmp_path):
    jobs = _backlog(aws, tmp_path)
    proc, log = _start_drain_run(aws, tmp_path)
    try:
        _wait_until_completed(aws, proc, 30)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        log.close()
    state = _settled_state(aws)
    params = fs.runner_parameters(aws)
    applied = [j for j in jobs if state[j["job_id"]]["status"] == "completed"]
    assert 30 <= len(applied) < N
    for job in jobs:
        item = state[job["job_id"]]
        if item["status"] == "running":  # untouched
            assert "termination_round" not in item and "completed_at" not in item
        elif fs.round_done(aws, item):  # finished: its clean-up is done too
            assert f"/runs-fleet/runners/{job['instance_id']}/config" not in params
    time.sleep(4.5)  # the killed run's messages become visible again
    second = fs.drain(aws)
    assert second.counts["failed"] == 0 and second.counts["dead_lettered"] == 0
    _assert_all_done(aws, jobs)
    assert second.counts["taken_over"] == len(applied) - sum(fs.round_done(aws, state[j["job_id"]]) for j in applied)
    # Metrics: every job counted; at most the round killed between PutMetricData and its marker twice.
    assert N <= fs.metric_sum(aws, "JobSuccess") <= N + 10


def test_sigterm_stops_the_drain_run_gracefully_and_nothing_is_applied_twice(aws, tmp_path):
    jobs = _backlog(aws, tmp_path)
    proc, log = _start_drain_run(aws, tmp_path)
    try:
        _wait_until_completed(aws, proc, 30)
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=120)
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
    assert any(" drain: " in m and "stopped_by=interrupted" in m for m in messages)
    state = fs.jobs_state(aws)
    finished = [state[j["job_id"]] for j in jobs if state[j["job_id"]]["status"] == "completed"]
    assert all(fs.round_done(aws, item) for item in finished)  # the round in flight finished
    done = sum(1 for j in jobs if state[j["job_id"]]["status"] == "completed")
    assert 30 <= done < N
    time.sleep(4.5)
    second = fs.drain(aws)
    assert second.counts["applied"] == N - done
    _assert_all_done(aws, jobs)
    assert fs.metric_sum(aws, "JobSuccess") == N  # nothing applied twice
