"""The ``alerts`` sensor, the ``alerts/incidents`` asset and ``close_incident`` (docs/alerts.md)."""

import contextlib
import dataclasses
import datetime as dt
import hashlib
import json
import os
import time
import uuid
from collections.abc import Callable, Container, Iterator

import dagster as dg
import sqlalchemy as db
from sqlalchemy import exc as db_exc

from pipelines.alerts.incidents import FIRING, AlertBook, Signal, iso_seconds, notice
from pipelines.alerts.params import IncidentAction
from pipelines.alerts.sinks import REQUEST_TIMEOUT_SECONDS, AlertConfig, NoAnswer, alert_config, within
from pipelines.alerts.sources import (
    CAPABILITY_TAG,
    RunEnd,
    as_demo,
    automatic_retry,
    cause_of,
    check_evaluated,
    dead_letters,
    depth_unread,
    lineage_root,
    partition_materialized,
    run_failed,
    run_succeeded,
    ticks_seen,
    work_unit,
)
from pipelines.common import first_line
from pipelines.common.aws_batches import datum, put_metrics
from pipelines.common.defs.active_runs import child_run, first_position, not_retried, run_assets, status_changes
from pipelines.common.defs.metadata import metadata_from, table_from
from pipelines.common.defs.tasks import one_op_job
from pipelines.common.params import ParamsError, parse_params
from pipelines.common.sqs import dead_letter_depth, queue_name
from pipelines.common.summary import is_dry_run
from pipelines.retry import fixed
from pipelines.retry.runs import RETRY_SENSOR
from pipelines.retry.simulate import human
from pipelines.retry.tags import DAGSTER_PARENT_TAG, POLICY_TAG
from resources.clients import SNSResource
from resources.settings import FleetSettings

SENSOR_NAME = "alerts"
CLOSE_JOB = "close_incident"  # an operator's acknowledge or close, applied by the sensor's next tick
STATE_KEY = "groundskeeper/alerts/state"
STATE_COPY_KEY = "groundskeeper/alerts/state-copy"  # the same document, read when the first is gone
LEASE_KEY = "groundskeeper/alerts/lease"  # who is evaluating the sensor now, and until when
KEY_VALUES = db.table("kvs", db.column("key"), db.column("value"))  # the SQL run storage's key-value table
ASSET_KEY = dg.AssetKey(["alerts", "incidents"])
REBUILD_LOOKBACK_SECONDS = 7 * 86400  # a fresh state's open incidents: rebuilt from the runs of the last 7 days
REBUILD_PAGE = 500  # run records read per query while rebuilding
EVENTS_PER_TICK = 200  # run events read per query and kind (queried again until caught up or out of time)
TICKS_READ = 10  # ticks read per sensor and schedule beyond ALERTS_TICK_FAILURES (some may still be running)
RUN_STATUS_EVENTS = (dg.DagsterEventType.RUN_FAILURE, dg.DagsterEventType.RUN_SUCCESS)
CHECKS_READ = 20  # latest evaluations read per check and tick
CHECK_GONE = "its check is no longer defined in the code location (removed or renamed)"  # resolves its incidents
PARTITIONS_CHECKED = 20  # open run failures of asset partitions asked per tick whether materialized since
HEARTBEAT_METRIC = "AlertsHeartbeat"  # the template's alarm pages when none came for 10 minutes
HEARTBEAT_POLICY = fixed(1, 3)  # a throttled PutMetricData is tried twice more within the tick
UNDELIVERED = "undelivered_ticks"  # positions[...]: per sink that cannot deliver, for how many ticks in a row
UNDELIVERED_TICKS = 10  # then the sinks that deliver are told, once: the heartbeat alarm goes to the alerts topic
UNDELIVERED_TOLD = "undelivered_told"  # positions[...]: the sinks the others were told of (until they deliver)


def now() -> float:
    return time.time()


_ACCOUNTS: dict[tuple, str | None] = {}  # the caller's account, per SNS configuration: asked once


def caller_account(sns: SNSResource, warn) -> str | None:
    """The deployment's AWS account (STS, once per process and configuration), or None (one line)."""
    key = (sns.region_name, sns.endpoint_url, sns.profile_name, sns.aws_access_key_id)
    if key not in _ACCOUNTS:
        try:
            _ACCOUNTS[key] = within(REQUEST_TIMEOUT_SECONDS, sns.get_sts_client().get_caller_identity)["Account"]
        except Exception as exc:
            warn(f"the deployment's AWS account is unknown ({first_line(exc, 200)}): the topic's is not checked")
            return None
    return _ACCOUNTS[key]


def destination(sink) -> str:
    """Where a sink sends, as the saved state keeps it: its topic, else a digest of its URL (a secret)."""
    return getattr(sink, "topic_arn", None) or hashlib.sha256(getattr(sink, "url", "").encode()).hexdigest()[:16]


def tick_budget_seconds() -> float:
    """How long after its start a tick may begin another send (a read: half as long, the rest is kept for sending):
    it ends well inside the daemon's timeout."""
    return max(1.0, sensor_timeout_seconds() / 2 - REQUEST_TIMEOUT_SECONDS)


