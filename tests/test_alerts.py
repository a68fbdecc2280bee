"""Alerting's plain logic: incidents open and resolve once, delivery per sink with retries by policy,
at most ALERTS_MAX_PER_TICK messages per tick, and the sinks' rules (no redirects, no secrets in
log lines, bad settings as one line each)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from pipelines.alerts.incidents import FIRING, KINDS, RESOLVED, AlertBook, Signal, SinkError, message_id, text_of
from pipelines.alerts.sinks import SnsSink, WebhookSink, alert_config
from pipelines.alerts.sources import (
    STILL_FAILING_SECONDS,
    RunEnd,
    automatic_retry,
    cause_of,
    check_evaluated,
    dead_letters,
    run_failed,
    run_succeeded,
    ticks_seen,
    work_unit,
)
from pipelines.common.env import SettingsError
from pipelines.common.summary import counts_tag
from pipelines.retry import exponential, fixed, policy_from_text
from pipelines.retry.runs import run_retry
from resources.settings import ALERT_ENV, AlertSettings
from tests.alerts_support import webhook_receiver

NOW = 1_800_000_000.0
HERE = "__repository__@groundskeeper"  # the code location's repository, as the UI's paths name it


def typed(by_variable: dict[str, str]) -> AlertSettings:
    """The typed settings resource the sensor reads, from values by their variable's name."""
    fields = {variable: name for name, variable in ALERT_ENV.items()}
    return AlertSettings(**{fields[variable]: value for variable, value in by_variable.items()})


NO_WAIT = fixed(0, None)


class ListSink:
    def __init__(self, name: str = "list", fail: int = 0) -> None:
        self.name, self.fail, self.messages = name, fail, []

    def send(self, message):
        if self.fail:
            self.fail -= 1
            raise SinkError(f"{self.name} is down")
        self.messages.append(dict(message))


def _run(book: AlertBook, signals, sink, now: float = NOW, **kw):
    for signal in signals:
        message = book.observe(signal, now)
        if message is not None:
            book.enqueue(message, [sink.name])
    return book.deliver([sink], now, policy=kw.pop("policy", NO_WAIT), max_per_tick=kw.pop("max_per_tick", 20))


def _check(passed: bool, severity: str = "ERROR"):
    return check_evaluated("orders", "not_empty", passed, severity, "0 rows" if not passed else "12 rows",
                           run_id="r", ui_url="http://ui")  # fmt: skip


def test_check_pass_fail_fail_pass_sends_one_firing_and_one_resolved():
    book, sink = AlertBook(), ListSink()
    for i, passed in enumerate([True, False, False, True]):
        _run(book, [_check(passed)], sink, now=NOW + i)
    assert [(m["state"], m["kind"], m["severity"]) for m in sink.messages] == [
        (FIRING, "check_failure", "critical"),
        (RESOLVED, "check_failure", "critical"),
    ]
    firing = sink.messages[0]
    assert firing["alert_key"] == "check_failure:orders:not_empty"
    assert firing["summary"] == "0 rows"
    assert firing["runbook"] == "docs/runbooks/check_failure.md"
    assert firing["url"].startswith("http://ui/assets/")


def test_a_check_failing_passing_failing_after_the_ticks_clock_sends_each_change_with_its_own_id():
    """The evaluations are stamped after the tick's clock (the run worker's clock ahead of the code server's)."""
    book, sink = AlertBook(), ListSink()
    for passed, at in ((False, NOW + 10), (True, NOW + 20), (False, NOW + 25)):
        signal = check_evaluated("orders", "not_empty", passed, "ERROR", "x", run_id="r", ui_url=None, at=at)
        _run(book, [signal], sink)
    assert len({m["message_id"] for m in sink.messages}) == 3


def test_a_warn_check_is_a_warning_and_can_be_muted():
    assert _check(False, "WARN").severity == "warning"
    muted = check_evaluated("orders", "not_empty", False, "WARN", None, run_id=None, ui_url=None,
                            muted=frozenset({"orders:not_empty"}))  # fmt: skip
    assert muted is None


def test_a_warn_check_muted_while_its_incident_is_open_still_resolves_when_it_passes():
    book, sink = AlertBook(), ListSink()
    _run(book, [_check(False, "WARN")], sink)
    muted = frozenset({"orders:not_empty"})
    passing = check_evaluated("orders", "not_empty", True, "WARN", "12 rows", run_id="r", ui_url=None, muted=muted)
    _run(book, [passing], sink, now=NOW + 1)
    assert [(m["alert_key"], m["state"]) for m in sink.messages] == [
        ("check_failure:orders:not_empty", FIRING),
        ("check_failure:orders:not_empty", RESOLVED),
    ]


def test_three_failing_ticks_fire_once_and_the_next_success_resolves():
    book, sink = AlertBook(), ListSink()
    history: list[str] = []
    for i, status in enumerate(["FAILURE", "FAILURE", "FAILURE", "FAILURE", "FAILURE", "SUCCESS"]):
        history.insert(0, status)
        signal = ticks_seen(
            "queue_sensor", "sensor", history, "boom\nTraceback...", threshold=3, ui_url=None, repository=HERE
        )
        _run(book, [signal] if signal else [], sink, now=NOW + i)
        if i < 2:
            assert sink.messages == []
    assert [m["state"] for m in sink.messages] == [FIRING, RESOLVED]
    assert sink.messages[0]["summary"] == "boom"
    assert sink.messages[0]["kind"] == "tick_failure"


def test_a_sink_that_is_down_keeps_its_messages_and_holds_back_no_other_sink():
    book, down, up = AlertBook(), ListSink("down", fail=2), ListSink("up")
    message = book.observe(_check(False), NOW)
    book.enqueue(message, ["down", "up"])
    first = book.deliver([down, up], NOW, policy=fixed(60, None), max_per_tick=20)
    assert len(up.messages) == 1
    assert down.messages == []
    assert first.failed == [
        "down did not take check_failure:orders:not_empty#2027-01-15T08:00:00.000Z#firing (attempt 1): down is down"
    ]
    # the policy's delay: not tried again before it is due, then once more (fails), then delivered
    assert book.deliver([down, up], NOW + 30, policy=fixed(60, None), max_per_tick=20).sent == []
    book.deliver([down, up], NOW + 60, policy=fixed(60, None), max_per_tick=20)
    assert down.messages == []
    book.deliver([down, up], NOW + 120, policy=fixed(60, None), max_per_tick=20)
    assert [m["state"] for m in down.messages] == [FIRING]
    assert len(up.messages) == 1
    assert book.outbox == {"down": [], "up": []}


