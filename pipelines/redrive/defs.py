"""Dagster wiring of ``redrive_failed_partitions`` (docs/batching.md): one asset backfill, as the UI launches."""

import dataclasses
import datetime as dt
import secrets
import string
import time
from collections.abc import Callable, Container
from typing import Any

import dagster as dg

from pipelines.common import iso
from pipelines.common.defs.active_runs import ACTIVE_STATUSES, not_retried
from pipelines.common.defs.metadata import metadata_from
from pipelines.common.defs.schedules import ONE_AT_A_TIME_TAG
from pipelines.common.defs.summary import mark_dry_run
from pipelines.common.defs.tasks import one_op_job, resource_clients
from pipelines.redrive.params import RedriveParams
from pipelines.redrive.plan import FAILED, GONE, IN_BACKFILL, IN_PROGRESS, MISSING, SKIPPED, counts, plan, report
from pipelines.retry.runs import RETRY_MARGIN_SECONDS, run_retry
from pipelines.retry.tags import PARTITION_TAG

JOB_NAME = "redrive_failed_partitions"
OP_NAME = "find_and_relaunch"
REDRIVE_TAG = "groundskeeper/redrive"
CAPABILITY = {"groundskeeper/capability": "redrive"}


def _run_partitions(instance: dg.DagsterInstance, key: dg.AssetKey, runs_filter: dg.RunsFilter) -> set[str]:
    """The partition tags of the runs ``runs_filter`` selects that targeted ``key`` (or every asset)."""
    return {
        run.tags[PARTITION_TAG]
        for run in instance.get_runs(runs_filter, limit=10_000)
        if run.tags.get(PARTITION_TAG) and (not run.asset_selection or key in run.asset_selection)
    }


def _failed_since(instance: dg.DagsterInstance, key: dg.AssetKey, since: dt.datetime) -> set[str]:
    """Partition keys with a failure in the window: from the asset's failed-to-materialize events
    and from the partition tag of runs that failed in the window (a run that fails in its step
    records no such event, only the run failure). The caller keeps those whose status is failed."""
    failed: set[str] = set()
    cursor = None
    while True:
        page = instance.fetch_failed_materializations(
            dg.AssetRecordsFilter(asset_key=key, after_timestamp=since.timestamp()), limit=1000, cursor=cursor
        )
        failed |= {r.partition_key for r in page.records if r.partition_key}
        if not page.has_more:
            break
        cursor = page.cursor
    return failed | _run_partitions(
        instance, key, dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE], updated_after=since)
    )


def _backfill_module():
    """Dagster has no public API to launch an asset backfill from code or to list the unfinished ones:
    this is what the UI's "Launch backfill" uses, imported when a redrive runs (0.1 s that loading the code
    location need not pay)."""
    from dagster._core.execution import backfill

    return backfill


def unfinished_backfills(instance: dg.DagsterInstance, key: dg.AssetKey) -> dict[str, str]:
    """Partition -> backfill id, for the partitions of ``key`` that a backfill still running
    (requested or canceling) targets and has not yet seen materialized or failed: the daemon may
    not have created their runs yet, so they show in no partition status."""
    backfill = _backfill_module()
    pending: dict[str, str] = {}
    for status in (backfill.BulkActionStatus.REQUESTED, backfill.BulkActionStatus.CANCELING):
        for action in instance.get_backfills(status=status):
            data = action.asset_backfill_data
            if data is None:  # a job backfill: its partitions (the daemon may not have launched their runs)
                for name in action.partition_names or ():
                    pending.setdefault(name, action.backfill_id)
                continue
            for p in data.target_subset.iterate_asset_partitions():
                settled = p in data.materialized_subset or p in data.failed_and_downstream_subset
                if p.asset_key == key and p.partition_key and not settled:
                    pending.setdefault(p.partition_key, action.backfill_id)
    return pending


