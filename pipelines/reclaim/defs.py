"""Dagster wiring of POP's agenda reclaimer: the ``reclaim_agendas`` job (run config: POP's flat JSON,
one :func:`pipelines.reclaim.engine.reclaim_pass` per segment) and a schedule per entry of its targets file."""

import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import dagster as dg

from pipelines.common import first_line
from pipelines.common.aws_batches import datum, put_metrics
from pipelines.common.defs.config import config_schema, flat_config, params_from_config
from pipelines.common.defs.failures import AWS_RETRY_POLICY, one_line_failures
from pipelines.common.defs.metadata import metadata_from
from pipelines.common.defs.metrics import CommittedChangeMetrics
from pipelines.common.defs.schedules import schedule
from pipelines.common.defs.summary import mark_dry_run, own_outcome, run_summary
from pipelines.common.http import location
from pipelines.common.targets import Target
from pipelines.reclaim.engine import LOOK_READS, Counts, KeyValueCursor, SegmentPlan, look, reclaim_pass
from pipelines.reclaim.http import EndpointError, endpoint_url, make_writer
from pipelines.reclaim.params import ParamsError, ReclaimParams, check_max_runtime
from pipelines.reclaim.source import TableError, inspect_table
from pipelines.reclaim.targets import load_targets
from pipelines.reclaim.writers import OperationProgressWriter
from resources import AgendaSettings, CloudWatchResource, DynamoDBResource, KMSResource

JOB_NAME = "reclaim_agendas"
PLAN_OP = "plan_reclaim"
MAX_RUNTIME_SECONDS = "900"  # dagster/max_runtime; maximumExecutionSeconds must stay below it
MAX_PARALLEL_SEGMENTS = 8
TABLE_TAG = "groundskeeper/table"  # one reclaim run per table (dagster.yaml tag concurrency limit)
WRITE_MODES = {  # DynamoDB writes grouped or not, for the run log's plan line
    True: "grouped writes (up to 25 conditional updates per BatchExecuteStatement)",
    False: "one conditional UpdateItem per item (DYNAMODB_GROUPED_WRITES off)",
}
# Counts field -> metric name (namespace RUNS_FLEET_METRICS_NAMESPACE, default RunsFleet).
ACTION_METRICS = {
    "reclaimed": "AgendaReclaimFailed",
    "retried": "AgendaReclaimRetried",
    "held": "AgendaReclaimHeld",
    "queued": "AgendaReclaimQueued",
    "exhausted": "AgendaReclaimExhausted",
    "raced": "AgendaReclaimRaced",
    "skipped": "AgendaReclaimSkipped",
    "errors": "AgendaReclaimErrors",
}


def execution_for(values: Mapping[str, Any]) -> dict[str, Any]:
    """Segments > 1 run on the multiprocess executor, anything else in process. Never raises: the
    plan op validates the values and fails with one line."""
    segments = values.get("segments")
    if isinstance(segments, int) and not isinstance(segments, bool) and segments > 1:
        return {"multiprocess": {"max_concurrent": min(segments, MAX_PARALLEL_SEGMENTS)}}
    return {"in_process": {}}


def older_run_on_same_table(instance: dg.DagsterInstance, run_id: str, table: str) -> str | None:
    """The id of an earlier-started reclaim run still working on ``table``, if any: the check of runs
    launched by hand (``docs/development.md``, "Queue hygiene")."""
    records = instance.get_run_records(
        dg.RunsFilter(job_name=JOB_NAME, statuses=[dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]),
        limit=100,
    )
    mine = instance.get_run_record_by_id(run_id)
    my_start = (mine.start_time if mine else None) or time.time()
    for record in records:
        other = record.dagster_run
        if other.run_id == run_id or (other.run_config or {}).get("tableName") != table:  # its flat run config
            continue
        if ((record.start_time or 0), other.run_id) < (my_start, run_id):
            return other.run_id
    return None


