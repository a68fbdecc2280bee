"""One resource per AWS service Groundskeeper calls: ``get_client()`` gives a plain boto3 client (from
the process's shared boto3 session), which the capability logic takes as an argument; and AWS
connection and configuration failures as one clear line (:func:`explain_aws_error`)."""

import os
import threading
from typing import Any, ClassVar

import boto3
from botocore.exceptions import (
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
    ParamValidationError,
)
from dagster_aws.s3 import S3Resource as DagsterAwsS3Resource
from dagster_aws.s3.utils import disable_signing
from dagster_aws.ssm import SSMResource as DagsterAwsSSMResource
from dagster_aws.utils import ResourceWithBoto3Configuration, construct_boto_client_retry_config
from pydantic import Field

from pipelines.common.http import location
from pipelines.retry.classify import error_code_and_message
from resources.settings import CheckedSettings, LoadSettingError

__all__ = [
    "CloudWatchResource",
    "DynamoDBResource",
    "EC2Resource",
    "KMSResource",
    "S3Resource",
    "SNSResource",
    "SQSResource",
    "SSMResource",
]

SESSION_ENV = (
    "AWS_PROFILE",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_CONFIG_FILE",
    "AWS_SHARED_CREDENTIALS_FILE",
)
"""The environment a boto3 session reads once (its credentials): a session is shared while they stay."""

CLIENT_OPTIONS = (
    "region_name endpoint_url use_ssl verify aws_access_key_id aws_secret_access_key aws_session_token".split()
)
"""The fields of a resource's configuration that ``Session.client`` takes under the same name."""

_sessions: dict[tuple[str | None, ...], boto3.session.Session] = {}
_sessions_lock = threading.Lock()


def _shared_client(service_name: str, configuration: ResourceWithBoto3Configuration) -> Any:
    """A client from one boto3 session per profile and credentials: a new session reads botocore's files
    again (80 to 230 ms of CPU per client, not 3 to 30), and clients are built at every tick."""
    profile = configuration.profile_name
    key = (profile, *(os.environ.get(name) for name in SESSION_ENV))
    with _sessions_lock:
        if key not in _sessions:
            _sessions[key] = boto3.session.Session(profile_name=profile)
        options = {name: getattr(configuration, name) for name in CLIENT_OPTIONS}
        config = construct_boto_client_retry_config(configuration.max_attempts)
        return _sessions[key].client(service_name, config=config, **options)


class _Boto3ClientResource(ResourceWithBoto3Configuration):
    service_name: ClassVar[str]

    def get_client(self) -> Any:
        return _shared_client(self.service_name, self)


class S3Resource(DagsterAwsS3Resource):
    """dagster-aws's S3 resource, with a client from the shared session (dagster-aws's builds one each time)."""

    def get_client(self) -> Any:
        client = _shared_client("s3", self)
        if self.use_unsigned_session:
            client.meta.events.register("choose-signer.s3.*", disable_signing)
        return client


class SSMResource(DagsterAwsSSMResource):
    """dagster-aws's SSM resource, with a client from the shared session (dagster-aws's builds one each time)."""

    def get_client(self) -> Any:
        return _shared_client("ssm", self)


class DynamoDBResource(_Boto3ClientResource, CheckedSettings):
    """A DynamoDB client (AgendaProgress, runs-fleet jobs and pools, receivers and records)."""

    service_name: ClassVar[str] = "dynamodb"
    grouped_writes: bool = Field(
        default=True,
        description="Group conditional updates into PartiQL BatchExecuteStatement calls (25 statements each). "
        "Needs an endpoint that evaluates each statement's WHERE conditions on its own: AWS and DynamoDB "
        "Local do, moto does not (it ignores them), so the moto-backed deployments set false.",
    )
    invalid: str = Field(default="", description="DYNAMODB_GROUPED_WRITES when it was invalid: using DynamoDB fails.")


