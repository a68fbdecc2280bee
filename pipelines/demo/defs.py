"""Dagster wiring for the local demo traffic: the ``demo_traffic`` job (one step of each
capability's demo traffic, ``pipelines.demo.traffic``) and its schedule. Every schedule is built at
the demo's cadence by its own factory (``GROUNDSKEEPER_DEMO``, ``pipelines.common.cadence``)."""

import os
import warnings

import dagster as dg

from pipelines.common.cadence import DEMO_ENV, demo_mode
from pipelines.common.defs.active_runs import exclusive_schedule
from pipelines.common.defs.config import config_schema, params_from_config
from pipelines.common.defs.failures import AWS_RETRY_POLICY, one_line_failures
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
    retry_policy=AWS_RETRY_POLICY,  # transient AWS errors retry with backoff, others fail in one line
)
@one_line_failures
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


def build_defs(deployment: str) -> dg.Definitions:
    """In the local deployment only, the demo traffic job and its schedule (at the demo's cadence,
    ``GROUNDSKEEPER_DEMO``; an invalid value is one warning); elsewhere nothing."""
    if deployment != "local":
        return dg.Definitions()
    problem = demo_mode(os.environ)[1]
    if problem:
        warnings.warn(problem, stacklevel=1)
    schedule = exclusive_schedule(
        name="demo_traffic_schedule",
        job=demo_traffic,
        cron_schedule="*/2 * * * *",
        description=f"One step of demo traffic on the local moto platform (every 2 minutes when {DEMO_ENV}=busy).",
        deployment=deployment,
    )
    return dg.Definitions(jobs=[demo_traffic], schedules=[schedule])
