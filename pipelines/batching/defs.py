"""Dagster wiring for ReportStream's per-receiver batching.

- ``receivers`` dynamic partitions, kept equal to the receivers table by the ``receivers_sync`` sensor;
- ``receiver_batches``: an asset partitioned by receiver x UTC day; materializing (r, d) writes every
  batch of r whose batch time falls in d, up to now, that is not written yet (logic in ``batcher``);
- ``batch_decider``: every minute, one run per receiver with a batch time in the last 60 s;
- ``receiver_records`` (the receivers and records tables, kept by ReportStream) and its asset checks:
  invalid receiver configs, pending records of deleted receivers, malformed records. The checks sit
  on the tables, not on ``receiver_batches``, so that a backfill of ``receiver_batches`` (whatever
  job the UI picks) runs the asset alone: Dagster adds an asset's checks to every run of it.
"""

import datetime as dt
import json
import os
import time

import dagster as dg

from pipelines.batching import store
from pipelines.batching.batcher import ReceiverBatcher, RunReport
from pipelines.batching.decider import (
    decide,
    invalid_receivers,
    look_at_receivers,
    malformed_pending,
    orphaned_pending,
    valid_partition_names,
)
from pipelines.batching.params import ImportReceiverSettingsParams, ReceiverBatchesParams, batch_start_date
from pipelines.batching.reportstream_settings import ADD, CHANGE, DISABLE, SKIPPED, UNCHANGED, import_settings
from pipelines.common.defs.active_runs import active_run, still_going
from pipelines.common.defs.config import config_schema, flat_config, params_from_config
from pipelines.common.defs.failures import AWS_RETRY_POLICY, one_line_failures
from pipelines.common.defs.metadata import rounded, table_from
from pipelines.common.defs.schedules import schedule
from pipelines.common.defs.summary import run_summary
from pipelines.common.looks import Look
from resources import BatchingSettings, DynamoDBResource, S3Resource

BATCH_START_DATE = batch_start_date(os.environ, dt.date.today())

receivers_partitions = dg.DynamicPartitionsDefinition(name="receivers")
days_partitions = dg.DailyPartitionsDefinition(start_date=BATCH_START_DATE, end_offset=1, timezone="UTC")
batch_partitions = dg.MultiPartitionsDefinition({"receiver": receivers_partitions, "day": days_partitions})


def report_metadata(report: RunReport) -> dict:
    files = report.files
    return {
        "status": dg.MetadataValue.text(report.status),
        "dry_run": dg.MetadataValue.bool(report.dry_run),
        "batch_times_written": dg.MetadataValue.json([b.batch_time for b in report.batches if b.files]),
        "batch_times_without_records": dg.MetadataValue.json([b.batch_time for b in report.batches if not b.files]),
        "batch_times_already_done": dg.MetadataValue.int(len(report.already_done)),
        "files_written": dg.MetadataValue.int(len(files)),
        "files": dg.MetadataValue.json([f.key for f in files]),
        "records_per_file": dg.MetadataValue.json({f.key: f.records for f in files}),
        "records_batched": dg.MetadataValue.int(report.records_batched),
        "invalid_json_payloads": dg.MetadataValue.int(sum(f.invalid_payloads for f in files)),
        "recovered_batches": dg.MetadataValue.json(report.recovered),
        "invalid_records": dg.MetadataValue.json(report.invalid_records[:100]),
        "invalid_record_count": dg.MetadataValue.int(len(report.invalid_records)),
        "pending_before": dg.MetadataValue.int(report.pending_before),
        "still_pending": dg.MetadataValue.int(report.still_pending),
        "oldest_pending_age_seconds": dg.MetadataValue.float(
            rounded("oldest_pending_age_seconds", report.oldest_pending_age_seconds or 0.0)
        ),
    }


