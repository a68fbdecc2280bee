"""A code location for the alerting scenario test: the alerts sensor with only a webhook sink (the
test's receiver, ``ALERTS_WEBHOOK_URL``), tried again at every tick, and the local retry_demo job,
over the moto stack the test deployed (its variables come from the environment).

With ``SCENARIO_WEBHOOK_TIMEOUT_SECONDS`` set (a daemon's environment, not the test's process), the
webhook sink waits that many seconds for an answer instead of the product's 10: a test that holds
the daemon's request while it does something else must not see the sink give up first on a loaded
machine."""

import os

import dagster as dg

from infra.demo.defs import retry_demo
from pipelines.alerts import sinks
from pipelines.alerts.defs import build_alerts_sensor
from resources import CloudWatchResource, SNSResource, SQSResource
from resources.settings import AlertSettings, fleet_settings_from_env

WEBHOOK_TIMEOUT = os.environ.get("SCENARIO_WEBHOOK_TIMEOUT_SECONDS")

if WEBHOOK_TIMEOUT:

    class _PatientWebhookSink(sinks.WebhookSink):
        def __init__(self, url: str) -> None:
            super().__init__(url, timeout=float(WEBHOOK_TIMEOUT))

    sinks.WebhookSink = _PatientWebhookSink  # the sink alert_config builds from ALERTS_WEBHOOK_URL

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
