"""A drain run launched and terminated the way the Dagster UI does it, stopped gracefully.

The run is launched through ``instance.launch_run`` with the default run launcher, so it executes
in a run worker subprocess spawned by a real code server (``dagster api grpc``), and it is
terminated with the GraphQL ``terminateRun`` mutation (what the UI's "Terminate" button sends):
run coordinator ``cancel_run`` -> ``DefaultRunLauncher.terminate`` -> gRPC ``CancelExecution`` on
the code server -> the run worker's termination thread interrupts it (SIGINT) -> the op, which the
in-process executor runs in the run worker itself, gets ``DagsterExecutionInterruptedError``.

The graceful stop on the UI path: the drain stops receiving, finishes the messages in flight and
ends as interrupted; the rest reappear after their visibility timeout and a second drain applies
exactly them, so nothing is lost and nothing is applied twice.

The code server starts first and the test builds the backlog while it comes up (start-up is most
of the time). The run reaches moto through a proxy that holds it at its first receive after
``STOP_AFTER`` jobs are done (``fs.ReceiveHold``), until the terminate has been requested: however
fast the drain, it cannot finish the backlog before the terminate arrives.
"""

import os
import signal
import subprocess
import sys
import time

import dagster as dg
import pytest
from dagster._core.test_utils import poll_for_finished_run
from dagster._core.workspace.context import WorkspaceProcessContext
from dagster._core.workspace.load_target import GrpcServerTarget
from dagster._grpc.client import DagsterGrpcClient
from dagster._utils import find_free_port
from dagster_graphql.client.client_queries import TERMINATE_RUN_JOB_MUTATION
from dagster_graphql.test.utils import execute_dagster_graphql

from pipelines.common.summary import run_counters
from pipelines.definitions import ROOT_DIR, defs
from tests import fleet_support as fs
from tests.conftest import PATIENCE

pytestmark = pytest.mark.cli  # a code server and a run worker in subprocesses

TQ, DLQ = "RUNS_FLEET_TERMINATION_QUEUE_URL", "RUNS_FLEET_TERMINATION_DLQ_URL"
N = 100
# Jobs done when the run is held: three rounds of 10, which a flush has acknowledged (deleted) before the
# fourth receive, so nothing the run received waits undeleted while it is held.
STOP_AFTER = 30
# Short, so that what the terminated run held comes back within seconds; long beside a round and its flush
# on a loaded machine, as in test_fleet_crash.py (a message seen again after it was applied is no longer
# one the second drain applies).
VISIBILITY_SECONDS = 10
LOCATION = "groundskeeper"
JOB = "process_termination_queue"
RUN_CONFIG = {"concurrency": 1, "max_messages": 0, "max_seconds": 300, "wait_seconds": 0}


