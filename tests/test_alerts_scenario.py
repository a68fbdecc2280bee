"""A real ``dagster-daemon`` runs the alerts sensor while its only sink, a webhook, is down, then
slow, then back, and runs fail and succeed: every state change arrives exactly once (by its
``message_id``), none is lost, and no heartbeat is published while nothing can be delivered."""

import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import dagster as dg
import pytest

from infra.local import stop
from pipelines.alerts.heartbeat import HEARTBEAT_METRIC
from tests.test_alerts_daemon import _alerts_ticks, _wait_for
from tests.test_alerts_sensor import run_demo

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.cli, pytest.mark.slow]


class Receiver:
    """A webhook receiver that is ``down`` (503), ``slow`` (answers 200 after ``delay`` s) or ``up``."""

    def __init__(self) -> None:
        self.mode, self.delay, self.received, self.requests = "down", 3.0, [], 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                receiver.requests += 1
                if receiver.mode == "down":
                    status = 503
                else:
                    if receiver.mode == "slow":
                        time.sleep(receiver.delay)  # a slow receiver is the condition under test
                    receiver.received.append(json.loads(body))
                    status = 200
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/services/T000/B000/secret"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def ids(self, key: str) -> list[str]:
        return [m["message_id"] for m in self.received if m["alert_key"] == key]


def _daemon(env: dict, log: Path):
    import subprocess
    import sys

    with open(log, "ab") as out:
        return subprocess.Popen(
            [str(Path(sys.executable).parent / "dagster-daemon"), "run", "-m", "tests.alerts_scenario_defs",
             "-d", str(ROOT)],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


def _reasons(instance) -> list[str]:
    return [t.skip_reason or "" for t in _alerts_ticks(instance)]


def _unbeaten(instance) -> int:
    return sum("no heartbeat: webhook cannot deliver" in r for r in _reasons(instance))


def _beats(aws) -> list:
    return aws.client("cloudwatch").list_metrics(MetricName=HEARTBEAT_METRIC)["Metrics"]


def test_down_then_slow_then_back_every_state_change_once_and_no_heartbeat_while_down(aws, tmp_path, monkeypatch):
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    receiver = Receiver()
    env = {**aws.subprocess_env(), "DAGSTER_HOME": str(home), "PYTHONPATH": str(ROOT),
           "ALERTS_WEBHOOK_URL": receiver.url, "DAGSTER_SENSOR_GRPC_TIMEOUT_SECONDS": "40"}  # fmt: skip
    key = "run_failure:retry_demo:ThrottlingException"  # its unit of work and its cause
    log = tmp_path / "daemon.log"
    with dg.DagsterInstance.get() as instance:
        # down: a lineage fails; ticks try the webhook, deliver nothing and do not beat
        run_demo(instance, 4, succeed_on=5, previous="lineage-1")  # before the first tick: it has work
        daemon = _daemon(env, log)
        try:
            _wait_for("3 ticks without a heartbeat", lambda: _unbeaten(instance) >= 3, log)
            assert receiver.received == []
            assert _beats(aws) == [], _reasons(instance)[:5]
            # slow: the firing goes; a success resolves it, slowly too
            receiver.mode = "slow"
            _wait_for("the firing", lambda: len(receiver.ids(key)) >= 1, log)
            run_demo(instance, 1, succeed_on=1)
            _wait_for("the resolved", lambda: len(receiver.ids(key)) >= 2, log)
            # back: another lineage fails and a success resolves it
            receiver.mode = "up"
            run_demo(instance, 4, succeed_on=5, previous="lineage-2")
            _wait_for("the second firing", lambda: len(receiver.ids(key)) >= 3, log)
            run_demo(instance, 1, succeed_on=1)
            _wait_for("the second resolved", lambda: len(receiver.ids(key)) >= 4, log)
            ticks = len(_alerts_ticks(instance))
            _wait_for("3 more ticks", lambda: len(_alerts_ticks(instance)) >= ticks + 3, log)
        finally:
            stop(daemon)
        reasons = _reasons(instance)
    states = [m["state"] for m in receiver.received if m["alert_key"] == key]
    assert states == ["firing", "resolved", "firing", "resolved"]
    counts = Counter(m["message_id"] for m in receiver.received)
    assert [mid for mid, n in counts.items() if n > 1] == []
    assert "no heartbeat" not in reasons[0]  # the last tick: delivered, so it beat
    assert _beats(aws) != []
    assert all("Traceback" not in r for r in reasons)
