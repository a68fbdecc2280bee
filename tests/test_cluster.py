"""The ``cluster`` profile on this machine: two real Celery workers, RabbitMQ and PostgreSQL.

One module-scoped cluster serves every test: a RabbitMQ vhost and a PostgreSQL database of its own
(created here, removed at the end), its own moto server with the template deployed, the instance
file ``infra/dagster.cluster.yaml`` (with the per-queue limit raised to 3, for three drains of
one queue at once), ``dagster instance migrate``, then two workers
``w1`` and ``w2`` (``dagster-celery worker start``, one process each), the code location's gRPC
server (``dagster code-server start``) and ``dagster-daemon`` on a workspace that points at it. Runs
are submitted to the run queue (``infra.cluster.launch_runs``) and launched by the daemon. Each worker
reaches moto through a proxy of its own (``fs.ReceiveHold``), so that a test can hold a step at the
point under test (``Cluster.hold``) while it kills, terminates or cuts something, whatever the
machine's speed.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import boto3
import dagster as dg
import psycopg2
import pytest

from infra import cluster as cl
from infra.deploy import deploy, free_port
from pipelines.common.summary import run_counters
from resources.cluster import broker_lost_message, storage_lost_message
from tests import fleet_support as fs
from tests.batching_helpers import pending_ids, put_receiver, put_records
from tests.conftest import ATOMIC_DYNAMODB_SERVER, PATIENCE, LocalAWS, moto_server

pytestmark = pytest.mark.cluster
# The tests of the one cluster share one xdist worker (make test: --dist loadgroup), never two
# clusters at once; the module's other tests start no cluster and run anywhere.
ONE_CLUSTER = pytest.mark.xdist_group("cluster")

PG = {"host": "127.0.0.1", "port": 5432, "user": "postgres"}
BACKFILL_LIMIT = 2
RUN_TIMEOUT = 1200  # generous: a loaded 2-core machine (one run here took 16 min in all); a hung run fails the test
FINISHED = {dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED}


def _rabbitmqctl(*args: str) -> None:
    subprocess.run(["rabbitmqctl", *args], check=True, capture_output=True, timeout=PATIENCE)


@dataclass
class Cluster:
    env: dict[str, str]
    home: Path
    logs: Path
    config_path: Path
    aws: LocalAWS
    instance: dg.DagsterInstance
    vhost: str
    db_name: str
    workers: dict[str, subprocess.Popen] = field(default_factory=dict)
    proxies: dict[str, fs.ReceiveHold] = field(default_factory=dict)  # each worker's way to moto
    daemon: subprocess.Popen | None = None
    code_server: subprocess.Popen | None = None
    workspace: Path = cl.ROOT / "workspace.yaml"

    def ensure_daemon(self) -> None:
        if self.daemon is None or self.daemon.poll() is not None:
            self.daemon = cl.start_daemon(self.env, self.logs / "daemon.log", self.workspace)

    def start_worker(self, name: str) -> None:
        log = self.logs / f"{name}.log"
        log.write_text("")  # a restarted worker's "ready" line must be a new one
        env = {**self.env, "AWS_ENDPOINT_URL": self.proxies[name].endpoint}
        self.workers[name] = cl.start_worker(name, env, self.config_path, log)

    def ensure_workers(self) -> None:
        """Both workers up (a test that killed one gets it back)."""
        for name in cl.WORKERS:
            proc = self.workers.get(name)
            if proc is None or proc.poll() is not None:
                self.start_worker(name)
        for name in cl.WORKERS:
            cl.wait_worker_ready(self.workers[name], name, self.logs / f"{name}.log")

    def hold(self, until: Callable[[fs.ReceiveHold], bool], **what: str) -> None:
        """Hold the next step, on whichever worker, that sends ``what`` (``fs.ReceiveHold.hold``) once
        ``until(its worker's proxy)`` is true, until :meth:`release`."""
        for proxy in self.proxies.values():
            proxy.hold(lambda proxy=proxy: until(proxy), **what)

    def wait_held(self, run_id: str) -> str:
        """Until a step of the run is held (the run still going): the name of the worker it runs on."""
        deadline = time.monotonic() + PATIENCE
        while not (held := [name for name, proxy in self.proxies.items() if proxy.held]):
            assert not self.instance.get_run_by_id(run_id).is_finished, self.failure(run_id)
            assert time.monotonic() < deadline, f"no step of {run_id} was held (logs in {self.logs})"
            time.sleep(0.05)
        return held[0]

    def release(self) -> None:
        for proxy in self.proxies.values():
            proxy.release()

    def launch(self, job: str, run_config: dict | None = None, tags: dict | None = None, count: int = 1) -> list[str]:
        """Submit runs to the queue from a subprocess with the cluster's environment (the daemon
        that launches them started first, if a test stopped it)."""
        self.ensure_daemon()
        args = [sys.executable, "-m", "infra.cluster", "launch", "--job", job, "--count", str(count)]
        if run_config is not None:
            path = self.home / f"config-{uuid.uuid4().hex[:8]}.json"
            path.write_text(json.dumps(run_config))
            args += ["--config", str(path)]
        args += ["--tags", json.dumps(tags or {})]
        done = subprocess.run(args, env=self.env, cwd=cl.ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT)
        assert done.returncode == 0, done.stderr[-3000:]
        return [line.split()[-1] for line in done.stdout.splitlines() if line.startswith("queued run ")]

    def wait(self, run_ids: list[str], timeout: float = RUN_TIMEOUT) -> list:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            records = [self.instance.get_run_record_by_id(r) for r in run_ids]
            if all(r is not None and r.dagster_run.status in FINISHED for r in records):
                return records
            time.sleep(0.5)
        raise AssertionError(f"runs not finished after {timeout}s: {run_ids} (logs in {self.logs})")

    def failure(self, run_id: str) -> str:
        lines = [
            e.dagster_event.message or ""
            for e in self.instance.all_logs(run_id)
            if e.dagster_event is not None and e.dagster_event.is_failure
        ]
        return "\n".join(lines)[-3000:]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("cluster")
    tag = uuid.uuid4().hex[:10]
    vhost, db_name = f"groundskeeper-test-{tag}", f"groundskeeper_cluster_{tag}"
    _rabbitmqctl("add_vhost", vhost)
    _rabbitmqctl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
    admin = psycopg2.connect(dbname="postgres", **PG)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute(f'CREATE DATABASE "{db_name}"')
    logs = root / "logs"
    logs.mkdir()
    state = None
    mp = pytest.MonkeyPatch()
    servers = contextlib.ExitStack()
    try:
        # DynamoDB writes isolated as DynamoDB's are: three drains of one queue write at once
        endpoint = servers.enter_context(moto_server(logs / "moto.log", ATOMIC_DYNAMODB_SERVER))
        proxies = {name: servers.enter_context(fs.ReceiveHold(endpoint)) for name in cl.WORKERS}
        stack = deploy(boto3.client("cloudformation", endpoint_url=endpoint, region_name="us-east-1"))
        aws = LocalAWS(endpoint=endpoint, env={"AWS_ENDPOINT_URL": endpoint, **stack})
        home = root / "home"
        # three drains per queue; a backfill keeps to 2 runs at once (the profile says 4): the limit test
        # then needs only a few short runs
        cl.write_instance(home, {"groundskeeper/queue": 3, "dagster/backfill": BACKFILL_LIMIT})
        broker = f"pyamqp://guest:guest@127.0.0.1:5672/{vhost}"
        pg_url = f"postgresql+psycopg2://postgres@127.0.0.1:5432/{db_name}"
        env = {**os.environ, **aws.env, **cl.cluster_env(home=home, pg_url=pg_url, broker=broker)}
        cl.migrate(env)  # before any worker or the daemon opens the empty database
        for key in ("DAGSTER_PG_URL", "DAGSTER_HOME"):
            mp.setenv(key, env[key])
        state = Cluster(
            env=env,
            home=home,
            logs=logs,
            config_path=cl.write_worker_config(home / "celery.yaml", broker),
            aws=aws,
            instance=dg.DagsterInstance.from_config(str(home)),
            vhost=vhost,
            db_name=db_name,
            proxies=proxies,
        )
        for name in cl.WORKERS:
            state.start_worker(name)
        # as make cluster does: the code location in a gRPC server of its own, which the daemon reaches
        code_port = free_port()
        state.code_server = cl.start_code_server(env, code_port, logs / "code_server.log")
        cl.wait_code_server(state.code_server, code_port, logs / "code_server.log", timeout=PATIENCE)
        state.workspace = cl.write_workspace(home / cl.WORKSPACE_FILE, code_port)  # launches read it too
        state.ensure_daemon()
        state.ensure_workers()
        yield state
    finally:
        if state is not None:
            for proc in state.workers.values():
                cl.stop(proc)
            for proc in (state.daemon, state.code_server):
                if proc is not None:
                    cl.stop(proc)
            state.instance.dispose()
        servers.close()
        mp.undo()
        with admin.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')
        admin.close()
        _rabbitmqctl("delete_vhost", vhost)


def _state(ddb, table: str) -> dict[str, tuple]:
    from pipelines.common import from_item

    out, kwargs = {}, {"TableName": table, "ConsistentRead": True}
    while True:
        page = ddb.scan(**kwargs)
        for raw in page["Items"]:
            item = from_item(raw)
            events = json.loads(item.get("diagnosticEvents") or "[]")
            out[item["id"]] = (
                item["processingState"],
                item.get("processingStateMessage"),
                int(item.get("attemptsCompleted", 0)),
                tuple(e["message"] for e in events),
            )
        if "LastEvaluatedKey" not in page:
            return out
        kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]