def load_book(instance: dg.DagsterInstance, warn=lambda _: None) -> AlertBook:
    """The saved book; when its document is gone or unreadable, its copy, else a fresh one."""
    saved = instance.run_storage.get_cursor_values({STATE_KEY, STATE_COPY_KEY})
    book = AlertBook.load(saved.get(STATE_KEY))
    if not book.fresh:
        return book
    copy = AlertBook.load(saved.get(STATE_COPY_KEY))
    if not copy.fresh:
        warn(f"alert state {'unreadable' if saved.get(STATE_KEY) else 'missing'}: using its copy")
        return copy
    # fresh: the sensor rebuilds it (rebuild_run_signals); a document there but unreadable is a reset
    return AlertBook.load(saved.get(STATE_KEY) or saved.get(STATE_COPY_KEY), warn)


def save_book(instance: dg.DagsterInstance, book: AlertBook) -> None:
    text = book.dumps()
    instance.run_storage.set_cursor_values({STATE_KEY: text, STATE_COPY_KEY: text})


def sensor_timeout_seconds() -> float:
    """The daemon's sensor evaluation timeout, read as Dagster reads it (default 60 s)."""
    for name in ("DAGSTER_SENSOR_GRPC_TIMEOUT_SECONDS", "DAGSTER_GRPC_TIMEOUT_SECONDS"):
        if os.environ.get(name):
            try:
                return float(os.environ[name])
            except ValueError:
                break
    return 60.0


def compare_and_set(instance: dg.DagsterInstance, key: str, expected: str | None, new: str) -> bool:
    """Sets ``key`` of the instance's key-value store to ``new`` only if it holds ``expected`` (None: no
    value), in one statement of its SQL run storage: of two evaluations that read the same value, one sets it."""
    with instance.run_storage.connect() as conn:
        if expected is None:
            try:
                conn.execute(KEY_VALUES.insert().values(key=key, value=new))
                return True
            except db_exc.IntegrityError:
                return False
        update = KEY_VALUES.update().where(KEY_VALUES.c.key == key).where(KEY_VALUES.c.value == expected)
        return conn.execute(update.values(value=new)).rowcount == 1


@contextlib.contextmanager
def sensor_lease(instance: dg.DagsterInstance, warn) -> Iterator[str | Callable[[], bool]]:
    """Holds the sensor's lease (one evaluation at a time) and yields its renewal, else yields why not. The
    lease outlasts any tick (its budget, the last request, a margin) from its last renewal; ``renew()`` is
    False once another evaluation took it (this one outlived it: it must neither save nor send)."""
    if not hasattr(instance.run_storage, "connect"):  # not a SQL run storage: no compare-and-set
        warn("the instance's run storage is not SQL: two evaluations at once could repeat an alert")
        yield lambda: True
        return
    current = instance.run_storage.get_cursor_values({LEASE_KEY}).get(LEASE_KEY)
    try:
        until = float(json.loads(current)["until"]) if current else 0.0
    except (ValueError, TypeError, KeyError):
        until = 0.0  # unreadable: lapsed
    seconds = max(sensor_timeout_seconds(), tick_budget_seconds() + REQUEST_TIMEOUT_SECONDS + 30)
    holder = uuid.uuid4().hex
    mine = json.dumps({"holder": holder, "until": now() + seconds})

    def renew() -> bool:
        nonlocal mine
        renewed = json.dumps({"holder": holder, "until": now() + seconds})
        held = compare_and_set(instance, LEASE_KEY, mine, renewed)
        mine = renewed if held else mine
        return held

    if until > now():
        yield f"another evaluation of the sensor holds its lease until {iso_seconds(until)}: nothing sent"
    elif not compare_and_set(instance, LEASE_KEY, current, mine):
        yield "another evaluation of the sensor took its lease first: nothing sent"
    else:
        try:
            yield renew
        finally:
            compare_and_set(instance, LEASE_KEY, mine, json.dumps({"holder": None, "until": 0}))


def status_changes_in_order(instance, book: AlertBook, clock: float) -> tuple[list[tuple[object, bool]], bool]:
    """Run failures and successes since the last read, at most ``EVENTS_PER_TICK`` of each kind, in
    order: ([(record, failed)], whether more remain). When one kind has more, the other is read only as
    far, so that a success is never taken before an earlier failure left for the next read."""
    for kind in RUN_STATUS_EVENTS:
        if book.positions.get(kind.value) is None:
            book.positions[kind.value] = first_position(instance, kind, clock)
    kinds = {
        kind: status_changes(instance, kind, book.positions[kind.value], EVENTS_PER_TICK) for kind in RUN_STATUS_EVENTS
    }
    full = [records[-1].storage_id for records in kinds.values() if len(records) >= EVENTS_PER_TICK]
    bound = min(full) if full else None
    changes = []
    for kind, records in kinds.items():
        kept = [r for r in records if bound is None or r.storage_id <= bound]
        if kept:
            book.positions[kind.value] = kept[-1].storage_id
        changes += [(r, kind == dg.DagsterEventType.RUN_FAILURE) for r in kept]
    return sorted(changes, key=lambda pair: pair[0].storage_id), bool(full)


def _first_error(instance: dg.DagsterInstance, run_id: str) -> tuple[str, str]:
    """(the error of the first failed step of ``run_id``, else of the run itself (a resource that failed to start),
    else its run-failure message; its cause's class)."""
    events = [
        records[0].event_log_entry.dagster_event
        for kind in (dg.DagsterEventType.STEP_FAILURE, dg.DagsterEventType.RUN_FAILURE)
        if (records := instance.get_records_for_run(run_id, of_type=kind, limit=1).records)
    ]
    data = next((e.event_specific_data for e in events if getattr(e.event_specific_data, "error", None)), None)
    chain, error = [], data.error if data else None
    while error is not None:
        chain.append(error)
        error = error.cause
    if (failure := getattr(data, "user_failure_data", None)) and failure.description:
        message = raw = failure.description
    elif chain:  # the user's error, not Dagster's wrapping of it; a module's class (its cause) not repeated
        user = next((e for e in chain if not e.cls_name.startswith("Dagster")), chain[-1])
        raw = user.message
        named, _, rest = raw.partition(": ")
        message = rest if named.endswith(f".{user.cls_name}") else raw
    else:
        message = raw = (events[-1].message or "") if events else ""
    return message, cause_of([e.cls_name for e in chain], [raw, *(e.message for e in chain)])


