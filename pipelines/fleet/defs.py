"""Dagster layer of the fleet queue processors (seed 002). Thin: read config, call the logic, report.

- ``process_termination_queue`` / ``process_housekeeping_queue``: one drain run per queue at a time
  (run tag ``groundskeeper/queue``), launched by ``termination_queue_sensor`` /
  ``housekeeping_queue_sensor`` when messages wait.
- ``housekeeping``: runs one task; its flat run config is the seed's message. Three schedules.
- ``redrive_dead_letters``: by hand; moves dead letters back at a rate, quarantines repeat offenders.
- ``fleet_dead_letter_checks``: asset checks on the depth of each dead-letter queue (warn above 0).
"""

from typing import Any, Literal

import dagster as dg

from pipelines.fleet.aws import FleetContext, queue_depth, queue_name
from pipelines.fleet.dead_letters import RedriveSettings, redrive
from pipelines.fleet.drain import DrainLimits, run_with_graceful_stop
from pipelines.fleet.housekeeping import housekeeping_drain, parse_request, run_task
from pipelines.fleet.messages import InvalidMessage
from pipelines.fleet.termination import termination_drain
from pipelines.pool_audit.defs import record_housekeeping_audits
from resources import (
    CloudWatchResource,
    DynamoDBResource,
    EC2Resource,
    FleetSettings,
    S3Resource,
    SQSResource,
    SSMResource,
    clear_aws_errors,
)

TERMINATION_QUEUE = "runs-fleet-termination"
HOUSEKEEPING_QUEUE = "runs-fleet-housekeeping"
QUEUE_TAG = "groundskeeper/queue"
CAPABILITY_TAGS = {"groundskeeper/capability": "fleet"}


class DrainConfig(dg.Config):
    """The seed's flat drain config, plus optional knobs."""

    concurrency: int = 5
    maxMessages: int = 0
    maxSeconds: float = 300
    waitSeconds: int = 2
    stopTimeoutSeconds: float = 60

    def limits(self) -> DrainLimits:
        try:
            return DrainLimits(
                concurrency=self.concurrency,
                max_messages=self.maxMessages,
                max_seconds=self.maxSeconds,
                wait_seconds=self.waitSeconds,
                stop_timeout_seconds=self.stopTimeoutSeconds,
            )
        except ValueError as exc:
            raise dg.Failure(description=f"invalid run config: {exc}", allow_retries=False) from None


def _flat(op_name: str, config_cls: type[dg.Config]) -> dg.ConfigMapping:
    """Run config given flat (the seed's JSON as is) is handed to the job's one op."""

    def fn(values: dict[str, Any]) -> dict[str, Any]:
        return {"ops": {op_name: {"config": values}}}

    return dg.ConfigMapping(config_fn=fn, config_schema=config_cls.to_fields_dict())


def _fleet_context(context, *, ssm, dynamodb, cloudwatch, s3, fleet: FleetSettings, ec2=None) -> FleetContext:
    return FleetContext(
        ec2=ec2.get_client() if ec2 is not None else None,
        ssm=ssm.get_client(),
        dynamodb=dynamodb.get_client(),
        cloudwatch=cloudwatch.get_client(),
        s3=s3.get_client(),
        jobs_table=fleet.jobs_table,
        archive_bucket=fleet.archive_bucket,
        namespace=fleet.metrics_namespace,
        log=context.log,
        pools_table=fleet.pools_table,
    )


def _drain(context: dg.OpExecutionContext, make_drain, ctx: FleetContext, sqs, queue_url: str, dlq_url: str, config):
    """Build the queue's drain, run it with graceful stop, and report its counts as metadata."""
    drain = make_drain(
        ctx, sqs=sqs.get_client(), queue_url=queue_url, dlq_url=dlq_url, run_id=context.run_id, limits=config.limits()
    )
    result, interrupt = run_with_graceful_stop(drain, logger=context.log)
    summary = result.as_dict(drain.report_keys)
    if interrupt is not None:
        raise interrupt
    metadata = {
        k: (dg.MetadataValue.float(v) if isinstance(v, float) else v)
        for k, v in summary.items()
        if isinstance(v, int | float | str)
    }
    keys = drain.handler.archive.keys
    metadata["raw_archive"] = dg.MetadataValue.text(f"s3://{ctx.archive_bucket}/{keys[0]}" if keys else "(nothing)")
    results = getattr(drain.handler, "results", None)
    record_housekeeping_audits(context, results or [])
    if results:
        metadata["tasks"] = dg.MetadataValue.json(results)
    return dg.Output(summary, metadata=metadata)