def _most_at_once(records) -> int:
    """The most runs in progress at one moment, from their start and end times."""
    points = sorted([(r.start_time, 1) for r in records] + [(r.end_time, -1) for r in records])
    running, most = 0, 0
    for _, delta in points:
        running += delta
        most = max(most, running)
    return most


def _counts(instance: dg.DagsterInstance, run_id: str) -> dict[str, int]:
    return run_counters(instance.get_run_by_id(run_id).tags)


@ONE_CLUSTER
def test_reclaim_with_4_segments_runs_on_both_workers_and_equals_a_single_machine_run(cluster, monkeypatch):
    cluster.ensure_workers()
    ddb = cluster.aws.client("dynamodb")
    now = int(time.time() * 1000)
    stale = cl.seed_scan_table(ddb, "cluster-reclaim", 200, now_ms=now)
    cl.seed_scan_table(ddb, "single-reclaim", 200, now_ms=now)

    (run_id,) = cluster.launch("reclaim_agendas", cl.reclaim_config("cluster-reclaim", 4))
    (record,) = cluster.wait([run_id])
    assert record.dagster_run.status == dg.DagsterRunStatus.SUCCESS, cluster.failure(run_id)
    workers = cl.step_workers(cluster.instance, run_id)
    segments = {k: v for k, v in workers.items() if k.startswith("reclaim_segment")}
    assert len(segments) == 4, workers
    assert {w.split("@")[0] for w in workers.values()} == {"w1", "w2"}, workers

    # The same data on one machine: the local deployment, in process.
    for key, value in cluster.aws.env.items():
        monkeypatch.setenv(key, value)
    from pipelines.definitions import build_definitions

    job = build_definitions("local").resolve_job_def("reclaim_agendas")
    with dg.instance_for_test() as instance:
        single = job.execute_in_process(run_config=cl.reclaim_config("single-reclaim", 4), instance=instance)
        single_counts = _counts(instance, single.run_id)
    assert _counts(cluster.instance, run_id) == single_counts
    assert single_counts["reclaimed"] == len(stale) == 100
    assert _state(ddb, "cluster-reclaim") == _state(ddb, "single-reclaim")


