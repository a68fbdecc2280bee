"""Dagster wiring for ReportStream's per-receiver batching (docs/batching.md)."""

import datetime as dt
import json
import os
import time
from collections.abc import Iterator

import dagster as dg

from pipelines.batching import decider, minute, store
from pipelines.batching.batcher import ReceiverBatcher, RunReport
from pipelines.batching.params import (
    BatchMinuteParams,
    ImportReceiverSettingsParams,
    ReceiverBatchesParams,
    batch_start_date,
)
from pipelines.batching.reportstream_settings import ADD, CHANGE, DISABLE, SKIPPED, UNCHANGED, import_settings
from pipelines.batching.schedule import format_batch_time
from pipelines.common import iso, printable, time_gone_by
from pipelines.common.defs.active_runs import ACTIVE_STATUSES, still_going
from pipelines.common.defs.config import config_schema, flat_config, params_from_config
from pipelines.common.defs.failures import AWS_RETRY_POLICY, one_line_failures
from pipelines.common.defs.metadata import metadata_from, table_from
from pipelines.common.defs.schedules import ONE_AT_A_TIME_TAG, SCHEDULE_TAG, schedule, tick_time
from pipelines.common.defs.summary import own_outcome, run_summary
from pipelines.common.defs.tasks import one_op_job, resource_clients
from pipelines.retry.tags import PARTITION_TAG
from resources import BatchingSettings, DynamoDBResource, S3Resource

BATCH_START_DATE = batch_start_date(os.environ, dt.date.today())

receivers_partitions = dg.DynamicPartitionsDefinition(name="receivers")
days_partitions = dg.DailyPartitionsDefinition(start_date=BATCH_START_DATE, end_offset=1, timezone="UTC")
batch_partitions = dg.MultiPartitionsDefinition({"receiver": receivers_partitions, "day": days_partitions})


DRY_RUN_KEYS = {
    "batch_times_written": "batch_times_would_write",
    "files_written": "files_would_write",
    "files": "file_keys_would_write",
    "records_per_file": "records_per_file_would_write",
    "records_batched": "records_would_batch",
    "recovered_batches": "batches_would_recover",
    "still_pending": "records_would_stay_pending",
    "batched": "partitions_would_batch",  # a minute run's
    "batches_sent": "files_would_write",  # a run's summary
}
"""A dry run's metadata keys for what a run does (it writes nothing); the others keep theirs."""


def report_metadata(report: RunReport) -> dict:
    files = report.files
    values = {
        "status": report.status,
        "dry_run": report.dry_run,
        "batch_times_written": [b.batch_time for b in report.batches if b.files],
        "batch_times_without_records": [b.batch_time for b in report.batches if not b.files],
        "batch_times_already_done": len(report.already_done),
        "files_written": len(files),
        "files": [f.key for f in files],
        "records_per_file": {f.key: f.records for f in files},
        "records_batched": report.records_batched,
        "invalid_json_payloads": sum(f.invalid_payloads for f in files),
        "recovered_batches": report.recovered,
        "invalid_records": report.invalid_records[:100],
        "invalid_record_count": len(report.invalid_records),
        "pending_before": report.pending_before,
        "still_pending": report.still_pending,
        "oldest_pending_age_seconds": report.oldest_pending_age_seconds or 0.0,
    }
    values = _as_dry_run(values, report.dry_run)
    typed = metadata_from(values)  # leaves out an empty list or map: shown here as JSON all the same
    return {key: typed[key] if key in typed else dg.MetadataValue.json(value) for key, value in values.items()}


@dg.asset(
    partitions_def=batch_partitions,
    description=(
        "Outbox batch files of one receiver for one UTC day: every batch time of that day up to now "
        "that is not written yet (first those missed since its last batch), each with the receiver's pending "
        "records created before it."
    ),
    kinds={"s3", "dynamodb"},
    group_name="batching",
    config_schema=config_schema(ReceiverBatchesParams),
    retry_policy=AWS_RETRY_POLICY,
    output_required=False,  # a dry run materializes nothing
)
@one_line_failures
def receiver_batches(
    context: dg.AssetExecutionContext,
    dynamodb: DynamoDBResource,
    s3: S3Resource,
    batching: BatchingSettings,
) -> Iterator[dg.MaterializeResult | dg.AssetObservation]:
    own_outcome(context)
    params = params_from_config(context, ReceiverBatchesParams)
    # a launch tagged with dagster/partition alone (no dimension tags) gives the key as its text
    keys = batch_partitions.get_partition_key_from_str(str(context.partition_key)).keys_by_dimension
    receiver, day = keys["receiver"], keys["day"]
    settings = params.settings(batching)
    owner = store.lease_owner(context.run_id, str(context.partition_key))  # as a minute run's batcher of it
    batcher = ReceiverBatcher(dynamodb.get_client(), s3.get_client(), settings, owner=owner, log=context.log.info)
    try:
        report = batcher.run(receiver, day, dt.datetime.now(dt.UTC), dry_run=params.dry_run)
    except store.ReceiverBusy as exc:
        raise dg.Failure(str(exc)) from exc
    metadata = report_metadata(report)
    if report.failure:
        raise dg.Failure(description=report.failure, metadata=metadata, allow_retries=False)
    _log_report(context.log, report)
    counters = _as_dry_run(_counters(report), params.dry_run)
    run_summary(context, f"batches of {receiver} for {day}", counters, dry_run=params.dry_run)
    if params.dry_run:  # it wrote nothing: the partition's status stays as it was
        yield dg.AssetObservation(asset_key=context.asset_key, partition=context.partition_key, metadata=metadata)
    else:
        yield dg.MaterializeResult(metadata=metadata)