def partition_states(
    instance: dg.DagsterInstance,
    key: dg.AssetKey,
    partitions_def: dg.PartitionsDefinition,
    params: RedriveParams,
    backfills: dict[str, str],
) -> dict[str, str]:
    """Every candidate partition's state (``backfills``: partition -> unfinished backfill)."""
    now = dt.datetime.now(dt.UTC)
    since = now - dt.timedelta(hours=params.since_hours)
    existing = partitions_def.get_partition_keys(dynamic_partitions_store=instance)
    candidates = _failed_since(instance, key, since)
    if params.include_missing:  # those whose time window overlaps the window's; all of those without time
        timed = isinstance(partitions_def, dg.TimeWindowPartitionsDefinition) or (
            isinstance(partitions_def, dg.MultiPartitionsDefinition) and partitions_def.has_time_window_dimension
        )
        for k in existing:
            window = partitions_def.time_window_for_partition_key(k) if timed else None
            if window is None or (window.start < now and window.end > since):
                candidates.add(k)
    gone = candidates - set(existing)
    live = sorted(candidates - gone)
    statuses, in_flight = {}, set()
    if live:
        statuses = dict(instance.get_status_by_partition(key, live, partitions_def) or {})
        # a queued, starting or started run (also one of a job backfill)
        in_flight = _run_partitions(instance, key, dg.RunsFilter(statuses=ACTIVE_STATUSES, tags={PARTITION_TAG: live}))
    states = dict.fromkeys(gone, GONE)
    for k in live:
        status = statuses.get(k)
        if status == dg.AssetPartitionStatus.MATERIALIZED:
            continue  # succeeded since it failed; nothing to do
        if status == dg.AssetPartitionStatus.IN_PROGRESS or k in in_flight:
            states[k] = IN_PROGRESS
        elif k in backfills:
            states[k] = IN_BACKFILL
        elif status == dg.AssetPartitionStatus.FAILED:
            states[k] = FAILED
        elif status is None:
            states[k] = MISSING
    return states


def retries_due(
    instance: dg.DagsterInstance, key: dg.AssetKey, failed: list[str], retried_jobs: Container[str]
) -> dict[str, str]:
    """Partition -> when its retry is due, for each of the ``failed`` partitions whose latest failed run
    ``delayed_run_retries`` retries (the rule alerting reads too) and whose retry is not overdue: launched by
    a redrive as well, it would run twice (the retry does not know of the redrive's run)."""
    latest: dict[str, Any] = {}  # partition -> the record of its latest failed run of ``key`` (newest first)
    filters = dg.RunsFilter(statuses=[dg.DagsterRunStatus.FAILURE], tags={PARTITION_TAG: failed})
    for record in instance.get_run_records(filters) if failed else ():
        if not record.dagster_run.asset_selection or key in record.dagster_run.asset_selection:
            latest.setdefault(record.dagster_run.tags[PARTITION_TAG], record)
    due: dict[str, str] = {}
    for partition, record in latest.items():
        run, at = record.dagster_run, record.end_time or record.update_timestamp.timestamp()
        wait = run_retry(run.tags, run.run_id).wait
        if wait is not None and time.time() < at + wait + RETRY_MARGIN_SECONDS:
            if not not_retried(instance, run, retried_jobs, None):
                due[partition] = iso(dt.datetime.fromtimestamp(at + wait, dt.UTC))
    return due


OUTCOMES_SCHEMA = dg.TableSchema(
    columns=[
        dg.TableColumn("partition", "string"),
        dg.TableColumn("state", "string", description="failed, missing, in_progress, in_backfill or gone"),
        dg.TableColumn("outcome", "string", description="launched, would_launch or skipped"),
        dg.TableColumn("detail", "string"),
    ]
)