@ONE_CLUSTER
def test_three_drains_on_one_queue_apply_every_message_exactly_once(cluster):
    cluster.ensure_workers()
    aws = cluster.aws
    jobs = fs.start_jobs(aws, 120)
    fs.send(aws, [fs.termination_body(job) for job in jobs])

    run_ids = cluster.launch("process_termination_queue", {"wait_seconds": 0, "concurrency": 1}, count=3)
    records = cluster.wait(run_ids)
    for record in records:
        assert record.dagster_run.status == dg.DagsterRunStatus.SUCCESS, cluster.failure(record.dagster_run.run_id)
    # never more than the queue's limit (3) at once; whether two did overlap depends on the machine's
    # speed (one drain may empty the queue before the coordinator launches the next), not on the code
    assert _most_at_once(records) <= 3
    # the termination_queue_sensor may have started a drain of its own meanwhile: count them all
    drains = cluster.instance.get_runs(dg.RunsFilter(job_name="process_termination_queue"))
    cluster.wait([r.run_id for r in drains])
    applied = sum(_counts(cluster.instance, r.run_id).get("applied", 0) for r in drains)
    assert applied == len(jobs)
    states = fs.jobs_state(aws)
    assert {states[j["job_id"]]["status"] for j in jobs} == {"completed"}
    assert fs.metric_sum(aws, "JobSuccess") == len(jobs)
    assert fs.depth(aws, "RUNS_FLEET_TERMINATION_QUEUE_URL") == 0
    # each drain's step ran on a Celery worker (which one is the broker's choice: one worker may take
    # all three when each drain ends quickly; the reclaim test shows steps spread over both)
    for run_id in run_ids:
        workers = {w.split("@")[0] for w in cl.step_workers(cluster.instance, run_id).values()}
        assert workers, workers
        assert workers <= {"w1", "w2"}, workers


