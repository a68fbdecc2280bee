"""Dagster wiring of alerting: the ``alerts`` sensor and the ``alerts/incidents`` asset.

Each tick of the sensor reads what happened since its last tick from the instance (run failures
and successes, asset check evaluations, the ticks of every sensor and schedule) and the
capabilities' own measures (the dead-letter queues' depth), turns them into incidents
(``pipelines.alerts.incidents``), delivers each state change to the configured sinks and publishes
its heartbeat metric. Its state (incidents, outboxes, read positions) is one JSON document in the
instance's key-value store (and a copy), saved after each message a sink took: delivery is at
least once, each message with the ``message_id`` of its state change (docs/alerts.md).
"""

import json
import os
import time
import uuid
from collections.abc import Iterator

import dagster as dg
import sqlalchemy as db
from sqlalchemy import exc as db_exc

from pipelines.alerts.config import AlertConfig, alert_config
from pipelines.alerts.heartbeat import publish_heartbeat
from pipelines.alerts.incidents import AlertBook, Signal, iso_seconds, notice, one_line
from pipelines.alerts.sinks import WEBHOOK_TIMEOUT_SECONDS
from pipelines.alerts.sources import (
    automatic_retry,
    check_evaluated,
    dead_letters,
    lineage_root,
    run_failed,
    run_succeeded,
    ticks_seen,
)
from pipelines.common.defs.metadata import table_from
from resources.clients import CloudWatchResource, SNSResource, SQSResource
from resources.settings import AlertSettings, FleetSettings

SENSOR_NAME = "alerts"
STATE_KEY = "groundskeeper/alerts/state"
STATE_COPY_KEY = "groundskeeper/alerts/state-copy"  # the same document, read when the first is gone
LEASE_KEY = "groundskeeper/alerts/lease"  # who is evaluating the sensor now, and until when
KEY_VALUES = db.table("kvs", db.column("key"), db.column("value"))  # the SQL run storage's key-value table
ASSET_KEY = dg.AssetKey(["alerts", "incidents"])
FIRST_TICK_LOOKBACK_SECONDS = 3600  # with no read position yet, the last hour is read
EVENTS_PER_TICK = 200  # run events read per query and kind (queried again until caught up or out of time)
TICKS_READ = 10  # latest ticks read per sensor and schedule
RUN_STATUS_EVENTS = (dg.DagsterEventType.RUN_FAILURE, dg.DagsterEventType.RUN_SUCCESS)
CHECKS_READ = 20  # latest evaluations read per check and tick


def now() -> float:
    return time.time()


_ACCOUNTS: dict[tuple, str | None] = {}  # the caller's account, per SNS configuration: asked once


def caller_account(sns: SNSResource, warn) -> str | None:
    """The deployment's AWS account (STS GetCallerIdentity, once per process and configuration);
    None when it cannot be told (one line), and the topic's account is then not checked."""
    key = (sns.region_name, sns.endpoint_url, sns.profile_name, sns.aws_access_key_id)
    if key not in _ACCOUNTS:
        try:
            _ACCOUNTS[key] = sns.get_sts_client().get_caller_identity()["Account"]
        except Exception as exc:
            warn(f"the deployment's AWS account is unknown ({one_line(exc, 200)}): the topic's is not checked")
            return None
    return _ACCOUNTS[key]


def tick_budget_seconds() -> float:
    """How long after its start a tick may begin another read or send: half the daemon's sensor
    evaluation timeout (``DAGSTER_SENSOR_GRPC_TIMEOUT_SECONDS``, else ``DAGSTER_GRPC_TIMEOUT_SECONDS``,
    default 60 s) less the longest request, so that a tick ends well inside it (the rest: next tick)."""
    return max(1.0, sensor_timeout_seconds() / 2 - WEBHOOK_TIMEOUT_SECONDS)


def load_book(instance: dg.DagsterInstance, warn=lambda _: None) -> AlertBook:
    """The saved book; when its document is gone or unreadable, its copy (open incidents are never
    forgotten while either is there), else a fresh one."""
    saved = instance.run_storage.get_cursor_values({STATE_KEY, STATE_COPY_KEY})
    book = AlertBook.load(saved.get(STATE_KEY), lambda _: None)
    if saved.get(STATE_KEY) and not book.reset:
        return book
    if saved.get(STATE_COPY_KEY):
        copy = AlertBook.load(saved[STATE_COPY_KEY], lambda _: None)
        if not copy.reset:
            warn(f"alert state {'unreadable' if saved.get(STATE_KEY) else 'missing'}: using its copy")
            return copy
    return AlertBook.load(saved.get(STATE_KEY), warn)