def run_target(instance: dg.DagsterInstance, run: dg.DagsterRun) -> str:
    """What a run is of, for its alert: the assets it materializes (whichever job ran it), else its job."""
    return ",".join(sorted(key.to_user_string() for key in run_assets(instance, run) if key)) or run.job_name


AWAITING_RETRY = "awaiting_retry"  # positions[...]: failed runs whose automatic retry is awaited


def _run_end(instance: dg.DagsterInstance, run: dg.DagsterRun, cfg: AlertConfig, at: float) -> RunEnd:
    """``run`` as its alerts name it; ``at``: its RUN_FAILURE or RUN_SUCCESS event's time (a failure's first_seen)."""
    what = run_target(instance, run)
    return RunEnd(what, run.run_id, dict(run.tags), work_unit(what, run.tags, run.run_config), cfg.ui_url, at)


REEXECUTED_DEPTH = 10  # the runs read up a successful re-execution's parent chain


def _parent_id(run: dg.DagsterRun) -> str | None:
    return run.parent_run_id or run.tags.get(DAGSTER_PARENT_TAG)


STEP_EVENTS = {  # the steps a run began or passed over: with those planned, its steps (a fan-out's, as resolved)
    dg.DagsterEventType.STEP_START,
    dg.DagsterEventType.STEP_FAILURE,
    dg.DagsterEventType.STEP_SKIPPED,
}


def _steps(instance: dg.DagsterInstance, run_id: str, kinds: set) -> tuple[set[str], set[str]]:
    """(the steps of ``run_id`` that succeeded, those with an event of ``kinds``), in one read."""
    succeeded, seen = set(), set()
    for record in instance.get_records_for_run(run_id, of_type={dg.DagsterEventType.STEP_SUCCESS, *kinds}).records:
        entry = record.event_log_entry
        if entry.step_key:
            (succeeded if entry.dagster_event_type == dg.DagsterEventType.STEP_SUCCESS else seen).add(entry.step_key)
    return succeeded, seen


def reexecuted_failures(instance: dg.DagsterInstance, run: dg.DagsterRun, failed: Container[str]) -> dict[str, str]:
    """The runs of ``failed`` (those that failed an open incident last) whose work a successful re-execution
    completed (Dagster's re-execution from failure, by hand or as a run retry, runs only what failed: its unit of
    work is not theirs), by run id -> unit of work: up its parent chain, each failed run of its partition and target
    whose steps that did not succeed (failed, skipped, begun, planned and never started) all succeeded in it or in
    the runs between; a fan-out's step planned unresolved (``op[?]``) is its resolved steps (``op[<key>]``) the run
    began. The chain ends at the first failed run it did not complete: a failure that still stands is never
    resolved. No step is read when no run of ``failed`` is in the chain, nor above the last one."""
    chain, parent_id = [], _parent_id(run) if failed else None  # no open incident: nothing to read
    where = work_unit("", run.tags, run.run_config)  # its partition and target
    while parent_id and len(chain) < REEXECUTED_DEPTH:
        parent = instance.get_run_by_id(parent_id)
        if parent is None or work_unit("", parent.tags, parent.run_config) != where:
            break
        chain.append(parent)
        parent_id = _parent_id(parent)
    while chain and chain[-1].run_id not in failed:
        chain.pop()
    out: dict[str, str] = {}
    done = _steps(instance, run.run_id, set())[0] if chain else set()
    for parent in chain:
        succeeded, seen = _steps(instance, parent.run_id, STEP_EVENTS)
        if parent.status == dg.DagsterRunStatus.FAILURE:
            plan_id = parent.execution_plan_snapshot_id
            plan = instance.get_execution_plan_snapshot(plan_id) if plan_id else None
            steps = {*plan.step_keys_to_execute, *seen} if plan else set()
            if plan is None or not {key for key in steps - succeeded if not key.endswith("[?]")} <= done:
                break
            if parent.run_id in failed:
                out[parent.run_id] = work_unit(run_target(instance, parent), parent.tags, parent.run_config)
        done |= succeeded
    return out


def materialized_signals(instance: dg.DagsterInstance, book: AlertBook, cfg: AlertConfig, clock: float) -> list:
    """Resolves the open run failures of asset partitions (``<asset>:<partition>``) that a run of another unit
    materialized after they failed (a minute run batching a failed partition's receiver): ``PARTITIONS_CHECKED``
    of them a tick, those checked longest ago first."""
    out, units = [], book.open_units()
    parts = {key: unit.partition(":")[::2] for key, unit in units.items() if "@" not in unit}  # (asset, partition)
    due = [key for key, (asset, partition) in parts.items() if partition and "," not in asset]
    for key in sorted(due, key=lambda k: book.incidents[k].get("partition_checked", 0))[:PARTITIONS_CHECKED]:
        incident, (asset, partition) = book.incidents[key], parts[key]
        incident["partition_checked"] = clock
        after = incident["first_seen"]
        if incident.get("failed_run") and (failed := instance.get_run_record_by_id(incident["failed_run"])):
            after = max(after, failed.end_time or after)  # it failed again since it opened
        found = dg.AssetRecordsFilter(dg.AssetKey.from_user_string(asset), [partition], after_timestamp=after)
        for record in instance.fetch_materializations(found, limit=1).records:
            job = record.event_log_entry.job_name
            out.append(partition_materialized(key, units[key], record.run_id, job, cfg.ui_url))
    return out


