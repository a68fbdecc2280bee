"""The alerts sensor under a real ``dagster-daemon``: a run whose lineage failed while the daemon was
down alerts once when it starts, and a restart of the daemon repeats nothing."""

import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest

from infra.local import stop
from tests.conftest import PATIENCE
from tests.test_alerts_sensor import Inbox, run_demo

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

pytestmark = [pytest.mark.cli, pytest.mark.slow]


def _daemon(env: dict, log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(
            [str(BIN / "dagster-daemon"), "run", "-m", "tests.alerts_daemon_defs", "-d", str(ROOT)],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


def _alerts_ticks(instance: dg.DagsterInstance) -> list:
    states = [s for s in instance.all_instigator_state() if s.instigator_name == "alerts"]
    return [t for s in states for t in instance.get_ticks(s.instigator_origin_id, s.selector_id)]


def _wait_for(what: str, condition, log: Path):
    deadline = time.monotonic() + PATIENCE
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.1)  # polling a condition, not waiting for time to pass
    raise AssertionError(f"no {what} within {PATIENCE} s; daemon log:\n{log.read_text()[-5000:]}")


def test_a_real_daemon_alerts_once_and_a_restart_repeats_nothing(aws, tmp_path, monkeypatch):
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    env = {**aws.subprocess_env(), "DAGSTER_HOME": str(home), "PYTHONPATH": str(ROOT)}
    inbox = Inbox(aws)
    log = tmp_path / "daemon.log"
    with dg.DagsterInstance.get() as instance:
        run_demo(instance, 4, succeed_on=5, previous="an-earlier-attempt")  # fails while no daemon runs
        daemon = _daemon(env, log)
        try:
            (firing,) = _wait_for("alert", inbox.read, log)
            assert (firing["alert_key"], firing["state"], firing["attempts"]) == ("run_failure:retry_demo", "firing", 4)
        finally:
            stop(daemon)
        ticks_before = len(_alerts_ticks(instance))
        daemon = _daemon(env, log)
        try:
            _wait_for("tick after the restart", lambda: len(_alerts_ticks(instance)) > ticks_before, log)
        finally:
            stop(daemon)
        assert inbox.read() == []
        assert all(t.status.value != "FAILURE" for t in _alerts_ticks(instance))
