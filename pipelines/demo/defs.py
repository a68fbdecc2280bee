"""Dagster wiring for the local demo traffic: the ``demo_traffic`` job and its schedule, and the
local deployment's demo cadence (``GROUNDSKEEPER_DEMO``, :func:`with_demo_cadence`)."""

import os
import warnings

import dagster as dg

from pipelines.common.defs.active_runs import exclusive_schedule
from pipelines.common.defs.config import config_schema, params_from_config
from pipelines.common.defs.failures import aws_errors
from pipelines.demo.cadence import DEMO_ENV, DEMO_TRAFFIC_SCHEDULES, demo_mode, local_cron
from pipelines.demo.traffic import DEMO_PARAMS, DemoConfig, DemoTargets, run_demo_traffic
from resources import (
    AgendaSettings,
    BatchingSettings,
    DynamoDBResource,
    EC2Resource,
    FleetSettings,
    SQSResource,
    SSMResource,
)


@dg.op(
    description="One step of demo traffic across agendas, the fleet and receivers (local only).",
    config_schema={key: value for kind in DEMO_PARAMS for key, value in config_schema(kind).items()},
)
def demo_traffic_step(
    context: dg.OpExecutionContext,
    dynamodb: DynamoDBResource,
    ec2: EC2Resource,
    ssm: SSMResource,
    sqs: SQSResource,
    agenda: AgendaSettings,
    fleet: FleetSettings,
    batching: BatchingSettings,
) -> dg.Output[dict]:
    cfg = DemoConfig.from_flat(context.op_config, lambda kind, raw: params_from_config(context, kind, raw))
    targets = DemoTargets(
        agenda_progress_table=agenda.progress_table,
        jobs_table=fleet.jobs_table,
        pools_table=fleet.pools_table,
        termination_queue_url=fleet.termination_queue_url,
        housekeeping_queue_url=fleet.housekeeping_queue_url,
        receivers_table=batching.receivers_table,
        records_table=batching.records_table,
    )
    with aws_errors(context):  # transient AWS errors retry with backoff, others fail in one line
        counts = run_demo_traffic(
            dynamodb=dynamodb.get_client(),
            ec2=ec2.get_client(),
            ssm=ssm.get_client(),
            sqs=sqs.get_client(),
            targets=targets,
            cfg=cfg,
        )
    context.log.info("demo traffic: " + ", ".join(f"{k}={v}" for k, v in counts.items()))
    return dg.Output(counts, metadata={k: dg.MetadataValue.int(v) for k, v in counts.items()})


@dg.job(
    description="Local only: keeps the demo platform alive (agendas, fleet jobs, queue messages, records).",
    tags={"groundskeeper/capability": "demo"},
    executor_def=dg.in_process_executor,  # one op
)
def demo_traffic():
    demo_traffic_step()


def build_defs(deployment: str, others: dg.Definitions | None = None) -> dg.Definitions:
    """``others`` (the other capabilities' definitions) with the demo: in the local deployment only,
    the demo traffic job and its schedule, and every schedule at the demo's cadence
    (``GROUNDSKEEPER_DEMO``, :func:`with_demo_cadence`); elsewhere ``others`` unchanged."""
    others = others if others is not None else dg.Definitions()
    if deployment != "local":
        return others
    mode, problem = demo_mode(os.environ)
    if problem:
        warnings.warn(problem, stacklevel=1)
    schedule = exclusive_schedule(
        name="demo_traffic_schedule",
        job=demo_traffic,
        cron_schedule="*/2 * * * *",
        description=f"One step of demo traffic on the local moto platform (every 2 minutes when {DEMO_ENV}=busy).",
    )
    return with_demo_cadence(
        dg.Definitions.merge(others, dg.Definitions(jobs=[demo_traffic], schedules=[schedule])), mode
    )


def _with_cron(schedule: dg.ScheduleDefinition, cron: str, status: dg.DefaultScheduleStatus, note: str):
    """``schedule`` with another cron, default status and a note after its description; the rest
    (its evaluation, target, tags, resources) as ``ScheduleDefinition.with_attributes`` copies it."""
    if cron == schedule.cron_schedule and status == schedule.default_status:
        return schedule
    target_job = schedule.job if schedule.target.has_job_def else None
    return dg.ScheduleDefinition(
        name=schedule.name,
        cron_schedule=cron,
        job_name=None if target_job is not None else schedule.job_name,
        job=target_job,
        execution_timezone=schedule.execution_timezone,
        execution_fn=schedule._execution_fn,  # the evaluation, unchanged (with_attributes copies it too)
        description=f"{schedule.description} {note}".strip(),
        default_status=status,
        environment_vars=schedule.environment_vars,
        required_resource_keys=schedule._raw_required_resource_keys,
        tags=schedule.tags,
        metadata=schedule.metadata,
        owners=schedule.owners,
    )


def with_demo_cadence(defs: dg.Definitions, mode: str) -> dg.Definitions:
    """The local deployment's schedules at the demo's cadence (``pipelines.demo.cadence``): under
    ``quiet`` and ``off`` the frequent ones slower, under ``off`` the demo traffic stopped, under
    ``busy`` unchanged. Each changed schedule's description says so."""
    schedules = []
    for schedule in defs.schedules or []:
        cron = local_cron(schedule.name, schedule.cron_schedule, mode)
        stopped = mode == "off" and schedule.name in DEMO_TRAFFIC_SCHEDULES
        status = dg.DefaultScheduleStatus.STOPPED if stopped else schedule.default_status
        notes = []
        if cron != schedule.cron_schedule:
            notes.append(f"Under make dev ({DEMO_ENV}={mode}) it runs on {cron}, not {schedule.cron_schedule}.")
        if stopped:
            notes.append(f"Stopped by {DEMO_ENV}=off: start it here for demo traffic.")
        schedules.append(_with_cron(schedule, cron, status, " ".join(notes)))
    return dg.Definitions(
        assets=defs.assets,
        asset_checks=defs.asset_checks,
        jobs=defs.jobs,
        schedules=schedules,
        sensors=defs.sensors,
        resources=defs.resources,
        executor=defs.executor,
        loggers=defs.loggers,
        metadata=defs.metadata,
    )
