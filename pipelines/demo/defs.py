"""Dagster wiring for the local demo traffic: the ``demo_traffic`` job and its schedule."""

import dagster as dg

from pipelines.common.defs.active_runs import exclusive_schedule
from pipelines.common.defs.config import config_schema, params_from_config
from pipelines.common.defs.failures import aws_errors
from pipelines.demo.traffic import DemoConfig, run_demo_traffic
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
    config_schema=config_schema(DemoConfig),
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
    cfg = params_from_config(context, DemoConfig)
    env = {
        "AGENDA_PROGRESS_TABLE": agenda.progress_table,
        "RUNS_FLEET_JOBS_TABLE": fleet.jobs_table,
        "RUNS_FLEET_POOLS_TABLE": fleet.pools_table,
        "RUNS_FLEET_TERMINATION_QUEUE_URL": fleet.termination_queue_url,
        "RUNS_FLEET_HOUSEKEEPING_QUEUE_URL": fleet.housekeeping_queue_url,
        "RECEIVERS_TABLE": batching.receivers_table,
        "BATCH_RECORDS_TABLE": batching.records_table,
    }
    with aws_errors(context):  # transient AWS errors retry with backoff, others fail in one line
        counts = run_demo_traffic(
            dynamodb=dynamodb.get_client(),
            ec2=ec2.get_client(),
            ssm=ssm.get_client(),
            sqs=sqs.get_client(),
            env=env,
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
    """Demo traffic exists only in the local deployment, where its schedule is on by default."""
    if deployment != "local":
        return dg.Definitions()
    schedule = exclusive_schedule(
        name="demo_traffic_schedule",
        job=demo_traffic,
        cron_schedule="*/2 * * * *",
        description="Every 2 minutes: one step of demo traffic on the local moto platform.",
    )
    return dg.Definitions(jobs=[demo_traffic], schedules=[schedule])