def _failure_signal(
    instance: dg.DagsterInstance, run: dg.DagsterRun, end: RunEnd, cfg: AlertConfig, note: str = ""
) -> Signal:
    first, cause = _first_error(instance, lineage_root(run.run_id, run.tags))
    if not first:
        first, cause = _first_error(instance, run.run_id)
    signal = run_failed(end, first, cause, note)
    return as_demo(signal) if run.job_name in cfg.demo_jobs else signal


def awaited_retries(context, instance: dg.DagsterInstance, book: AlertBook, cfg: AlertConfig, clock: float) -> list:
    """The failures waiting for their automatic retry, looked at once due (a tick reads only those): done with when
    a retry run exists, alerting if none came."""
    awaiting = book.positions.setdefault(AWAITING_RETRY, {})
    out: list[Signal] = []
    for run_id, item in sorted(awaiting.items(), key=lambda kv: kv[1].get("by", 0)):
        if clock < float(item.get("by", 0)):
            break  # in the order they are due
        child = child_run(instance, run_id, item.get("tags") or ())  # a retry (or re-execution) of it
        del awaiting[run_id]
        if child is not None:
            context.log.info(f"run {run_id} failed and was retried as run {child[1]}: no alert")
            continue
        run = instance.get_run_by_id(run_id)
        if run is None:  # deleted from the instance: nothing left to alert with
            context.log.warning(f"run {run_id} failed and was deleted before its retry was due: no alert")
            continue
        waited = human(max(0.0, clock - float(item["at"])))
        context.log.warning(f"run {run_id} of {run.job_name}: no retry was launched within {waited}, alerting")
        end = _run_end(instance, run, cfg, float(item["at"]))
        out.append(_failure_signal(instance, run, end, cfg, note=f"no retry launched within {waited}"))
    return out


def incident_action(context, book: AlertBook, run: dg.DagsterRun) -> Signal | None:
    """The acknowledge or close a ``close_incident`` run asked for, as a signal of its incident (of the opening
    the operator saw: ``at``, when the run was created; one opened after it is left alone as it is when the
    signal applies, after this tick's earlier signals)."""
    try:  # the flat run config as given (the job's config mapping takes nothing else)
        params, _ = parse_params(IncidentAction, run.run_config or {})
    except ParamsError as exc:
        context.log.warning(f"{CLOSE_JOB} run {run.run_id}: not applied, {exc}")
        return None
    incident = book.incidents.get(params.key)
    if incident is None or incident["state"] != FIRING:
        context.log.warning(f"{CLOSE_JOB} run {run.run_id}: no open incident {params.key!r}, nothing to do")
        return None
    done = {"acknowledge": "acknowledged", "close": "closed"}[params.action]
    return Signal(
        alert_key=params.key,
        kind=incident["kind"],
        firing=False,
        action=params.action,
        summary=f"{done} by hand (run {run.run_id})" + (f": {params.note}" if params.note else ""),
        run_id=run.run_id,
        at=context.instance.get_run_record_by_id(run.run_id).create_timestamp.timestamp(),  # when it was asked for
    )


def run_signals(
    context, instance: dg.DagsterInstance, book: AlertBook, cfg: AlertConfig, clock: float, deadline: float
) -> tuple[list, str | None]:
    """Reads run failures and successes until caught up or past ``deadline`` (``time.monotonic``):
    (the signals, a line on how far behind it still is, or None)."""
    out: list[Signal] = []
    open_units = book.open_units()  # and those this tick opens, in order, over every batch read
    open_runs = book.open_runs()  # the same incidents': the run that failed last
    read, more, last = 0, True, None
    while more and (read == 0 or time.monotonic() < deadline):
        changes, more = status_changes_in_order(instance, book, clock)
        out += _run_signals_of(context, instance, book, changes, cfg, open_units, open_runs)
        read += len(changes)
        last = changes[-1][0] if changes else last
    out += awaited_retries(context, instance, book, cfg, clock)
    if not more:
        return out, None
    behind = f", behind by {clock - last.timestamp:.0f} s" if last is not None else ""
    return out, f"run events: {read} read this tick, more remain{behind}: the rest next tick"