def test_a_delay_function_that_fails_stops_the_policy_and_delivery_goes_on():
    book, down, up = AlertBook(), ListSink("down", fail=1), ListSink("up")
    book.enqueue(book.observe(_check(False), NOW), ["down", "up"])
    book.outbox["down"][0]["attempts"] = 1  # tests.retry_delay_functions:broken raises from its second attempt on
    policy = policy_from_text('{"kind": "function", "path": "tests.retry_delay_functions:broken", "maxAttempts": 9}')
    done = book.deliver([down, up], NOW, policy=policy, max_per_tick=20)
    assert len(up.messages) == 1
    assert book.outbox["down"][0]["next_try"] == NOW + 900  # as once the policy stops
    assert "'tests.retry_delay_functions:broken' failed for n=2" in done.failed[0]


def test_the_state_survives_a_save_and_a_load_without_repeating_anything():
    book, sink = AlertBook(), ListSink()
    _run(book, [_check(False)], sink)
    again = AlertBook.load(book.dumps())
    _run(again, [_check(False)], sink, now=NOW + 60)
    assert len(sink.messages) == 1
    assert AlertBook.load("not json", warn=lambda line: sink.messages.append({"warned": line})).incidents == {}


def test_at_most_max_per_tick_messages_the_rest_in_one_summary():
    book, sink = AlertBook(), ListSink()
    signals = [check_evaluated(f"asset_{i}", "c", False, "ERROR", "bad", run_id=None, ui_url=None) for i in range(25)]
    done = _run(book, signals, sink, max_per_tick=20)
    assert len(sink.messages) == 21
    assert done.summarised == 5
    summary = sink.messages[-1]
    assert summary["kind"] == "summary"
    assert summary["title"] == "5 more alerts this tick (5 firing)"
    assert "check_failure:asset_20:c firing" in summary["summary"]
    assert book.outbox["list"] == []
    assert len(book.open_incidents()) == 25


def test_an_outbox_keeps_at_most_its_limit_and_says_what_it_dropped(monkeypatch):
    from pipelines.alerts import incidents

    monkeypatch.setattr(incidents, "MAX_KEPT_PER_SINK", 2)
    book, lines = AlertBook(), []
    for i in range(3):
        lines += book.enqueue(book.observe(check_evaluated(f"a{i}", "c", False, "ERROR", "bad", run_id=None,
                                                           ui_url=None), NOW), ["down"])  # fmt: skip
    assert [item["message"]["alert_key"] for item in book.outbox["down"]] == [
        "check_failure:a1:c",
        "check_failure:a2:c",
    ]
    assert lines == [
        "down has 2 messages waiting: dropped the oldest, check_failure:a0:c#2027-01-15T08:00:00.000Z#firing"
    ]


def test_a_full_outbox_drops_an_incident_that_opened_and_ended_while_waiting_never_its_firing_alone(monkeypatch):
    from pipelines.alerts import incidents

    monkeypatch.setattr(incidents, "MAX_KEPT_PER_SINK", 3)
    book, lines = AlertBook(), []
    lines += book.enqueue(book.observe(_check(False), NOW), ["down"])
    lines += book.enqueue(book.observe(_failing_ticks("a"), NOW), ["down"])
    lines += book.enqueue(book.observe(_check(True), NOW + 60), ["down"])
    lines += book.enqueue(book.observe(_failing_ticks("b"), NOW + 60), ["down"])
    kept = [(item["message"]["alert_key"], item["message"]["state"]) for item in book.outbox["down"]]
    assert kept == [("tick_failure:a", FIRING), ("tick_failure:b", FIRING)]
    assert lines == [
        "down has 3 messages waiting: dropped check_failure:orders:not_empty#2027-01-15T08:00:00.000Z#firing, "
        "check_failure:orders:not_empty#2027-01-15T08:00:00.000Z#resolved, an incident that opened and ended "
        "while they waited"
    ]


def test_a_full_outbox_never_holds_an_incidents_resolution_without_its_firing(monkeypatch):
    from pipelines.alerts import incidents

    monkeypatch.setattr(incidents, "MAX_KEPT_PER_SINK", 2)
    book, held = AlertBook(), []
    for name in "abc":
        book.enqueue(book.observe(_failing_ticks(name), NOW), ["down"])
        held.append({item["id"] for item in book.outbox["down"]})
    book.enqueue(book.observe(_resolved_ticks("a"), NOW + 60), ["down"])
    held.append({item["id"] for item in book.outbox["down"]})
    a = "tick_failure:a#2027-01-15T08:00:00.000Z"
    assert [ids for ids in held if f"{a}#resolved" in ids and f"{a}#firing" not in ids] == []


def test_an_open_incident_whose_firing_gave_way_is_sent_as_a_firing_at_its_next_rise(monkeypatch):
    from pipelines.alerts import incidents

    monkeypatch.setattr(incidents, "MAX_KEPT_PER_SINK", 2)
    book = AlertBook()
    book.enqueue(book.observe(_check(False, "WARN"), NOW), ["webhook"])
    for name in "ab":  # the check's firing gives way
        book.enqueue(book.observe(_failing_ticks(name), NOW + 60), ["webhook"])
    book.enqueue(book.observe(_check(False, "ERROR"), NOW + 120), ["webhook"])  # its severity rises
    check = "check_failure:orders:not_empty"
    kept = [m for m in (item["message"] for item in book.outbox["webhook"]) if m["alert_key"] == check]
    assert [(m["state"], m["reminder"], m["severity"]) for m in kept] == [(FIRING, False, "critical")]


def test_a_sink_sending_elsewhere_since_the_last_tick_gets_the_firing_of_every_open_incident():
    book = AlertBook()
    book.add_sinks({"webhook": "one"})
    book.enqueue(book.observe(_check(False), NOW), ["webhook"])
    book.outbox["webhook"] = []  # taken
    book.add_sinks({"webhook": "two"})
    assert [item["message"]["state"] for item in book.outbox["webhook"]] == [FIRING]


def test_a_reminder_only_when_asked_for():
    book = AlertBook()
    assert book.observe(_check(False), NOW)["state"] == FIRING
    assert book.observe(_check(False), NOW + 7200) is None
    assert book.reminders(NOW + 7200, None) == []
    (reminder,) = book.reminders(NOW + 7200, 3600)
    assert reminder["reminder"] is True
    assert reminder["state"] == FIRING
    assert book.reminders(NOW + 7300, 3600) == []