def _log_report(log, report: RunReport) -> None:
    """The lines of one partition's batching (its run's, or its part of a minute run's log)."""
    for problem in report.invalid_records[:20]:
        log.error(printable(f"record {problem['record_id']} left pending: {problem['problem']}"))
    if report.status in {"disabled", "cancelled"}:
        log.warning(f"{report.receiver}: batching_enabled is false ({report.status}); remaining batches wait")
    if report.dry_run:
        log.info(
            f"{report.receiver} {report.day}: dry run, nothing written: {len(report.batches)} batch time(s) "
            f"would write {len(report.files)} file(s) of {report.records_batched} record(s); "
            f"{report.still_pending} would stay pending"
        )
        return
    log.info(
        f"{report.receiver} {report.day}: {len(report.batches)} batch time(s), {len(report.files)} file(s), "
        f"{report.records_batched} record(s); {report.still_pending} still pending"
    )


def _counters(report: RunReport) -> dict[str, int]:
    return {"batches_sent": len(report.files), "records_batched": report.records_batched}


def _as_dry_run(values: dict, dry_run: bool) -> dict:
    """``values``, on a dry run named as what the run would have done (``DRY_RUN_KEYS``)."""
    return {DRY_RUN_KEYS.get(key, key): value for key, value in values.items()} if dry_run else values


# ReportStream writes these tables; Groundskeeper only reads them. An asset without a materializing
# function: nothing materializes it, so no backfill or asset job ever includes its checks.
receiver_records = dg.AssetSpec(
    "receiver_records",
    description=(
        "ReportStream's receivers table (one item per receiver: schedule, batching_enabled) and "
        "records table (pending records per receiver), in DynamoDB. Its checks run in batching_checks_job."
    ),
    kinds={"dynamodb"},
    group_name="batching",
)


BATCHING_TAG = "groundskeeper/batching"
"""``minute`` or ``partition``: the run queue gives each value at most 2 runs at once (dagster.yaml)."""


MINUTE_JOB = "batch_minute_job"
PARTITION_JOB = "receiver_batches_job"
BATCH_TIME_TAG = "groundskeeper/batch_time"
"""The decider minute of a ``batch_minute_job`` run; the next tick's window starts there."""
HANDOFF_TAG = "groundskeeper/handoff"
"""``pending`` on a minute run in which receivers failed; their partitions are in :data:`FAILED_TAG`."""
FAILED_TAG = "groundskeeper/failed_partitions"
HANDOFF_OF_TAG = "groundskeeper/handoff_of"
"""On a ``receiver_batches_job`` run of a receiver that failed in a minute run, and on the ``batch_minute_job``
run of the partitions left by a minute run that ended before its report: that run's id."""
MAX_WINDOW_SECONDS = 15 * 60
"""A tick after skipped ones takes the batch times since the last minute run, at most this far back
(older ones are missed batches: the receiver's next run writes them first)."""


def _minute_shares(context: dg.OpExecutionContext) -> tuple[BatchMinuteParams, list[dict]]:
    """The run's partitions in shares, each naming its partitions already materialized (one query)."""
    own_outcome(context, {HANDOFF_TAG: "", FAILED_TAG: ""})  # the run's first step
    params = params_from_config(context, BatchMinuteParams)
    due, problems = minute.parse_partitions(params.partitions)
    for line in problems:
        context.log.error(line)
    parts = minute.shares(due)
    context.log.info(f"minute {params.batch_time}: {len(due)} partition(s) in {len(parts)} share(s)")
    status = context.instance.get_status_by_partition(
        receiver_batches.key, [d.partition for d in due], receiver_batches.partitions_def
    )
    shown = {key for key, value in (status or {}).items() if value == dg.AssetPartitionStatus.MATERIALIZED}
    return params, [
        {
            "batch_time": params.batch_time,
            "dry_run": params.dry_run,
            "partitions": [d.partition for d in share],
            "materialized": [d.partition for d in share if d.partition in shown],
        }
        for share in parts
    ]


