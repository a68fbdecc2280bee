"""AWS connection and configuration failures as one clear line, not a botocore stack trace."""

from __future__ import annotations

from botocore.exceptions import (
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
    ParamValidationError,
)

from pipelines.common.http import location
from pipelines.retry.classify import error_code_and_message

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
        code, message = error_code_and_message(exc.response.get("Error", {}))
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