def _run_signals_of(
    context,
    instance: dg.DagsterInstance,
    book: AlertBook,
    changes: list,
    cfg: AlertConfig,
    open_units: dict,
    open_runs: dict,
) -> list:
    """The signals of run ends (docs/alerts.md, "What resolves what"); ``open_units`` and ``open_runs``: those of
    :meth:`AlertBook.open_units` and :meth:`AlertBook.open_runs`, kept up to date."""
    out: list[Signal] = []
    awaiting = book.positions.setdefault(AWAITING_RETRY, {})
    repository, origin = context.repository_def, context.code_location_origin
    here = origin.location_name if origin else None
    retrier = repository and repository.has_sensor_def(RETRY_SENSOR) and repository.get_sensor_def(RETRY_SENSOR)
    retried_jobs = {target.job_name for target in retrier.targets} if retrier else None  # None: not known
    ids = list({record.run_id for record, _ in changes})
    runs = {run.run_id: run for run in instance.get_runs(dg.RunsFilter(run_ids=ids))} if ids else {}
    for record, failed in changes:
        run = runs.get(record.run_id)
        if run is None:
            continue
        if run.job_name == CLOSE_JOB:
            action = incident_action(context, book, run) if not failed else None
            out += [action] if action else []
            continue  # its failure is the operator's to see in its run (a key not open): no page
        if not failed and is_dry_run(run.tags):
            continue  # it did none of its unit's work: it resolves nothing, and a retry awaited is awaited still
        end = _run_end(instance, run, cfg, record.timestamp)
        if not failed:
            end = dataclasses.replace(end, completes=reexecuted_failures(instance, run, set(open_runs.values())))
            signals = run_succeeded(end, open_units, open_runs)
            for signal in signals:
                open_units.pop(signal.alert_key, None)
                open_runs.pop(signal.alert_key, None)
            for run_id in [rid for rid, item in awaiting.items() if item.get("unit") == end.unit]:
                del awaiting[run_id]  # the work was done since: its retry is not awaited any more
            out += signals
            continue
        skipped = not_retried(instance, run, retried_jobs, here) if POLICY_TAG in run.tags else None
        if expected := automatic_retry(end.tags, run.run_id, instance, skipped):
            why, seconds, child_tags = expected
            context.log.info(f"run {run.run_id} of {run.job_name} failed; no alert yet, {why}")
            by = record.timestamp + seconds
            awaiting[run.run_id] = {"at": record.timestamp, "by": by, "tags": list(child_tags), "unit": end.unit}
            continue
        signal = _failure_signal(instance, run, end, cfg, note=f"not retried, {skipped}" if skipped else "")
        open_units[signal.alert_key], open_runs[signal.alert_key] = end.unit, run.run_id
        out.append(signal)
    return out


def rebuild_run_signals(
    context, instance: dg.DagsterInstance, book: AlertBook, cfg: AlertConfig, clock: float, deadline: float
) -> list:
    """A fresh state: the open incidents of runs, rebuilt (docs/alerts.md, "What holds"). The read positions
    start at the latest run events, read first: a run that ends meanwhile is read twice, which changes nothing."""
    for kind in RUN_STATUS_EVENTS:
        latest = instance.fetch_run_status_changes(dg.RunStatusChangeRecordsFilter(event_type=kind), limit=1)
        if latest.records:
            book.positions[kind.value] = latest.records[0].storage_id
    since = dt.datetime.fromtimestamp(clock - REBUILD_LOOKBACK_SECONDS, dt.UTC)
    finished = dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.SUCCESS], updated_after=since)
    newest: dict[str, tuple[float, dg.DagsterRun]] = {}  # unit of work -> its latest finished run
    targets: dict[tuple, str] = {}  # the assets a job's runs materialize: read once per job snapshot, selection, steps
    cursor, back_to = None, None
    while cursor is None or time.monotonic() < deadline:
        page = instance.get_run_records(finished, limit=REBUILD_PAGE, cursor=cursor)
        for record in page:
            run = record.dagster_run
            if run.status == dg.DagsterRunStatus.SUCCESS and is_dry_run(run.tags):
                continue  # resolves nothing: the unit's latest run is the one before it
            assets = tuple(sorted(map(str, run.asset_selection or ())))
            key = (run.job_name, run.job_snapshot_id, assets, tuple(sorted(run.step_keys_to_execute or ())))
            if key not in targets:
                targets[key] = run_target(instance, run)
            unit = work_unit(targets[key], run.tags, run.run_config)
            ended = record.end_time or record.update_timestamp.timestamp()
            if unit not in newest or ended > newest[unit][0]:
                newest[unit] = (ended, run)
        if len(page) < REBUILD_PAGE:
            back_to = None
            break
        cursor, back_to = page[-1].dagster_run.run_id, page[-1].create_timestamp.timestamp()
    changes = []
    for _, run in newest.values():
        failed = run.status == dg.DagsterRunStatus.FAILURE
        if run.job_name == CLOSE_JOB or not (failed or _parent_id(run) or run.tags.get(CAPABILITY_TAG) == "reclaim"):
            continue  # a success opens nothing but a reclaim run's item errors; a re-execution's resolves its failures
        kind = dg.DagsterEventType.RUN_FAILURE if failed else dg.DagsterEventType.RUN_SUCCESS
        events = instance.get_records_for_run(run.run_id, of_type=kind, limit=1).records
        changes += [(events[0], failed)] if events else []
    # in the order the runs ended (a re-execution's success after the failures it resolves): a run's own events'
    # storage ids are of its own shard in a SQLite event log
    changes.sort(key=lambda change: (change[0].timestamp, change[0].storage_id))
    signals = _run_signals_of(context, instance, book, changes, cfg, {}, {})
    opened = [s.alert_key for s in signals if s.firing]
    context.log.warning(
        f"alert state {'unreadable' if book.reset else 'missing'}: rebuilt from the latest run of each unit of "
        f"work of the last {REBUILD_LOOKBACK_SECONDS // 86400} days: {len(opened)} open"
        + (f" ({', '.join(opened[:5])}{', ...' if len(opened) > 5 else ''})" if opened else "")
        + (f"; runs before {iso_seconds(back_to)} not read (the tick's time budget is spent)" if back_to else "")
    )
    return signals


