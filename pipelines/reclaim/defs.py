"""Dagster wiring for agenda reclaim (seed 000): the ``reclaim_agendas`` job and one schedule per target.

The job's run config is the seed's flat JSON (a config mapping), so the seed's own sample runs
unchanged: ``dagster job execute -m pipelines.definitions -j reclaim_agendas -c sample.json``.
The ops stay thin: ``plan_reclaim`` validates and picks the path, ``reclaim_segment`` (one per
parallel-scan segment, mapped) calls :func:`pipelines.reclaim.engine.reclaim_pass`, and
``report_reclaim`` adds the counts to the run's metadata and sends the CloudWatch metrics.
"""

import dataclasses
import json
import os
import time

import dagster as dg

from pipelines.common.defs import aws_errors
from pipelines.reclaim.engine import Counts, reclaim_pass
from pipelines.reclaim.http import EndpointError
from pipelines.reclaim.metrics import put_reclaim_metrics
from pipelines.reclaim.params import ALL_FIELDS, REQUIRED, ParamsError, check_max_runtime, parse_params
from pipelines.reclaim.policy import policy_from_params
from pipelines.reclaim.source import TableError, TableInfo, inspect_table
from pipelines.reclaim.targets import Target, load_targets, targets_path
from pipelines.reclaim.wiring import KeyValueCursor, cursor_key, endpoint_url, make_writer
from pipelines.reclaim.writers import OperationProgressWriter
from resources import AgendaSettings, CloudWatchResource, DynamoDBResource, KMSResource

JOB_NAME = "reclaim_agendas"
MAX_RUNTIME_SECONDS = "900"  # dagster/max_runtime; maximumExecutionSeconds must stay below it
TABLE_TAG = "groundskeeper/table"  # one reclaim run per table (dagster.yaml tag concurrency limit)
MAX_PARALLEL_SEGMENTS = 8

_CONFIG_TYPES = {int: dg.Int, str: dg.String, bool: dg.Bool, dict: dg.Permissive()}
CONFIG_SCHEMA = {
    name: (
        dg.Field(_CONFIG_TYPES[kind], is_required=True)
        if name in REQUIRED
        else dg.Field(_CONFIG_TYPES[kind], is_required=False, default_value=default)
        if default is not None
        else dg.Field(_CONFIG_TYPES[kind], is_required=False)
    )
    for name, (kind, default) in ALL_FIELDS.items()
}


def _params_or_failure(raw: dict):
    try:
        return parse_params(raw)
    except ParamsError as exc:
        raise dg.Failure(description=str(exc), allow_retries=False) from None


@dg.config_mapping(config_schema=CONFIG_SCHEMA)
def reclaim_config(values: dict) -> dict:
    """The seed's flat JSON -> the plan op's config; segments > 1 run on the multiprocess executor."""
    params = parse_params({k: v for k, v in values.items() if v is not None})
    if params.segments > 1:
        execution = {"multiprocess": {"max_concurrent": min(params.segments, MAX_PARALLEL_SEGMENTS)}}
    else:
        execution = {"in_process": {}}
    return {
        "ops": {"plan_reclaim": {"config": {"params_json": json.dumps(params.as_config())}}},
        "execution": {"config": execution},
    }


class PlanConfig(dg.Config):
    params_json: str


def _table_of(run_config: dict) -> str | None:
    if isinstance(run_config.get("tableName"), str):
        return run_config["tableName"]
    try:
        raw = run_config["ops"]["plan_reclaim"]["config"]["params_json"]
        return json.loads(raw).get("tableName")
    except (KeyError, TypeError, ValueError):
        return None


def older_run_on_same_table(instance: dg.DagsterInstance, run_id: str, table: str) -> str | None:
    """The id of an earlier-started reclaim run still working on ``table``, if any."""
    records = instance.get_run_records(
        dg.RunsFilter(job_name=JOB_NAME, statuses=[dg.DagsterRunStatus.STARTED]), limit=100
    )
    mine = instance.get_run_record_by_id(run_id)
    my_start = (mine.start_time if mine else None) or time.time()
    for record in records:
        other = record.dagster_run
        if other.run_id == run_id or _table_of(other.run_config or {}) != table:
            continue
        if ((record.start_time or 0), other.run_id) < (my_start, run_id):
            return other.run_id
    return None


@dg.op(
    out=dg.DynamicOut(dict),
    description="Validate the parameters, check the table (and index), refuse overlaps, fan out the segments.",
)
def plan_reclaim(context: dg.OpExecutionContext, config: PlanConfig, dynamodb: DynamoDBResource):
    params = _params_or_failure(json.loads(config.params_json))
    try:
        check_max_runtime(params, context.run.tags.get("dagster/max_runtime"))
    except ParamsError as exc:
        raise dg.Failure(description=str(exc), allow_retries=False) from None
    deadline = time.time() + params.maximumExecutionSeconds
    base = {"params": params.as_config(), "deadline": deadline}
    older = older_run_on_same_table(context.instance, context.run_id, params.tableName)
    if older:
        context.log.warning(f"reclaim run {older} is still working on table {params.tableName}: this run does nothing")
        yield dg.DynamicOutput({**base, "segment": 0, "overlap": older}, mapping_key="segment_0")
        return
    client = dynamodb.get_client()
    with aws_errors(context):
        try:
            info = inspect_table(client, params)
            if params.operationProgressTableName:
                OperationProgressWriter(client, params.operationProgressTableName)
        except TableError as exc:
            raise dg.Failure(description=str(exc), allow_retries=False) from None
    segments = 1 if info.index else params.segments
    url = endpoint_url(params)
    context.log.info(
        f"reclaim {params.tableName}: {'query ' + info.index if info.index else f'scan in {segments} segment(s)'}, "
        f"action {params.reclaimAction}{' (DRY RUN: logReclaimOnly)' if params.dry_run else ''}, "
        f"writer {'HTTP ' + url if url else 'DynamoDB'}, cutoff {params.reclaimAgeMinutes} min, "
        f"budget {params.maximumExecutionSeconds}s, about {info.item_count} item(s) in the table"
    )
    if info.index and params.segments > 1:
        context.log.info(f"segments={params.segments} ignored: the index query reads only stale items")
    for segment in range(segments):
        yield dg.DynamicOutput(
            {**base, "segment": segment, "info": dataclasses.asdict(info)}, mapping_key=f"segment_{segment}"
        )