def _batch_share(
    context: dg.OpExecutionContext,
    share: dict,
    dynamodb: DynamoDBResource,
    s3: S3Resource,
    batching: BatchingSettings,
) -> dg.Output[dict]:
    settings = ReceiverBatchesParams().settings(batching)
    ddb, s3_client = dynamodb.get_client(), s3.get_client()
    due, _ = minute.parse_partitions(share["partitions"])
    already = set(share.get("materialized", ()))
    totals = {"batches_sent": 0, "records_batched": 0}
    counted: dict[str, dict[str, int]] = {}  # partitions batched as usual: counted, not materialized again

    def report(outcome: minute.Outcome) -> None:  # in the step's own thread: the run's log and events
        d, r = outcome.due, outcome.report
        if not outcome.failed:
            for name, value in _counters(r).items():
                totals[name] += value
            if d.partition in already and not minute.worth_showing(r):
                counted[d.partition] = {
                    "files": len(r.files),
                    "records": r.records_batched,
                    "still_pending": r.still_pending,
                }
                return
        for line in outcome.lines:
            context.log.info(line)
        if outcome.failed:
            context.log.error(
                f"{d.receiver} {d.day}: {outcome.error} (handed to a receiver_batches_job run of its own)"
            )
            return
        _log_report(context.log, r)
        event = dg.AssetObservation if r.dry_run else dg.AssetMaterialization  # a dry run leaves the status be
        context.log_event(
            event(
                asset_key=receiver_batches.key,
                partition=dg.MultiPartitionKey({"receiver": d.receiver, "day": d.day}),
                metadata=report_metadata(r),
            )
        )

    outcomes = minute.batch_share(
        lambda d: ReceiverBatcher(ddb, s3_client, settings, owner=store.lease_owner(context.run_id, d.partition)),
        due,
        dt.datetime.now(dt.UTC),
        report,
        dry_run=share["dry_run"],
    )
    failed = [o.due.partition for o in outcomes if o.failed]
    result = {**share, **totals, "batched": len(outcomes) - len(failed), "failed": failed, "counted": counted}
    if share["dry_run"]:
        context.log.info(
            f"{len(outcomes)} partition(s), dry run (nothing written or materialized; an observation each): "
            f"{result['batched']} would be batched, {len(failed)} failed, {totals['records_batched']} record(s) "
            "would be batched"
        )
    else:
        context.log.info(
            f"{len(outcomes)} partition(s): {result['batched']} batched ({result['batched'] - len(counted)} "
            f"materialized, {len(counted)} counted here: batched as usual, already materialized), {len(failed)} "
            "failed; " + ", ".join(f"{k}={v}" for k, v in totals.items())
        )
    return dg.Output(result, metadata=_minute_totals([result])[1])


def _minute_totals(results: list[dict]) -> tuple[dict, dict]:
    """The shares' results added up (counters, partitions batched, failed and counted), and as metadata."""
    totals = {
        **{name: sum(r[name] for r in results) for name in ("batches_sent", "records_batched", "batched")},
        "failed": sorted(p for r in results for p in r["failed"]),
        "counted": {k: v for r in results for k, v in r["counted"].items()},
    }
    dry_run = any(r["dry_run"] for r in results)  # it materializes nothing
    metadata = {
        **{k: dg.MetadataValue.int(totals[k]) for k in ("batches_sent", "records_batched", "batched")},
        "partitions_materialized": dg.MetadataValue.int(0 if dry_run else totals["batched"] - len(totals["counted"])),
        "partitions_counted": dg.MetadataValue.json(totals["counted"]),
    }
    return totals, _as_dry_run(metadata, dry_run)


def _report_minute(context, results: list[dict], batch_time: str, dry_run: bool) -> tuple[list[str], dict]:
    """The minute's run summary; receivers that failed are tagged for their own runs (returned, with metadata)."""
    totals, metadata = _minute_totals(results)
    failed = totals["failed"]
    if failed and not dry_run:
        context.instance.add_run_tags(context.run_id, {HANDOFF_TAG: "pending", FAILED_TAG: ",".join(failed)})
    counters = _as_dry_run({name: totals[name] for name in ("batches_sent", "records_batched")}, dry_run)
    detail = f"failed: {', '.join(failed)}" if failed else ""
    what = f"batch minute {batch_time}: {totals['batched']} partition(s) {'would be ' if dry_run else ''}batched"
    run_summary(context, what, counters, detail, dry_run=dry_run)
    return failed, metadata