def check_signals(context, instance: dg.DagsterInstance, book: AlertBook, cfg: AlertConfig) -> list:
    """Each asset check's evaluations not read yet, in the order they were evaluated (the first time, only its
    latest), and a resolve of each open incident of a check no longer defined. One still being evaluated (planned,
    its run still going) holds back none after it: the position stays before it and the ids read beyond it are kept
    (``checks_ahead``; those among its latest ``CHECKS_READ``) until it is read. Execution ids are global in every
    storage (SQLite too)."""
    repository = context.repository_def
    if repository is None:
        return []
    seen, ahead = book.positions.setdefault("checks", {}), book.positions.setdefault("checks_ahead", {})
    out = []
    for key in sorted(repository.asset_graph.asset_check_keys, key=str):
        name = key.to_user_string()
        history = instance.event_log_storage.get_asset_check_execution_history(key, limit=CHECKS_READ)
        last, done = seen.get(name), set(ahead.pop(name, ()))
        new = [r for r in history if (last is None or r.id > last) and r.id not in done][: 1 if last is None else None]
        runs = {r.id: instance.get_run_by_id(r.run_id) for r in new if r.status.value == "PLANNED"}  # not evaluated
        waiting = [i for i, run in runs.items() if run is not None and not run.is_finished]  # read once evaluated
        done |= {r.id for r in new if r.id not in waiting}
        if waiting or done:
            seen[name] = min(waiting) - 1 if waiting else max(done)
            if beyond := sorted(i for i in done & {r.id for r in history} if i > seen[name]):
                ahead[name] = beyond
        # not an evaluation when planned and its run ended without it (the run alerts)
        evaluated = [r for r in new if r.id not in waiting and isinstance(r.evaluation, dg.AssetCheckEvaluation)]
        for record in sorted(evaluated, key=lambda r: (r.event.timestamp, r.id)):
            data = record.evaluation
            signal = check_evaluated(
                data.asset_key.to_user_string(),
                data.check_name,
                data.passed,
                data.severity.value,
                data.description,
                run_id=record.run_id,
                ui_url=cfg.ui_url,
                muted=cfg.muted_checks,
                at=record.event.timestamp,  # each firing its own first_seen, so its own message_id
            )
            if signal is not None:
                demo = signal.firing and "demo" in (data.metadata or {})  # seeded by the local demo
                out.append(as_demo(signal) if demo else signal)
    defined = {f"check_failure:{key.to_user_string()}" for key in repository.asset_graph.asset_check_keys}
    for incident in book.open_incidents():  # a check removed or renamed is never evaluated again
        if incident["alert_key"].startswith("check_failure:") and incident["alert_key"] not in defined:
            out.append(Signal(incident["alert_key"], incident["kind"], False, summary=CHECK_GONE))
    return out


def tick_signals(context, instance: dg.DagsterInstance, cfg: AlertConfig) -> Iterator[Signal]:
    """Each sensor and schedule of this code location: N failed ticks in a row fire; a good tick resolves.
    The instance also keeps the states and ticks of other code locations (one renamed: the same names) and
    of sensors and schedules removed since: those are not read."""
    repository = context.repository_def
    if repository is None:
        return
    names = {d.name for d in (*repository.sensor_defs, *repository.schedule_defs)}
    here = context.code_location_origin.location_name if context.code_location_origin else None
    for state in instance.all_instigator_state():
        kind = {"SENSOR": "sensor", "SCHEDULE": "schedule"}.get(state.instigator_type.value)
        location = state.origin.repository_origin.code_location_origin.location_name
        if kind is None or state.instigator_name not in names or (here and location != here):
            continue
        ticks = instance.get_ticks(state.instigator_origin_id, state.selector_id, limit=cfg.tick_failures + TICKS_READ)
        statuses = [tick.status.value for tick in ticks]
        error = next((t.error.message for t in ticks if t.error is not None), None)
        repository = f"{state.origin.repository_origin.repository_name}@{location}"
        signal = ticks_seen(
            state.instigator_name,
            kind,
            statuses,
            error,
            threshold=cfg.tick_failures,
            ui_url=cfg.ui_url,
            repository=repository,
        )
        if signal is not None:
            yield signal


def dead_letter_signals(
    context,
    sqs,
    fleet: FleetSettings,
    cfg: AlertConfig | None = None,
    unread: dict[str, int] | None = None,
    deadline: float | None = None,
) -> Iterator[Signal]:
    """Each dead-letter queue's depth; the message links its asset (``runs_fleet/<queue>_dead_letters``).
    ``unread``: since when each queue's depth could not be read (kept in the book between ticks). The reads
    begin before ``deadline`` (``time.monotonic``; one not begun leaves its queue's unread clock as it is) and
    take ``REQUEST_TIMEOUT_SECONDS`` at most together."""
    unread = {} if unread is None else unread
    until = time.monotonic() + REQUEST_TIMEOUT_SECONDS
    for label, url in (("termination", fleet.termination_dlq_url), ("housekeeping", fleet.housekeeping_dlq_url)):
        name = queue_name(url)
        link = f"{cfg.ui_url}/assets/runs_fleet/{label}_dead_letters?view=checks" if cfg and cfg.ui_url else None
        if deadline is not None and time.monotonic() >= deadline:
            context.log.warning(f"dead letters of {name}: not asked this tick (its time budget is spent)")
            continue
        try:
            if time.monotonic() >= until:
                raise NoAnswer("out of time this tick")
            depth = within(until - time.monotonic(), lambda url=url: dead_letter_depth(sqs, url))["depth"]
        except Exception as exc:  # one line; its incident keeps its state, and a depth unread for long alerts
            context.log.warning(f"dead letters of {name}: not read this tick ({first_line(exc, 200)})")
            since = unread.setdefault(name, int(now()))
            signals = [depth_unread(name, now() - since, first_line(exc, 200))]
        else:
            signals = [depth_unread(name, None)] if unread.pop(name, None) is not None else []
            signals.append(dead_letters(name, depth))
        yield from (dataclasses.replace(signal, url=link) for signal in signals if signal is not None)