class SQSResource(_Boto3ClientResource):
    """An SQS client (termination and housekeeping queues and their dead-letter queues)."""

    service_name: ClassVar[str] = "sqs"


class EC2Resource(_Boto3ClientResource):
    """An EC2 client (fleet instances)."""

    service_name: ClassVar[str] = "ec2"


METRICS_SINKS = ("cloudwatch", "none")
"""Where the metrics of every capability go (``METRICS_SINK``): CloudWatch, or nowhere."""


class CloudWatchResource(_Boto3ClientResource):
    """A CloudWatch client (``PutMetricData``) and the deployment's metrics sink."""

    service_name: ClassVar[str] = "cloudwatch"
    metrics_sink: str = Field(
        default="cloudwatch",
        description="Where metrics go (METRICS_SINK): cloudwatch, or none (no CloudWatch call at all, for a "
        "deployment without AWS).",
    )


def metrics_sink_from_env(default: str = "cloudwatch") -> str:
    """``METRICS_SINK`` (unset or empty: ``default``); anything else names the variable."""
    raw = os.environ.get("METRICS_SINK", "").strip().lower() or default
    if raw not in METRICS_SINKS:
        raise LoadSettingError(f"METRICS_SINK={raw!r} is not one of {', '.join(METRICS_SINKS)}")
    return raw


class KMSResource(_Boto3ClientResource):
    """A KMS client (decrypting ``IDM_ENCRYPTED_PASS``)."""

    service_name: ClassVar[str] = "kms"


class SNSResource(_Boto3ClientResource):
    """An SNS client (alerts: ``Publish`` to ``ALERTS_SNS_TOPIC_ARN``)."""

    service_name: ClassVar[str] = "sns"

    def get_sts_client(self) -> Any:
        """An STS client of the same configuration (the caller's account, to check a topic's)."""
        return _shared_client("sts", self)


SIGNATURE_ERRORS = frozenset({"SignatureDoesNotMatch", "InvalidSignatureException", "IncompleteSignature"})
_NOT_FOUND = frozenset(
    {"ResourceNotFoundException", "AWS.SimpleQueueService.NonExistentQueue", "NoSuchBucket", "QueueDoesNotExist"}
)
_ACCESS_DENIED = frozenset(
    {"AccessDenied", "AccessDeniedException", "UnrecognizedClientException", "InvalidClientTokenId"}
    | {"ExpiredToken", "ExpiredTokenException"}
)


def explain_aws_error(exc: BaseException) -> str | None:
    """A one-line explanation for environment-level AWS failures, or None for anything else."""
    if isinstance(exc, EndpointConnectionError):
        return (
            f"cannot reach the AWS endpoint {location(str(exc.kwargs.get('endpoint_url') or ''))}: is the local AWS "
            "running (`make dev`), or is AWS_ENDPOINT_URL / the network wrong?"
        )
    if isinstance(exc, NoCredentialsError):
        return "no AWS credentials found: set AWS_PROFILE or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"
    if isinstance(exc, NoRegionError):
        return "no AWS region configured: set AWS_REGION"
    if isinstance(exc, ParamValidationError):
        return f"invalid AWS request parameters: {exc}"
    if isinstance(exc, ClientError):
        code, message = error_code_and_message(exc.response.get("Error") or {})
        if code in SIGNATURE_ERRORS:
            return (
                f"{exc.operation_name}: {code}: AWS rejected the request signature: the secret key does not "
                "belong to the access key id (check AWS_SECRET_ACCESS_KEY / the profile's secret, and the clock)"
            )
        if code in _NOT_FOUND:
            return (
                f"{exc.operation_name}: {code}: {message} (check the table, queue "
                "and bucket environment variables, and that infra/template.yaml is deployed)"
            )
        if code in _ACCESS_DENIED:
            return f"{exc.operation_name}: {code}: {message} (check credentials and the IAM policy)"
    return None