@dg.op(
    description="Drains the termination queue: archive, conditional job update, SSM clean-up, metrics, ack.",
    tags={"kind": "sqs"},
)
def drain_termination_queue(
    context: dg.OpExecutionContext,
    config: DrainConfig,
    sqs: SQSResource,
    dynamodb: DynamoDBResource,
    ssm: SSMResource,
    cloudwatch: CloudWatchResource,
    s3: S3Resource,
    fleet: FleetSettings,
) -> dg.Output[dict]:
    with clear_aws_errors():
        ctx = _fleet_context(context, ssm=ssm, dynamodb=dynamodb, cloudwatch=cloudwatch, s3=s3, fleet=fleet)
        return _drain(
            context, termination_drain, ctx, sqs, fleet.termination_queue_url, fleet.termination_dlq_url, config
        )


@dg.op(description="Drains the housekeeping queue: dispatches each message on its task_type.", tags={"kind": "sqs"})
def drain_housekeeping_queue(
    context: dg.OpExecutionContext,
    config: DrainConfig,
    sqs: SQSResource,
    ec2: EC2Resource,
    dynamodb: DynamoDBResource,
    ssm: SSMResource,
    cloudwatch: CloudWatchResource,
    s3: S3Resource,
    fleet: FleetSettings,
) -> dg.Output[dict]:
    with clear_aws_errors():
        ctx = _fleet_context(context, ec2=ec2, ssm=ssm, dynamodb=dynamodb, cloudwatch=cloudwatch, s3=s3, fleet=fleet)
        return _drain(
            context, housekeeping_drain, ctx, sqs, fleet.housekeeping_queue_url, fleet.housekeeping_dlq_url, config
        )


@dg.job(
    description="Drain the termination queue (launched by termination_queue_sensor; one run per queue at a time).",
    tags={**CAPABILITY_TAGS, QUEUE_TAG: TERMINATION_QUEUE},
    config=_flat("drain_termination_queue", DrainConfig),
)
def process_termination_queue():
    drain_termination_queue()


@dg.job(
    description="Drain the housekeeping queue (launched by housekeeping_queue_sensor; one run per queue at a time).",
    tags={**CAPABILITY_TAGS, QUEUE_TAG: HOUSEKEEPING_QUEUE},
    config=_flat("drain_housekeeping_queue", DrainConfig),
)
def process_housekeeping_queue():
    drain_housekeeping_queue()


# ------------------------------------------------------------------------ housekeeping

HOUSEKEEPING_SCHEMA = {
    "task_type": dg.Field(str, description="orphaned_instances | stale_ssm | old_jobs | pool_audit"),
    "timestamp": dg.Field(dg.Noneable(str), default_value=None, is_required=False),
    "params": dg.Field(
        dg.Permissive(),
        default_value={},
        is_required=False,
        description="now (ISO-8601, what-if clock), dryRun (bool), and the task's own: max_runtime, "
        "confirm_after_minutes, terminated_grace_minutes, retention_days, idle_cost_threshold_usd_per_hour",
    ),
}


@dg.op(
    description="Runs one housekeeping task (the seed's message shape as config).", config_schema=HOUSEKEEPING_SCHEMA
)
def run_housekeeping_task(
    context: dg.OpExecutionContext,
    ec2: EC2Resource,
    dynamodb: DynamoDBResource,
    ssm: SSMResource,
    cloudwatch: CloudWatchResource,
    s3: S3Resource,
    fleet: FleetSettings,
) -> dg.Output[dict]:
    try:
        request = parse_request({k: v for k, v in context.op_config.items() if v is not None})
    except InvalidMessage as exc:
        raise dg.Failure(description=f"invalid housekeeping request: {exc.reason}", allow_retries=False) from None
    with clear_aws_errors():
        ctx = _fleet_context(context, ec2=ec2, ssm=ssm, dynamodb=dynamodb, cloudwatch=cloudwatch, s3=s3, fleet=fleet)
        try:
            result = run_task(ctx, request)
        except InvalidMessage as exc:
            raise dg.Failure(description=f"invalid housekeeping request: {exc.reason}", allow_retries=False) from None
    record_housekeeping_audits(context, [result])
    context.log.info(f"{request.task_type}: " + ", ".join(f"{k}={v}" for k, v in result.items()))
    return dg.Output(
        result,
        metadata={"task_type": request.task_type, **{k: v for k, v in result.items() if isinstance(v, int | str)}},
    )