def build_alerts_sensor(
    *,
    demo_noise: frozenset[str] = frozenset(),
    demo_jobs: frozenset[str] = frozenset(),
    minimum_interval_seconds: int = 60,
) -> dg.SensorDefinition:
    """``demo_noise``: kinds recorded as incidents but never sent; ``demo_jobs``: a development code
    location's demo jobs, whose failures are demo alerts (``[demo]``, never critical). The heartbeat
    alarm allows ``minimum_interval_seconds`` up to 10 minutes."""

    @dg.sensor(
        name=SENSOR_NAME,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        required_resource_keys={"alerts", "fleet", "sns", "sqs", "cloudwatch"},
        description=(
            "Turns failed runs (after their automatic retries), failed asset checks, failing ticks and "
            "dead letters into incidents, sends one message when each opens and one when it resolves "
            "(ALERTS_SNS_TOPIC_ARN, ALERTS_WEBHOOK_URL) and publishes the AlertsHeartbeat metric."
        ),
    )
    def alerts(context: dg.SensorEvaluationContext) -> dg.SkipReason:
        with sensor_lease(context.instance, context.log.warning) as lease:
            return dg.SkipReason(lease) if isinstance(lease, str) else _evaluate(context, demo_noise, demo_jobs, lease)

    return alerts


def _evaluate(
    context, demo_noise: frozenset[str], demo_jobs: frozenset[str], lease: Callable[[], bool]
) -> dg.SkipReason:
    deadline = time.monotonic() + tick_budget_seconds()
    reads_until = deadline - tick_budget_seconds() / 2  # catching up on run events leaves half of it for sending
    instance = context.instance
    resources = context.resources  # AlertSettings, FleetSettings, SNSResource, SQSResource, CloudWatchResource
    sns = resources.sns
    topic = (resources.alerts.sns_topic_arn or "").strip()
    cfg = alert_config(
        resources.alerts,
        sns=sns.get_client() if topic else None,
        region=sns.region_name or os.environ.get("AWS_REGION") or "us-east-1",
        account=caller_account(sns, context.log.warning) if topic else None,
    )
    cfg = dataclasses.replace(cfg, demo_jobs=demo_jobs)
    for problem in cfg.problems:
        context.log.warning(problem)
    book = load_book(instance, context.log.warning)
    clock = now()
    unread = book.positions.setdefault("dead_letters_unread", {})  # read first: run events may take the budget
    dead = list(dead_letter_signals(context, resources.sqs.get_client(), resources.fleet, cfg, unread, reads_until))
    sinks = [sink.name for sink in cfg.sinks]
    for line in book.add_sinks({sink.name: destination(sink) for sink in cfg.sinks}, demo_noise):
        context.log.warning(line)
    if book.reset:
        why = "the alert state was unreadable: started afresh"
        book.enqueue(notice("state_reset", why, book.reset, clock), sinks)
    changes, noise = [], []

    def enqueue(message) -> None:
        if message["kind"] in demo_noise:
            noise.append(message["alert_key"])
            return
        changes.append(f"{message['alert_key']} {message['state']}")
        for line in book.enqueue(message, sinks):
            context.log.warning(line)

    def observe(signals) -> None:
        for signal in signals:
            message = book.observe(signal, clock)
            if message is not None:
                enqueue(message)
            elif signal.action and signal.at is not None:  # a close_incident run's, as the incident is at this point
                context.log.warning(
                    f"{CLOSE_JOB} run {signal.run_id}: {signal.alert_key} is not open as it was when asked "
                    "(it resolved or opened again since, or was acknowledged already): not applied"
                )

    if book.fresh:  # open incidents are not forgotten: rebuilt before anything new is read
        observe(rebuild_run_signals(context, instance, book, cfg, clock, reads_until))
    run_changes, behind = run_signals(context, instance, book, cfg, clock, reads_until)
    if behind:
        context.log.warning(behind)
    observe(run_changes + check_signals(context, instance, book, cfg))
    observe(materialized_signals(instance, book, cfg, clock))  # of the incidents open now, a rebuilt one's too
    observe(tick_signals(context, instance, cfg))
    observe(dead)
    for message in book.reminders(clock, cfg.remind_seconds):  # of what is still open after this tick's signals
        enqueue(message)
    if not lease():  # this tick outlived its lease: another evaluation may have sent and saved since
        return dg.SkipReason(
            "the sensor's lease lapsed during this tick (its reads took too long): nothing saved or sent"
        )
    save_book(instance, book)  # the read positions and the outboxes, before anything is sent
    delivery = book.deliver(
        cfg.sinks,
        clock,
        policy=cfg.policy,
        max_per_tick=cfg.max_per_tick,
        save=lambda: save_book(instance, book),
        deadline=deadline,
        runbook_url=cfg.runbook_url,
    )
    for line in delivery.failed:
        context.log.warning(line)
    stuck = sorted({*book.undeliverable(sinks), *cfg.refusing})
    last = book.positions.get(UNDELIVERED, {})
    book.positions[UNDELIVERED] = {name: last.get(name, 0) + 1 for name in stuck}  # ticks in a row
    told = book.positions[UNDELIVERED_TOLD] = {n: 1 for n in book.positions.get(UNDELIVERED_TOLD, {}) if n in stuck}
    others = [other for other in sinks if other not in stuck]  # the next tick sends it to them, once
    for name, ticks in book.positions[UNDELIVERED].items():
        if ticks < UNDELIVERED_TICKS or name in told or not others:  # none delivers now: a later tick tells
            continue
        error = next((i["last_error"] for i in book.outbox.get(name, []) if i.get("last_error")), "a refused setting")
        title = f"{name} has delivered no alert for {ticks} ticks ({first_line(error, 200)})"
        why = "its alerts wait for it; the heartbeat alarm publishes to the alerts topic, which may be what fails"
        told[name] = 1
        for line in book.enqueue(notice("heartbeat", title, why, clock, "critical"), others):
            context.log.warning(line)
    book.prune(clock)
    save_book(instance, book)
    parts = [delivery.describe(), f"{len(book.open_incidents())} open incident(s)", *([behind] if behind else [])]
    if stuck:  # alerts cannot be delivered: the heartbeat alarm pages, by the template's own action
        parts.append(f"no heartbeat: {', '.join(stuck)} cannot deliver (its messages are kept until it can)")
    elif delivery.out_of_time and not delivery.sent:  # alerts wait, and none went: not a tick that delivers
        parts.append("no heartbeat: the tick's time budget was spent before it sent any of the messages waiting")
    elif not sinks:  # nowhere to send: alerts would go unseen (the open ones go to a sink once there is one)
        parts.append("no heartbeat: no sink configured (ALERTS_SNS_TOPIC_ARN, ALERTS_WEBHOOK_URL)")
    else:
        try:
            # deployments sharing an account and a namespace each feed their own alarm
            beat = datum(HEARTBEAT_METRIC, 1.0, Env=cfg.heartbeat_env)
            cloudwatch = resources.cloudwatch.get_client()
            put_metrics(cloudwatch, resources.fleet.metrics_namespace, [beat], policy=HEARTBEAT_POLICY)
        except Exception as exc:
            context.log.warning(f"heartbeat not published: {first_line(exc, 200)}")
    if noise:
        parts.append(f"demo noise, not sent: {', '.join(noise[:5])}")
    if changes:
        context.log.info(f"state changes: {', '.join(changes)}")
    return dg.SkipReason("; ".join(parts))