def test_an_incident_its_source_does_not_see_again_is_reminded_each_time_with_its_own_id():
    book = AlertBook()
    book.observe(_check(False), NOW)  # a check evaluated once, or a run failure: seen once
    ids = [message_id(m) for at in (NOW + 3600, NOW + 7200) for m in book.reminders(at, 3600)]
    assert ids == [
        "check_failure:orders:not_empty#2027-01-15T08:00:00.000Z#firing#reminder@2027-01-15T09:00:00.000Z",
        "check_failure:orders:not_empty#2027-01-15T08:00:00.000Z#firing#reminder@2027-01-15T10:00:00.000Z",
    ]


def test_a_reminder_says_what_its_source_saw_last():
    book = AlertBook()
    book.observe(_dead_letters(3), NOW)
    book.observe(_dead_letters(500), NOW + 60)
    (reminder,) = book.reminders(NOW + 7200, 3600)
    assert reminder["title"] == "termination-dlq holds 500 dead letter(s)"


CHECK_KEY = "check_failure:orders:not_empty"


def test_an_open_incident_failing_at_a_higher_severity_sends_one_message_at_that_severity():
    book = AlertBook()
    book.observe(_check(False, "WARN"), NOW)
    escalated = book.observe(_check(False, "ERROR"), NOW + 60)
    assert (escalated["state"], escalated["severity"], escalated["reminder"]) == (FIRING, "critical", True)


def test_a_rise_of_severity_is_sent_even_when_the_incident_is_acknowledged():
    book = AlertBook()
    book.observe(_check(False, "WARN"), NOW)
    book.observe(Signal(CHECK_KEY, "check_failure", False, action="acknowledge", summary="on it"), NOW + 1)
    assert book.observe(_check(False, "ERROR"), NOW + 60)["severity"] == "critical"


def test_a_fall_of_severity_is_kept_without_a_message():
    book = AlertBook()
    book.observe(_check(False, "ERROR"), NOW)
    assert book.observe(_check(False, "WARN"), NOW + 60) is None
    assert book.incidents[CHECK_KEY]["severity"] == "warning"


def test_a_reminder_and_a_rise_of_severity_in_one_tick_send_the_rise():
    book, sink = AlertBook(), ListSink()
    _run(book, [_check(False, "WARN")], sink)
    for severity in ("WARN", "ERROR"):
        if message := book.observe(_check(False, severity), NOW + 7200):
            book.enqueue(message, [sink.name])
    assert book.reminders(NOW + 7200, 3600) == []
    book.deliver([sink], NOW + 7200, policy=NO_WAIT, max_per_tick=20)
    assert [m["severity"] for m in sink.messages] == ["warning", "critical"]


def _retries(enabled: bool, max_retries: int, on_step_failure: bool = False) -> SimpleNamespace:
    """A Dagster instance's run retries, as automatic_retry reads them."""
    return SimpleNamespace(
        run_retries_enabled=enabled,
        run_retries_max_retries=max_retries,
        run_retries_retry_on_asset_or_op_failure=on_step_failure,
    )


def test_automatic_retries_do_not_alert_the_last_attempt_does():
    policy = '{"kind": "fixed", "delay": 10, "maxAttempts": 3}'
    tags = {"groundskeeper/retry_policy": policy}
    assert automatic_retry({**tags, "groundskeeper/retry_attempt": "2"}, "", _retries(False, 0))
    assert not automatic_retry({**tags, "groundskeeper/retry_attempt": "3"}, "", _retries(False, 0))
    assert automatic_retry({"dagster/retry_number": "1"}, "", _retries(True, 2))
    assert not automatic_retry({"dagster/retry_number": "2"}, "", _retries(True, 2))
    assert not automatic_retry({"groundskeeper/retry_policy": "nonsense"}, "", _retries(False, 0))


def test_dagster_run_retries_count_only_when_dagster_retries_the_run():
    """Dagster's own decision (dagster/will_retry) wins; without it, a step failure is not retried
    when retries on asset or op failure are off, as in this project's dagster.yaml."""
    on = _retries(True, 2)
    assert not automatic_retry({"dagster/will_retry": "false"}, "", on)
    assert automatic_retry({"dagster/will_retry": "true", "dagster/max_retries": "0"}, "", on)
    step = {"dagster/failure_reason": "STEP_FAILURE"}
    assert not automatic_retry(step, "", on)
    assert automatic_retry(step, "", _retries(True, 2, on_step_failure=True))
    step_off = {**step, "dagster/retry_on_asset_or_op_failure": "false"}
    assert not automatic_retry(step_off, "", _retries(True, 2, on_step_failure=True))
    assert automatic_retry({"dagster/failure_reason": "RUN_EXCEPTION"}, "", on)


def _lineage(first_failed_ago: float | None, status: str = "FAILURE") -> SimpleNamespace:
    """A Dagster instance holding a lineage's first run ``root`` (None: gone) and its attempt ``r`` that
    failed ``first_failed_ago`` seconds after it, as automatic_retry reads them."""

    def record(end_time: float, status: str) -> SimpleNamespace:
        return SimpleNamespace(end_time=end_time, dagster_run=SimpleNamespace(status=SimpleNamespace(value=status)))

    records = {"r": record(NOW, "FAILURE")}
    if first_failed_ago is not None:
        records["root"] = record(NOW - first_failed_ago, status)
    return SimpleNamespace(**vars(_retries(False, 0)), get_run_record_by_id=records.get)


TEMPORAL = {"groundskeeper/retry_policy": "temporal", "groundskeeper/retry_root": "root"}  # unlimited attempts


@pytest.mark.parametrize("attempt", ["40", "10000"])
def test_a_lineage_retried_for_an_hour_alerts_while_its_retries_go_on(attempt):
    tags = {**TEMPORAL, "groundskeeper/retry_attempt": attempt}
    assert automatic_retry(tags, "r", _lineage(STILL_FAILING_SECONDS)) is None
    assert run_retry(tags, "r").wait == 100.0  # delayed_run_retries, reading the same decision, retries it


def test_a_lineage_retried_for_less_than_an_hour_does_not_alert_yet():
    tags = {**TEMPORAL, "groundskeeper/retry_attempt": "40"}
    assert automatic_retry(tags, "r", _lineage(STILL_FAILING_SECONDS - 1)) is not None


def test_a_lineage_whose_first_run_is_gone_alerts_while_its_retries_go_on():
    assert automatic_retry({**TEMPORAL, "groundskeeper/retry_attempt": "2"}, "r", _lineage(None)) is None


