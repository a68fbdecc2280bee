"""The alerts sensor under a real ``dagster-daemon``: a run whose lineage failed while the daemon was
down alerts once when it starts, and a restart of the daemon repeats nothing."""

import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest

from infra.local import stop
from pipelines.alerts.defs import load_book
from tests import alerts_daemon_defs
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


def _home(aws, tmp_path, monkeypatch) -> dict:
    """A fresh DAGSTER_HOME for this process and the daemon's; returns the daemon's environment."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    return {**aws.subprocess_env(), "DAGSTER_HOME": str(home), "PYTHONPATH": str(ROOT)}


def test_a_real_daemon_alerts_once_and_a_restart_repeats_nothing(aws, tmp_path, monkeypatch):
    env = _home(aws, tmp_path, monkeypatch)
    inbox = Inbox(aws)
    log = tmp_path / "daemon.log"
    with dg.DagsterInstance.get() as instance:
        run_demo(instance, 4, succeed_on=5, previous="an-earlier-attempt")  # fails while no daemon runs
        daemon = _daemon(env, log)
        try:
            (firing,) = _wait_for("alert", inbox.read, log)
            assert (firing["alert_key"], firing["state"], firing["attempts"]) == (
                "run_failure:retry_demo:ThrottlingException",
                "firing",
                4,
            )
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


def _scan(instance, table: str, error: str = "") -> bool:
    config = {"ops": {"scan_table": {"config": {"tableName": table, "error": error}}}}
    return alerts_daemon_defs.reclaim_agendas.execute_in_process(
        run_config=config, instance=instance, raise_on_error=False
    ).success


def test_under_a_real_daemon_each_cause_is_its_own_incident_resolved_only_by_its_own_unit_of_work(
    aws, tmp_path, monkeypatch
):
    """A second cause of the same job is sent although the first is open; a success on other data
    resolves nothing; a success of the same job and table resolves that table's failure only; a
    failed partition of an asset job is resolved by a redrive of that partition (a run of Dagster's
    own asset job), and a success of another partition resolves nothing."""
    env = _home(aws, tmp_path, monkeypatch)
    inbox = Inbox(aws)
    log = tmp_path / "daemon.log"
    throttled = "run_failure:reclaim_agendas@Agendas:ThrottlingException"
    misspelt = "run_failure:reclaim_agendas@Agendsa:ResourceNotFoundException"
    partition = "run_failure:alerts_test/receiver_batches:acme:RuntimeError"

    def expect(*wanted: tuple[str, str]) -> None:
        got: list = []

        def arrived():
            got.extend((m["alert_key"], m["state"]) for m in inbox.read())
            return len(got) >= len(wanted)

        _wait_for(f"messages {wanted}", arrived, log)
        assert sorted(got) == sorted(wanted)

    with dg.DagsterInstance.get() as instance:
        daemon = _daemon(env, log)
        try:
            assert not _scan(instance, "Agendas", "ThrottlingException")
            expect((throttled, "firing"))
            assert not _scan(instance, "Agendsa", "ResourceNotFoundException")
            expect((misspelt, "firing"))
            assert _scan(instance, "OtherAgendas")  # a scheduled run on other data
            assert _scan(instance, "Agendas")
            expect((throttled, "resolved"))

            job = alerts_daemon_defs.defs.resolve_job_def("receiver_batches_job")
            failed = job.execute_in_process(instance=instance, partition_key="acme", raise_on_error=False)
            assert not failed.success
            expect((partition, "firing"))
            # materialize raises on a failed run: these two succeed or the test stops here
            dg.materialize([alerts_daemon_defs.receiver_batches], instance=instance, partition_key="zeta",
                           tags={"good": "yes"})  # fmt: skip
            dg.materialize([alerts_daemon_defs.receiver_batches], instance=instance, partition_key="acme",
                           tags={"good": "yes"})  # fmt: skip
            expect((partition, "resolved"))
            ticks = len(_alerts_ticks(instance))
            _wait_for("a later tick", lambda: len(_alerts_ticks(instance)) > ticks + 1, log)
        finally:
            stop(daemon)
        assert inbox.read() == []
        assert [i["alert_key"] for i in load_book(instance).open_incidents()] == [misspelt]