@dg.op(
    description="The partitions due in the decider's minute, in shares of at most 25 receivers (a step each).",
    out=dg.DynamicOut(dict),
)
@one_line_failures
def plan_batch_minute(context: dg.OpExecutionContext):
    params, parts = _minute_shares(context)
    if not parts:  # no share: no step sums them
        _report_minute(context, [], params.batch_time, params.dry_run)
    for i, share in enumerate(parts):
        yield dg.DynamicOutput(share, mapping_key=f"share_{i}")


batch_receivers = dg.op(
    name="batch_receivers",
    description="Batches a share's receivers on a few threads; a materialization for each partition whose status "
    "this changes or that holds something to look at.",
    retry_policy=AWS_RETRY_POLICY,  # a retried share re-batches nothing: each receiver's ledger and lease hold
)(one_line_failures(_batch_share))


@dg.op(description="Sums the shares; receivers that failed are tagged for their own runs (batch_failures_handoff).")
def report_batch_minute(context: dg.OpExecutionContext, results: list[dict]) -> None:
    if results:
        _report_minute(context, results, results[0]["batch_time"], results[0]["dry_run"])


@dg.op(
    description="Batches every partition due in the decider's minute: its shares of at most 25 receivers one "
    "after another, each on a few threads; a materialization for each partition whose status this changes or "
    "that holds something to look at.",
    retry_policy=AWS_RETRY_POLICY,  # a retried minute re-batches nothing: each receiver's ledger and lease hold
)
@one_line_failures
def batch_minute(
    context: dg.OpExecutionContext,
    dynamodb: DynamoDBResource,
    s3: S3Resource,
    batching: BatchingSettings,
) -> dg.Output[dict]:
    params, parts = _minute_shares(context)
    results = [_batch_share(context, share, dynamodb, s3, batching).value for share in parts]
    failed, metadata = _report_minute(context, results, params.batch_time, params.dry_run)
    return dg.Output({"shares": len(results), "failed": failed}, metadata=metadata)


def minute_job(executor_def: dg.ExecutorDefinition | None = None) -> dg.JobDefinition:
    """The ``batch_minute_job``: in process one step (``batch_minute``, a step costs the instance about ten
    events); with ``executor_def`` (the cluster's Celery executor) a ``batch_receivers`` step per share."""
    fan_out = executor_def is not None

    @dg.job(
        name=MINUTE_JOB,
        # a minute run comes every minute: its console (captured with the run) shows INFO and above
        config=flat_config(
            (plan_batch_minute if fan_out else batch_minute).name, BatchMinuteParams, console_level="INFO"
        ),
        description="Batches every (receiver, day) partition due in one decider minute; launched by batch_decider "
        "(and by batch_failures_handoff, again, for a minute run that died).",
        tags={"groundskeeper/capability": "batching", BATCHING_TAG: "minute"},
        executor_def=executor_def or dg.in_process_executor,
    )
    def batch_minute_job():
        if fan_out:
            report_batch_minute(plan_batch_minute().map(batch_receivers).collect())
        else:
            batch_minute()

    return batch_minute_job