def test_a_re_execution_of_a_run_that_succeeded_counts_from_its_own_failure():
    tags = {**TEMPORAL, "groundskeeper/retry_attempt": "2"}
    assert automatic_retry(tags, "r", _lineage(7 * 86400, status="SUCCESS")) is not None


def test_the_alert_of_a_lineage_still_retried_says_that_its_retries_go_on():
    tags = {**TEMPORAL, "groundskeeper/retry_attempt": "40"}
    signal = run_failed(RunEnd("sync_orders", "r", tags, "sync_orders"), "boom")
    assert signal.title == "sync_orders failed after 40 attempts, retries go on (the next in 1m40s)"


def _reclaim(table: str) -> tuple[str, dict]:
    return work_unit("reclaim_agendas", {}, {"ops": {"reclaim": {"config": {"tableName": table}}}}), {}


def test_a_new_cause_is_a_new_incident_and_only_a_success_of_its_unit_of_work_resolves_it():
    book, sink = AlertBook(), ListSink()
    agendas, tags = _reclaim("Agendas")
    misspelt, _ = _reclaim("Agendsa")
    throttled = "An error occurred (ThrottlingException) when calling the Scan operation: Rate exceeded"
    missing = "An error occurred (ResourceNotFoundException) when calling the Scan operation: not found"
    for unit, error in ((agendas, throttled), (agendas, missing), (misspelt, missing)):
        signal = run_failed(RunEnd("reclaim_agendas", "r1", tags, unit), error, cause=cause_of([], [error]))
        _run(book, [signal], sink)
    assert [m["alert_key"] for m in sink.messages] == [
        "run_failure:reclaim_agendas@Agendas:ThrottlingException",
        "run_failure:reclaim_agendas@Agendas:ResourceNotFoundException",
        "run_failure:reclaim_agendas@Agendsa:ResourceNotFoundException",
    ]
    other, _ = _reclaim("OtherAgendas")
    assert run_succeeded(RunEnd("reclaim_agendas", "r2", tags, other), book.open_units()) == []
    resolved = run_succeeded(RunEnd("reclaim_agendas", "r3", tags, agendas), book.open_units())
    _run(book, resolved, sink)
    assert [(m["alert_key"], m["state"]) for m in sink.messages[3:]] == [
        ("run_failure:reclaim_agendas@Agendas:ResourceNotFoundException", RESOLVED),
        ("run_failure:reclaim_agendas@Agendas:ThrottlingException", RESOLVED),
    ]
    assert [i["alert_key"] for i in book.open_incidents()] == [
        "run_failure:reclaim_agendas@Agendsa:ResourceNotFoundException"
    ]


@pytest.mark.parametrize(
    ("job", "config", "unit"),
    [
        ("housekeeping", {"task_type": "stale_ssm", "params": {"dryRun": True}}, "housekeeping@stale_ssm"),
        ("redrive_dead_letters", {"queue": "housekeeping"}, "redrive_dead_letters@housekeeping"),
        ("redrive_failed_partitions", {"asset": "receiver_batches"}, "redrive_failed_partitions@receiver_batches"),
    ],
)
def test_a_job_that_works_on_one_of_several_things_names_it_in_its_unit_of_work(job, config, unit):
    assert work_unit(job, {}, config) == unit


def _reclaimed(book: AlertBook, table: str, errors: int, run_id: str) -> list[Signal]:
    """The signals of a reclaim_agendas run on ``table`` that had ``errors`` item errors."""
    tags = {"groundskeeper/capability": "reclaim", **counts_tag({"reclaimed": 1, "errors": errors})}
    return run_succeeded(RunEnd("reclaim_agendas", run_id, tags, _reclaim(table)[0]), book.open_units())


def test_item_errors_are_one_incident_per_table_which_only_a_clean_run_of_that_table_resolves():
    book, sink = AlertBook(), ListSink()
    for table, errors, run_id in (("A", 7, "a1"), ("B", 0, "b1"), ("B", 2, "b2"), ("A", 7, "a2"), ("A", 0, "a3")):
        _run(book, _reclaimed(book, table, errors, run_id), sink)
    assert [(m["alert_key"], m["state"], m["run_id"]) for m in sink.messages] == [
        ("reclaim_errors:reclaim_agendas@A", FIRING, "a1"),
        ("reclaim_errors:reclaim_agendas@B", FIRING, "b2"),
        ("reclaim_errors:reclaim_agendas@A", RESOLVED, "a3"),
    ]


def test_an_item_errors_incident_of_the_whole_job_is_closed_by_its_next_run_and_says_why():
    """Saved before item errors were per table, under reclaim_errors:<job>: the job's next run closes it
    (not resolved: its table may still fail, and then opens its own incident)."""
    book, sink = AlertBook(), ListSink()
    _run(book, [Signal("reclaim_errors:reclaim_agendas", "reclaim_errors", True, summary="7 item error(s)")], sink)
    _run(book, _reclaimed(book, "B", 0, "b1"), sink)
    _run(book, _reclaimed(book, "B", 0, "b2"), sink)
    (_, closed) = sink.messages
    assert (closed["alert_key"], closed["state"]) == ("reclaim_errors:reclaim_agendas", "closed")
    assert closed["summary"].startswith("now one per table, reclaim_errors:reclaim_agendas@<table>: a table still")
    assert book.open_incidents() == []


def test_the_cause_is_the_aws_code_else_the_first_class_under_dagsters_wrapping():
    assert cause_of(["DagsterExecutionStepExecutionError", "Failure", "KeyError"], ["boom"]) == "KeyError"
    assert cause_of(["Failure", "ClientError"], ["Query was throttled (ThrottlingException)"]) == "ThrottlingException"
    assert cause_of(["Failure"], ["RuntimeError: receiver acme is unreachable"]) == "RuntimeError"
    assert cause_of([], ["something odd"]) == "failure"


def test_every_kind_has_a_runbook():
    from pathlib import Path

    runbooks = Path(__file__).resolve().parent.parent / "docs" / "runbooks"
    assert {p.stem for p in runbooks.glob("*.md")} >= set(KINDS)


def test_the_dead_letters_runbook_names_the_drain_job_of_each_queue():
    """Each fleet queue's dead letters are logged by its drain job, ``process_<queue>_queue``."""
    from pathlib import Path

    from pipelines.definitions import build_definitions
    from pipelines.fleet.defs.checks import DLQ_ASSETS

    text = (Path(__file__).resolve().parent.parent / "docs" / "runbooks" / "dead_letters.md").read_text()
    defs = build_definitions("local")
    for queue in DLQ_ASSETS:
        job = defs.resolve_job_def(f"process_{queue}_queue")
        assert f"`{job.name}`" in text, job.name