def save_book(instance: dg.DagsterInstance, book: AlertBook) -> None:
    text = book.dumps()
    instance.run_storage.set_cursor_values({STATE_KEY: text, STATE_COPY_KEY: text})


def sensor_timeout_seconds() -> float:
    """The daemon's sensor evaluation timeout (``DAGSTER_SENSOR_GRPC_TIMEOUT_SECONDS``, else
    ``DAGSTER_GRPC_TIMEOUT_SECONDS``, default 60 s)."""
    for name in ("DAGSTER_SENSOR_GRPC_TIMEOUT_SECONDS", "DAGSTER_GRPC_TIMEOUT_SECONDS"):  # as Dagster reads them
        if os.environ.get(name):
            try:
                return float(os.environ[name])
            except ValueError:
                break
    return 60.0


def lease_seconds() -> float:
    """How long an evaluation's lease lasts: longer than any tick (its budget, the last request and
    a margin for the reads and saves), so that it lapses only when its holder died."""
    return max(sensor_timeout_seconds(), tick_budget_seconds() + WEBHOOK_TIMEOUT_SECONDS + 30)


def compare_and_set(instance: dg.DagsterInstance, key: str, expected: str | None, new: str) -> bool:
    """Sets ``key`` of the instance's key-value store to ``new`` only if it holds ``expected`` (None:
    no value), in one statement of its SQL run storage (SQLite, PostgreSQL, MySQL): of two
    evaluations that read the same value, one only sets it."""
    storage = instance.run_storage
    with storage.connect() as conn:
        if expected is None:
            try:
                conn.execute(KEY_VALUES.insert().values(key=key, value=new))
                return True
            except db_exc.IntegrityError:
                return False
        table = KEY_VALUES.c
        update = KEY_VALUES.update().where(table.key == key).where(table.value == expected)
        return conn.execute(update.values(value=new)).rowcount == 1


def take_lease(instance: dg.DagsterInstance, seconds: float, warn) -> tuple[str | None, str | None]:
    """(the lease taken, or None; why not). One evaluation of the sensor at a time: a second one
    (a tick that overran, the UI's "Test sensor", two code servers during a deploy) sends nothing.
    A lease lasts ``seconds`` (a crashed holder's lapses)."""
    if not hasattr(instance.run_storage, "connect"):  # not a SQL run storage: no compare-and-set
        warn("the instance's run storage is not SQL: two evaluations at once could repeat an alert")
        return "", None
    current = instance.run_storage.get_cursor_values({LEASE_KEY}).get(LEASE_KEY)
    try:
        until = float(json.loads(current)["until"]) if current else 0.0
    except (ValueError, TypeError, KeyError):
        until = 0.0  # unreadable: lapsed
    if until > now():
        return None, f"another evaluation of the sensor holds its lease until {iso_seconds(until)}: nothing sent"
    mine = json.dumps({"holder": uuid.uuid4().hex, "until": now() + seconds})
    if not compare_and_set(instance, LEASE_KEY, current, mine):
        return None, "another evaluation of the sensor took its lease first: nothing sent"
    return mine, None


def give_back_lease(instance: dg.DagsterInstance, lease: str) -> None:
    if lease:
        compare_and_set(instance, LEASE_KEY, lease, json.dumps({"holder": None, "until": 0}))


# ---------------------------------------------------------------------------- what happened


def _status_changes(instance, book: AlertBook, event_type, clock: float) -> list:
    after = book.positions.get(event_type.value)
    return instance.fetch_run_status_changes(
        dg.RunStatusChangeRecordsFilter(
            event_type=event_type,
            after_storage_id=after,
            after_timestamp=clock - FIRST_TICK_LOOKBACK_SECONDS if after is None else None,
        ),
        limit=EVENTS_PER_TICK,
        ascending=True,
    ).records


