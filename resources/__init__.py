"""Resources for every deployment (``DAGSTER_DEPLOYMENT``), from ``docs/contracts.md``'s variables."""

import os
from collections.abc import Mapping
from typing import Any

import dagster as dg
from dagster_aws.s3 import S3PickleIOManager

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
from resources.clients import explain_aws_error as explain_aws_error
from resources.postgres import progressor_database_from_env
from resources.settings import AgendaSettings as AgendaSettings
from resources.settings import BatchingSettings as BatchingSettings
from resources.settings import FleetSettings as FleetSettings
from resources.settings import (
    LoadSettingError,
    agenda_settings_from_env,
    alert_settings_from_env,
    batching_settings_from_env,
    fleet_settings_from_env,
)

IO_PREFIX = "dagster-io"
"""Where the ``cluster`` deployment's step outputs go in the archive bucket (``RUNS_FLEET_ARCHIVE_BUCKET``)."""


DEPLOYMENTS = ("local", "prod", "cluster")
"""``local``: the moto server, a few fast retries (a local endpoint either answers or is down), and
conditional writes one UpdateItem at a time (moto ignores PartiQL WHERE conditions); ``prod``: real AWS,
standard retry mode with more attempts for throttling, grouped writes; ``cluster``: prod's retries
against local endpoints (moto under make cluster), step outputs in S3. Only the chosen one is built."""


def deployment_name() -> str:
    """The current deployment (``DAGSTER_DEPLOYMENT``, default ``local``); anything else is an error."""
    name = os.environ.get("DAGSTER_DEPLOYMENT", "local")
    if name not in DEPLOYMENTS:  # one line where the code location's load error is shown, no traceback
        raise LoadSettingError(f"DAGSTER_DEPLOYMENT={name!r} is not one of {', '.join(DEPLOYMENTS)}")
    return name


def fixed(resources: Mapping[str, Any]) -> dict[str, Any]:
    """``resources`` with an empty config schema, each built at run start from the values it was given: no
    run config reaches a resource (docs/development.md, "Flat run config")."""
    return {key: _fixed(key, resource) for key, resource in resources.items()}


def _fixed(key: str, resource: Any) -> Any:
    definition = resource.get_resource_definition()
    values = definition.config_schema.as_field().default_value  # its fields' values: {"env": NAME} for an EnvVar

    def init(context: dg.InitResourceContext) -> Any:
        config = {}
        for name, value in values.items():
            if isinstance(value, dict) and set(value) == {"env"}:
                variable, value = value["env"], os.environ.get(value["env"])
                if value is None:
                    raise SettingsError(f"resource {key}: the environment variable {variable} is not set")
            config[name] = value
        return definition.resource_fn(context.replace_config(config))

    kind = dg.IOManagerDefinition if isinstance(definition, dg.IOManagerDefinition) else dg.ResourceDefinition
    return kind(resource_fn=init, config_schema={}, description=definition.description)


def resources_for(deployment: str | None = None) -> dict[str, Any]:
    """The deployment's resources; ``DYNAMODB_GROUPED_WRITES`` overrides its grouped writes."""
    deployment = deployment or deployment_name()
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    boto3_config: dict[str, Any] = {"region_name": region, "max_attempts": 2 if deployment == "local" else 8}
    problems: list[str] = []
    grouped = checked(problems, bool_env, "DYNAMODB_GROUPED_WRITES", deployment == "prod")
    resources = {
        "dynamodb": DynamoDBResource(grouped_writes=grouped, invalid="; ".join(problems), **boto3_config),
        "sqs": SQSResource(**boto3_config),
        "ec2": EC2Resource(**boto3_config),
        "ssm": SSMResource(**boto3_config),
        "cloudwatch": CloudWatchResource(metrics_sink=metrics_sink_from_env(), **boto3_config),
        "s3": S3Resource(**boto3_config),
        "kms": KMSResource(**boto3_config),
        "sns": SNSResource(**boto3_config),
        "fleet": fleet_settings_from_env(),
        "agenda": agenda_settings_from_env(),
        "batching": batching_settings_from_env(),
        "progressor_db": progressor_database_from_env(),
        "alerts": alert_settings_from_env(),
    }

    # Step outputs: named here so that no run config can choose where they are pickled and read back.
    resources["io_manager"] = dg.FilesystemIOManager()  # under the instance's storage folder
    if deployment == "cluster":  # steps run on Celery workers on other machines: their outputs cross through S3
        bucket = dg.EnvVar("RUNS_FLEET_ARCHIVE_BUCKET")
        resources["io_manager"] = S3PickleIOManager(s3_resource=resources["s3"], s3_bucket=bucket, s3_prefix=IO_PREFIX)
    return resources