@dg.asset(
    partitions_def=batch_partitions,
    description=(
        "Outbox batch files of one receiver for one UTC day: every batch time of that day up to now "
        "that is not written yet, each with the receiver's pending records created before it."
    ),
    kinds={"s3", "dynamodb"},
    group_name="batching",
    config_schema=config_schema(ReceiverBatchesParams),
    retry_policy=AWS_RETRY_POLICY,
)
@one_line_failures
def receiver_batches(
    context: dg.AssetExecutionContext,
    dynamodb: DynamoDBResource,
    s3: S3Resource,
    batching: BatchingSettings,
) -> dg.MaterializeResult:
    params = params_from_config(context, ReceiverBatchesParams)
    keys = context.partition_key.keys_by_dimension
    receiver, day = keys["receiver"], keys["day"]
    settings = params.settings(
        receivers_table=batching.receivers_table,
        records_table=batching.records_table,
        outbox_bucket=batching.outbox_bucket,
    )
    batcher = ReceiverBatcher(
        dynamodb.get_client(), s3.get_client(), settings, owner=f"run-{context.run_id}", log=context.log.info
    )
    try:
        report = batcher.run(receiver, day, dt.datetime.now(dt.UTC), dry_run=params.dry_run)
    except store.ReceiverBusy as exc:
        raise dg.Failure(str(exc)) from exc
    metadata = report_metadata(report)
    for problem in report.invalid_records[:20]:
        context.log.error(f"record {problem['record_id']} left pending: {problem['problem']}")
    if report.status in {"invalid_config", "receiver_missing"}:
        raise dg.Failure(description="; ".join(report.errors), metadata=metadata, allow_retries=False)
    if report.status in {"disabled", "cancelled"}:
        context.log.warning(f"{receiver}: batching_enabled is false ({report.status}); remaining batches wait")
    context.log.info(
        f"{receiver} {day}: {len(report.batches)} batch time(s), {len(report.files)} file(s), "
        f"{report.records_batched} record(s); {report.still_pending} still pending"
    )
    counters = {"batches_sent": 0 if params.dry_run else len(report.files), "records_batched": report.records_batched}
    run_summary(context, f"batches of {receiver} for {day}", counters, "dry run" if params.dry_run else "")
    return dg.MaterializeResult(metadata=metadata)


RECEIVER_TAG = "dagster/partition/receiver"
"""The receiver of a batch run: Dagster tags every run of a multi-partition with each dimension's key
(hidden in the runs list, which shows the partition itself)."""

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


def batches_job(executor_def: dg.ExecutorDefinition | None = None):
    """The ``receiver_batches_job``: in process (one asset, no step worth a process of its own)
    unless ``executor_def`` is given (the cluster's Celery executor, ``celery_fan_out_executor``)."""
    return dg.define_asset_job(
        "receiver_batches_job",
        selection=dg.AssetSelection.assets(receiver_batches).without_checks(),
        tags={"groundskeeper/capability": "batching"},
        description="Batches one (receiver, day) partition; launched by batch_decider or a backfill.",
        executor_def=executor_def or dg.in_process_executor,
    )


receiver_batches_job = batches_job()


SYNC_REFRESH_SECONDS = 600
"""receivers_sync compares the receivers table with the partitions themselves at least this often;
in between, with the table as its last tick read it (its cursor): partitions added or removed by
hand are put right within this time, a changed table at the next tick."""


def _synced(cursor: str | None) -> tuple[list[str], float] | None:
    """(the receiver names, when) the sync last found the partitions equal to, from its cursor."""
    try:
        seen = json.loads(cursor or "")
        return list(seen["receivers"]), float(seen["at"])
    except (ValueError, KeyError, TypeError):
        return None


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
    wanted, bad = valid_partition_names(items)
    if bad:
        context.log.warning(f"receiver names that cannot be partition keys (skipped): {', '.join(bad[:20])}")
    clock, names = time.time(), sorted(wanted)
    seen = _synced(context.cursor)
    if seen is not None and seen[0] == names and clock - seen[1] < SYNC_REFRESH_SECONDS:
        return dg.SkipReason(f"{len(names)} receiver(s), the table unchanged since the partitions were in sync")
    current = set(context.instance.get_dynamic_partitions(receivers_partitions.name))
    add, remove = sorted(wanted - current), sorted(current - wanted)
    cursor = json.dumps({"receivers": names, "at": clock})
    if not add and not remove:
        context.update_cursor(cursor)
        return dg.SkipReason(f"{len(current)} receiver partition(s), all in sync")
    context.log.info(f"receivers: adding {add[:20]}, removing {remove[:20]}")
    requests = []
    if add:
        requests.append(receivers_partitions.build_add_request(add))
    if remove:
        requests.append(receivers_partitions.build_delete_request(remove))
    return dg.SensorResult(dynamic_partitions_requests=requests, cursor=cursor)


