"""A real ``dagster-daemon`` runs the alerts sensor while its only sink, a webhook, is down, then
slow, then back, and runs fail and succeed: every state change arrives exactly once (by its
``message_id``), none is lost, and no heartbeat is published while nothing can be delivered."""

from collections import Counter

import dagster as dg
import pytest

from infra.local import stop
from pipelines.alerts.defs import HEARTBEAT_METRIC
from tests.alerts_support import Receiver, alerts_ticks, dagster_home, start_daemon, wait_for
from tests.test_alerts_sensor import run_demo

pytestmark = [pytest.mark.cli, pytest.mark.slow]


def _reasons(instance) -> list[str]:
    return [t.skip_reason or "" for t in alerts_ticks(instance)]


def _unbeaten(instance) -> int:
    return sum("no heartbeat: webhook cannot deliver" in r for r in _reasons(instance))


def _beats(aws) -> list:
    return aws.client("cloudwatch").list_metrics(MetricName=HEARTBEAT_METRIC)["Metrics"]


def test_down_then_slow_then_back_every_state_change_once_and_no_heartbeat_while_down(aws, tmp_path, monkeypatch):
    receiver = Receiver()
    env = dagster_home(aws, tmp_path, monkeypatch, ALERTS_WEBHOOK_URL=receiver.url,
                       DAGSTER_SENSOR_GRPC_TIMEOUT_SECONDS="40")  # fmt: skip
    key = "run_failure:retry_demo:ThrottlingException"  # its unit of work and its cause
    log = tmp_path / "daemon.log"
    with dg.DagsterInstance.get() as instance:
        # down: a lineage fails; ticks try the webhook, deliver nothing and do not beat
        run_demo(instance, 4, succeed_on=5, previous="lineage-1")  # before the first tick: it has work
        daemon = start_daemon("tests.alerts_scenario_defs", env, log)
        try:
            wait_for("3 ticks without a heartbeat", lambda: _unbeaten(instance) >= 3, log)
            assert receiver.received == []
            assert _beats(aws) == [], _reasons(instance)[:5]
            # slow: the firing goes; a success resolves it, slowly too
            receiver.mode = "slow"
            wait_for("the firing", lambda: len(receiver.ids(key)) >= 1, log)
            run_demo(instance, 1, succeed_on=1)
            wait_for("the resolved", lambda: len(receiver.ids(key)) >= 2, log)
            # back: another lineage fails and a success resolves it
            receiver.mode = "up"
            run_demo(instance, 4, succeed_on=5, previous="lineage-2")
            wait_for("the second firing", lambda: len(receiver.ids(key)) >= 3, log)
            run_demo(instance, 1, succeed_on=1)
            wait_for("the second resolved", lambda: len(receiver.ids(key)) >= 4, log)
            ticks = len(alerts_ticks(instance))
            wait_for("3 more ticks", lambda: len(alerts_ticks(instance)) >= ticks + 3, log)
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