@dg.op(description="Reclaim one parallel-scan segment (or the index queries): read, batch, act.")
def reclaim_segment(
    context: dg.OpExecutionContext,
    plan: dict,
    dynamodb: DynamoDBResource,
    kms: KMSResource,
    agenda: AgendaSettings,
) -> dg.Output[dict]:
    params = _params_or_failure(plan["params"])
    if plan.get("overlap"):
        counts = Counts()
        return dg.Output(counts.as_dict(), metadata={"overlapping_run": plan["overlap"]})
    info = TableInfo(**{**plan["info"], "key_attrs": tuple(plan["info"]["key_attrs"])})
    client = dynamodb.get_client()
    storage = context.instance.run_storage
    cursor = KeyValueCursor(
        lambda key: storage.get_cursor_values({key}).get(key),
        lambda key, value: storage.set_cursor_values({key: value}),
        cursor_key(params, plan["segment"]),
    )
    try:
        policy = policy_from_params(params.retryPolicy) if params.reclaimAction == "retry" else None
        writer = None
        if not params.dry_run:
            writer = make_writer(params, dynamodb=client, kms=kms.get_client(), ready_table=agenda.ready_table)
        operations = (
            OperationProgressWriter(client, params.operationProgressTableName)
            if params.operationProgressTableName and not params.dry_run
            else None
        )
        with aws_errors(context):
            counts = reclaim_pass(
                dynamodb=client,
                info=info,
                params=params,
                writer=writer,
                deadline=plan["deadline"],
                segment=plan["segment"],
                cursor=cursor if info.index is None else None,
                policy=policy,
                operations=operations,
                log=context.log,
                run_id=context.run_id,
            )
    except (ParamsError, EndpointError, TableError) as exc:
        raise dg.Failure(description=str(exc), allow_retries=False) from None
    result = counts.as_dict()
    context.log.info(f"segment {plan['segment']}: " + ", ".join(f"{k}={v}" for k, v in result.items() if v))
    return dg.Output(result, metadata=_metadata(result))


def _metadata(result: dict) -> dict:
    out = {}
    for key, value in result.items():
        if isinstance(value, bool):
            out[key] = dg.MetadataValue.bool(value)
        elif isinstance(value, int):
            out[key] = dg.MetadataValue.int(value)
        elif value:
            out[key] = dg.MetadataValue.json(value)
    return out


@dg.op(description="Sum the segments into the run's metadata and send one CloudWatch metric per action.")
def report_reclaim(
    context: dg.OpExecutionContext, plans: list[dict], results: list[dict], cloudwatch: CloudWatchResource
) -> dg.Output[dict]:
    total = Counts()
    for result in results:
        total.add(Counts(**result))
    params = parse_params(plans[0]["params"])
    summary = total.as_dict()
    summary.update(table=params.tableName, action=params.reclaimAction, dry_run=params.dry_run)
    overlap = next((p["overlap"] for p in plans if p.get("overlap")), None)
    if overlap:
        summary["overlapping_run"] = overlap
    elif not params.dry_run:
        namespace = os.environ.get("RUNS_FLEET_METRICS_NAMESPACE") or "RunsFleet"
        with aws_errors(context):
            put_reclaim_metrics(cloudwatch.get_client(), namespace, params.tableName, summary)
    context.log.info(
        f"reclaim {params.tableName}{' (dry run)' if params.dry_run else ''}: scanned {total.scanned}, "
        f"matched {total.matched}, reclaimed {total.reclaimed}, retried {total.retried}, held {total.held}, "
        f"queued {total.queued}, exhausted {total.exhausted}, raced {total.raced}, skipped {total.skipped}, "
        f"errors {total.errors}, would act on {total.would_act}"
    )
    metadata = _metadata(summary)
    metadata.update(table=params.tableName, action=params.reclaimAction)
    return dg.Output(summary, metadata=metadata)


@dg.job(
    name=JOB_NAME,
    config=reclaim_config,
    description="Seed 000: fail (or retry) stale EXECUTING AgendaProgress items. Flat run config = the seed's JSON.",
    tags={"groundskeeper/capability": "reclaim", "dagster/max_runtime": MAX_RUNTIME_SECONDS},
)
def reclaim_agendas():
    plans = plan_reclaim()
    results = plans.map(reclaim_segment)
    report_reclaim(plans.collect(), results.collect())


def schedule_for(target: Target) -> dg.ScheduleDefinition:
    table = target.config["tableName"]
    return dg.ScheduleDefinition(
        name=f"reclaim_{target.name}",
        job=reclaim_agendas,
        cron_schedule=target.cron,
        run_config=target.config,
        tags={TABLE_TAG: table, "groundskeeper/capability": "reclaim"},
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description=f"Reclaim stale agendas of {table} ({target.cron}).",
    )


def build_defs(deployment: str) -> dg.Definitions:
    """The job everywhere; a schedule per entry of the deployment's targets file."""
    targets = load_targets(targets_path(deployment))
    return dg.Definitions(jobs=[reclaim_agendas], schedules=[schedule_for(t) for t in targets])