def _start_code_server(aws, tmp_path, endpoint: str) -> tuple[subprocess.Popen, int]:
    """``dagster api grpc`` for the code location, in its own process group (with the run worker it
    spawns), so that one ``killpg`` cleans up all of them; its AWS is at ``endpoint``. Returns at
    once; see ``_wait_for``."""
    port = find_free_port()
    log = open(tmp_path / "code_server.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "dagster", "api", "grpc", "-m", "pipelines.definitions"]
        + ["-d", str(ROOT_DIR), "-h", "127.0.0.1", "-p", str(port), "--location-name", LOCATION],
        cwd=ROOT_DIR,
        env={**aws.subprocess_env(), "DAGSTER_HOME": str(tmp_path), "AWS_ENDPOINT_URL": endpoint},
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()  # the child has its own copy
    return proc, port


def _wait_for(proc: subprocess.Popen, port: int, tmp_path) -> None:
    client = DagsterGrpcClient(host="127.0.0.1", port=port)
    deadline = time.monotonic() + PATIENCE
    while True:
        try:
            client.ping("")
            return
        except Exception:
            if proc.poll() is not None or time.monotonic() > deadline:
                _stop_process_group(proc)
                raise AssertionError(
                    "the code server did not come up:\n" + (tmp_path / "code_server.log").read_text()[-3000:]
                ) from None
            time.sleep(0.2)


def _stop_process_group(proc: subprocess.Popen) -> None:
    """SIGKILL the code server's process group: the server and the run worker."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=PATIENCE)


def test_terminate_from_the_ui_stops_the_drain_run_gracefully(aws, tmp_path):
    started = time.monotonic()
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")  # default run launcher
    aws.client("sqs").set_queue_attributes(
        QueueUrl=aws.env[TQ], Attributes={"VisibilityTimeout": str(VISIBILITY_SECONDS)}
    )
    instance = dg.DagsterInstance.from_config(str(tmp_path))
    with fs.ReceiveHold(aws.endpoint, until=lambda: fs.jobs_done(aws) >= STOP_AFTER) as hold:
        server, port = _start_code_server(aws, tmp_path, hold.endpoint)
        try:
            jobs = fs.start_jobs(aws, N)
            fs.send(aws, [fs.termination_body(j, "success") for j in jobs])
            _wait_for(server, port, tmp_path)
            with WorkspaceProcessContext(
                instance, GrpcServerTarget(host="127.0.0.1", port=port, socket=None, location_name=LOCATION)
            ) as process_context:
                request_context = process_context.create_request_context()
                location = request_context.get_code_location(LOCATION)
                (repository,) = location.get_repositories().values()
                remote_job = repository.get_full_job(JOB)
                run = instance.create_run_for_job(
                    job_def=defs.get_job_def(JOB),
                    run_config=RUN_CONFIG,
                    remote_job_origin=remote_job.get_remote_origin(),
                    job_code_origin=remote_job.get_python_origin(),
                )
                instance.launch_run(run.run_id, request_context)
                hold.wait_held(lambda: not instance.get_run_by_id(run.run_id).is_finished)

                # The UI's "Terminate": the terminateRun mutation, run coordinator -> run launcher.
                result = execute_dagster_graphql(request_context, TERMINATE_RUN_JOB_MUTATION, {"runId": run.run_id})
                hold.release()
                assert result.data["terminateRun"]["__typename"] == "TerminateRunSuccess", result.data
                finished = poll_for_finished_run(instance, run.run_id, timeout=PATIENCE)
                messages = [e.message for e in instance.all_logs(run.run_id)]
                step_errors = [
                    e.dagster_event.step_failure_data.error.cls_name
                    for e in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_FAILURE)
                ]
                retries = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_UP_FOR_RETRY)
                counted = run_counters(instance.get_run_by_id(run.run_id).tags)
        finally:
            _stop_process_group(server)
            instance.dispose()
    print(f"run status after terminate: {finished.status.value}; {time.monotonic() - started:.1f}s to here")

    assert finished.status in (dg.DagsterRunStatus.CANCELED, dg.DagsterRunStatus.FAILURE), finished.status
    # The op saw the interrupt (and re-raised it after the round in flight), or, when a round boundary
    # fell between the run turning CANCELING and the interrupt's arrival, saw the status first: either
    # way its step fails with one line, and its retry policy does not start it again.
    assert step_errors == ["Failure"], step_errors
    assert not retries
    assert any("finishing the messages in flight" in m for m in messages), messages[-20:]
    stops = ("stopped_by=interrupted", "stopped_by=terminated")
    assert any(" drain: " in m and any(stop in m for stop in stops) for m in messages), messages[-20:]
    state = fs.jobs_state(aws)
    done = sum(1 for j in jobs if state[j["job_id"]]["status"] == "completed")
    assert STOP_AFTER <= done < N, done
    assert counted.get("applied") == done  # the run's counts tag holds what it applied, however it stopped

    fs.wait_until_visible(aws, TQ)  # what the interrupted run received but did not acknowledge
    second = fs.drain(aws)
    assert second.counts["applied"] == N - done
    state = fs.jobs_state(aws)
    assert all(state[j["job_id"]]["status"] == "completed" for j in jobs), "a job is not completed"
    assert fs.runner_parameters(aws) == set()
    assert fs.depth(aws, TQ) == 0
    assert fs.depth(aws, DLQ) == 0
    assert fs.metric_sum(aws, "JobSuccess") == N  # nothing applied twice, nothing lost
