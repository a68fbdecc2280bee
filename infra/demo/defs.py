"""Dagster wiring of the demo traffic: the ``demo_traffic`` job (one step of each capability's
demo traffic, ``infra.demo.traffic``), the ``progressor_demo_traffic`` job (``infra.demo.progressor``)
and their schedules, at the demo's cadence (``GROUNDSKEEPER_DEMO``, ``infra.demo.cadence``); and the
``retry_demo`` job, whose failed runs ``delayed_run_retries`` re-launches (docs/retry.md)."""

import time
from dataclasses import dataclass

import dagster as dg
from botocore.exceptions import ClientError

from infra.demo.cadence import DEMO_ENV, DEMO_TRAFFIC_SCHEDULES, demo_crons
from infra.demo.progressor import DemoTraffic, play
from infra.demo.traffic import DEMO_PARAMS, DemoConfig, DemoTargets, run_demo_traffic
from pipelines.common.defs.config import config_schema, params_from_config
from pipelines.common.defs.failures import AWS_RETRY_POLICY, one_line_failures
from pipelines.common.defs.schedules import ONE_AT_A_TIME_TAG, schedule
from pipelines.common.params import param
from pipelines.retry.tags import ATTEMPT_TAG, POLICY_TAG
from resources import (
    AgendaSettings,
    BatchingSettings,
    DynamoDBResource,
    EC2Resource,
    FleetSettings,
    SQSResource,
    SSMResource,
)
from resources.postgres import ProgressorDatabase, ProgressorDatabaseError


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
    tags={"groundskeeper/capability": "demo", ONE_AT_A_TIME_TAG: "demo_traffic"},
    executor_def=dg.in_process_executor,  # one op
)
def demo_traffic():
    demo_traffic_step()


@dg.op(description="Local only: play a progressor (processes, timers, calls, sometimes a crashed worker).")
def play_progressor(context: dg.OpExecutionContext, progressor_db: ProgressorDatabase) -> dict:
    try:
        with progressor_db.connection() as conn:
            counts = play(conn, DemoTraffic())
    except ProgressorDatabaseError as exc:
        raise dg.Failure(description=str(exc), allow_retries=False) from None
    context.log.info("progressor demo: " + ", ".join(f"{k}={v}" for k, v in counts.items()))
    return counts


@dg.job(
    description="Local only: progressor demo traffic.",
    tags={"groundskeeper/capability": "progressor", ONE_AT_A_TIME_TAG: "progressor_demo_traffic"},
)
def progressor_demo_traffic():
    play_progressor()


OWN_CRONS = {"demo_traffic_schedule": "*/2 * * * *", "progressor_demo_traffic_schedule": "* * * * *"}
"""The demo traffic schedules' own cadence (``GROUNDSKEEPER_DEMO=busy``)."""


@dataclass(frozen=True)
class RetryDemoParams:
    """How the local retry demo fails."""

    succeed_on_attempt: int = param(
        3,
        description="The attempt (groundskeeper/retry_attempt tag) that succeeds; earlier ones are throttled.",
        minimum=1,
        maximum=100,
    )
    seconds: float = param(
        0.0,
        description="Seconds of work before the attempt fails or succeeds (time to try terminating it from the UI).",
        minimum=0,
        maximum=3600,
    )


@dg.op(
    description="Local demo: throttled (a simulated ThrottlingException) until attempt N, by its run tag.",
    config_schema=config_schema(RetryDemoParams),
)  # no retry policy: the run fails in one line, and delayed_run_retries re-launches it
@one_line_failures
def throttled_until_attempt(context: dg.OpExecutionContext) -> int:
    params = params_from_config(context, RetryDemoParams)
    attempt = int(context.run.tags.get(ATTEMPT_TAG, "1"))
    time.sleep(params.seconds)
    if attempt < params.succeed_on_attempt:
        error = {"Error": {"Code": "ThrottlingException", "Message": "Rate exceeded (simulated)"}}
        raise ClientError(error, "Query")
    context.log.info(f"attempt {attempt} succeeded")
    return attempt


@dg.job(
    description="Local only: fails twice with a transient error; delayed_run_retries re-launches it after 10 s, 20 s.",
    tags={
        POLICY_TAG: '{"kind": "exponential", "initial": 10, "coefficient": 2, "maxAttempts": 4}',
        "groundskeeper/capability": "retry",
    },
    executor_def=dg.in_process_executor,  # one op
)
def retry_demo():
    throttled_until_attempt()


def demo_defs(mode: str) -> dg.Definitions:
    """The demo traffic jobs and their schedules under ``mode`` (``off``, ``quiet``, ``busy``): the
    demo's cadence, stopped under ``off``."""
    crons = demo_crons(mode)
    stopped = mode == "off"
    status = dg.DefaultScheduleStatus.STOPPED if stopped else dg.DefaultScheduleStatus.RUNNING
    off = f" Stopped by {DEMO_ENV}=off: start it here for demo traffic." if stopped else ""
    descriptions = {
        "demo_traffic_schedule": "One step of demo traffic on the local moto platform (every 2 minutes when "
        f"{DEMO_ENV}=busy).",
        "progressor_demo_traffic_schedule": f"Local only: progressor demo traffic (every minute when {DEMO_ENV}=busy).",
    }
    jobs = {"demo_traffic_schedule": demo_traffic, "progressor_demo_traffic_schedule": progressor_demo_traffic}
    schedules = [
        schedule(
            name=name,
            job=jobs[name],
            cron_schedule=OWN_CRONS[name],
            description=f"{descriptions[name]}{off} Skips a tick while the previous run is still queued, running "
            "or being cancelled.",
            crons=crons,
            default_status=status,
        )
        for name in DEMO_TRAFFIC_SCHEDULES
    ]
    return dg.Definitions(jobs=[*jobs.values(), retry_demo], schedules=schedules, sensors=[retry_policies_on_start])


RETRY_POLICIES = dg.AssetKey("retry_policies")
MATERIALIZED = "materialized"  # retry_policies_on_start's cursor once it has seen the asset materialized


@dg.sensor(
    name="retry_policies_on_start",
    target=dg.AssetSelection.assets(RETRY_POLICIES),
    default_status=dg.DefaultSensorStatus.RUNNING,
    minimum_interval_seconds=600,  # its first tick is at the start; later ones only find it materialized
    description="Local only: materializes retry_policies once when it was never materialized.",
)
def retry_policies_on_start(context: dg.SensorEvaluationContext):
    """``make dev`` opens on the retry policies rendered."""
    # once seen materialized, the cursor spares reading the instance again
    if context.cursor == MATERIALIZED or context.instance.get_latest_materialization_event(RETRY_POLICIES) is not None:
        context.update_cursor(MATERIALIZED)
        return dg.SkipReason(f"{RETRY_POLICIES.to_user_string()} is materialized; nothing to do")
    # the run key makes this one run per instance, also if it is still queued on the next tick
    return dg.RunRequest(run_key="first-materialization")