@dg.schedule(
    cron_schedule="* * * * *",
    job_name=receiver_batches_job.name,  # the deployment's receiver_batches_job (build_defs)
    execution_timezone="UTC",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Every minute: a run for (receiver, today) per enabled receiver with a batch time in the last 60 s.",
)
@one_line_failures
def batch_decider(context: dg.ScheduleEvaluationContext, dynamodb: DynamoDBResource, batching: BatchingSettings):
    tick = context.scheduled_execution_time or dt.datetime.now(dt.UTC)
    decision = decide(
        dynamodb.get_client(),
        receivers_table=batching.receivers_table,
        records_table=batching.records_table,
        tick=tick.astimezone(dt.UTC),
    )
    if not decision.due:
        return dg.SkipReason(f"no receiver due at {tick:%H:%M} ({decision.receivers} receiver(s))")
    # A receiver whose previous batch run is still queued or running is left out: that run sends its records.
    previous = {d.receiver: active_run(context.instance, receiver_batches_job.name, {RECEIVER_TAG: d.receiver})
                for d in decision.due}  # fmt: skip
    busy = [f"{receiver}: the previous batch run {still_going(run)}" for receiver, run in previous.items() if run]
    due = [d for d in decision.due if previous[d.receiver] is None]
    if not due:
        return dg.SkipReason("; ".join(busy))
    for line in busy:
        context.log.info(f"left out of this tick: {line}")
    for d in due:  # on the tick's page (the run shows its partition, its counts once it ends)
        context.log.info(f"{d.receiver}: batch time {d.run_key.split('@', 1)[1]}, {d.pending} record(s) pending, "
                         f"{d.expected_files} file(s) expected")  # fmt: skip
    known = set(context.instance.get_dynamic_partitions(receivers_partitions.name))
    new = sorted({d.receiver for d in due} - known)
    if new:  # receivers_sync has not seen them yet: add them now rather than miss a batch
        context.instance.add_dynamic_partitions(receivers_partitions.name, new)
    return [
        dg.RunRequest(
            run_key=d.run_key,
            partition_key=dg.MultiPartitionKey({"receiver": d.receiver, "day": d.day}),
        )
        for d in due
    ]


@dg.asset_check(
    asset=receiver_records.key,
    description="Every receiver's configuration can be scheduled.",
    retry_policy=AWS_RETRY_POLICY,
)
@one_line_failures
def receiver_configs_valid(
    context: dg.AssetCheckExecutionContext, dynamodb: DynamoDBResource, batching: BatchingSettings
) -> dg.AssetCheckResult:
    invalid = invalid_receivers(dynamodb.get_client(), batching.receivers_table)
    return dg.AssetCheckResult(
        passed=not invalid,
        severity=dg.AssetCheckSeverity.ERROR,
        description=f"{len(invalid)} receiver(s) with an invalid configuration are skipped" if invalid else None,
        metadata={"invalid_receivers": dg.MetadataValue.json(invalid), "count": dg.MetadataValue.int(len(invalid))},
    )


@dg.asset_check(
    asset=receiver_records.key,
    description="No deleted receiver still has pending records.",
    retry_policy=AWS_RETRY_POLICY,
)
@one_line_failures
def no_orphaned_pending_records(
    context: dg.AssetCheckExecutionContext, dynamodb: DynamoDBResource, batching: BatchingSettings
) -> dg.AssetCheckResult:
    orphans = orphaned_pending(
        dynamodb.get_client(), receivers_table=batching.receivers_table, records_table=batching.records_table
    )
    return dg.AssetCheckResult(
        passed=not orphans,
        severity=dg.AssetCheckSeverity.WARN,
        description=(f"pending records of deleted receivers: {json.dumps(orphans)}" if orphans else None),
        metadata={"orphaned_pending": dg.MetadataValue.json(orphans)},
    )


@dg.asset_check(
    asset=receiver_records.key,
    description="No pending record lacks receiver/created_at (such records are invisible to the pending-index).",
    retry_policy=AWS_RETRY_POLICY,
)
@one_line_failures
def pending_records_well_formed(
    context: dg.AssetCheckExecutionContext, dynamodb: DynamoDBResource, batching: BatchingSettings
) -> dg.AssetCheckResult:
    total, sample = malformed_pending(dynamodb.get_client(), batching.records_table)
    return dg.AssetCheckResult(
        passed=total == 0,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"malformed_pending": dg.MetadataValue.int(total), "sample": dg.MetadataValue.json(sample)},
    )