# at most 4 columns, so that the asset page shows the table inline; the key in full (close_incident takes it)
INCIDENT_COLUMNS = {"alert_key": "key", "severity": "severity", "since": "since (UTC)", "alert": "alert"}
TABLE_ALERT_CHARS = 140  # the title (a demo alert's starts with [demo]) and the summary, on one line


@dg.asset(
    key=ASSET_KEY,
    group_name="alerts",
    description="The open incidents of the alerts sensor (inline table) and the last 24 h of opened/resolved counts.",
    tags={CAPABILITY_TAG: "alerts"},
)
def incidents(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
    book = load_book(context.instance, context.log.warning)
    rows = [
        {
            **i,
            "since": iso_seconds(i["first_seen"])[:16].replace("T", " "),
            "alert": first_line(
                f"{i.get('title') or i['alert_key']}" + (f": {i['summary']}" if i.get("summary") else ""),
                TABLE_ALERT_CHARS,
            ),
        }
        for i in book.open_incidents()
    ]
    counts = book.counts_since(now() - 86400)
    context.log.info(
        f"{len(rows)} open incident(s); last 24 h: {counts['opened']} opened, {counts['resolved']} resolved"
    )
    figures = metadata_from({"open": len(rows), "opened_24h": counts["opened"], "resolved_24h": counts["resolved"]})
    return dg.MaterializeResult(metadata={**figures, "incidents": table_from(rows, INCIDENT_COLUMNS)})


def _close_incident(context: dg.OpExecutionContext, params: IncidentAction) -> None:
    book = load_book(context.instance, context.log.warning)
    incident = book.incidents.get(params.key)
    if incident is None or incident["state"] != FIRING:
        shown = ", ".join(i["alert_key"] for i in book.open_incidents()[:10]) or "none"
        raise dg.Failure(description=f"no open incident {params.key!r}; open ones: {shown}", allow_retries=False)
    context.log.info(f"{params.action} {params.key}: applied by the alerts sensor's next tick")


close_incident = one_op_job(
    CLOSE_JOB,
    "incident_action",
    IncidentAction,
    _close_incident,
    description=(
        "Acknowledge (no more reminders) or close (closed until it fires again) an open incident of the "
        "alerts sensor by its key; the sensor applies it at its next tick and sends one message."
    ),
    op_description="Acknowledge or close an incident.",
    tags={CAPABILITY_TAG: "alerts"},
    executor_def=dg.in_process_executor,
    retry_policy=None,  # no AWS call
)


def build_defs(*, noise: frozenset[str] = frozenset(), demo_jobs: frozenset[str] = frozenset()) -> dg.Definitions:
    """``noise`` and ``demo_jobs``: as :func:`build_alerts_sensor`'s ``demo_noise`` and ``demo_jobs``."""
    sensor = build_alerts_sensor(demo_noise=noise, demo_jobs=demo_jobs)
    return dg.Definitions(assets=[incidents], jobs=[close_incident], sensors=[sensor])
