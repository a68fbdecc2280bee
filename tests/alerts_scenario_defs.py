"""A code location for the alerting scenario test: the alerts sensor with only a webhook sink (the
test's receiver, ``ALERTS_WEBHOOK_URL``), tried again at every tick, and the local retry_demo job,
over the moto stack the test deployed (its variables come from the environment)."""

import dagster as dg

from infra.demo.defs import retry_demo
from pipelines.alerts.defs import build_alerts_sensor
from resources import CloudWatchResource, SNSResource, SQSResource
from resources.settings import AlertSettings, fleet_settings_from_env

defs = dg.Definitions(
    jobs=[retry_demo],
    sensors=[build_alerts_sensor(minimum_interval_seconds=1)],
    resources={
        "alerts": AlertSettings(
            webhook_url=dg.EnvVar("ALERTS_WEBHOOK_URL"),
            retry_policy='{"kind": "fixed", "delay": 0, "maxAttempts": 1000}',
        ),
        "fleet": fleet_settings_from_env(),
        "sns": SNSResource(region_name="us-east-1"),
        "sqs": SQSResource(region_name="us-east-1"),
        "cloudwatch": CloudWatchResource(region_name="us-east-1"),
    },
)
