"""Which AWS errors are worth retrying (botocore only, no Dagster). Transient: throttling, HTTP 5xx and
connection errors (the codes botocore's "standard" retry mode retries, botocore/retries/standard.py).
Permanent: any other AWS or client-side error. Anything else is not an AWS error."""

import re
from dataclasses import dataclass
from enum import StrEnum

from botocore.exceptions import (
    ClientError,
    HTTPClientError,
    NoCredentialsError,
    NoRegionError,
    ParamValidationError,
)
from botocore.exceptions import ConnectionError as BotoConnectionError

THROTTLING_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottledException",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "TransactionInProgressException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "LimitExceededException",
        "RequestThrottled",
        "SlowDown",
        "EC2ThrottledException",
    }
)
TRANSIENT_CODES = frozenset(
    {
        "RequestTimeout",
        "RequestTimeoutException",
        "PriorRequestNotComplete",
        "InternalError",
        "InternalFailure",
        "InternalServerError",
        "ServiceUnavailable",
        "ServiceUnavailableException",
        "TransactionConflict",
        "TransactionConflictException",
    }
)
TRANSIENT_STATUS = frozenset({500, 502, 503, 504})
TRANSIENT_ITEM_CODES = frozenset(
    {
        "TransactionConflict",
        "ThrottlingError",
        "ProvisionedThroughputExceeded",
        "RequestLimitExceeded",
        "InternalServerError",
    }
)
"""Codes of one item inside a successful call (a transaction's cancellation reasons, a
``BatchExecuteStatement`` response's errors) that are worth another try: botocore retries failed
calls, not failed items of a call."""


class ErrorKind(StrEnum):
    TRANSIENT = "transient"
    PERMANENT = "permanent"
    NOT_AWS = "not-aws"


@dataclass(frozen=True)
class Classification:
    kind: ErrorKind
    reason: str

    @property
    def transient(self) -> bool:
        return self.kind is ErrorKind.TRANSIENT


_XML_CODE = re.compile(r"<Code>([^<]{1,100})</Code>")
_XML_MESSAGE = re.compile(r"<Message>([^<]{0,500})</Message>")


def error_code_and_message(error: dict) -> tuple[str, str]:
    """The AWS error code and a one-line message. When botocore could not parse the error body (a
    query-protocol service answering in a format it did not expect), the code is the HTTP status
    and the message is the raw XML: the real code and message are read out of that XML."""
    code, message = str(error.get("Code", "") or ""), str(error.get("Message", "") or "")
    if message.lstrip().startswith("<"):
        found_code, found_message = _XML_CODE.search(message), _XML_MESSAGE.search(message)
        code = found_code.group(1) if found_code else code
        message = found_message.group(1) if found_message else ""
    return code, " ".join(message.split())


def classify_aws_error(exc: BaseException) -> Classification:
    """Sort an exception into transient / permanent / not an AWS error, with a short reason."""
    if isinstance(exc, ClientError):
        code, message = error_code_and_message(exc.response.get("Error") or {})
        status = (exc.response.get("ResponseMetadata", {}) or {}).get("HTTPStatusCode")
        if code in THROTTLING_CODES:
            return Classification(ErrorKind.TRANSIENT, f"{exc.operation_name} was throttled ({code})")
        if code in TRANSIENT_CODES or (isinstance(status, int) and status in TRANSIENT_STATUS):
            return Classification(ErrorKind.TRANSIENT, f"{exc.operation_name}: server error {code} ({status})")
        return Classification(ErrorKind.PERMANENT, f"{exc.operation_name}: {code}: {message}")
    if isinstance(exc, BotoConnectionError | HTTPClientError):
        return Classification(ErrorKind.TRANSIENT, f"connection error: {exc}")
    if isinstance(exc, ParamValidationError | NoCredentialsError | NoRegionError):
        return Classification(ErrorKind.PERMANENT, str(exc))
    return Classification(ErrorKind.NOT_AWS, str(exc))


def is_transient(exc: BaseException) -> bool:
    """True for throttling, 5xx and connection errors."""
    return classify_aws_error(exc).transient
