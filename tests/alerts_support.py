"""The alerting tests' support: webhook receivers (``infra.alerts_receiver``, the one ``make dev``
runs, and :class:`Receiver`, whose answers a test decides), one evaluation of the sensor in a new
process, and a real ``dagster-daemon`` over a code location of the tests."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from infra.alerts_receiver import LocalAlertsReceiver
from tests.conftest import PATIENCE
from tests.fleet_support import client_gone

ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def webhook_receiver(path: str = "/services/T000/B000/secret-token") -> Iterator[LocalAlertsReceiver]:
    with LocalAlertsReceiver(path=path) as receiver:
        yield receiver


_TICK = """
import json, sys
import dagster as dg
from pipelines.alerts.defs import build_alerts_sensor
from resources import CloudWatchResource, SNSResource, SQSResource
from resources.settings import AlertSettings, fleet_settings_from_env
res = {"alerts": AlertSettings(**json.loads(sys.argv[2])), "fleet": fleet_settings_from_env(),
       "sns": SNSResource(region_name="us-east-1"), "sqs": SQSResource(region_name="us-east-1"),
       "cloudwatch": CloudWatchResource(region_name="us-east-1")}
with dg.instance_for_test(temp_dir=sys.argv[1]) as instance:
    with dg.build_sensor_context(instance=instance, resources=res) as context:
        print(build_alerts_sensor().evaluate_tick(context).skip_message)
"""


def tick_in_a_new_process(instance_dir: str, settings: dict, env: dict[str, str]) -> str:
    """One evaluation of the alerts sensor in a new Python process over the instance stored in
    ``instance_dir``, as a restarted daemon's; returns its skip reason."""
    done = subprocess.run(
        [sys.executable, "-c", _TICK, instance_dir, json.dumps(settings)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=PATIENCE,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


class Receiver:
    """A webhook receiver that is ``down`` (503), ``slow`` (answers 200 after ``delay`` s) or ``up``.
    After :meth:`hold`, the next request it receives is recorded and then held, unanswered, until
    the test sets ``release`` (``reached`` says it arrived; ``hung_up``, once released, whether its
    client had given up on it by then)."""

    def __init__(self, mode: str = "down") -> None:
        self.mode, self.delay, self.received, self.requests = mode, 3.0, [], 0
        self.reached, self.release = threading.Event(), threading.Event()
        self.release.set()  # nothing held until hold()
        self.holding = False
        self.hung_up: list[bool] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.requests += 1
                if receiver.mode == "down":
                    status = 503
                else:
                    receiver.received.append(json.loads(body))
                    if receiver.holding:
                        receiver.holding = False
                        receiver.reached.set()
                        receiver.release.wait(PATIENCE)  # held until the test says
                        receiver.hung_up.append(client_gone(self.connection))
                    if receiver.mode == "slow":
                        time.sleep(receiver.delay)  # a slow receiver is the condition under test
                    status = 200
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/services/T000/B000/secret"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def hold(self) -> None:
        """Hold the next request until ``release`` is set."""
        self.release.clear()
        self.holding = True

    def ids(self, key: str) -> list[str]:
        return [m["message_id"] for m in self.received if m["alert_key"] == key]


class HoldingEndpoint:
    """An HTTP endpoint (as an AWS service's ``endpoint_url``) that holds every request it receives,
    unanswered, until the test sets ``release``; then it answers 500. ``held``: how many it holds."""

    def __init__(self) -> None:
        self.release, self.held = threading.Event(), 0
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                endpoint.held += 1
                endpoint.release.wait(PATIENCE)
                endpoint.held -= 1
                self.send_response(500)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()


# ---------------------------------------------------------------------------- a real daemon


def dagster_home(aws, tmp_path: Path, monkeypatch, **env: str) -> dict[str, str]:
    """A fresh DAGSTER_HOME for this process and the daemon's; returns the daemon's environment
    (``env`` added)."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return {**aws.subprocess_env(), "DAGSTER_HOME": str(home), "PYTHONPATH": str(ROOT), **env}


def start_daemon(module: str, env: dict, log: Path) -> subprocess.Popen:
    """``dagster-daemon run`` over the code location ``module`` (stop it with ``infra.local.stop``)."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            [str(Path(sys.executable).parent / "dagster-daemon"), "run", "-m", module, "-d", str(ROOT)],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


def alerts_ticks(instance) -> list:
    """The ticks of the ``alerts`` sensor the instance holds, newest first."""
    states = [s for s in instance.all_instigator_state() if s.instigator_name == "alerts"]
    return [t for s in states for t in instance.get_ticks(s.instigator_origin_id, s.selector_id)]


def wait_for(what: str, condition, log: Path):
    """``condition()``'s first truthy value, polled; fails with the daemon's log after ``PATIENCE``."""
    deadline = time.monotonic() + PATIENCE
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.1)  # polling a condition, not waiting for time to pass
    raise AssertionError(f"no {what} within {PATIENCE} s; daemon log:\n{log.read_text()[-5000:]}")