batching_checks_job = dg.define_asset_job(
    "batching_checks_job",
    selection=dg.AssetSelection.checks_for_assets(receiver_records.key),
    tags={"groundskeeper/capability": "batching"},
    description="The batching asset checks (receiver configs, orphaned and malformed pending records).",
    executor_def=dg.in_process_executor,  # three short scans: a process each would cost more than they do
)


CHECKS_REFRESH = dt.timedelta(hours=1)
"""The batching checks run at least this often, whatever their schedule's look finds."""


def _receivers_look(context: dg.ScheduleEvaluationContext) -> Look:
    batching: BatchingSettings = context.resources.batching
    return look_at_receivers(
        context.resources.dynamodb.get_client(),
        receivers_table=batching.receivers_table,
        records_table=batching.records_table,
    )


IMPORT_OP = "import_reportstream_receivers"


@dg.op(
    name=IMPORT_OP,
    description="Reads ReportStream's receiver settings and adds, changes or disables receiver items to match.",
    retry_policy=AWS_RETRY_POLICY,
)
@one_line_failures
def import_receiver_settings_op(
    context: dg.OpExecutionContext, dynamodb: DynamoDBResource, s3: S3Resource, batching: BatchingSettings
) -> dg.Output[dict]:
    params = params_from_config(context, ImportReceiverSettingsParams)
    changes, problems = import_settings(
        dynamodb.get_client(), s3.get_client(), table=batching.receivers_table, path=params.path, dry_run=params.dry_run
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
    rows = [{"receiver": c.receiver, "action": c.action, "outcome": c.outcome, "detail": c.detail} for c in changes]
    result = {"path": params.path, "dry_run": params.dry_run, **counts, "conflicts": conflicts, "not_read": problems}
    written = {
        f"receivers_{w}": 0 if params.dry_run else counts[a]
        for a, w in [(ADD, "added"), (CHANGE, "changed"), (DISABLE, "disabled")]
    }
    run_summary(context, "ReportStream receiver settings", written, "dry run" if params.dry_run else "")
    metadata = {
        **{k: dg.MetadataValue.int(v) for k, v in counts.items()},
        "dry_run": dg.MetadataValue.bool(params.dry_run),
        "conflicts": dg.MetadataValue.int(conflicts),
        "not_read": dg.MetadataValue.json(problems),
        "receivers": table_from(
            rows, {"receiver": "receiver", "action": "action", "outcome": "outcome", "detail": "detail"}
        ),
    }
    return dg.Output({**result, "changes": rows}, metadata=metadata)


@dg.job(
    name="import_receiver_settings",
    config=flat_config(IMPORT_OP, ImportReceiverSettingsParams),
    description="ReportStream's receiver settings (organizations.yml or a folder of organization files, local "
    "or s3://) into the receivers table: adds, changes and disables receivers `<organization>.<receiver>`; "
    "`dry_run` shows what it would do.",
    tags={"groundskeeper/capability": "batching"},
    executor_def=dg.in_process_executor,
)
def import_receiver_settings():
    import_receiver_settings_op()


def build_defs(*, executor: dg.ExecutorDefinition | None = None) -> dg.Definitions:
    """Batching; each batch run's step on ``executor`` when given (the cluster's Celery workers)."""
    checks_schedule = schedule(
        name="batching_checks_schedule",
        job=batching_checks_job,
        cron_schedule="*/15 * * * *",
        look=_receivers_look,
        refresh=CHECKS_REFRESH,
        required_resource_keys={"dynamodb", "batching"},
        description="Every 15 minutes: the batching asset checks. Looks first (a scan of the receivers table and "
        "of the pending-index) and runs them when the invalid receivers or the pending records of deleted "
        "receivers differ from what the last checks recorded, and at least every hour (the malformed records "
        "check scans the whole records table: it runs on that hourly refresh, or with the others).",
    )
    return dg.Definitions(
        assets=[receiver_batches, receiver_records],
        asset_checks=[receiver_configs_valid, no_orphaned_pending_records, pending_records_well_formed],
        jobs=[
            batches_job(executor) if executor else receiver_batches_job,
            batching_checks_job,
            import_receiver_settings,
        ],
        schedules=[batch_decider, checks_schedule],
        sensors=[receivers_sync],
    )