def _checks_run_by(repo, command: str, target: str) -> set:
    """The asset checks ``dg launch --<command> <target>`` runs (``--assets`` as dg selects them)."""
    import dagster as dg

    if command == "job":
        return set(repo.get_job(target).asset_layer.asset_graph.asset_check_keys)
    keys = dg.AssetSelection.from_coercible(target.split(",")).resolve(repo.asset_graph)
    job = repo.get_implicit_job_def_for_assets(keys).get_subset(asset_selection=keys)
    return set(job.asset_layer.asset_graph.asset_check_keys)


def test_the_check_failure_runbook_runs_each_alerting_check_again():
    """Each asset with a check that opens a check_failure has a row in the runbook whose commands run its checks."""
    import re
    from pathlib import Path

    from infra.demo.definitions import build_local_definitions
    from pipelines.alerts.sources import CHECKS_WITH_THEIR_OWN_SOURCE

    runbook = Path(__file__).resolve().parent.parent / "docs" / "runbooks" / "check_failure.md"
    rows = re.findall(r"^\| `([^`]+)`[^|]*\| (.+) \|$", runbook.read_text(), re.M)
    repo = build_local_definitions({}).get_repository_def()
    checks_by_asset: dict = {}
    for key in repo.asset_graph.asset_check_keys:
        if key.name not in CHECKS_WITH_THEIR_OWN_SOURCE:
            checks_by_asset.setdefault(key.asset_key.to_user_string(), set()).add(key)
    for asset, checks in sorted(checks_by_asset.items()):
        row = [(pattern, cell) for pattern, cell in rows if re.fullmatch(re.sub("<[a-z]+>", "[^/]+", pattern), asset)]
        assert len(row) == 1, f"{asset}: {len(row)} row(s) in {runbook.name}"
        (pattern, cell) = row[0]
        commands = re.findall(r"`\.venv/bin/dg launch --(job|assets) (\S+)`", cell)
        assert commands, f"{asset}: no dg launch command in its row"
        for command, target in commands:
            target = asset if target == pattern else target
            assert _checks_run_by(repo, command, target) >= checks, f"{asset}: --{command} {target}"


# ------------------------------------------------------------------------------ sinks and settings


def _message(book=None):
    return (book or AlertBook()).observe(_check(False), NOW)


def test_the_webhook_posts_text_and_the_contract_fields():
    with webhook_receiver() as receiver:
        WebhookSink(receiver.url).send(_message())
    (body,) = receiver.received
    assert body["text"].startswith("FIRING [critical] check not_empty of orders fails: 0 rows")
    assert body["alert_key"] == "check_failure:orders:not_empty"
    assert body["state"] == "firing"


def test_the_webhook_escapes_text_from_the_data_for_slack():
    description = "1 pending record(s) of <!channel> see <https://evil.example|runbook> & more"
    signal = check_evaluated("orders", "not_empty", False, "ERROR", description, run_id="r", ui_url="http://ui")
    with webhook_receiver() as receiver:
        WebhookSink(receiver.url).send(AlertBook().observe(signal, NOW))
    (body,) = receiver.received
    assert "&lt;!channel&gt; see &lt;https://evil.example|runbook&gt; &amp; more" in body["text"]
    assert "<" not in body["text"]


def test_a_failed_runs_title_stays_on_one_line_whatever_its_partition_tag():
    tags = {"dagster/partition": "2024-01-01\nFIRING [critical] all fine"}
    message = AlertBook().observe(run_failed(RunEnd("sync_orders", "r", tags, "sync_orders"), "boom"), NOW)
    assert "\n" not in message["title"]


def test_the_webhook_follows_no_redirect_and_logs_no_secret_path():
    with webhook_receiver() as target, webhook_receiver() as receiver:
        receiver.redirect_to = target.url
        with pytest.raises(SinkError) as raised:
            WebhookSink(receiver.url).send(_message())
    assert target.requests == 0
    assert receiver.requests == 1
    assert "HTTP 302, a redirect: not followed" in str(raised.value)
    assert "secret-token" not in str(raised.value)


def test_a_webhook_answering_500_is_one_line_without_the_path():
    with webhook_receiver() as receiver:
        receiver.failures = [500]
        with pytest.raises(SinkError) as raised:
            WebhookSink(receiver.url).send(_message())
    assert str(raised.value) == f"webhook at {receiver.url.split('/services')[0]} answered HTTP 500"


def test_a_webhook_that_hangs_times_out():
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)  # accepts the connection, never answers
    try:
        with pytest.raises(SinkError, match="did not answer within 0.5 s"):
            WebhookSink(f"http://127.0.0.1:{listener.getsockname()[1]}/hook", timeout=0.5).send(_message())
    finally:
        listener.close()


@pytest.mark.parametrize(
    "url", ["ftp://example.com/hook", "file:///etc/passwd", "hooks.example.com/x", "https://h.example/a/../b"]
)
def test_a_webhook_url_that_is_not_http_or_leaves_its_path_is_refused(url):
    with pytest.raises(SettingsError):
        WebhookSink(url)


@pytest.mark.parametrize(
    "url",
    [
        "https://bot:s3cr3t-Pa55@hooks.example/services/T0/B0/s3cr3t-Pa55",  # user info
        "https://hooks.example/services/T0/B0/s3cr3t-Pa55#frag",
        "https://hooks.example/services/T0/B0/s3cr3t-Pa55/..%00",
        "https://hooks.example/services/T0/B0/s3cr3t-Pa55/%c0%ae%c0%ae",
        "https://hooks.example/services/T0/B0/s3cr3t-Pa55/\uff0e\uff0e",
        "https://hooks.example/services/T0/B0/s3cr3t-Pa55/%zz",
    ],
)
def test_a_webhook_url_with_user_info_a_fragment_nul_or_non_ascii_is_refused_without_showing_it(url):
    with pytest.raises(SettingsError) as info:
        WebhookSink(url)
    message = str(info.value)
    assert message.splitlines() == [message]
    assert message.startswith("ALERTS_WEBHOOK_URL ")
    assert "s3cr3t-Pa55" not in message


def test_a_webhook_at_an_ipv6_address_is_shown_by_scheme_and_host():
    assert WebhookSink("http://[::1]:8080/services/T0/B0/s3cr3t-Pa55").where == "http://[::1]:8080"


