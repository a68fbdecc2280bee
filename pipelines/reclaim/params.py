"""The reclaim job's parameters: POP's flat JSON plus Groundskeeper's extension keys, validated
by :func:`parse_params` alike for run config, targets file and tests. No Dagster."""

import re
from dataclasses import dataclass
from typing import Any

from pipelines.common.http import UnsafeURL, credential_url
from pipelines.common.params import ParamsError, param
from pipelines.common.params import parse_params as _parse
from pipelines.retry import RetryPolicy, RetryPolicyError, policy_from_json

# DynamoDB: table and index names are 3-255 of [a-zA-Z0-9_.-]; attribute names 1-255 bytes.
TABLE_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{3,255}\Z")


@dataclass(frozen=True)
class ReclaimParams:
    # POP's agenda reclaimer (descriptions from its documentation)
    tableName: str = param(description="The name of the table to scan items from.")
    idFieldName: str = param(description="The name of the id field in the table to scan (its hash key).")
    timeFieldName: str = param(description="The name of the time field in the table to scan (epoch ms or ISO-8601).")
    maximumExecutionSeconds: int = param(
        60,
        description="The maximum amount of time the execution should run for; fuzzy: the batch in hand is "
        "finished, no page starts after it. Must be below the run's dagster/max_runtime tag (job default 900).",
        minimum=1,
        maximum=86_400,  # a day; the run's dagster/max_runtime must be above it anyway
    )
    reclaimAgeMinutes: int = param(
        0,
        description="The age in minutes an object must be for reclaim consideration: "
        "reclaimed when now - reclaimAgeMinutes > its time field.",
        minimum=0,
        maximum=10 * 366 * 1440,  # ten years
    )
    scanDelayMillis: int = param(
        0,
        description="The number of milliseconds to delay between scan calls (DynamoDB has capacity limits); "
        "a delay never runs past the budget.",
        minimum=0,
        maximum=10_000,  # and never past the budget: the engine sleeps no longer than it has left
    )
    targetBatchSize: int = param(
        50, description="The number of objects to gather before attempting to reclaim them.", minimum=1, maximum=1000
    )
    objectScanLimit: int = param(
        50,
        description="The number of objects to allow DynamoDB to scan before returning "
        "(may return 0 to objectScanLimit items).",
        minimum=1,
        maximum=1000,
    )
    logReclaimOnly: bool = param(
        False,
        description="Log the reclaim actions only (dry run): one `dry run: would ...` line per candidate, no write.",
    )
    agendaProgressEndpointURL: str | None = param(
        None,
        description="Write through this AgendaProgress HTTP endpoint instead of DynamoDB "
        "(wins over AGENDA_PROGRESS_URL). It gets the bearer token, so it must be AGENDA_PROGRESS_URL or "
        "under a prefix in AGENDA_PROGRESS_ALLOWED_URLS.",
    )
    # Groundskeeper's extensions
    reclaimAction: str = param(
        "fail",
        description="What to do with a stale agenda: fail it (timeout), or retry it while its attempts allow.",
        choices=("fail", "retry"),
    )
    retryPolicy: dict | None = param(
        None,
        description='Retry action only: the retry library\'s JSON policy, e.g. {"kind": "exponential", '
        '"initial": 60, "coefficient": 2, "maxDelay": 3600, "maxAttempts": 5}; unset: retry at once.',
    )
    indexName: str | None = param(
        None,
        description="The GSI to query (hash processingState, range the time field, projection ALL); "
        "unset: processingState-updatedTime-index or another fitting one, else the scan.",
    )
    segments: int = param(
        1,
        description="Scan path only: DynamoDB parallel-scan segments, one op each (multiprocess executor above 1; "
        "Celery workers under the cluster deployment).",
        minimum=1,
        maximum=64,
    )
    operationProgressTableName: str | None = param(
        None, description="Also fail the EXECUTING OperationProgress items of each failed agenda in this table."
    )
    includeWaiting: bool = param(
        False,
        description="Stale WAITING items count too, meant for agendas taken from the queue but never started; "
        "a WAITING item cannot tell those from an agenda still waiting in the ReadyAgenda queue, which is then "
        "failed, or queued a second time by the retry action.",
    )
    retryFailed: bool = param(
        False, description="Retry action only: COMPLETE/failed items not yet handled are retried too."
    )

    def __post_init__(self) -> None:
        for name in ("tableName", "indexName", "operationProgressTableName"):
            value = getattr(self, name)
            if value is not None and not TABLE_NAME_RE.match(value):
                raise ParamsError(f"{name} {value!r} is not a valid DynamoDB name (3-255 of A-Z a-z 0-9 _ . -)")
        for name in ("idFieldName", "timeFieldName"):
            value = getattr(self, name)
            if not value or len(value.encode()) > 255:
                raise ParamsError(f"{name} {value!r} must be 1 to 255 bytes long")
        for name, value in (("retryFailed", self.retryFailed), ("retryPolicy", self.retryPolicy is not None)):
            if value and self.reclaimAction != "retry":
                raise ParamsError(f"{name} needs reclaimAction 'retry'")
        if self.retryPolicy is not None:
            policy_from_params(self.retryPolicy)  # refused here, before the run touches AWS
        if self.agendaProgressEndpointURL is not None:
            check_url("agendaProgressEndpointURL", self.agendaProgressEndpointURL)

    def cutoff_ms(self, now_ms: int) -> int:
        """Items whose time field is below this are stale: ``now - reclaimAgeMinutes``."""
        return now_ms - self.reclaimAgeMinutes * 60_000


def parse_params(raw: dict[str, Any]) -> ReclaimParams:
    """Validate the flat JSON; unknown keys, missing required keys and bad ranges are errors."""
    return _parse(ReclaimParams, raw)[0]


def policy_from_params(retry_policy: dict[str, Any] | None) -> RetryPolicy:
    """``retryPolicy`` as a policy; unset, retry at once while the agenda's own ``maximumAttempts`` allows
    (the original retry Lambda). One the retry library refuses is a ``ParamsError``."""
    if retry_policy is None:
        retry_policy = {"kind": "fixed", "delay": 0, "maxAttempts": None}
    try:
        return policy_from_json(retry_policy)
    except RetryPolicyError as exc:
        raise ParamsError(f"retryPolicy: {exc}") from None


def check_url(name: str, value: str, *, query: bool = False) -> str:
    """``credential_url`` as a ``ParamsError``, without a trailing ``/`` (``query``: only ``IDENTITY_URL``)."""
    try:
        return credential_url(name, value, query=query).rstrip("/")
    except UnsafeURL as exc:
        raise ParamsError(str(exc)) from None


def check_max_runtime(params: ReclaimParams, max_runtime_tag: str | None) -> None:
    """POP's warning: the scan budget must be below the run's own timeout (``dagster/max_runtime``)."""
    if max_runtime_tag is None:
        return
    try:
        max_runtime = float(max_runtime_tag)
    except ValueError:
        raise ParamsError(f"the run tag dagster/max_runtime={max_runtime_tag!r} is not a number") from None
    if params.maximumExecutionSeconds >= max_runtime:
        raise ParamsError(
            f"maximumExecutionSeconds={params.maximumExecutionSeconds} must be below the run's "
            f"dagster/max_runtime={max_runtime_tag} seconds, or the run is killed mid-batch"
        )