@ONE_CLUSTER
def test_a_batching_backfill_of_more_partitions_than_its_limit_keeps_to_the_limit(cluster):
    cluster.ensure_workers()
    aws = cluster.aws
    receivers = ["cluster-r1", "cluster-r2"]
    days = [dt.date(2026, 11, 1) + dt.timedelta(days=n) for n in range(2)]  # 4 partitions, twice the limit
    for name in receivers:
        put_receiver(aws, name, number_per_day=1, initial_time="23:00")
        put_records(aws, name, [dt.datetime(d.year, d.month, d.day, 10, tzinfo=dt.UTC) for d in days for _ in range(3)])
    cluster.instance.add_dynamic_partitions("receivers", receivers)
    partitions = [f"{d.isoformat()}|{r}" for r in receivers for d in days]

    done = subprocess.run(
        [
            str(cl.BIN / "dagster"),
            "job",
            "backfill",
            "-w",
            str(cluster.workspace),  # the code server's: the backfill loads no code of its own
            "-j",
            "receiver_batches_job",
            "--partitions",
            ",".join(partitions),
            "--noprompt",
        ],
        env=cluster.env,
        cwd=cl.ROOT,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    backfills = cluster.instance.get_backfills()
    backfill_id = backfills[0].backfill_id
    runs = cluster.instance.get_runs(dg.RunsFilter(tags={"dagster/backfill": backfill_id}))
    assert len(runs) == len(partitions)
    records = cluster.wait([r.run_id for r in runs])
    for record in records:
        assert record.dagster_run.status == dg.DagsterRunStatus.SUCCESS, cluster.failure(record.dagster_run.run_id)
    # never more than the backfill's limit at once; how many did run at once depends on how fast the
    # machine is, which a test does not assert
    assert _most_at_once(records) <= BACKFILL_LIMIT
    for name in receivers:
        assert pending_ids(aws, name) == set()
    # every step ran on a Celery worker (which one is the broker's choice; the reclaim test shows both used)
    workers = {w.split("@")[0] for r in runs for w in cl.step_workers(cluster.instance, r.run_id).values()}
    assert workers, workers
    assert workers <= {"w1", "w2"}, workers


SCAN, UPDATE = "DynamoDB_20120810.Scan", "DynamoDB_20120810.UpdateItem"


@ONE_CLUSTER
def test_a_worker_killed_mid_run_leaves_the_step_to_the_other_and_a_rerun_changes_nothing(cluster):
    cluster.ensure_workers()
    ddb = cluster.aws.client("dynamodb")
    stale = cl.seed_scan_table(ddb, "killed-reclaim", 300)
    # small pages: a segment writes what it found on a page before it scans the next. Whichever worker
    # has written some (the first reclaimed agendas) is held at its next scan, and killed there.
    config = cl.reclaim_config("killed-reclaim", 2, objectScanLimit=10, targetBatchSize=5)
    cluster.hold(lambda proxy: proxy.seen[UPDATE] > 0, target=SCAN, naming="killed-reclaim")
    (run_id,) = cluster.launch("reclaim_agendas", config)
    try:
        killed = cluster.wait_held(run_id)
        (step,) = [
            k
            for k, w in cl.step_workers(cluster.instance, run_id).items()
            if k.startswith("reclaim_segment")
            and w.startswith(f"{killed}@")
            and not _step_ended(cluster.instance, run_id, k)
        ]
        cl.stop(cluster.workers[killed], sig=signal.SIGKILL)
    finally:
        cluster.release()

    (record,) = cluster.wait([run_id])
    assert record.dagster_run.status == dg.DagsterRunStatus.SUCCESS, cluster.failure(run_id)
    (other,) = set(cl.WORKERS) - {killed}
    assert cl.step_workers(cluster.instance, run_id)[step].startswith(f"{other}@")  # taken over
    after = _state(ddb, "killed-reclaim")
    assert {after[i] for i in stale} == {("COMPLETE", "failed", 1, ("AgendaProgress timed out.",))}
    assert sum(1 for v in after.values() if v[0] == "EXECUTING") == 300 - len(stale)

    cluster.ensure_workers()
    (again,) = cluster.launch("reclaim_agendas", config)
    (record,) = cluster.wait([again])
    assert record.dagster_run.status == dg.DagsterRunStatus.SUCCESS, cluster.failure(again)
    assert _counts(cluster.instance, again)["reclaimed"] == 0
    assert _state(ddb, "killed-reclaim") == after


# ------------------------------------------------------------------ losses and termination

TQ, DLQ = "RUNS_FLEET_TERMINATION_QUEUE_URL", "RUNS_FLEET_TERMINATION_DLQ_URL"


def _consumers(vhost: str, queue: str = "dagster") -> int:
    """Consumers of ``queue`` on the test's own vhost (the workers that take steps)."""
    done = subprocess.run(
        ["rabbitmqctl", "list_consumers", "-q", "--no-table-headers", "-p", vhost],
        capture_output=True,
        text=True,
        timeout=PATIENCE,
    )
    return sum(1 for line in done.stdout.splitlines() if line.split("\t")[0] == queue) if done.returncode == 0 else 0


def _restore_broker(cluster: Cluster) -> None:
    """The test's vhost back, and both workers consuming from it again (a worker reconnects by itself;
    one that gave up is started again)."""
    _rabbitmqctl("add_vhost", cluster.vhost)
    _rabbitmqctl("set_permissions", "-p", cluster.vhost, "guest", ".*", ".*", ".*")
    deadline = time.monotonic() + PATIENCE
    while _consumers(cluster.vhost) < len(cl.WORKERS):
        if any(proc.poll() is not None for proc in cluster.workers.values()):
            cluster.ensure_workers()
        assert time.monotonic() < deadline, f"the workers did not come back to {cluster.vhost} (logs in {cluster.logs})"
        time.sleep(1)


def _run_failure(instance: dg.DagsterInstance, run_id: str) -> dg.DagsterEvent:
    (event,) = instance.all_logs(run_id, of_type=dg.DagsterEventType.RUN_FAILURE)
    return event.dagster_event


def _assert_one_line(failure: dg.DagsterEvent, starts: str) -> None:
    """The run failure is the line alone: no error (stack trace, cause) under it, no credentials."""
    message = failure.message or ""
    data = failure.event_specific_data
    error = getattr(data, "error", None)
    assert message.startswith(starts), (message, error and error.to_string())
    assert "\n" not in message.strip(), message
    assert error is None, error.to_string()
    assert "guest" not in message, message
    assert "postgres@" not in message, message


def _step_on_worker(cluster: Cluster, run_id: str, prefix: str = "") -> tuple[str, str]:
    """Wait until a step of the run (its key starting with ``prefix``) has started on a worker."""
    deadline = time.monotonic() + RUN_TIMEOUT
    while time.monotonic() < deadline:
        started = {k: w for k, w in cl.step_workers(cluster.instance, run_id).items() if k.startswith(prefix)}
        if started:
            return next(iter(started.items()))
        run = cluster.instance.get_run_by_id(run_id)
        assert run is not None, cluster.failure(run_id)
        assert not run.is_finished, cluster.failure(run_id)
        time.sleep(0.2)
    raise AssertionError(f"no step of {run_id} started on a worker (logs in {cluster.logs})")


def _step_ended(instance: dg.DagsterInstance, run_id: str, step: str) -> bool:
    ends = (dg.DagsterEventType.STEP_SUCCESS, dg.DagsterEventType.STEP_FAILURE)
    return any(e.step_key == step for kind in ends for e in instance.all_logs(run_id, of_type=kind))


def _completed(aws, job_ids: set[str]) -> int:
    state = fs.jobs_state(aws)
    return sum(1 for j in job_ids if state[j]["status"] == "completed")


def _drain_with_backlog(cluster: Cluster, n: int, held_after: int) -> tuple[str, list[dict]]:
    """A drain run queued first, then ``n`` termination messages: the run holds the queue's consumer
    slot from the start, so the termination_queue_sensor launches no drain of its own beside it. The
    run is held at its first receive once it has completed ``held_after`` of these jobs (the rounds
    before flushed: nothing it received waits undeleted), until ``cluster.release()``."""
    config = {"wait_seconds": 20, "concurrency": 1, "max_messages": n, "max_seconds": 1200}
    (run_id,) = cluster.launch("process_termination_queue", config)
    jobs = fs.start_jobs(cluster.aws, n)
    mine = {j["job_id"] for j in jobs}
    cluster.hold(lambda _: _completed(cluster.aws, mine) >= held_after, naming=cluster.aws.env[TQ])
    fs.send(cluster.aws, [fs.termination_body(job) for job in jobs])
    return run_id, jobs


@ONE_CLUSTER
def test_terminating_a_drain_on_a_celery_worker_stops_it_at_a_round_boundary_and_loses_nothing(cluster):
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import EmptyWorkspaceTarget
    from dagster_graphql.client.client_queries import TERMINATE_RUN_JOB_MUTATION
    from dagster_graphql.test.utils import execute_dagster_graphql

    cluster.ensure_workers()
    cluster.ensure_daemon()
    aws, n, stop_after = cluster.aws, 150, 30
    successes, dead_letters = fs.metric_sum(aws, "JobSuccess"), fs.depth(aws, DLQ)
    run_id, jobs = _drain_with_backlog(cluster, n, held_after=stop_after)
    mine = {j["job_id"] for j in jobs}
    try:
        step, worker = _step_on_worker(cluster, run_id)
        cluster.wait_held(run_id)  # however fast the drain, it cannot finish before the terminate
        # The UI's "Terminate": the terminateRun mutation -> run coordinator -> run launcher.
        with WorkspaceProcessContext(cluster.instance, EmptyWorkspaceTarget()) as workspace:
            result = execute_dagster_graphql(
                workspace.create_request_context(), TERMINATE_RUN_JOB_MUTATION, {"runId": run_id}
            )
    finally:
        cluster.release()
    assert result.data["terminateRun"]["__typename"] == "TerminateRunSuccess", result.data
    (record,) = cluster.wait([run_id])
    # every message applied once or still in its queue: nothing in between, nothing lost
    applied = _completed(aws, mine)
    left = fs.depth(aws, TQ)

    assert record.dagster_run.status == dg.DagsterRunStatus.CANCELED, cluster.failure(run_id)
    assert worker.split("@")[0] in cl.WORKERS
    failures = cluster.instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_FAILURE)
    assert [e.step_key for e in failures] == [step]
    error = failures[0].dagster_event.step_failure_data.error
    assert "run terminated: the runs-fleet-termination-dev drain stopped at a round boundary" in error.message
    messages = [e.message for e in cluster.instance.all_logs(run_id)]
    assert any("the run is being terminated: no more receives" in m for m in messages), messages[-20:]
    assert any(" drain: " in m and "stopped_by=terminated" in m for m in messages), messages[-20:]
    assert stop_after <= applied < n, applied
    assert applied + left == n, (applied, left)

    rest = fs.drain(aws)  # a second drain takes exactly what the terminated one left
    assert rest.counts["applied"] == n - applied
    assert _completed(aws, mine) == n
    assert fs.depth(aws, TQ) == 0
    assert fs.depth(aws, DLQ) == dead_letters
    assert fs.metric_sum(aws, "JobSuccess") - successes == n  # nothing applied twice
    assert not {f"/runs-fleet/runners/{j['instance_id']}/config" for j in jobs} & fs.runner_parameters(aws)


