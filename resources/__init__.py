"""Resources for every deployment, chosen from one dict keyed by ``DAGSTER_DEPLOYMENT``.

``local`` talks to the moto server that ``make dev`` starts (boto3 reads ``AWS_ENDPOINT_URL``
itself); ``prod`` talks to real AWS with the ambient credentials. ``cluster`` is ``prod``'s
resources with endpoints from the environment as ``local`` (moto under ``make cluster``), plus the
S3 pickle IO manager on the archive bucket: its steps run on Celery workers on other machines,
so step outputs must cross machines through S3. Table names, queue URLs and
buckets come from the environment variables of ``docs/contracts.md``.
"""

from __future__ import annotations

import os
from typing import Any

from pipelines.common.env import SettingsError, bool_env, checked
from resources.clients import (
    CloudWatchResource,
    DynamoDBResource,
    EC2Resource,
    KMSResource,
    S3Resource,
    SNSResource,
    SQSResource,
    SSMResource,
    metrics_sink_from_env,
)
from resources.errors import explain_aws_error
from resources.postgres import ProgressorDatabase, progressor_database_from_env
from resources.settings import (
    AgendaSettings,
    AlertSettings,
    BatchingSettings,
    FleetSettings,
    LoadSettingError,
    agenda_settings_from_env,
    alert_settings_from_env,
    batching_settings_from_env,
    fleet_settings_from_env,
)

IO_PREFIX = "dagster-io"
"""Where the ``cluster`` deployment's step outputs go in the archive bucket (``RUNS_FLEET_ARCHIVE_BUCKET``)."""


def deployment_name() -> str:
    """The current deployment (``DAGSTER_DEPLOYMENT``, default ``local``); anything else is an error."""
    name = os.environ.get("DAGSTER_DEPLOYMENT", "local")
    if name not in DEPLOYMENTS:  # one line where the code location's load error is shown, no traceback
        raise LoadSettingError(f"DAGSTER_DEPLOYMENT={name!r} is not one of {', '.join(DEPLOYMENTS)}")
    return name


def _aws_resources(*, grouped_writes: bool, **boto3_config: Any) -> dict[str, Any]:
    """``grouped_writes``: the deployment's default, unless ``DYNAMODB_GROUPED_WRITES`` says otherwise."""
    problems: list[str] = []
    grouped = checked(problems, bool_env, "DYNAMODB_GROUPED_WRITES", grouped_writes)
    return {
        "dynamodb": DynamoDBResource(grouped_writes=grouped, invalid="; ".join(problems), **boto3_config),
        "sqs": SQSResource(**boto3_config),
        "ec2": EC2Resource(**boto3_config),
        "ssm": SSMResource(**boto3_config),
        "cloudwatch": CloudWatchResource(metrics_sink=metrics_sink_from_env(), **boto3_config),
        "s3": S3Resource(**boto3_config),
        "kms": KMSResource(**boto3_config),
        "sns": SNSResource(**boto3_config),
    }


def _settings() -> dict[str, Any]:
    return {
        "fleet": fleet_settings_from_env(),
        "agenda": agenda_settings_from_env(),
        "batching": batching_settings_from_env(),
        "progressor_db": progressor_database_from_env(),
        "alerts": alert_settings_from_env(),
    }


def _step_outputs_in_s3(s3: S3Resource) -> dict[str, Any]:
    """The IO manager of the ``cluster`` deployment: step outputs pickled into the archive bucket."""
    import dagster as dg
    from dagster_aws.s3 import S3PickleIOManager

    return {
        "io_manager": S3PickleIOManager(
            s3_resource=s3, s3_bucket=dg.EnvVar("RUNS_FLEET_ARCHIVE_BUCKET"), s3_prefix=IO_PREFIX
        )
    }


def _local(region: str) -> dict[str, Any]:
    # The moto server. A few fast retries: a local endpoint either answers or is down. moto ignores
    # PartiQL WHERE conditions, so conditional writes go one UpdateItem at a time.
    return {**_aws_resources(region_name=region, max_attempts=2, grouped_writes=False), **_settings()}


def _prod(region: str) -> dict[str, Any]:
    # Real AWS: standard retry mode with more attempts for throttling; grouped writes.
    return {**_aws_resources(region_name=region, max_attempts=8, grouped_writes=True), **_settings()}


def _cluster(region: str) -> dict[str, Any]:
    # Prod's retries against local endpoints (moto under make cluster), step outputs in S3.
    aws = _aws_resources(region_name=region, max_attempts=8, grouped_writes=False)
    return {**aws, **_settings(), **_step_outputs_in_s3(aws["s3"])}


RESOURCES_BY_DEPLOYMENT = {"local": _local, "prod": _prod, "cluster": _cluster}
"""Deployment -> the builder of its resources (only the chosen deployment's are built)."""
DEPLOYMENTS = tuple(RESOURCES_BY_DEPLOYMENT)


def resources_for(deployment: str | None = None) -> dict[str, Any]:
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    return RESOURCES_BY_DEPLOYMENT[deployment or deployment_name()](region)


__all__ = [
    "DEPLOYMENTS",
    "AgendaSettings",
    "AlertSettings",
    "BatchingSettings",
    "CloudWatchResource",
    "DynamoDBResource",
    "EC2Resource",
    "FleetSettings",
    "LoadSettingError",
    "SettingsError",
    "KMSResource",
    "ProgressorDatabase",
    "S3Resource",
    "SNSResource",
    "SQSResource",
    "SSMResource",
    "deployment_name",
    "explain_aws_error",
    "RESOURCES_BY_DEPLOYMENT",
    "resources_for",
]