@dg.job(
    description="Run one housekeeping task. Flat config: {task_type, timestamp, params}.",
    tags=CAPABILITY_TAGS,
    config=dg.ConfigMapping(
        config_fn=lambda values: {"ops": {"run_housekeeping_task": {"config": values}}},
        config_schema=HOUSEKEEPING_SCHEMA,
    ),
)
def housekeeping():
    run_housekeeping_task()


HOUSEKEEPING_SCHEDULES = {
    "orphaned_instances": "*/5 * * * *",
    "stale_ssm": "*/15 * * * *",
    "old_jobs": "0 * * * *",
}


def _housekeeping_schedule(task_type: str, cron: str) -> dg.ScheduleDefinition:
    @dg.schedule(
        name=f"housekeeping_{task_type}_schedule",
        job=housekeeping,
        cron_schedule=cron,
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description=f"Runs the {task_type} housekeeping task ({cron}), as runs-fleet's EventBridge rules do.",
    )
    def _schedule(context: dg.ScheduleEvaluationContext):
        moment = context.scheduled_execution_time
        return dg.RunRequest(
            run_key=f"{task_type}-{moment.isoformat()}" if moment else None,
            run_config={"task_type": task_type, "timestamp": moment.isoformat() if moment else None, "params": {}},
            tags={"groundskeeper/task": task_type},
        )

    return _schedule


# ------------------------------------------------------------------------------ sensors


def _queue_sensor(name: str, job: dg.JobDefinition, queue_field: str, label: str) -> dg.SensorDefinition:
    @dg.sensor(
        name=name,
        job=job,
        minimum_interval_seconds=30,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Launches a {job.name} run when messages wait on the {label} queue (one GetQueueAttributes).",
        required_resource_keys={"sqs", "fleet"},
    )
    def _sensor(context: dg.SensorEvaluationContext):
        fleet: FleetSettings = context.resources.fleet
        url = getattr(fleet, queue_field)
        with clear_aws_errors():
            depth = queue_depth(context.resources.sqs.get_client(), url)
        if depth["visible"] == 0:
            return dg.SkipReason(f"{queue_name(url)} is empty ({depth['in_flight']} in flight)")
        active = context.instance.get_runs(
            filters=dg.RunsFilter(
                job_name=job.name,
                statuses=[
                    dg.DagsterRunStatus.QUEUED,
                    dg.DagsterRunStatus.NOT_STARTED,
                    dg.DagsterRunStatus.STARTING,
                    dg.DagsterRunStatus.STARTED,
                ],
            ),
            limit=1,
        )
        if active:
            return dg.SkipReason(f"{depth['visible']} waiting; drain run {active[0].run_id} is still going")
        sequence = int(context.cursor or 0) + 1
        context.update_cursor(str(sequence))
        return dg.RunRequest(
            run_key=f"{label}-drain-{sequence}",
            tags={QUEUE_TAG: TERMINATION_QUEUE if label == "termination" else HOUSEKEEPING_QUEUE},
        )

    return _sensor


termination_queue_sensor = _queue_sensor(
    "termination_queue_sensor", process_termination_queue, "termination_queue_url", "termination"
)
housekeeping_queue_sensor = _queue_sensor(
    "housekeeping_queue_sensor", process_housekeeping_queue, "housekeeping_queue_url", "housekeeping"
)


# ------------------------------------------------------------------------- dead letters


class RedriveConfig(dg.Config):
    queue: Literal["termination", "housekeeping"] = "termination"
    ratePerSecond: float = 10.0
    maxMessages: int = 0
    maxRedrives: int = 3
    dryRun: bool = False