@ONE_CLUSTER
def test_a_broker_lost_while_a_run_is_going_fails_it_with_one_line(cluster):
    cluster.ensure_workers()
    cluster.ensure_daemon()
    ddb = cluster.aws.client("dynamodb")
    cl.seed_scan_table(ddb, "broker-lost", 300)
    # small slow pages: the segment takes seconds, so the broker goes while it runs
    config = cl.reclaim_config("broker-lost", 1, objectScanLimit=10, targetBatchSize=5, scanDelayMillis=250)
    (run_id,) = cluster.launch("reclaim_agendas", config)
    step, _ = _step_on_worker(cluster, run_id, "reclaim_segment")
    try:
        _rabbitmqctl("delete_vhost", cluster.vhost)  # the test's own vhost: every connection to it closes
        (record,) = cluster.wait([run_id])
    finally:
        _restore_broker(cluster)

    assert record.dagster_run.status == dg.DagsterRunStatus.FAILURE
    failure = _run_failure(cluster.instance, run_id)
    print(f"run failure: {failure.message}")
    _assert_one_line(failure, f"the Celery broker pyamqp://127.0.0.1:5672/{cluster.vhost} was lost: ")
    # a step already on a worker still ends there (and records its end: the database is not the broker)
    deadline = time.monotonic() + RUN_TIMEOUT
    while not _step_ended(cluster.instance, run_id, step):
        assert time.monotonic() < deadline, f"{step} did not end on its worker (logs in {cluster.logs})"
        time.sleep(0.5)