def test_a_ui_url_with_user_info_is_refused_without_showing_it():
    cfg = alert_config(typed({"DAGSTER_UI_URL": "https://admin:s3cr3t-Pa55@dagster.example"}))
    assert cfg.ui_url is None  # no message carries the password in its links
    (line,) = cfg.problems
    assert line.startswith("DAGSTER_UI_URL ")
    assert "s3cr3t-Pa55" not in line


def test_a_topic_of_another_region_or_not_a_topic_is_refused():
    with pytest.raises(SettingsError, match="in eu-west-1, not in this deployment's region us-east-1"):
        SnsSink(None, "arn:aws:sns:eu-west-1:123456789012:alerts", region="us-east-1")
    with pytest.raises(SettingsError, match="is not an SNS topic ARN"):
        SnsSink(None, "arn:aws:sqs:us-east-1:123456789012:alerts", region="us-east-1")


def test_bad_settings_are_one_line_each_and_the_defaults_hold():
    cfg = alert_config(
        typed(
            {
                "ALERTS_WEBHOOK_URL": "ftp://hooks.example/secret",
                "ALERTS_SNS_TOPIC_ARN": "arn:aws:sns:eu-west-1:123456789012:alerts",
                "ALERTS_MAX_PER_TICK": "lots",
                "ALERTS_REMIND_HOURS": "-1",
                "ALERTS_RETRY_POLICY": "{",
                "DAGSTER_UI_URL": "javascript:alert(1)",
            }
        ),
        region="us-east-1",
    )
    assert cfg.refusing == ["sns", "webhook"]  # set, but unusable: their alerts wait, and no heartbeat
    assert cfg.max_per_tick == 20
    assert cfg.remind_seconds is None
    assert cfg.ui_url is None
    assert len(cfg.problems) == 6
    assert not any("hooks.example" in line for line in cfg.problems)
    assert json.dumps(cfg.problems)  # plain lines


def _dead_letters(depth: int):
    return dead_letters("termination-dlq", depth)


def _by_hand(action: str):
    return Signal("dead_letters:termination-dlq", "dead_letters", False, action=action, summary=f"{action} by hand")


def test_a_closed_incident_stays_closed_while_its_problem_stays_and_fires_again_once_it_came_back():
    book, sink = AlertBook(), ListSink()
    _run(book, [_dead_letters(3)], sink)
    _run(book, [_by_hand("close")], sink, now=NOW + 60)
    _run(book, [_dead_letters(3)], sink, now=NOW + 120)
    _run(book, [_dead_letters(4)], sink, now=NOW + 180)
    assert [m["state"] for m in sink.messages] == [FIRING, "closed"]
    _run(book, [_dead_letters(0)], sink, now=NOW + 240)
    _run(book, [_dead_letters(1)], sink, now=NOW + 300)
    assert [m["state"] for m in sink.messages] == [FIRING, "closed", FIRING]


def test_a_close_asked_for_before_the_incident_opened_again_leaves_the_new_opening_firing():
    book = AlertBook()
    book.observe(_dead_letters(3), NOW)
    book.observe(_dead_letters(0), NOW + 60)
    book.observe(_dead_letters(2), NOW + 120)
    asked = Signal("dead_letters:termination-dlq", "dead_letters", False, action="close", summary="x", at=NOW + 30)
    assert book.observe(asked, NOW + 120) is None
    assert book.incidents["dead_letters:termination-dlq"]["state"] == FIRING


def test_an_acknowledged_incident_gets_no_reminder_and_still_resolves():
    book = AlertBook()
    book.observe(_dead_letters(3), NOW)
    acknowledged = book.observe(_by_hand("acknowledge"), NOW + 1)
    assert acknowledged["state"] == "acknowledged"
    assert book.observe(_dead_letters(3), NOW + 7200) is None
    assert book.reminders(NOW + 7200, 3600) == []
    assert book.observe(_dead_letters(0), NOW + 7300)["state"] == RESOLVED


BAD_VALUES = ["http://hooks.example:99999/x", "http://hooks.example:abc/x", "http://hooks.example:-1/x",
              "http://[::1/services/x", "http://[not-an-ip]/x", "\x00", " ", "{", "[]", "1e309", "nan", "-inf",
              "9" * 400, '{"kind": "fixed", "delay": "x"}', '{"kind": ' * 2000, "::", "é"]  # fmt: skip
ALL_SETTINGS = sorted(ALERT_ENV.values())
GOOD_TOPIC = "arn:aws:sns:us-east-1:123456789012:alerts"


@pytest.mark.parametrize("name", ALL_SETTINGS)
def test_any_bad_value_of_any_setting_is_at_most_one_line_and_the_other_sinks_stay(name):
    for value in BAD_VALUES:
        settings = {"ALERTS_SNS_TOPIC_ARN": GOOD_TOPIC, "ALERTS_WEBHOOK_URL": "https://hooks.example/services/x"}
        settings[name] = value
        cfg = alert_config(typed(settings), region="us-east-1")
        assert len(cfg.problems) <= 1, (value, cfg.problems)
        kept = {"sns"} if name == "ALERTS_WEBHOOK_URL" else {"webhook"} if name == "ALERTS_SNS_TOPIC_ARN" else set()
        assert kept <= {sink.name for sink in cfg.sinks}, value


@pytest.mark.parametrize(
    "url",
    [
        "http://hooks.example:99999/x",
        "http://hooks.example:abc/x",
        "http://hooks.example:-1/x",
        "http://[::1/services/x",
    ],  # fmt: skip
)
def test_a_webhook_url_with_a_bad_port_or_host_is_one_line_and_sns_stays(url):
    cfg = alert_config(typed({"ALERTS_SNS_TOPIC_ARN": GOOD_TOPIC, "ALERTS_WEBHOOK_URL": url}), region="us-east-1")
    assert [sink.name for sink in cfg.sinks] == ["sns", "webhook"]
    assert cfg.refusing == ["webhook"]
    (line,) = cfg.problems
    assert "ALERTS_WEBHOOK_URL" in line


def test_a_refused_sink_setting_refuses_each_message_with_its_line_and_no_secret():
    url = "http://hooks.example:99999/services/T000/B000/secret-token"
    cfg = alert_config(typed({"ALERTS_WEBHOOK_URL": url}), region="us-east-1")
    (sink,) = cfg.sinks
    with pytest.raises(SinkError) as refused:
        sink.send(_message())
    assert str(refused.value) == cfg.problems[0]
    assert "secret-token" not in str(refused.value)


def _tcp_server(answer):
    """A TCP server on a free port: ``answer(conn)`` after reading each request."""
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)

    def serve():
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                try:
                    answer(conn)
                except OSError:
                    pass

    threading.Thread(target=serve, daemon=True).start()
    return listener


