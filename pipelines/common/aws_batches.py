"""Batched AWS writes over boto3 clients, each call retried by a retry-library policy after a transient error."""

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from botocore.exceptions import ClientError, ParamValidationError

from pipelines.common import first_line, from_item
from pipelines.retry import TRANSIENT_ITEM_CODES, is_transient, preset, retry_call
from pipelines.retry.classify import error_code_and_message
from pipelines.retry.policy import RetryPolicy

T = TypeVar("T")
log = logging.getLogger(__name__)

CALL_POLICY = preset("runs-fleet")
"""One AWS call's retry unless the caller names another: waits 0.1, 0.5, 1 s, 4 attempts."""
TRANSACTION_LIMIT = 100  # TransactWriteItems actions per call
METRICS_PER_CALL = 1000  # PutMetricData datums per call


def chunks(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def error_code(exc: BaseException) -> str:
    """The AWS error code of a ``ClientError`` (also from an unparsed XML body), else the class name."""
    if isinstance(exc, ClientError):
        return error_code_and_message(exc.response.get("Error") or {})[0]
    return type(exc).__name__


def no_such_object(exc: BaseException) -> bool:
    """An S3 read of a key that is not there (HeadObject answers 404, GetObject NoSuchKey)."""
    return error_code(exc) in ("404", "NoSuchKey", "NotFound")


def object_exists(s3, bucket: str, key: str) -> bool:
    """``HeadObject``: whether the object is there (any other error than its absence raises)."""
    try:
        s3.head_object(Bucket=bucket, Key=key)
    except ClientError as exc:
        if not no_such_object(exc):
            raise
        return False
    return True


def conditional_write(write: Callable[[], Any]) -> Any:
    """``write()``'s response, or None when its condition failed (other errors raise)."""
    try:
        return write()
    except ClientError as exc:
        if error_code(exc) != "ConditionalCheckFailedException":
            raise
        return None


def retry_note(what: str, logger: logging.Logger = log) -> Callable[[int, BaseException, float], None]:
    """A retry's log line (``on_retry``): ``what``, its error, the retry's number and its wait."""
    return lambda attempt, exc, wait: logger.warning("%s failed (%s), retry %d in %.1fs", what, exc, attempt, wait)


class FenceFailed(RuntimeError):
    """The fence's condition failed: nothing of that transaction was written."""


@dataclass
class Transacted(Generic[T]):
    """What :func:`transact_conditional` did with each item."""

    applied: list[T] = field(default_factory=list)
    conditional: list[tuple[T, dict[str, Any]]] = field(default_factory=list)
    """The condition failed: the item and its stored values (when its action asked for ``ALL_OLD``, else {})."""
    refused: list[tuple[T, str]] = field(default_factory=list)  # this item's write can never succeed: why
    failed: list[T] = field(default_factory=list)  # transient errors after the policy's last try
    error: BaseException | None = None  # the last of those errors


_SETTLED_LATER = frozenset({"", "None", *TRANSIENT_ITEM_CODES})  # a reason that is no verdict on the item


def cancellation_codes(exc: BaseException) -> list[str] | None:
    """The per-action codes of a cancelled transaction, or None when ``exc`` is not one."""
    if not isinstance(exc, ClientError) or error_code(exc) != "TransactionCanceledException":
        return None
    return [str(r.get("Code") or "None") for r in exc.response.get("CancellationReasons") or []]


def _worth_retrying(exc: BaseException) -> bool:
    """A transaction cancelled by a conflict (no action's own verdict), or a transient AWS error."""
    codes = cancellation_codes(exc)
    return is_transient(exc) if codes is None else all(code in _SETTLED_LATER for code in codes)


def _item_refused(exc: BaseException) -> bool:
    """An error of a whole call that one bad item can cause (the call does not say which)."""
    if isinstance(exc, ClientError):
        return error_code(exc) in ("ValidationException", "SerializationException")
    return isinstance(exc, ParamValidationError | ValueError | TypeError)


def transact_conditional(
    dynamodb,
    items: Sequence[T],
    action: Callable[[T], dict[str, Any]],
    *,
    fence: dict[str, Any] | None = None,
    policy: RetryPolicy = CALL_POLICY,
    what: str = "TransactWriteItems",
) -> Transacted[T]:
    """``action(item)`` (one ``Put``/``Update``/``Delete``/``ConditionCheck``) for each item, ``fence`` in
    every transaction: see ``docs/development.md``, "Batched writes"."""
    out: Transacted[T] = Transacted()
    for part in chunks(list(items), TRANSACTION_LIMIT - (1 if fence else 0)):
        _transact(dynamodb, list(part), action, fence, policy, what, out)
    return out


def _transact(dynamodb, todo: list[T], action, fence, policy: RetryPolicy, what: str, out: Transacted[T]) -> None:
    def submit() -> None:
        nonlocal todo
        while todo:
            try:
                actions = [action(item) for item in todo] + ([fence] if fence else [])
                dynamodb.transact_write_items(TransactItems=actions)
            except ClientError as exc:
                codes = cancellation_codes(exc)
                if codes is None or len(codes) != len(todo) + (1 if fence else 0):
                    raise
                if fence and codes[-1] == "ConditionalCheckFailed":
                    raise FenceFailed(f"{what}: the fence's condition failed") from exc
                left = []
                for item, code, reason in zip(todo, codes, exc.response["CancellationReasons"], strict=False):
                    if code == "ConditionalCheckFailed":
                        out.conditional.append((item, from_item(reason["Item"]) if reason.get("Item") else {}))
                    elif code not in _SETTLED_LATER:
                        out.refused.append((item, first_line(f"{code}: {reason.get('Message') or ''}")))
                    else:
                        left.append(item)
                if len(left) == len(todo):
                    raise
                todo = left
                continue  # the others' actions were fine: submit them again at once
            out.applied.extend(todo)
            todo = []

    try:
        retry_call(submit, policy, retryable=_worth_retrying, on_retry=retry_note(what))
    except FenceFailed:
        raise
    except Exception as exc:
        if _worth_retrying(exc):
            out.failed.extend(todo)
            out.error = exc
        elif not _item_refused(exc):
            raise
        elif len(todo) == 1:
            out.refused.append((todo[0], first_line(f"{error_code(exc)}: {exc}")))
        else:
            half = len(todo) // 2
            _transact(dynamodb, todo[:half], action, fence, policy, what, out)
            _transact(dynamodb, todo[half:], action, fence, policy, what, out)


def datum(name: str, value: Any, unit: str = "Count", timestamp: Any = None, **dimensions: str) -> dict[str, Any]:
    """One ``PutMetricData`` datum: ``value`` and the dimension values as given, ``Timestamp`` only when given."""
    dims = [{"Name": k, "Value": v} for k, v in dimensions.items()]
    out = {"MetricName": name, "Dimensions": dims, "Value": value, "Unit": unit}
    return out if timestamp is None else out | {"Timestamp": timestamp}


def put_metrics(
    cloudwatch,
    namespace: str,
    datums: Sequence[dict[str, Any]],
    *,
    policy: RetryPolicy = CALL_POLICY,
    per_call: int = METRICS_PER_CALL,
) -> int:
    """``PutMetricData``, each call retried by ``policy``; a call that still fails raises, unless
    ``cloudwatch`` has ``not_published(exc)`` (``CommittedChangeMetrics``). Returns the calls that published."""
    # a metrics sink's ``not_published(exc)``, or None for a raw client (which raises instead)
    not_published = getattr(cloudwatch, "not_published", None)
    calls = 0
    for batch in chunks(list(datums), per_call):
        try:
            retry_call(
                lambda batch=batch: cloudwatch.put_metric_data(Namespace=namespace, MetricData=list(batch)),
                policy,
                on_retry=retry_note("PutMetricData"),
            )
            calls += 1
        except Exception as exc:
            if not_published is None:
                raise
            not_published(exc)
    return calls