@ONE_CLUSTER
def test_a_storage_database_lost_while_a_run_is_going_fails_it_with_one_line(cluster):
    """Last of the cluster's tests: losing the database disturbs the daemon too, so the daemon is
    stopped at the end, and a later launch starts it afresh (on the same code server)."""
    cluster.ensure_workers()
    cluster.ensure_daemon()
    aws, n = cluster.aws, 80
    sqs = aws.client("sqs")
    successes = fs.metric_sum(aws, "JobSuccess")
    # what the stopped drain received but could not acknowledge comes back within seconds, not 5 minutes
    sqs.set_queue_attributes(QueueUrl=aws.env[TQ], Attributes={"VisibilityTimeout": "10"})
    admin = psycopg2.connect(dbname="postgres", **PG)
    admin.autocommit = True
    try:
        run_id, jobs = _drain_with_backlog(cluster, n, held_after=30)
        mine = {j["job_id"] for j in jobs}
        try:
            step, worker = _step_on_worker(cluster, run_id)
            cluster.wait_held(run_id)  # however fast the drain, it cannot finish before the database goes
            log = cluster.logs / f"{worker.split('@')[0]}.log"
            seen = len(log.read_bytes())
            with admin.cursor() as cur:
                # the test's own database only: no new connection, and its open ones dropped
                cur.execute(f'ALTER DATABASE "{cluster.db_name}" WITH ALLOW_CONNECTIONS false')
                cur.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                    "AND pid <> pg_backend_pid()",
                    (cluster.db_name,),
                )
            cluster.release()
            # The drain stops at its next round boundary (its run's status unreadable), and its step
            # cannot record its end: the task fails on the worker.
            deadline = time.monotonic() + RUN_TIMEOUT
            while b"raised unexpected" not in log.read_bytes()[seen:]:
                assert time.monotonic() < deadline, f"the step's task did not fail (see {log})"
                time.sleep(0.5)
        finally:
            cluster.release()
            with admin.cursor() as cur:
                cur.execute(f'ALTER DATABASE "{cluster.db_name}" WITH ALLOW_CONNECTIONS true')

        (record,) = cluster.wait([run_id])
        assert record.dagster_run.status == dg.DagsterRunStatus.FAILURE
        failure = _run_failure(cluster.instance, run_id)
        print(f"run failure: {failure.message}")
        _assert_one_line(failure, f"the Dagster storage database 127.0.0.1:5432/{cluster.db_name} was lost: ")
        assert f"(step {step} on its Celery worker)" in failure.message

        # nothing lost: what the drain did not apply is still in the queue, and a second drain applies it
        fs.wait_until_visible(aws, TQ)
        fs.drain(aws)
        assert _completed(aws, mine) == n
        assert fs.depth(aws, TQ) == 0
        assert fs.metric_sum(aws, "JobSuccess") - successes <= n  # nothing applied twice
    finally:
        admin.close()
        sqs.set_queue_attributes(QueueUrl=aws.env[TQ], Attributes={"VisibilityTimeout": "300"})
        cl.stop(cluster.daemon)
        cluster.daemon = None