def _one_shot_server(answer: bytes):
    """Answers ``answer`` as it is, then closes."""
    return _tcp_server(lambda conn: conn.sendall(answer))


NOT_HTTP = [
    b"hello\r\n",  # BadStatusLine
    b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten..",  # IncompleteRead
    b"HTTP/1.1 200 OK\r\n" + b"X-Long: " + b"a" * 70000 + b"\r\n\r\n",  # LineTooLong
    b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(120)) + b"\r\n",  # too many headers
    b"",  # RemoteDisconnected
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",  # a bad chunk
    b"SSH-2.0-OpenSSH_9.6\r\n",
]


@pytest.mark.parametrize("answer", NOT_HTTP, ids=range(len(NOT_HTTP)))
def test_a_webhook_that_is_not_http_or_stops_mid_body_is_that_sinks_one_line(answer):
    listener = _one_shot_server(answer)
    try:
        with pytest.raises(SinkError) as raised:
            WebhookSink(f"http://127.0.0.1:{listener.getsockname()[1]}/services/secret-token").send(_message())
    finally:
        listener.close()
    assert "secret-token" not in str(raised.value)


class BrokenSink(ListSink):
    def send(self, message):
        raise KeyError("a sink's own bug")


def test_any_failure_of_one_sink_is_that_sinks_failure_and_the_other_sink_still_gets_its_message():
    book, good, broken = AlertBook(), ListSink("good"), BrokenSink("broken")
    book.enqueue(book.observe(_check(False), NOW), ["broken", "good"])
    done = book.deliver([broken, good], NOW, policy=NO_WAIT, max_per_tick=20)
    assert len(good.messages) == 1
    assert len(book.outbox["broken"]) == 1
    assert any("broken did not take" in line for line in done.failed)


_INCIDENT = {"alert_key": "k", "kind": "run_failure", "state": "firing", "first_seen": NOW, "last_seen": NOW}
_ITEM = {"id": "x", "attempts": 0, "next_try": 0}
BAD_STATES = [
    [],
    "text",
    {"incidents": []},
    {"incidents": {"k": 1}},
    {"incidents": {"k": {"state": "firing"}}},
    {"incidents": {"k": {**_INCIDENT, "first_seen": "yesterday"}}},
    {"incidents": {"k": {**_INCIDENT, "kind": "nonsense"}}},
    {"incidents": {"k": {**_INCIDENT, "first_seen": float("inf")}}},
    {"incidents": {"k": {**_INCIDENT, "first_seen": 1e300}}},
    {"outbox": []},
    {"outbox": {"list": [1]}},
    {"outbox": {"list": [{"id": "x"}]}},
    {"outbox": {"list": [{**_ITEM, "message": {"alert_key": "k", "kind": "run_failure"}}]}},
    {"outbox": {"list": [{**_ITEM, "message": {"alert_key": "k", "state": "firing"}}]}},
    {"history": [1]},
    {"history": {"a": 1}},
    {"positions": []},
    {"positions": {"RUN_FAILURE": "abc"}},
    {"positions": {"checks": {"a:b": "x"}}},
    {"positions": {"checks_ahead": []}},
    {"positions": {"checks_ahead": {"a:b": ["x"]}}},
    {"positions": {"checks_ahead": {"a:b": 5}}},
]


@pytest.mark.parametrize("state", BAD_STATES, ids=range(len(BAD_STATES)))
def test_valid_json_of_another_shape_starts_afresh_with_one_warning(state):
    warnings: list[str] = []
    book = AlertBook.load(json.dumps(state), warnings.append)
    assert len(warnings) == 1
    assert book.reset is not None
    sink = ListSink()
    _run(book, [_check(False)], sink, max_per_tick=1)
    book.prune(NOW)
    assert [m["state"] for m in sink.messages] == [FIRING]
    assert book.open_incidents()[0]["alert_key"] == "check_failure:orders:not_empty"


def test_a_good_state_is_no_reset():
    book = AlertBook()
    _run(book, [_check(False)], ListSink())
    assert AlertBook.load(book.dumps()).reset is None


@pytest.mark.parametrize("ahead", [{}, {"checks_ahead": {"a:b": [5, 6]}}], ids=["saved before", "ids read ahead"])
def test_the_read_positions_of_checks_load_with_or_without_ids_read_beyond_one_still_being_evaluated(ahead):
    assert AlertBook.load(json.dumps({"positions": {"checks": {"a:b": 3}, **ahead}})).reset is None


class PickySink(ListSink):
    """Refuses every message of one alert key, takes the others."""

    def __init__(self, refused: str) -> None:
        super().__init__("picky")
        self.refused = refused

    def send(self, message):
        if message["alert_key"] == self.refused:
            raise SinkError("400: this one is refused")
        self.messages.append(dict(message))


def _failing_ticks(sensor: str):
    return ticks_seen(sensor, "sensor", ["FAILURE"] * 3, "boom", threshold=3, ui_url=None, repository=HERE)


def test_one_refused_message_does_not_hold_the_ones_behind_it():
    book = AlertBook()
    sink = PickySink("tick_failure:poison")
    for i, name in enumerate(["poison", "a", "b", "c", "d", "e"]):
        book.enqueue(book.observe(_failing_ticks(name), NOW + i), [sink.name])
    for t in range(10):
        book.deliver([sink], NOW + 10 + t * 60, policy=fixed(30, None), max_per_tick=20)
    assert sorted(m["alert_key"] for m in sink.messages) == [f"tick_failure:{n}" for n in "abcde"]
    assert [i["id"].split("#")[0] for i in book.outbox["picky"]] == ["tick_failure:poison"]


def test_a_sink_that_is_down_is_tried_at_most_twice_a_tick():
    book, sink = AlertBook(), ListSink(fail=100)
    for i, name in enumerate("abcde"):
        book.enqueue(book.observe(_failing_ticks(name), NOW + i), [sink.name])
    done = book.deliver([sink], NOW + 10, policy=NO_WAIT, max_per_tick=20)
    assert len(done.failed) == 2
    assert len(book.outbox["list"]) == 5


def test_a_backlog_summary_names_every_alert_it_stands_for():
    book, sink = AlertBook(), ListSink()
    names = [f"a_rather_long_asset_name_number_{i}" for i in range(43)]
    signals = [check_evaluated(n, "not_empty", False, "ERROR", "bad", run_id=None, ui_url=None) for n in names]
    done = _run(book, signals, sink, max_per_tick=20)
    assert done.summarised == 23
    summary = sink.messages[-1]["summary"]
    named = [n for n in names[20:] if f"check_failure:{n}:not_empty firing" in summary]
    assert named == names[20:]