def status_changes_in_order(instance, book: AlertBook, clock: float) -> tuple[list[tuple[object, bool]], bool]:
    """Run failures and successes since the last read, at most ``EVENTS_PER_TICK`` of each kind, in
    the order they happened: ([(record, failed)], whether more remain). When one kind has more than
    that, the other is read only as far, so that a success is never taken before a failure that
    happened earlier but is left for the next read."""
    kinds = {kind: _status_changes(instance, book, kind, clock) for kind in RUN_STATUS_EVENTS}
    full = [records[-1].storage_id for records in kinds.values() if len(records) >= EVENTS_PER_TICK]
    bound = min(full) if full else None
    changes = []
    for kind, records in kinds.items():
        kept = [r for r in records if bound is None or r.storage_id <= bound]
        if kept:
            book.positions[kind.value] = kept[-1].storage_id
        changes += [(r, kind == dg.DagsterEventType.RUN_FAILURE) for r in kept]
    return sorted(changes, key=lambda pair: pair[0].storage_id), bool(full)


def _first_error(instance: dg.DagsterInstance, run_id: str) -> str:
    """The error of the first failed step of ``run_id``, else its run-failure message."""
    steps = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.STEP_FAILURE, limit=1).records
    for record in steps:
        data = record.event_log_entry.dagster_event.step_failure_data
        if data and data.user_failure_data and data.user_failure_data.description:
            return data.user_failure_data.description
        if data and data.error:
            error = data.error  # the user's error, not Dagster's wrapping of it
            while error.cause is not None and error.cls_name.startswith("Dagster"):
                error = error.cause
            return error.message
    failed = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.RUN_FAILURE, limit=1).records
    for record in failed:
        return record.event_log_entry.dagster_event.message or ""
    return ""


def run_target(instance: dg.DagsterInstance, run: dg.DagsterRun) -> str:
    """What a run is of, for its alert: its job, or for a run of Dagster's own asset job (a
    materialization or backfill launched from the UI, a partition redrive) the assets it planned."""
    if not run.job_name.startswith("__"):
        return run.job_name
    keys = set(run.asset_selection or ())
    if not keys:
        planned = instance.get_records_for_run(
            run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED, limit=100
        ).records
        keys = {r.event_log_entry.dagster_event.asset_key for r in planned if r.event_log_entry.dagster_event}
    return ",".join(sorted(key.to_user_string() for key in keys if key)) or run.job_name


def run_signals(
    context, instance: dg.DagsterInstance, book: AlertBook, cfg: AlertConfig, clock: float, deadline: float
) -> tuple[list, str | None]:
    """Reads run failures and successes until caught up or ``deadline`` (``time.monotonic``) has
    passed: (the signals, a line on how far behind it still is, or None)."""
    out: list[Signal] = []
    read, more, last = 0, True, None
    while more and (read == 0 or time.monotonic() < deadline):
        changes, more = status_changes_in_order(instance, book, clock)
        out += _run_signals_of(context, instance, changes, cfg)
        read += len(changes)
        last = changes[-1][0] if changes else last
    if not more:
        return out, None
    behind = f", behind by {clock - last.timestamp:.0f} s" if last is not None else ""
    return out, f"run events: {read} read this tick, more remain{behind}: the rest next tick"


def _run_signals_of(context, instance: dg.DagsterInstance, changes: list, cfg: AlertConfig) -> list:
    """A run whose lineage finally failed (no automatic retry follows) fires; a success resolves."""
    out: list[Signal] = []
    ids = list({record.run_id for record, _ in changes})
    records = instance.get_run_records(dg.RunsFilter(run_ids=ids)) if ids else []
    runs = {r.dagster_run.run_id: r.dagster_run for r in records}
    for record, failed in changes:
        run = runs.get(record.run_id)
        if run is None:
            continue
        tags = dict(run.tags)
        if not failed:
            out += run_succeeded(run_target(instance, run), run.run_id, tags, ui_url=cfg.ui_url)
            continue
        why = automatic_retry(
            tags,
            dagster_retries=instance.run_retries_enabled,
            dagster_max_retries=instance.run_retries_max_retries,
            retry_on_step_failure=instance.run_retries_retry_on_asset_or_op_failure,
        )
        if why:
            context.log.info(f"run {run.run_id} of {run.job_name} failed; no alert, {why}")
            continue
        first = _first_error(instance, lineage_root(run.run_id, tags)) or _first_error(instance, run.run_id)
        out.append(run_failed(run_target(instance, run), run.run_id, tags, first, ui_url=cfg.ui_url))
    return out


def _run_going(instance: dg.DagsterInstance, run_id: str) -> bool:
    run = instance.get_run_by_id(run_id)
    return run is not None and not run.is_finished