def build_defs(asset_graph: Callable[[], Any], retried_jobs: Callable[[], Container[str]]) -> dg.Definitions:
    """``asset_graph`` gives the code location's asset graph, ``retried_jobs`` the jobs ``delayed_run_retries``
    retries (both resolved when a run needs them)."""

    def redrive(context: dg.OpExecutionContext, params: RedriveParams) -> dg.Output[dict]:
        fleet = context.resources.fleet
        if context.run.tags.get(ONE_AT_A_TIME_TAG) != JOB_NAME:
            raise dg.Failure(
                description=f"run tag {ONE_AT_A_TIME_TAG} must be {JOB_NAME!r} (the job's own, got "
                f"{context.run.tags.get(ONE_AT_A_TIME_TAG)!r}): two redrives at once would launch a partition twice",
                allow_retries=False,
            )
        key = dg.AssetKey([part for part in params.asset.split("/") if part])
        graph = asset_graph()
        if not graph.has(key) or graph.get(key).partitions_def is None:
            partitioned = sorted(
                k.to_user_string() for k in graph.materializable_asset_keys if graph.get(k).partitions_def
            )
            raise dg.Failure(
                description=f"asset {params.asset!r} is not a partitioned asset here; one of: {', '.join(partitioned)}",
                allow_retries=False,
            )
        partitions_def = graph.get(key).partitions_def
        backfills = unfinished_backfills(context.instance, key)
        states = partition_states(context.instance, key, partitions_def, params, backfills)
        failed = [k for k, state in states.items() if state == FAILED]
        outcomes = plan(states, params, backfills, retries_due(context.instance, key, failed, retried_jobs()))
        keys = [o.partition for o in outcomes if o.outcome != SKIPPED]
        backfill_id = None
        if params.dry_run:
            mark_dry_run(context)  # it launches nothing: its success resolves no incident
        elif keys:
            backfill_id = "".join(secrets.choice(string.ascii_lowercase) for _ in range(8))  # as Dagster's ids
            context.instance.add_backfill(
                _backfill_module().PartitionBackfill.from_asset_partitions(
                    backfill_id=backfill_id,
                    asset_graph=graph,
                    partition_names=keys,
                    asset_selection=[key],
                    backfill_timestamp=time.time(),
                    tags={**CAPABILITY, REDRIVE_TAG: context.run_id},
                    dynamic_partitions_store=context.instance,
                    all_partitions=False,
                    title=f"redrive {params.asset}",
                    description=f"redrive_failed_partitions run {context.run_id}: {len(keys)} partition(s)",
                    run_config=None,
                )
            )
        s3_key, body = report(params, context.run_id, backfill_id, outcomes)
        resource_clients(context, ("s3",))["s3"].put_object(
            Bucket=fleet.archive_bucket, Key=s3_key, Body=body, ContentType="application/json"
        )
        totals = counts(outcomes)
        report_url = f"s3://{fleet.archive_bucket}/{s3_key}"
        context.log.info(
            f"redrive {params.asset} (last {params.since_hours} h): {sum(1 for s in states.values() if s == FAILED)} "
            f"failed, {sum(1 for s in states.values() if s == MISSING)} missing; launched {totals['launched']}, "
            f"would launch {totals['would_launch']}, skipped {totals['skipped']}"
            + (f" (backfill {backfill_id})" if backfill_id else "")
            + f"; report {report_url}"
        )
        result = {**totals, "asset": params.asset, "backfill_id": backfill_id or "", "report": report_url}
        table = dg.MetadataValue.table([dg.TableRecord(dataclasses.asdict(o)) for o in outcomes], OUTCOMES_SCHEMA)
        return dg.Output(result, metadata={"partitions": table, **metadata_from(result)})

    job = one_op_job(
        JOB_NAME,
        OP_NAME,
        RedriveParams,
        redrive,
        description=(
            "Relaunch the failed (optionally missing) partitions of a partitioned asset in a time window, "
            "bounded by max_runs, as one tagged backfill; reports each partition's outcome."
        ),
        op_description="Relaunch failed partitions.",
        tags={**CAPABILITY, ONE_AT_A_TIME_TAG: JOB_NAME},  # one redrive at a time: none launches a partition twice
        resources=("s3", "fleet"),
        executor_def=dg.in_process_executor,
    )
    return dg.Definitions(jobs=[job])