def put_reclaim_metrics(cloudwatch, namespace: str, table: str, counts: dict[str, Any]) -> int:
    """One PutMetricData call with a datum per action (zeros included, so alarms see quiet runs)."""
    data = [datum(metric, float(counts.get(field, 0)), TableName=table) for field, metric in ACTION_METRICS.items()]
    put_metrics(cloudwatch, namespace, data)
    return len(data)


@dg.op(
    name=PLAN_OP,
    config_schema=config_schema(ReclaimParams),
    out=dg.DynamicOut(SegmentPlan),
    description="Validate the parameters, check the table (and index), refuse overlaps, fan out the segments.",
    retry_policy=AWS_RETRY_POLICY,
)
@one_line_failures
def plan_reclaim(context: dg.OpExecutionContext, dynamodb: DynamoDBResource, agenda: AgendaSettings):
    own_outcome(context)
    params = params_from_config(context, ReclaimParams)
    deadline = time.time() + params.maximumExecutionSeconds
    try:
        check_max_runtime(params, context.run.tags.get("dagster/max_runtime"))
        if older := older_run_on_same_table(context.instance, context.run_id, params.tableName):
            context.log.warning(
                f"reclaim run {older} is still working on table {params.tableName}: this run does nothing"
            )
            yield dg.DynamicOutput(SegmentPlan(params, 0, deadline, overlap=older), mapping_key="segment_0")
            return
        url = endpoint_url(params, agenda)  # refuses an endpoint the deployment does not name
        client = dynamodb.get_client()
        info = inspect_table(client, params)
        if params.operationProgressTableName:
            OperationProgressWriter(client, params.operationProgressTableName)
    except (ParamsError, TableError) as exc:
        raise dg.Failure(description=first_line(exc, None), allow_retries=False) from None
    segments = 1 if info.index else params.segments
    context.log.info(
        f"reclaim {params.tableName}: {'query ' + info.index if info.index else f'scan in {segments} segment(s)'}, "
        f"action {params.reclaimAction}{' (DRY RUN: logReclaimOnly)' if params.logReclaimOnly else ''}, "
        f"writer {'HTTP ' + location(url) if url else 'DynamoDB, ' + WRITE_MODES[dynamodb.grouped_writes]}, "
        f"cutoff {params.reclaimAgeMinutes} min, "
        f"budget {params.maximumExecutionSeconds}s, about {info.item_count} item(s) in the table"
    )
    if info.index and params.segments > 1:
        context.log.info(f"segments={params.segments} ignored: the index query reads only stale items")
    for segment in range(segments):
        yield dg.DynamicOutput(SegmentPlan(params, segment, deadline, info=info), mapping_key=f"segment_{segment}")


@dg.op(
    description="Reclaim one parallel-scan segment (or the index queries): read, batch, act.",
    retry_policy=AWS_RETRY_POLICY,
)
@one_line_failures
def reclaim_segment(
    context: dg.OpExecutionContext,
    plan: SegmentPlan,
    dynamodb: DynamoDBResource,
    kms: KMSResource,
    agenda: AgendaSettings,
) -> dg.Output[Counts]:
    if plan.overlap or plan.info is None:
        return dg.Output(Counts(), metadata={"overlapping_run": plan.overlap or ""})
    params, info = plan.params, plan.info
    client = dynamodb.get_client()
    try:
        writer = operations = None
        if not params.logReclaimOnly:
            writer = make_writer(
                params, dynamodb=client, kms=kms.get_client(), agenda=agenda, grouped_writes=dynamodb.grouped_writes
            )
            if params.operationProgressTableName:
                operations = OperationProgressWriter(client, params.operationProgressTableName)
        counts = reclaim_pass(
            client,
            plan,
            writer,
            cursor=KeyValueCursor(context.instance.run_storage, params, plan.segment) if info.index is None else None,
            operations=operations,
            log=context.log,
            run_id=context.run_id,
        )
    except (ParamsError, EndpointError, TableError) as exc:
        raise dg.Failure(description=first_line(exc, None), allow_retries=False) from None
    result = asdict(counts)
    context.log.info(f"segment {plan.segment}: " + ", ".join(f"{k}={v}" for k, v in result.items() if v))
    return dg.Output(counts, metadata=metadata_from(result))


