"""Small boto3-backed resources, one per AWS service Groundskeeper calls.

Each is a ``dg.ConfigurableResource`` with dagster-aws's boto3 configuration keys (``region_name``,
``max_attempts``, ``profile_name``, ``use_ssl``, ``endpoint_url``, ``verify`` and the three
credential keys, same names and defaults as dagster-aws's ``ResourceWithBoto3Configuration``)
whose ``get_client()`` returns a plain boto3 client. The capability logic takes those clients as
arguments and never imports Dagster.

They do not subclass dagster-aws: importing any ``dagster_aws`` module runs its package
``__init__``, which imports ``dagster.components`` and, through its Secrets Manager resource,
``dagster._core.test_utils`` with SQLAlchemy and Alembic: about half a second on every load of the
code location, in every code server and every run worker, for nine configuration fields. boto3
itself is imported when the first client is built, not at load (see "A run's fixed cost" and
"Loading the code location" in benchmarks/RESULTS.md).
"""

from __future__ import annotations

from typing import Any, ClassVar

import dagster as dg
from pydantic import Field

__all__ = [
    "CloudWatchResource",
    "DynamoDBResource",
    "EC2Resource",
    "KMSResource",
    "S3Resource",
    "SQSResource",
    "SSMResource",
]


class _Boto3ClientResource(dg.ConfigurableResource):
    """Builds one boto3 client for ``service_name``; botocore's standard retry mode, ``max_attempts`` tries."""

    service_name: ClassVar[str]

    region_name: str | None = Field(default=None, description="Specifies a custom region for the Boto3 session")
    max_attempts: int = Field(
        default=5,
        description=(
            "This provides Boto3's retry handler with a value of maximum retry attempts, where the"
            " initial call counts toward the max_attempts value that you provide"
        ),
    )
    profile_name: str | None = Field(default=None, description="Specifies a profile to connect that session")
    use_ssl: bool = Field(default=True, description="Whether or not to use SSL. By default, SSL is used.")
    endpoint_url: str | None = Field(default=None, description="Specifies a custom endpoint for the Boto3 session.")
    verify: bool | None = Field(
        default=True,
        description="Whether or not to verify SSL certificates. By default SSL certificates are verified.",
    )
    aws_access_key_id: str | None = Field(
        default=None, description="AWS access key ID to use when creating the boto3 session."
    )
    aws_secret_access_key: str | None = Field(
        default=None, description="AWS secret access key to use when creating the boto3 session."
    )
    aws_session_token: str | None = Field(
        default=None, description="AWS session token to use when creating the boto3 session."
    )

    def get_client(self) -> Any:
        import boto3  # at the first client, not at load
        from botocore.config import Config

        session = boto3.session.Session(profile_name=self.profile_name)
        return session.client(
            self.service_name,
            region_name=self.region_name,
            endpoint_url=self.endpoint_url,
            use_ssl=self.use_ssl,
            verify=self.verify,
            aws_access_key_id=self.aws_access_key_id,
            aws_secret_access_key=self.aws_secret_access_key,
            aws_session_token=self.aws_session_token,
            config=Config(retries={"max_attempts": self.max_attempts, "mode": "standard"}),
        )


class DynamoDBResource(_Boto3ClientResource):
    """A DynamoDB client (AgendaProgress, runs-fleet jobs and pools, receivers and records)."""

    service_name: ClassVar[str] = "dynamodb"


class SQSResource(_Boto3ClientResource):
    """An SQS client (termination and housekeeping queues and their dead-letter queues)."""

    service_name: ClassVar[str] = "sqs"


class EC2Resource(_Boto3ClientResource):
    """An EC2 client (fleet instances)."""

    service_name: ClassVar[str] = "ec2"


class CloudWatchResource(_Boto3ClientResource):
    """A CloudWatch client (``PutMetricData``)."""

    service_name: ClassVar[str] = "cloudwatch"


class KMSResource(_Boto3ClientResource):
    """A KMS client (decrypting ``IDM_ENCRYPTED_PASS``)."""

    service_name: ClassVar[str] = "kms"


class SSMResource(_Boto3ClientResource):
    """An SSM client (the fleet's runner parameters)."""

    service_name: ClassVar[str] = "ssm"


class S3Resource(_Boto3ClientResource):
    """An S3 client (archives, batch files, ledgers, pool reports, dead-letter redrive records)."""

    service_name: ClassVar[str] = "s3"