@dg.op(description="Moves dead letters back to their source queue at a rate; quarantines repeat offenders.")
def redrive_dead_letter_queue(
    context: dg.OpExecutionContext, config: RedriveConfig, sqs: SQSResource, s3: S3Resource, fleet: FleetSettings
) -> dg.Output[dict]:
    if config.ratePerSecond <= 0 or config.maxMessages < 0 or config.maxRedrives < 0:
        raise dg.Failure(description="ratePerSecond > 0, maxMessages >= 0 and maxRedrives >= 0 are required")
    source, dlq = {
        "termination": (fleet.termination_queue_url, fleet.termination_dlq_url),
        "housekeeping": (fleet.housekeeping_queue_url, fleet.housekeeping_dlq_url),
    }[config.queue]
    with clear_aws_errors():
        result = redrive(
            sqs.get_client(),
            s3.get_client(),
            dlq_url=dlq,
            source_url=source,
            bucket=fleet.archive_bucket,
            settings=RedriveSettings(
                rate_per_second=config.ratePerSecond,
                max_messages=config.maxMessages,
                max_redrives=config.maxRedrives,
                dry_run=config.dryRun,
            ),
            log=context.log,
        )
    return dg.Output(result, metadata={k: v for k, v in result.items() if isinstance(v, int | float | str)})


@dg.job(
    description="By hand: move dead-letter messages back to their source queue (flat config: queue, ratePerSecond, "
    "maxMessages, maxRedrives, dryRun).",
    tags=CAPABILITY_TAGS,
    config=_flat("redrive_dead_letter_queue", RedriveConfig),
)
def redrive_dead_letters():
    redrive_dead_letter_queue()


DLQ_ASSETS = {
    "termination": dg.AssetSpec(
        key=["runs_fleet", "termination_dead_letters"],
        description="The termination queue's dead-letter queue (SQS). Should stay empty.",
        kinds={"sqs"},
        group_name="fleet",
    ),
    "housekeeping": dg.AssetSpec(
        key=["runs_fleet", "housekeeping_dead_letters"],
        description="The housekeeping queue's dead-letter queue (SQS). Should stay empty.",
        kinds={"sqs"},
        group_name="fleet",
    ),
}


def _dlq_check(label: str, spec: dg.AssetSpec) -> dg.AssetChecksDefinition:
    @dg.asset_check(
        asset=spec.key,
        name="dead_letter_depth",
        description=f"Messages in the {label} dead-letter queue (warns above 0).",
    )
    def _check(sqs: SQSResource, fleet: FleetSettings) -> dg.AssetCheckResult:
        url = getattr(fleet, f"{label}_dlq_url")
        with clear_aws_errors():
            depth = queue_depth(sqs.get_client(), url)
        total = depth["visible"] + depth["in_flight"]
        return dg.AssetCheckResult(
            passed=total == 0,
            severity=dg.AssetCheckSeverity.WARN,
            description=f"{total} message(s) in {queue_name(url)}" + (": see redrive_dead_letters" if total else ""),
            metadata={"depth": total, "visible": depth["visible"], "in_flight": depth["in_flight"], "queue": url},
        )

    return _check


DLQ_CHECKS = [_dlq_check(label, spec) for label, spec in DLQ_ASSETS.items()]
dead_letter_checks_job = dg.define_asset_job(
    "fleet_dead_letter_checks",
    selection=dg.AssetSelection.checks(*DLQ_CHECKS),
    description="Checks the depth of each fleet dead-letter queue.",
    tags=CAPABILITY_TAGS,
)


def build_defs(deployment: str) -> dg.Definitions:
    """The same in every deployment: the fleet processors run wherever the queues are."""
    return dg.Definitions(
        assets=list(DLQ_ASSETS.values()),
        asset_checks=DLQ_CHECKS,
        jobs=[
            process_termination_queue,
            process_housekeeping_queue,
            housekeeping,
            redrive_dead_letters,
            dead_letter_checks_job,
        ],
        schedules=[
            *(_housekeeping_schedule(task, cron) for task, cron in HOUSEKEEPING_SCHEDULES.items()),
            dg.ScheduleDefinition(
                name="fleet_dead_letter_checks_schedule",
                job=dead_letter_checks_job,
                cron_schedule="*/10 * * * *",
                default_status=dg.DefaultScheduleStatus.RUNNING,
                description="Every 10 minutes: depth of each fleet dead-letter queue.",
            ),
        ],
        sensors=[termination_queue_sensor, housekeeping_queue_sensor],
    )