@dg.op(description="Sum the segments into the run's metadata and send one CloudWatch metric per action.")
def report_reclaim(
    context: dg.OpExecutionContext,
    plans: list[SegmentPlan],
    results: list[Counts],
    cloudwatch: CloudWatchResource,
    agenda: AgendaSettings,
) -> dg.Output[dict]:
    total = Counts()
    for result in results:
        total.add(result)
    params = plans[0].params
    summary = asdict(total)
    summary.update(table=params.tableName, action=params.reclaimAction, dry_run=params.logReclaimOnly)
    if overlap := next((p.overlap for p in plans if p.overlap), None):
        summary["overlapping_run"] = overlap
        mark_dry_run(context)  # it did nothing: its success resolves no incident of the table
    elif not params.logReclaimOnly:
        metrics = CommittedChangeMetrics(context, cloudwatch, f"reclaim {params.tableName}")
        put_reclaim_metrics(metrics, agenda.metrics_namespace, params.tableName, summary)
        summary["metrics_published"] = metrics.published
    told = ("scanned", "matched", "reclaimed", "retried", "held", "queued", "exhausted", "raced", "skipped", "errors")
    said = ", ".join(f"{name} {summary[name]}" for name in told)
    dry_run = " (dry run)" if params.logReclaimOnly else ""
    context.log.info(f"reclaim {params.tableName}{dry_run}: {said}, would act on {total.would_act}")
    counters = {"reclaimed": total.reclaimed, "retried": total.retried, "held": total.held, "errors": total.errors}
    run_summary(context, f"reclaim {params.tableName}", counters, dry_run=params.logReclaimOnly)
    return dg.Output(summary, metadata=metadata_from(summary))


def reclaim_job(executor_def: dg.ExecutorDefinition | None = None) -> dg.JobDefinition:
    """The ``reclaim_agendas`` job: segments on the multiprocess executor (:func:`execution_for`), or
    with ``executor_def`` (the cluster's ``celery_fan_out_executor``) a task any worker may take."""

    @dg.job(
        name=JOB_NAME,
        config=flat_config(PLAN_OP, ReclaimParams, execution=None if executor_def else execution_for),
        description="POP's agenda reclaimer: fail (or retry) stale EXECUTING AgendaProgress items. "
        "The flat run config is POP's JSON.",
        tags={"groundskeeper/capability": "reclaim", "dagster/max_runtime": MAX_RUNTIME_SECONDS},
        executor_def=executor_def or dg.multi_or_in_process_executor,  # the code location's default is in-process
    )
    def reclaim_agendas():
        plans = plan_reclaim()
        results = plans.map(reclaim_segment)
        report_reclaim(plans.collect(), results.collect())

    return reclaim_agendas


def schedule_for(
    target: Target, job: dg.JobDefinition | None = None, crons: Mapping[str, str] | None = None
) -> dg.ScheduleDefinition:
    table = target.config["tableName"]
    return schedule(
        name=f"reclaim_{target.name}",
        job=job,
        job_name=JOB_NAME,
        cron_schedule=target.cron,
        run_config=target.config,
        tags={TABLE_TAG: table, "groundskeeper/capability": "reclaim"},
        look=lambda context: look(context.resources.dynamodb.get_client(), target.params),
        required_resource_keys={"dynamodb"},
        crons=crons,
        description=f"Reclaim stale agendas of {table} ({target.cron}). Looks first (the run's own reads, at most "
        f"{LOOK_READS} pages) and runs when an item is to reclaim, or when the reads go on past that.",
    )


def build_defs(
    *,
    targets_file: Path | None = None,
    executor: dg.ExecutorDefinition | None = None,
    crons: Mapping[str, str] | None = None,
) -> dg.Definitions:
    """The job (its segments on ``executor`` when given: the cluster's Celery workers); a schedule
    per entry of ``targets_file`` (at the cron ``crons`` names for it, if any)."""
    job = reclaim_job(executor)
    return dg.Definitions(jobs=[job], schedules=[schedule_for(t, job, crons) for t in load_targets(targets_file)])
