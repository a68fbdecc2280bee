"""The alerts sensor under a real ``dagster-daemon``: a run whose lineage failed while the daemon was
down alerts once when it starts, a restart of the daemon repeats nothing, and a second evaluation
while the daemon's tick is sending sends nothing."""

from collections import Counter

import dagster as dg
import pytest

from infra.local import stop
from pipelines.alerts.defs import load_book
from tests import alerts_daemon_defs, alerts_scenario_defs
from tests.alerts_support import Receiver, alerts_ticks, dagster_home, start_daemon, wait_for
from tests.conftest import PATIENCE
from tests.test_alerts_sensor import Inbox, run_demo

pytestmark = [pytest.mark.cli, pytest.mark.slow]
DEFS = "tests.alerts_daemon_defs"


def test_a_real_daemon_alerts_once_and_a_restart_repeats_nothing(aws, tmp_path, monkeypatch):
    env = dagster_home(aws, tmp_path, monkeypatch)
    inbox = Inbox(aws)
    log = tmp_path / "daemon.log"
    with dg.DagsterInstance.get() as instance:
        run_demo(instance, 4, succeed_on=5, previous="an-earlier-attempt")  # fails while no daemon runs
        daemon = start_daemon(DEFS, env, log)
        try:
            (firing,) = wait_for("alert", inbox.read, log)
            assert (firing["alert_key"], firing["state"], firing["attempts"]) == (
                "run_failure:retry_demo:ThrottlingException",
                "firing",
                4,
            )
        finally:
            stop(daemon)
        ticks_before = len(alerts_ticks(instance))
        daemon = start_daemon(DEFS, env, log)
        try:
            wait_for("tick after the restart", lambda: len(alerts_ticks(instance)) > ticks_before, log)
        finally:
            stop(daemon)
        assert inbox.read() == []
        assert all(t.status.value != "FAILURE" for t in alerts_ticks(instance))


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
    env = dagster_home(aws, tmp_path, monkeypatch)
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

        wait_for(f"messages {wanted}", arrived, log)
        assert sorted(got) == sorted(wanted)

    with dg.DagsterInstance.get() as instance:
        daemon = start_daemon(DEFS, env, log)
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
            ticks = len(alerts_ticks(instance))
            wait_for("a later tick", lambda: len(alerts_ticks(instance)) > ticks + 1, log)
        finally:
            stop(daemon)
        assert inbox.read() == []
        assert [i["alert_key"] for i in load_book(instance).open_incidents()] == [misspelt]


def _evaluate_here(instance: dg.DagsterInstance) -> str:
    """One evaluation of the scenario's ``alerts`` sensor in this process, against ``instance``, as
    the UI's "Test sensor" or a second code server runs it while the daemon's does: its skip reason."""
    defs = alerts_scenario_defs.defs
    sensor = defs.resolve_sensor_def("alerts")
    with dg.build_sensor_context(instance=instance, resources=defs.resources, definitions=defs) as context:
        return sensor.evaluate_tick(context).skip_message or ""


def test_a_second_evaluation_while_the_daemons_tick_sends_sends_nothing_and_each_alert_arrives_once(
    aws, tmp_path, monkeypatch
):
    """The webhook holds the daemon's send (it answers when the test says) while a second
    evaluation of the same sensor runs against the same instance: it sends nothing and says so;
    once released, every state change arrives at the webhook once (by its message_id). The daemon's
    webhook sink waits for the answer as long as the test waits for anything, and its lease (the
    sensor timeout) outlasts that: a stall of the machine cannot end the hold early."""
    receiver = Receiver(mode="up")
    env = dagster_home(
        aws,
        tmp_path,
        monkeypatch,
        ALERTS_WEBHOOK_URL=receiver.url,
        SCENARIO_WEBHOOK_TIMEOUT_SECONDS=str(PATIENCE),
        DAGSTER_SENSOR_GRPC_TIMEOUT_SECONDS=str(3 * PATIENCE),
    )
    monkeypatch.setenv("ALERTS_WEBHOOK_URL", receiver.url)  # the second evaluation's sink: the same webhook
    key = "run_failure:retry_demo:ThrottlingException"
    log = tmp_path / "daemon.log"
    with dg.DagsterInstance.get() as instance:
        run_demo(instance, 4, succeed_on=5, previous="an-earlier-attempt")  # the first tick has an alert to send
        receiver.hold()
        daemon = start_daemon("tests.alerts_scenario_defs", env, log)
        try:
            wait_for("the daemon's send", receiver.reached.is_set, log)
            second = _evaluate_here(instance)  # while the daemon's tick is held in its send
            receiver.release.set()
            wait_for("the held send's answer", lambda: receiver.hung_up, log)
            run_demo(instance, 1, succeed_on=1)
            wait_for("the resolved", lambda: len(receiver.ids(key)) >= 2, log)
            ticks = len(alerts_ticks(instance))
            wait_for("2 more ticks", lambda: len(alerts_ticks(instance)) >= ticks + 2, log)
        finally:
            receiver.release.set()
            stop(daemon)
    assert receiver.hung_up == [False], "the daemon's sink gave up on its held send before the test released it"
    assert "another evaluation of the sensor holds its lease" in second
    assert [m["state"] for m in receiver.received] == ["firing", "resolved"]
    counts = Counter(m["message_id"] for m in receiver.received)
    assert [mid for mid, n in counts.items() if n > 1] == []