@dg.sensor(
    # A new receiver's first batch does not wait for it (batch_decider adds a missing partition itself).
    minimum_interval_seconds=120,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Every 2 minutes: keeps the `receivers` dynamic partitions equal to the receivers table (reads "
    "the partitions when the table changed, and at least every 10 minutes).",
)
@one_line_failures
def receivers_sync(context: dg.SensorEvaluationContext, dynamodb: DynamoDBResource, batching: BatchingSettings):
    items = store.scan_receivers(dynamodb.get_client(), batching.receivers_table)
    wanted, bad = decider.valid_partition_names(items)
    if bad:
        context.log.warning(f"receiver names that cannot be partition keys (skipped): {', '.join(bad[:20])}")
    clock, names = time.time(), sorted(wanted)
    try:  # the cursor: the receiver names the partitions last equalled, and when (read again after 10 minutes)
        seen = json.loads(context.cursor or "")
        unchanged = list(seen["receivers"]) == names and clock - float(seen["at"]) < 600
    except (ValueError, KeyError, TypeError):  # no cursor yet, or not one of ours
        unchanged = False
    if unchanged:
        return dg.SkipReason(f"{len(names)} receiver(s), the table unchanged since the partitions were in sync")
    current = set(context.instance.get_dynamic_partitions(receivers_partitions.name))
    add, remove = sorted(wanted - current), sorted(current - wanted)
    cursor = json.dumps({"receivers": names, "at": clock})
    if not add and not remove:
        context.update_cursor(cursor)
        return dg.SkipReason(f"{len(current)} receiver partition(s), all in sync")
    context.log.info(f"receivers: adding {add[:20]}, removing {remove[:20]}")
    requests = [receivers_partitions.build_add_request(add)] if add else []
    requests += [receivers_partitions.build_delete_request(remove)] if remove else []
    return dg.SensorResult(dynamic_partitions_requests=requests, cursor=cursor)


@one_line_failures
def minute_request(context: dg.ScheduleEvaluationContext) -> dg.RunRequest | dg.SkipReason:
    """``batch_decider``'s tick: the minute run of the receivers due, or why there is none."""
    tick = tick_time(context)
    mine = dg.RunsFilter(job_name=MINUTE_JOB, tags={SCHEDULE_TAG: "batch_decider"})  # not a handoff's re-run
    previous = next(iter(context.instance.get_runs(filters=mine, limit=1)), None)
    if previous is not None and previous.status in (dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED):
        # Not a second run behind it: the next tick's window starts at that run's minute and covers this one.
        return dg.SkipReason(f"the previous minute run {still_going(previous)}: this minute goes in the next run")
    try:  # the window: the minute, or back to the last minute run's minute after skipped ticks
        gap = int((tick - dt.datetime.fromisoformat(previous.tags[BATCH_TIME_TAG])).total_seconds())
    except (AttributeError, KeyError, ValueError):  # no previous run, or no minute in its tags
        gap = 60
    window = gap if 60 < gap <= MAX_WINDOW_SECONDS else 60
    decision = decider.decide(context.resources.dynamodb.get_client(), context.resources.batching, tick, window)
    invalid, least = list(decision.invalid_pending.items()), "at least " if decision.backlog or decision.unread else ""
    left = "; invalid pending records that no run batches (left pending): " if invalid else ""
    left += ", ".join(f"{name} {'at least ' * (name in decision.backlog)}{n}" for name, n in invalid[:20])
    if not decision.due:
        return dg.SkipReason(f"no receiver due at {tick:%H:%M} ({decision.receivers} receiver(s)){left}")
    due = list(dict.fromkeys(minute.Due(d.receiver, d.day) for d in decision.due))
    # One line on the tick's page (a tick's log is kept with the instance, every minute): the run's
    # config lists its partitions, and the run their counts once it ends.
    if decision.backlog:  # due at each batch time of the window; their runs batch exactly
        left += f"; more pending records than the {decider.PENDING_READ_LIMIT} a tick reads: "
        left += ", ".join(sorted(decision.backlog)[:20])
    if decision.unread:  # due at each batch time of the window
        left += "; pending not read: " + ", ".join(f"{n} ({why})" for n, why in list(decision.unread.items())[:20])
        left += "; its run reads exactly"
    context.log.info(
        f"{len(decision.due)} batch time(s) due for {len(due)} partition(s): "
        f"{least}{sum(d.pending for d in decision.due)} record(s) pending, "
        f"{least}{sum(d.expected_files for d in decision.due)} file(s) expected{left}"
    )
    known = set(context.instance.get_dynamic_partitions(receivers_partitions.name))
    new = sorted({d.receiver for d in due} - known)
    if new:  # receivers_sync has not seen them yet: add them now rather than miss a batch
        context.instance.add_dynamic_partitions(receivers_partitions.name, new)
    return dg.RunRequest(
        run_key=f"minute@{format_batch_time(tick)}",
        run_config={"batch_time": iso(tick), "partitions": [d.partition for d in due]},
        tags={BATCH_TIME_TAG: iso(tick)},
    )


batch_decider = schedule(
    name="batch_decider",
    job_name=MINUTE_JOB,  # the deployment's batch_minute_job (build_defs)
    cron_schedule="* * * * *",
    execution_timezone="UTC",
    request=minute_request,
    required_resource_keys={"dynamodb", "batching"},
    description="Every minute: one batch_minute_job run for every enabled receiver with a batch time in the minute "
    "(none when no receiver is due; the tick skips while its previous minute run is still queued).",
)


HANDOFF_MARGIN_SECONDS = 600
"""The handoff sensor looks this far behind its cursor again (a run's update time and the sensor's
clock may disagree); a partition handed off already is not launched twice (its run key)."""
HANDOFF_READS = 100
"""The most minute runs a handoff tick reads, oldest first: with more, the next tick reads on from there."""


@dg.sensor(  # its jobs, receiver_batches_job and the deployment's batch_minute_job: build_defs
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Every minute: a receiver_batches_job run for each partition that failed in batch_minute_job "
    "runs, so it fails (or succeeds) by Dagster's own rules and the alert names it; one run a partition at a "
    "time, none while the partition is FAILED already. A minute run that died or was cancelled before its report: "
    "one batch_minute_job run of its partitions but those it materialized (such a run that dies too: two of "
    "half each, down to a receiver_batches_job run of a partition that dies alone).",
)
@one_line_failures
def batch_failures_handoff(context: dg.SensorEvaluationContext):
    try:  # the cursor: the update time read up to, the partitions waiting for a run that began before them, and
        # whether that read was full (this one reads on from its newest update time, with no margin)
        cursor, latest = json.loads(context.cursor or ""), time.time() + HANDOFF_MARGIN_SECONDS  # clocks apart
        since, waiting = time_gone_by(cursor["at"], latest), dict(cursor["waiting"])
        for run_id, ended in waiting.values():  # partition -> [run id, when it failed]
            if not isinstance(run_id, str):
                raise TypeError(run_id)
            time_gone_by(ended, latest)
        margin = 1e-6 if cursor.get("more") else HANDOFF_MARGIN_SECONDS  # 1 µs: runs updated at that time too
    except (ValueError, KeyError, TypeError):  # no cursor yet, or not one of ours
        since, waiting, margin = time.time() - MAX_WINDOW_SECONDS, {}, HANDOFF_MARGIN_SECONDS
    records = context.instance.get_run_records(
        filters=dg.RunsFilter(
            job_name=MINUTE_JOB,
            statuses=[dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED],
            updated_after=dt.datetime.fromtimestamp(since - margin, dt.UTC),
        ),
        limit=HANDOFF_READS,
        order_by="update_timestamp",
        ascending=True,
    )
    more = len(records) == HANDOFF_READS
    newest, failures = since, [(ended, run_id, p) for p, (run_id, ended) in waiting.items()]
    reruns: list[dg.RunRequest] = []  # of minute runs that ended before their report
    for record in records:
        run, ended = record.dagster_run, record.update_timestamp.timestamp()
        newest = max(newest, ended)
        materialized, rerun = set(), False
        if run.tags.get(HANDOFF_TAG) == "pending":
            entries = run.tags.get(FAILED_TAG, "").split(",")
        elif run.status != dg.DagsterRunStatus.SUCCESS and not run.run_config.get("dry_run"):
            entries = run.run_config.get("partitions", [])  # it died or was cancelled before its report: all of them
            events = context.instance.get_records_for_run(  # but those it materialized before
                run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION, limit=len(entries)
            ).records
            materialized = {e.event_log_entry.dagster_event.partition for e in events}
            rerun = True  # one minute run again; a re-run that dies too, in halves: one that kills it ends alone
        else:
            continue
        due, problems = minute.parse_partitions(entries)
        for line in problems:
            context.log.warning(f"minute run {run.run_id}: {line}")
        left = [d.partition for d in due if d.partition not in materialized]
        again = HANDOFF_OF_TAG in run.tags
        if rerun and (len(left) > 1 or left and not again):
            context.log.info(f"minute run {run.run_id} ended before its report: {len(left)} partition(s) run again")
            parts = [left[: (len(left) + 1) // 2], left[(len(left) + 1) // 2 :]] if again else [left]
            reruns += [
                dg.RunRequest(
                    job_name=MINUTE_JOB,
                    run_key=f"rerun:{run.run_id}" + (f":{i}" if again else ""),
                    run_config={**run.run_config, "partitions": part},
                    tags={HANDOFF_OF_TAG: run.run_id},
                )
                for i, part in enumerate(parts)
            ]
        else:  # a failed partition, or the one a re-run that died held: a receiver_batches_job run
            failures += [(ended, run.run_id, p) for p in left]
    latest = {p: (run_id, ended) for ended, run_id, p in sorted(failures)}  # a partition once: its newest failure
    if not latest:
        return dg.SensorResult(
            run_requests=reruns,
            skip_reason=None if reruns else "no receiver failed in a minute run",
            cursor=json.dumps({"at": newest, "waiting": {}, "more": more}),
        )
    keys = sorted(latest)
    runs = context.instance.get_run_records(dg.RunsFilter(statuses=ACTIVE_STATUSES, tags={PARTITION_TAG: keys}))
    active = {r.dagster_run.tags[PARTITION_TAG]: r for r in runs}
    status = context.instance.get_status_by_partition(receiver_batches.key, keys, receiver_batches.partitions_def)
    requests, skipped, held = list(reruns), {}, {}
    receivers = set(context.instance.get_dynamic_partitions(receivers_partitions.name))
    for partition, (run_id, ended) in latest.items():
        other, (day, _, receiver) = active.get(partition), partition.partition("|")
        if receiver not in receivers or not days_partitions.has_partition_key(day):
            why = "its receiver was deleted?" if receiver not in receivers else "its day is outside the day partitions"
            skipped[partition] = f"not a partition of receiver_batches ({why}): not handed off"
        elif other is not None and (other.start_time is None or other.start_time >= ended):
            skipped[partition] = f"run {other.dagster_run.run_id} batches it (queued, or begun after the failure)"
        elif other is not None:  # its batch times end before the failure's: a tick after it ends looks again
            held[partition] = [run_id, ended]
            skipped[partition] = f"waits for run {other.dagster_run.run_id} (begun before the failure) to end"
        elif (status or {}).get(partition) == dg.AssetPartitionStatus.FAILED:
            skipped[partition] = "FAILED already (shown and alerted; minute runs and the redrive batch it again)"
        else:
            requests.append(
                dg.RunRequest(
                    job_name=PARTITION_JOB,
                    run_key=f"{run_id}:{partition}",
                    partition_key=dg.MultiPartitionKey({"receiver": receiver, "day": day}),
                    tags={HANDOFF_OF_TAG: run_id},
                )
            )
    line = f"{len(failures)} failure(s) of {len(latest)} partition(s) in minute runs, {len(requests)} run(s) "
    line += "requested" + "".join(f"; {p}: {why}" for p, why in list(skipped.items())[:20])
    if requests:
        context.log.info(line)
    cursor = json.dumps({"at": newest, "waiting": held, "more": more})
    return dg.SensorResult(run_requests=requests, skip_reason=None if requests else line, cursor=cursor)


def _tables_check(description: str):
    """A check on ``receiver_records`` (ReportStream's tables), with one-line failures, retried on AWS errors."""
    check = dg.asset_check(asset=receiver_records.key, description=description, retry_policy=AWS_RETRY_POLICY)
    return lambda fn: check(one_line_failures(fn))


@_tables_check("Every receiver's configuration can be scheduled.")
def receiver_configs_valid(
    context: dg.AssetCheckExecutionContext, dynamodb: DynamoDBResource, batching: BatchingSettings
) -> dg.AssetCheckResult:
    invalid = decider.invalid_receivers(store.scan_receivers(dynamodb.get_client(), batching.receivers_table))
    return dg.AssetCheckResult(
        passed=not invalid,
        severity=dg.AssetCheckSeverity.ERROR,
        description=f"{len(invalid)} receiver(s) with an invalid configuration are skipped" if invalid else None,
        metadata={"invalid_receivers": dg.MetadataValue.json(invalid), "count": dg.MetadataValue.int(len(invalid))},
    )


@_tables_check("No deleted receiver still has pending records.")
def no_orphaned_pending_records(
    context: dg.AssetCheckExecutionContext, dynamodb: DynamoDBResource, batching: BatchingSettings
) -> dg.AssetCheckResult:
    orphans = decider.orphaned_pending(dynamodb.get_client(), batching)
    return dg.AssetCheckResult(
        passed=not orphans,
        severity=dg.AssetCheckSeverity.WARN,
        description=(f"pending records of deleted receivers: {json.dumps(orphans)}" if orphans else None),
        metadata={"orphaned_pending": dg.MetadataValue.json(orphans)},
    )


@_tables_check("No pending record lacks receiver/created_at (such records are invisible to the pending-index).")
def pending_records_well_formed(
    context: dg.AssetCheckExecutionContext, dynamodb: DynamoDBResource, batching: BatchingSettings
) -> dg.AssetCheckResult:
    total, sample = decider.malformed_pending(dynamodb.get_client(), batching.records_table)
    return dg.AssetCheckResult(
        passed=total == 0,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"malformed_pending": dg.MetadataValue.int(total), "sample": dg.MetadataValue.json(sample)},
    )


batching_checks_job = dg.define_asset_job(
    "batching_checks_job",
    selection=dg.AssetSelection.checks_for_assets(receiver_records.key),
    tags={"groundskeeper/capability": "batching", ONE_AT_A_TIME_TAG: "batching_checks_job"},
    description="The batching asset checks (receiver configs, orphaned and malformed pending records).",
    executor_def=dg.in_process_executor,  # three short scans: a process each would cost more than they do
)


def _import_receiver_settings(context: dg.OpExecutionContext, params: ImportReceiverSettingsParams) -> dg.Output:
    clients = resource_clients(context, ("dynamodb", "s3"))
    batching = context.resources.batching
    changes, problems = import_settings(
        **clients, table=batching.receivers_table, path=params.path, dry_run=params.dry_run, root=batching.settings_dir
    )
    for line in problems:
        context.log.warning(line)
    for change in changes:
        if change.action == SKIPPED:
            context.log.warning(change.line())
        elif change.action != UNCHANGED or change.detail:
            context.log.info(change.line())
    counts = {a: sum(1 for c in changes if c.action == a) for a in (ADD, CHANGE, DISABLE, UNCHANGED, SKIPPED)}
    conflicts = sum(1 for c in changes if c.outcome.startswith("conflict"))
    verb = "would " if params.dry_run else ""
    context.log.info(
        f"ReportStream settings {params.path}: {verb}add {counts[ADD]}, {verb}change {counts[CHANGE]}, "
        f"{verb}disable {counts[DISABLE]}; {counts[UNCHANGED]} unchanged, {counts[SKIPPED]} skipped, "
        f"{len(problems)} file(s) or organization(s) not read" + (f", {conflicts} conflict(s)" if conflicts else "")
    )
    columns = ("receiver", "action", "outcome", "detail")
    rows = [{k: getattr(c, k) for k in columns} for c in changes]
    result = {"path": params.path, "dry_run": params.dry_run, **counts, "conflicts": conflicts, "not_read": problems}
    written = {
        f"receivers_{w}": 0 if params.dry_run else counts[a]
        for a, w in [(ADD, "added"), (CHANGE, "changed"), (DISABLE, "disabled")]
    }
    run_summary(context, "ReportStream receiver settings", written, dry_run=params.dry_run)
    metadata = metadata_from({**counts, "dry_run": params.dry_run, "conflicts": conflicts}) | {
        "not_read": dg.MetadataValue.json(problems),  # an empty list too
        "receivers": table_from(rows, dict(zip(columns, columns, strict=True))),
    }
    return dg.Output({**result, "changes": rows}, metadata=metadata)


import_receiver_settings = one_op_job(
    "import_receiver_settings",
    "import_reportstream_receivers",
    ImportReceiverSettingsParams,
    _import_receiver_settings,
    description="ReportStream's receiver settings (organizations.yml or a folder of organization files, local "
    "or s3://) into the receivers table: adds, changes and disables receivers `<organization>.<receiver>`; "
    "`dry_run` shows what it would do.",
    op_description="Reads ReportStream's receiver settings and adds, changes or disables receiver items to match.",
    tags={"groundskeeper/capability": "batching"},
    resources=("dynamodb", "s3", "batching"),
    executor_def=dg.in_process_executor,
)


def build_defs(*, executor: dg.ExecutorDefinition | None = None) -> dg.Definitions:
    """Batching; each batch run's step (a minute run's: each share's) on ``executor`` when given (the cluster's)."""
    checks_schedule = schedule(
        name="batching_checks_schedule",
        job=batching_checks_job,
        cron_schedule="*/15 * * * *",
        look=lambda context: decider.look_at_receivers(
            context.resources.dynamodb.get_client(), context.resources.batching
        ),
        refresh=dt.timedelta(hours=1),
        required_resource_keys={"dynamodb", "batching"},
        description="Every 15 minutes: the batching asset checks. Looks first (a scan of the receivers table and "
        f"of the pending-index, at most {decider.LOOK_READS} pages: past them the orphans are not compared) and runs "
        "them when the invalid receivers or the pending records of deleted receivers differ from what the last "
        "checks recorded, and at least every hour (the malformed records check scans the whole records table: it "
        "runs on that hourly refresh, or with the others).",
    )
    partition_job = dg.define_asset_job(
        PARTITION_JOB,
        selection=dg.AssetSelection.assets(receiver_batches).without_checks(),
        tags={"groundskeeper/capability": "batching", BATCHING_TAG: "partition"},
        description="Batches one (receiver, day) partition: a backfill, a redrive, a launch by hand, or a "
        "receiver that failed in a batch_minute_job run (batch_failures_handoff).",
        executor_def=executor or dg.in_process_executor,  # one asset: no step worth a process of its own
    )
    minutes = minute_job(executor)
    return dg.Definitions(
        assets=[receiver_batches, receiver_records],
        asset_checks=[receiver_configs_valid, no_orphaned_pending_records, pending_records_well_formed],
        jobs=[partition_job, minutes, batching_checks_job, import_receiver_settings],
        schedules=[batch_decider, checks_schedule],
        sensors=[receivers_sync, batch_failures_handoff.with_updated_jobs([partition_job, minutes])],
    )