def test_launching_a_job_the_workspace_lacks_is_one_line(tmp_path):
    """``python -m infra.cluster launch`` goes through ``dagster job launch``: a refusal is its last
    line, and no run is queued."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text("run_coordinator:\n  module: dagster\n  class: QueuedRunCoordinator\n")
    env = {**os.environ, "DAGSTER_HOME": str(home), "PYTHONPATH": str(cl.ROOT)}
    args = [sys.executable, "-m", "infra.cluster", "launch", "--job", "no_such_job"]
    done = subprocess.run(args, env=env, cwd=cl.ROOT, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert done.returncode == 1
    assert done.stderr.startswith("launch: dagster job launch -j no_such_job failed")
    assert done.stderr.count("\n") == 1
    assert "no_such_job" in done.stderr
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert instance.get_runs() == []


def test_an_unreachable_broker_or_database_is_one_line_naming_what_to_check():
    closed = free_port()
    with pytest.raises(cl.ClusterError) as broker:
        cl.check_broker(f"pyamqp://guest:secret@127.0.0.1:{closed}//", timeout=2)
    assert str(broker.value).startswith(
        f"RabbitMQ unreachable at pyamqp://guest:***@127.0.0.1:{closed}// (check CELERY_BROKER_URL)"
    )
    assert "\n" not in str(broker.value)
    with pytest.raises(cl.ClusterError) as database:
        cl.check_postgres(f"postgresql://postgres:secret@127.0.0.1:{closed}/dagster", timeout=2)
    assert str(database.value).startswith("PostgreSQL unreachable at postgresql://postgres:***@127.0.0.1")
    assert "(check DAGSTER_PG_URL)" in str(database.value)
    assert "\n" not in str(database.value)


def test_a_worker_without_the_code_location_exits_at_start_with_one_line(tmp_path):
    # The venv's editable install makes the real code importable from anywhere on this machine, so
    # a module the worker cannot import stands in for a worker machine without the repository.
    config = cl.write_worker_config(tmp_path / "celery.yaml", f"pyamqp://guest:guest@127.0.0.1:{free_port()}//")
    env = {
        **os.environ,
        "DAGSTER_HOME": str(tmp_path),
        "PATH": cl.cluster_env(home=tmp_path, pg_url="", broker="")["PATH"],
    }
    log = tmp_path / "w9.log"
    proc = cl.start_worker("w9", env, config, log, cwd=tmp_path, module="pipelines_elsewhere.definitions")
    try:
        with pytest.raises(cl.ClusterError) as exc:
            cl.wait_worker_ready(proc, "w9", log)
    finally:
        cl.stop(proc)
    message = str(exc.value)
    assert "\n" not in message
    assert "No module named 'pipelines_elsewhere'" in message
    assert "check that the worker has the code location" in message


def test_a_lost_broker_or_database_line_masks_the_user_a_server_error_names():
    refused = ConnectionError("Queue.declare: (403) ACCESS_REFUSED - access to queue 'q' refused for user 'guest'")
    broker = broker_lost_message("pyamqp://guest:s3cret@127.0.0.1:5672/prod", refused)
    assert broker == (
        "the Celery broker pyamqp://127.0.0.1:5672/prod was lost: "
        "Queue.declare: (403) ACCESS_REFUSED - access to queue 'q' refused for user '***'"
    )
    reason = 'FATAL: password authentication failed for user "dagster" (password s3cret)'
    database = storage_lost_message("postgresql://dagster:s3cret@127.0.0.1:5432/dagster", reason)
    assert database == (
        "the Dagster storage database 127.0.0.1:5432/dagster was lost: "
        'FATAL: password authentication failed for user "***" (password ***)'
    )
