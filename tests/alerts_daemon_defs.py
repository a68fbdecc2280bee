"""A code location for the alerting daemon test: the alerts sensor and the local retry_demo job, over
the moto stack the test deployed (its variables come from the environment)."""

import dagster as dg

from pipelines.alerts.defs import build_alerts_sensor
from pipelines.retry.defs import retry_demo
from resources import CloudWatchResource, SNSResource, SQSResource
from resources.settings import AlertSettings, fleet_settings_from_env

defs = dg.Definitions(
    jobs=[retry_demo],
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