def check_signals(context, instance: dg.DagsterInstance, book: AlertBook, cfg: AlertConfig) -> list:
    """Each asset check of the code location: its evaluations since the last one read, oldest first
    (the first time, only its latest). Execution ids are global in every storage (SQLite too)."""
    repository = context.repository_def
    if repository is None:
        return []
    seen = book.positions.setdefault("checks", {})
    out = []
    for key in sorted(repository.asset_graph.asset_check_keys, key=str):
        name = key.to_user_string()
        history = instance.event_log_storage.get_asset_check_execution_history(key, limit=CHECKS_READ)
        last = seen.get(name)
        new = [r for r in history if last is None or r.id > last][: 1 if last is None else None]
        for record in sorted(new, key=lambda r: r.id):
            if record.status.value == "PLANNED":  # planned, not yet evaluated
                if _run_going(instance, record.run_id):
                    break  # still being evaluated: read it (and what follows) on a later tick
                seen[name] = record.id  # its run ended without evaluating it (the run alerts)
                continue
            seen[name] = record.id
            data = record.evaluation
            if not isinstance(data, dg.AssetCheckEvaluation):
                continue
            signal = check_evaluated(
                data.asset_key.to_user_string(),
                data.check_name,
                data.passed,
                data.severity.value,
                data.description,
                run_id=record.run_id,
                ui_url=cfg.ui_url,
                muted=cfg.muted_checks,
            )
            if signal is not None:
                out.append(signal)
    return out


def tick_signals(instance: dg.DagsterInstance, cfg: AlertConfig) -> Iterator[Signal]:
    """Every sensor and schedule the instance knows: N failed ticks in a row fire; a good tick resolves."""
    for state in instance.all_instigator_state():
        kind = {"SENSOR": "sensor", "SCHEDULE": "schedule"}.get(state.instigator_type.value)
        if kind is None:
            continue
        ticks = instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=TICKS_READ)
        statuses = [tick.status.value for tick in ticks]
        error = next((t.error.message for t in ticks if t.error is not None), None)
        signal = ticks_seen(
            state.instigator_name, kind, statuses, error, threshold=cfg.tick_failures, ui_url=cfg.ui_url
        )
        if signal is not None:
            yield signal


def dead_letter_signals(context, sqs, fleet: FleetSettings) -> Iterator[Signal]:
    for url in (fleet.termination_dlq_url, fleet.housekeeping_dlq_url):
        name = url.rstrip("/").rsplit("/", 1)[-1]
        try:
            attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"])
            depth = int(attributes["Attributes"]["ApproximateNumberOfMessages"])
        except Exception as exc:  # one line; the incident keeps its state until the queue can be read
            context.log.warning(f"dead letters of {name}: not read this tick ({one_line(exc, 200)})")
            continue
        signal = dead_letters(name, depth)
        if signal is not None:
            yield signal


# ---------------------------------------------------------------------------- the sensor


def build_alerts_sensor(
    *, demo_noise: frozenset[str] = frozenset(), minimum_interval_seconds: int = 60
) -> dg.SensorDefinition:
    """``demo_noise``: kinds recorded as incidents but never sent (the local demo's expected dead letters).
    ``minimum_interval_seconds``: how often the daemon evaluates it (the heartbeat alarm allows 10 minutes)."""

    @dg.sensor(
        name=SENSOR_NAME,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            "Turns failed runs (after their automatic retries), failed asset checks, failing ticks and "
            "dead letters into incidents, sends one message when each opens and one when it resolves "
            "(ALERTS_SNS_TOPIC_ARN, ALERTS_WEBHOOK_URL) and publishes the AlertsHeartbeat metric."
        ),
    )
    def alerts(
        context: dg.SensorEvaluationContext,
        alerts: AlertSettings,
        fleet: FleetSettings,
        sns: SNSResource,
        sqs: SQSResource,
        cloudwatch: CloudWatchResource,
    ) -> dg.SkipReason:
        lease, busy = take_lease(context.instance, lease_seconds(), context.log.warning)
        if lease is None:
            return dg.SkipReason(busy)
        try:
            return _evaluate(context, alerts, fleet, sns, sqs, cloudwatch, demo_noise)
        finally:
            give_back_lease(context.instance, lease)

    return alerts