def _trickling_server(bytes_: int, every: float):
    """Answers 200 with a body of ``bytes_`` bytes, one every ``every`` seconds: no single read
    waits long, the whole answer does."""
    import time

    def trickle(conn):
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % bytes_)
        for _ in range(bytes_):
            time.sleep(every)  # the trickle itself is what is under test
            conn.sendall(b"x")

    return _tcp_server(trickle)


def test_a_webhook_trickling_its_answer_is_cut_at_the_deadline_of_the_whole_request():
    listener = _trickling_server(200, 0.1)  # 20 s in all, never 1 s without a byte
    try:
        with pytest.raises(SinkError, match="did not answer within 1 s"):
            WebhookSink(f"http://127.0.0.1:{listener.getsockname()[1]}/hook", timeout=1).send(_message())
    finally:
        listener.close()


class SlowSink(ListSink):
    """Each send moves a fake clock on by ``cost`` seconds."""

    def __init__(self, clock: list[float], cost: float) -> None:
        super().__init__("slow")
        self.clock, self.cost = clock, cost

    def send(self, message):
        self.clock[0] += self.cost
        super().send(message)


def test_a_tick_stops_sending_when_its_budget_is_spent_and_the_rest_go_next_tick():
    clock = [0.0]
    book, sink = AlertBook(), SlowSink(clock, 8)
    for i, name in enumerate("abcde"):
        book.enqueue(book.observe(_failing_ticks(name), NOW + i), [sink.name])
    first = book.deliver([sink], NOW + 10, policy=NO_WAIT, max_per_tick=20, deadline=20, clock=lambda: clock[0])
    assert len(sink.messages) == 3  # sent at 0, 8 and 16; at 24 the budget (20) is spent
    assert "budget" in first.describe()
    book.deliver([sink], NOW + 70, policy=NO_WAIT, max_per_tick=20, deadline=clock[0] + 20, clock=lambda: clock[0])
    assert [m["alert_key"] for m in sink.messages] == [f"tick_failure:{n}" for n in "abcde"]


def test_each_message_carries_the_id_of_its_state_change_the_same_on_every_attempt():
    book, sink = AlertBook(), ListSink(fail=0)
    book.enqueue(book.observe(_check(False), NOW), ["list", "other"])
    other = ListSink("other")
    book.deliver([sink, other], NOW, policy=NO_WAIT, max_per_tick=20)
    book.enqueue(book.observe(_check(True), NOW + 60), ["list"])
    book.deliver([sink], NOW + 60, policy=NO_WAIT, max_per_tick=20)
    firing, resolved = sink.messages
    assert other.messages[0]["message_id"] == firing["message_id"]
    assert firing["message_id"] != resolved["message_id"]
    assert resolved["message_id"].startswith("check_failure:orders:not_empty#")


def test_a_sink_not_yet_tried_with_messages_waiting_is_not_known_to_deliver():
    book = AlertBook()
    book.enqueue(book.observe(_check(False), NOW), ["list"])
    assert book.undeliverable(["list"]) == ["list"]
    book.deliver([ListSink()], NOW, policy=NO_WAIT, max_per_tick=20)
    assert book.undeliverable(["list"]) == []


def test_a_resolution_waits_for_its_firing_that_a_sink_refused_however_many_ticks_later():
    # the sink is down for three ticks (30 s doubling); the check passes again meanwhile
    book, sink = AlertBook(), ListSink(fail=3)
    for minute, passed in enumerate([False, False, True, True, True]):
        _run(book, [_check(passed)], sink, now=NOW + 60 * minute, policy=exponential(30, 2, 900, 8))
    assert [m["state"] for m in sink.messages] == [FIRING, RESOLVED]


def test_a_summary_holds_no_message_whose_incidents_earlier_one_was_refused():
    book, sink = AlertBook(), ListSink(fail=1)
    book.enqueue(book.observe(_check(False), NOW), [sink.name])
    for name in "ab":
        book.enqueue(book.observe(_failing_ticks(name), NOW), [sink.name])
    book.enqueue(book.observe(_check(True), NOW + 1), [sink.name])
    for t in range(2):
        book.deliver([sink], NOW + 1 + t, policy=NO_WAIT, max_per_tick=3)
    kinds = [m["kind"] for m in sink.messages]
    assert kinds == ["tick_failure", "tick_failure", "check_failure", "check_failure"]
    assert [m["state"] for m in sink.messages if m["kind"] == "check_failure"] == [FIRING, RESOLVED]


def _resolved_ticks(sensor: str):
    return ticks_seen(sensor, "sensor", ["SUCCESS", "FAILURE"], None, threshold=3, ui_url=None, repository=HERE)


def test_a_summary_of_resolutions_is_a_resolved_info_message():
    book, sink = AlertBook(), ListSink()
    _run(book, [_failing_ticks(name) for name in "abcde"], sink)
    _run(book, [_resolved_ticks(name) for name in "abcde"], sink, now=NOW + 60, max_per_tick=2)
    summary = sink.messages[-1]
    assert summary["kind"] == "summary"
    assert summary["state"] == RESOLVED
    assert summary["severity"] == "info"
    assert summary["message_id"].endswith("#resolved")
    assert text_of(summary).startswith("RESOLVED 3 more alerts this tick (3 resolved): tick_failure:c resolved, ")


def test_a_summary_links_its_runbook_under_the_runbook_base_url():
    book, sink = AlertBook(), ListSink()
    for name in "abc":
        book.enqueue(book.observe(_failing_ticks(name), NOW), [sink.name])
    book.deliver([sink], NOW, policy=NO_WAIT, max_per_tick=1, runbook_url="https://runbooks.example/docs")
    assert sink.messages[-1]["runbook"] == "https://runbooks.example/docs/summary.md"


def test_a_mixed_summary_fires_at_the_worst_severity_of_what_fires_and_says_what_it_holds():
    book, sink = AlertBook(), ListSink()
    _run(book, [_failing_ticks(name) for name in "ab"], sink)  # critical
    warnings = [check_evaluated(n, "c", False, "WARN", "bad", run_id=None, ui_url=None) for n in ("x", "y")]
    _run(book, [_resolved_ticks("a"), _resolved_ticks("b"), *warnings], sink, now=NOW + 60, max_per_tick=1)
    summary = sink.messages[-1]
    assert summary["state"] == FIRING
    assert summary["severity"] == "warning"
    assert summary["title"] == "3 more alerts this tick (2 firing, 1 resolved)"
