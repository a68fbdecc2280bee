"""A code location for the alerting daemon test: the alerts sensor, the local retry_demo job and two
stand-ins for real work (a job scanning a table named in its run config, as reclaim_agendas does, and
a partitioned asset job, as receiver_batches_job is), over the moto stack the test deployed (its
variables come from the environment)."""

import dagster as dg
from botocore.exceptions import ClientError

from infra.demo.defs import retry_demo
from pipelines.alerts.defs import build_alerts_sensor
from resources import CloudWatchResource, SNSResource, SQSResource
from resources.settings import AlertSettings, fleet_settings_from_env


@dg.op(config_schema={"tableName": str, "error": dg.Field(str, default_value="")})
def scan_table(context: dg.OpExecutionContext) -> None:
    """Fails with the AWS error code in ``error`` (none: succeeds)."""
    code = context.op_config["error"]
    if code:
        raise ClientError({"Error": {"Code": code, "Message": f"table {context.op_config['tableName']}"}}, "Scan")


@dg.job(name="reclaim_agendas")
def reclaim_agendas():
    scan_table()


@dg.asset(key=["alerts_test", "receiver_batches"], partitions_def=dg.StaticPartitionsDefinition(["acme", "zeta"]))
def receiver_batches(context: dg.AssetExecutionContext) -> int:
    if context.run.tags.get("good") != "yes":
        raise RuntimeError(f"receiver {context.partition_key} is unreachable")
    return 1


receiver_batches_job = dg.define_asset_job(
    "receiver_batches_job", selection=[receiver_batches], partitions_def=receiver_batches.partitions_def
)

defs = dg.Definitions(
    jobs=[retry_demo, reclaim_agendas, receiver_batches_job],
    assets=[receiver_batches],
    # due again 1 s after a tick, not 60: the test waits for a tick after each daemon start, and the
    # restarted daemon's first pass (5 s after the last, at the earliest) finds it due at once
    sensors=[build_alerts_sensor(minimum_interval_seconds=1)],
    resources={
        "alerts": AlertSettings(sns_topic_arn=dg.EnvVar("ALERTS_SNS_TOPIC_ARN")),
        "fleet": fleet_settings_from_env(),
        "sns": SNSResource(region_name="us-east-1"),
        "sqs": SQSResource(region_name="us-east-1"),
        "cloudwatch": CloudWatchResource(region_name="us-east-1"),
    },
)