def _evaluate(context, alerts: AlertSettings, fleet: FleetSettings, sns: SNSResource, sqs: SQSResource,
              cloudwatch: CloudWatchResource, demo_noise: frozenset[str]) -> dg.SkipReason:  # fmt: skip
    """One evaluation of the ``alerts`` sensor, under its lease."""
    deadline = time.monotonic() + tick_budget_seconds()
    instance = context.instance
    settings = alerts.as_env()
    region = sns.region_name or os.environ.get("AWS_REGION") or "us-east-1"
    topic = settings.get("ALERTS_SNS_TOPIC_ARN")
    cfg = alert_config(settings, sns=sns.get_client() if topic else None, region=region,
                       account=caller_account(sns, context.log.warning) if topic else None)  # fmt: skip
    for problem in cfg.problems:
        context.log.warning(problem)
    book = load_book(instance, context.log.warning)
    clock = now()
    if book.reset:
        reset = notice("state_reset", "the alert state was unreadable: started afresh", book.reset, clock)
        book.enqueue(reset, [sink.name for sink in cfg.sinks])
    run_changes, behind = run_signals(context, instance, book, cfg, clock, deadline)
    if behind:
        context.log.warning(behind)
    signals = [
        *run_changes,
        *check_signals(context, instance, book, cfg),
        *tick_signals(instance, cfg),
        *dead_letter_signals(context, sqs.get_client(), fleet),
    ]
    changes, noise = [], []
    for signal in signals:
        message = book.observe(signal, clock, remind_seconds=cfg.remind_seconds)
        if message is None:
            continue
        if signal.kind in demo_noise:
            noise.append(signal.alert_key)
            continue
        changes.append(f"{message['alert_key']} {message['state']}")
        for line in book.enqueue(message, [sink.name for sink in cfg.sinks]):
            context.log.warning(line)
    save_book(instance, book)  # the read positions and the outboxes, before anything is sent
    delivery = book.deliver(
        cfg.sinks, clock, policy=cfg.policy, max_per_tick=cfg.max_per_tick, save=lambda: save_book(instance, book),
        deadline=deadline,
    )  # fmt: skip
    for line in delivery.failed:
        context.log.warning(line)
    book.prune(clock)
    save_book(instance, book)
    parts = [delivery.describe(), f"{len(book.open_incidents())} open incident(s)", *([behind] if behind else [])]
    stuck = book.undeliverable(sink.name for sink in cfg.sinks)
    if stuck:  # alerts cannot be delivered: the heartbeat alarm pages, by the template's own action
        parts.append(f"no heartbeat: {', '.join(stuck)} cannot deliver (messages wait, none taken since)")
    else:
        try:
            publish_heartbeat(cloudwatch.get_client(), fleet.metrics_namespace, cfg.heartbeat_env)
        except Exception as exc:
            context.log.warning(f"heartbeat not published: {one_line(exc, 200)}")
    if not cfg.sinks:
        parts.append("no sink configured (ALERTS_SNS_TOPIC_ARN, ALERTS_WEBHOOK_URL)")
    if noise:
        parts.append(f"demo noise, not sent: {', '.join(noise[:5])}")
    if changes:
        context.log.info(f"state changes: {', '.join(changes)}")
    return dg.SkipReason("; ".join(parts))


# ---------------------------------------------------------------------------- the asset

INCIDENT_COLUMNS = {"alert_key": "alert", "severity": "severity", "since": "since", "summary": "summary"}


@dg.asset(
    key=ASSET_KEY,
    group_name="alerts",
    description="The open incidents of the alerts sensor (inline table) and the last 24 h of opened/resolved counts.",
    tags={"groundskeeper/capability": "alerts"},
)
def incidents(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
    book = load_book(context.instance, context.log.warning)
    rows = [
        {**i, "since": iso_seconds(i["first_seen"]), "summary": i.get("summary", "")} for i in book.open_incidents()
    ]
    counts = book.counts_since(now() - 86400)
    context.log.info(
        f"{len(rows)} open incident(s); last 24 h: {counts['opened']} opened, {counts['resolved']} resolved"
    )
    return dg.MaterializeResult(
        metadata={
            "open": dg.MetadataValue.int(len(rows)),
            "opened_24h": dg.MetadataValue.int(counts["opened"]),
            "resolved_24h": dg.MetadataValue.int(counts["resolved"]),
            "incidents": table_from(rows, INCIDENT_COLUMNS),
        }
    )


def build_defs(deployment: str) -> dg.Definitions:
    """Alerting: the ``alerts`` sensor (on by default; it sends only where a sink is configured) and
    the ``alerts/incidents`` asset. Locally, the demo's dead letters are noise, never sent."""
    noise = frozenset({"dead_letters"}) if deployment == "local" else frozenset()
    return dg.Definitions(assets=[incidents], sensors=[build_alerts_sensor(demo_noise=noise)])
